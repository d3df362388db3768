"""The test harness both test tiers share: real clusters built from upstream (``cluster``: binaries, control plane,
nodes with kubelet and containerd), simulated GPUs (``mocknvml``), images built without Docker (``image``), the node
plugin as a process (``nodeplugin``) and a kubelet-speaking client of it (``kubelet_client``), the cluster client
of tests and benchmarks (``kube``), the real-GPU check bundle (``gpu``) and the dependency pins (``lock``).

May import: ``api``, ``controller``, ``kubelet_plugin`` (never ``tests`` or ``e2e``). Imported by: ``tests`` (its
integration tier and the harness's unit tests) and ``e2e`` (the end-to-end tier, its benchmarks and demo).
"""
