"""The MIG kind: partitions of ``--mig-gpus`` GPUs, made at prepare. ``discovery`` (what a MIG GPU offers,
through NVML), ``publish`` (the MIG GPU, its counters and every possible partition, smallest first; pure),
``plan`` (a partition's share; pure), ``nvml`` (NVML's MIG calls), ``partitions`` (made, destroyed, swept at
start).

May import: ``kinds.share``, ``enforcement``, ``state``, ``core``, ``api``. Imported by: ``publishing``,
``prepare``, ``__main__``.
"""
