"""Claim status: the ``status.devices`` entries of our allocations (``plan``, pure) and the claims no published
GPU can ever satisfy (``feasibility``, with the CEL selectors of ``selectors``).

May import: ``core``, ``api``. Imported by: ``reconciler``.
"""
