"""The published devices and the claims on them: the catalogue of our driver's devices from the ResourceSlices, each
device's GPU object name, and the facts admission reviews read (``catalogue``), derived by ``facts`` (pure); the
one claim -> devices index and its inverse (``claim_index``), kept by the entry and read by the ledger and the MPS
trust domains.

May import: ``core``, ``api``. Imported by: ``nodes``, ``mps``, ``status``, ``ledger``, ``loops``, ``handlers``.
"""
