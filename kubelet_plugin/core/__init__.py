"""The node plugin's foundation: settings, value types, file primitives, metrics, Events, coalescing.

May import: ``api`` only. Imported by: every other package of the plugin.
"""
