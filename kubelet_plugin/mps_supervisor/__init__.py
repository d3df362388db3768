"""The MPS supervisor, a process of its own (``python -m kubelet_plugin.mps_supervisor``, the fracgpu-mps DaemonSet):
one CUDA MPS control daemon per MPS GPU, started from the node's driver for one trust domain at a time, kept
alive, and described in status files that the node plugin reads (``kubelet_plugin/state/mps_files.py``). It outlives
the node plugin's rollouts, so MPS clients keep their daemon when the plugin restarts.

May import: ``kubelet_plugin.kinds.mps``, ``kubelet_plugin.state``, ``kubelet_plugin.core``, ``api``, pynvml,
prometheus_client.
Imported by: nothing (an entry point).
"""
