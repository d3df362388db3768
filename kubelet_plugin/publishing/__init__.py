"""Publishing this node's GPUs: discovery through NVML (``discovery``, where each sits: ``pci_topology``), the
ResourceSlices (``slices``, pure: the kinds' devices assembled into slices; ``publisher`` keeps them in the API)
and the plugin's heartbeat Lease (``heartbeat``).

May import: ``kinds`` (what each publishes), ``enforcement``, ``state``, ``core``, ``api``. Imported by:
``__main__``.
"""
