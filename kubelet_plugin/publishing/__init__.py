"""Publishing this node's GPUs: discovery through NVML (``discovery``), the last known identities
(``gpu_inventory``), the ResourceSlices (``slices``, pure; ``publisher`` keeps them in the API) and the plugin's
heartbeat Lease (``heartbeat``).

May import: ``enforcement``, ``core``, ``api``. Imported by: ``prepare``, ``__main__``.
"""
