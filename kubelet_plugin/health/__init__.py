"""GPU health: what the driver reports (``nvml_watcher`` -> ``book``, classified by ``xid_catalog``), the
device-health stream the kubelet reads (``source``), slice taints, Events (``events``), metrics (``metrics``);
``watch`` wires them.

May import: ``state`` (the checkpoint's claims), ``core`` (device nodes), ``api``. An MPS daemon's health is the
MPS kind's (``kinds/mps/watch.py``). Imported by: ``serving``, ``__main__``. Independent of ``usage``.
"""
