"""GPU health: what the driver reports (``nvml_watcher`` -> ``book``, classified by ``xid_catalog``), the
device-health stream the kubelet reads (``source``), slice taints, Events (``events``), metrics (``metrics``);
``watch`` wires them.

May import: ``prepare`` (device nodes, the checkpoint's claims), ``publishing``, ``enforcement``, ``core``,
``api``. Imported by: ``serving``, ``__main__``. Independent of ``usage``.
"""
