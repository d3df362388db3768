"""GPU memory used per claim: NVML's processes (``nvml``), each process's pod (``cgroups``), attribution to
claims (``attribution``, pure), the sampler thread (``sampler``) and its metrics (``metrics``).

May import: ``state`` (the info files), ``core``, ``api``.
Imported by: ``__main__`` (only when sampling is on). Independent of ``health``.
"""
