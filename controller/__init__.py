"""fracgpu controller: records each claim's physical GPU and keeps the GPU ledger (kopf).

One package per concern; each may import only the packages below it (the ``controller-layers`` contract in
pyproject.toml), and none imports ``kubelet_plugin``:

- ``__main__``: wiring; ``handlers``: kopf's handlers and indexes;
- ``leadership``: leader election on a Lease and the gate on every write;
- ``reconciler``: the work loops (claim status, ledger, node lifecycle) over kopf's indexes;
- ``admission`` | ``status`` | ``ledger`` | ``nodes`` (independent of each other): the webhook and its verdicts;
  claim status entries and unsatisfiable requests; the GPU ledger; deleted nodes and plugin heartbeats;
- ``core``: settings, views of the API objects, the API client, metrics, the work queue, RBAC rules.

May import: ``api`` (never ``kubelet_plugin``). Imported by: nothing (the ``fracgpu-controller`` entry point).
"""
