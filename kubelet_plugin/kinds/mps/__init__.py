"""The MPS kind: GPUs whose shares are clients of one CUDA MPS daemon per trust domain. ``publish`` (the MPS
server's client capacity and binding conditions; pure), ``plan`` (the trust domain, a client's edits; pure),
``control`` (the driver's control client), ``limits`` (each MPS GPU's ceiling, kept and repaired), ``shares``
(admission of a claim's shares to its GPU's daemon, the ceiling lowered at unprepare), ``watch`` (the daemons'
health: taint, Events, gauge). The daemons themselves are the MPS supervisor's (``mps_supervisor``); their host
layout and files are ``state/mps_files.py``.

May import: ``kinds.share``, ``enforcement``, ``state``, ``core``, ``api``. Imported by: ``publishing``,
``prepare``, ``mps_supervisor``, ``__main__``.
"""
