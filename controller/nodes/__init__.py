"""Node lifecycle: claims on a deleted Node and the node plugins' heartbeats (``plan``, pure).

May import: ``core``, ``api``. Imported by: ``reconciler``.
"""
