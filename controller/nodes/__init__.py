"""Node lifecycle: claims on a deleted Node and the node plugins' heartbeats (``plan``, pure), and the listing of
the heartbeats into each node's `PluginReporting` condition (``heartbeats``).

May import: ``devices``, ``core``, ``api``. Imported by: ``status``, ``ledger``, ``loops``.
"""
