"""MPS trust domains at scheduling: the pure plan (``plan``: which claims an MPS GPU admits, the DeviceTaintRule that
records the domain it serves, a new claim's tolerations), the manager (``manager``: each MPS GPU's verdict from its
rule and its claims, the binding conditions the status writers write) and the loop that keeps the rules
(``taint_rules``: created, written back when edited or deleted, stale ones deleted).

May import: ``devices``, ``core``, ``api``. Imported by: the packages above it (admission, status, ledger and their
managers).
"""
