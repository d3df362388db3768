"""Claim status: the ``status.devices`` entries of our allocations (``plan``, pure), the claims no published GPU can
ever satisfy (``feasibility``, with the CEL selectors of ``selectors``), the Events about claims (``events``) and
the writers that reconcile each claim (``manager``).

May import: ``nodes``, ``devices``, ``core``, ``api``. Imported by: ``loops``.
"""
