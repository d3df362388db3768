"""Preparing a claim: NodePrepareResources / NodeUnprepareResources and recovery, over the kinds.

``preparer`` is thin: ``reader`` (claims from the API), ``journal`` (the node lock and the checkpoint),
``transaction`` (one claim's steps over its kinds, undone in reverse on failure), ``plan`` (pure: the kinds'
shares assembled into the CDI spec, files and devices), ``release`` (unprepare: the kinds' release hooks),
``recovery`` (at start), ``ready`` (the claim's status conditions, written in the background), ``driver_edits``
(NVIDIA's generated libraries and hooks), ``state_gate`` (a too-new checkpoint keeps the plugin unregistered).

May import: ``kinds``, ``enforcement``, ``state``, ``core``, ``api``. Imported by: ``serving``, ``__main__``.
"""
