"""Every on-disk format of the node plugin, in one place: the checkpoint (``checkpoint``; rebuilt from the specs
by ``spec_rebuild``), a claim's files (``claim_files``: its CDI spec, ``cdi``; its per-request info files,
``container_info``; its device metadata, ``device_metadata``; its HAMi-core files), the last known GPU identities
(``gpu_inventory``), the GPU faults kept until a reset (``health_faults``) and the MPS daemons' host layout,
tenant and status files (``mps_files``). Nothing else lists a directory of these files or parses them.

May import: ``core``, ``api``. Imports no kind. Imported by: every package above it.
"""
