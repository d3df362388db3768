"""The kinds of device the plugin prepares, one package each: ``gpu`` (a whole GPU shared by memory, its tiers
``none``, ``nvml`` and ``hami-core``), ``mig`` (MIG partitions) and ``mps`` (MPS GPUs: a share is a client of the
GPU's daemon). ``share`` holds what every kind's plan produces (a ``Share`` per allocation result, a tier's
``Edits``).

Each kind provides the same hooks, each in a module of the same name where it has one:
- ``publish``: what it publishes (devices, counters, attributes; pure), assembled by ``publishing/slices.py``;
- ``plan``: its pure part of a claim's plan (the ``Share`` of a result, its tier's edits), assembled by
  ``prepare/plan.py``;
- what it acquires and releases on the host, run by ``prepare/transaction.py`` and ``prepare/release.py``
  (``mig/partitions.py``: partitions made and destroyed; ``mps/shares.py``: admission to the GPU's daemon, the
  ceiling lowered);
- what it recovers at start (``mig/partitions.py`` ``sweep``, run by ``prepare/recovery.py``);
- its health watch (``mps/watch.py``; a whole GPU's and a partition's health is NVML's, ``health``).
``docs/architecture.md`` "Adding a kind" walks through them.

May import: ``enforcement``, ``state``, ``core``, ``api``. Kinds never import each other (``share`` imports no
kind). Imported by: ``publishing``, ``prepare`` and the packages above them.
"""
