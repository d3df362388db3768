"""The node plugin's foundation: settings, value types, error kinds, file primitives, device nodes, the
attributes every device of a GPU publishes, metrics, Events, coalescing.

May import: ``api`` only. Imported by: every other package of the plugin.
"""
