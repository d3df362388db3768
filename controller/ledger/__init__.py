"""The GPU ledger: each `GPU` object computed from its device and the claims on it (``plan``, pure).

May import: ``core``, ``api``. Imported by: ``reconciler``, ``handlers``.
"""
