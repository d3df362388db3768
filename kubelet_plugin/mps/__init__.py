"""The MPS supervisor, a process of its own (``python -m kubelet_plugin.mps``, the fracgpu-mps DaemonSet): one CUDA
MPS control daemon per MPS GPU, started from the node's driver, kept alive, and described in status files that
the node plugin reads (``kubelet_plugin/enforcement/mps.py``). It outlives the node plugin's rollouts, so MPS
clients keep their daemon when the plugin restarts.

May import: ``kubelet_plugin.core``, ``kubelet_plugin.enforcement``, ``kubelet_plugin.prepare.mps_ceiling`` (the
driver's control client), ``api``, pynvml, prometheus_client.
Imported by: nothing (an entry point).
"""
