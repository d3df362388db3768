"""Preparing a claim: NodePrepareResources / NodeUnprepareResources and recovery.

``preparer`` orchestrates; each step has its module: ``reader`` (claims from the API), ``node_lock``,
``journal`` over ``checkpoint`` (the durable record), ``plan`` (pure: claim -> CDI spec, info files, devices),
``cdi`` (the CDI spec model), ``container_info`` (what a container is told), ``devicenodes`` (the only place
that stats device nodes), ``driver_edits`` (NVIDIA's generated libraries and hooks), ``store`` (writes and
removes a claim's files), ``ready_writer`` and ``status`` (the claim's status conditions), ``spec_rebuild`` and
``state_gate`` (a corrupt or too-new checkpoint), ``errors`` (the error kinds).

May import: ``publishing``, ``enforcement``, ``core``, ``api``. Imported by: ``serving``, ``health``,
``usage``, ``__main__``.
"""
