"""Memory-enforcement tiers: what each GPU offers (``probe``, the node's facts) and which tier a share gets
(``tiers``, pure).

May import: ``core``, ``api``. Imported by: ``prepare``, ``publishing`` and the packages above them.
"""
