"""Models and names shared by the fracgpu controller and node plugin.

May import: nothing of ``controller`` or ``kubelet_plugin`` (the ``api-is-shared`` contract). Imported by: both.
"""
