"""fracgpu controller: records each claim's physical GPU and keeps the GPU ledger (kopf).

One package per concern, each holding its manager (stateful, I/O through the shared context's writer) next to its
pure plan; each may import only the packages below it (the ``controller-layers`` contract in pyproject.toml), and
none imports ``kubelet_plugin``:

- ``__main__``: wiring; ``handlers``: kopf's handlers and indexes;
- ``leadership``: leader election on a Lease and the gate on every write;
- ``loops``: the entry: one context, the managers started and stopped together, kopf's events fanned out;
- ``admission`` | ``status`` | ``ledger`` (independent of each other): the webhook and its verdicts; claim status
  entries, their Events and unsatisfiable requests; the GPU ledger;
- ``nodes`` | ``mps``: deleted nodes and the node plugins' heartbeats; the MPS GPUs' trust domains (their
  DeviceTaintRules and the binding conditions);
- ``devices``: the published devices, the admission facts and the one claim -> devices index;
- ``core``: settings, the shared context, views of the API objects, the API writer, metrics, the work queue, RBAC.

May import: ``api`` (never ``kubelet_plugin``). Imported by: nothing (the ``fracgpu-controller`` entry point).
"""
