"""The published devices: the catalogue of our driver's devices from the ResourceSlices, each device's GPU object
name, and the facts admission reviews read (``catalogue``), derived by ``facts`` (pure).

May import: ``core``, ``api``. Imported by: ``nodes``, ``status``, ``ledger``, ``loops``, ``handlers``.
"""
