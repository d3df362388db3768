"""The GPU ledger: each `GPU` object computed from its device and the claims on it (``plan``, pure), and the marks,
inverse index and loop that recompute and write it (``manager``).

May import: ``nodes``, ``devices``, ``core``, ``api``. Imported by: ``loops``, ``handlers``.
"""
