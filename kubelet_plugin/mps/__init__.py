"""CUDA MPS, shared by the node plugin and the MPS supervisor: the daemons' host layout and status files
(``layout``), the driver's control client (``control``) and each MPS GPU's limits, kept and repaired
(``limits``).

May import: ``core``, ``api``. Imported by: ``enforcement``, ``prepare``, ``health``, ``mps_supervisor``.
"""
