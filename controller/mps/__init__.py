"""MPS trust domains at scheduling: the pure plan (``plan``: which claims an MPS GPU admits, its DeviceTaintRule, a
new claim's tolerations).

May import: ``core``, ``api``. Imported by: the packages above it (admission, status, ledger and their managers).
"""
