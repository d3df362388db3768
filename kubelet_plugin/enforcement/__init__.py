"""Memory-enforcement tiers: what each GPU offers (``probe``, the node's facts) and which tier a share gets
(``tiers``, pure).

May import: ``state`` (the MPS daemons' status files), ``core``, ``api``. Imported by: ``kinds`` and the
packages above them.
"""
