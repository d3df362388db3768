"""The whole-GPU kind: a GPU shared by memory. ``publish`` (its ResourceSlice device), ``plan`` (a share's grant,
the tier each share gets from what the node offers, the ``nvml`` and ``hami-core`` tiers' edits).

May import: ``kinds.share``, ``enforcement``, ``state``, ``core``, ``api``. Imported by: ``publishing``,
``prepare``.
"""
