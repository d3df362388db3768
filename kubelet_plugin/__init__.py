"""fracgpu node plugin: speaks the kubelet's DRA gRPC protocol, publishes GPUs, prepares claims as CDI.

One package per concern; each may import only the packages below it (checked by ``lint-imports``, the
``plugin-layers`` contract in pyproject.toml), and none imports ``controller``, ``kubernetes`` or ``kopf``:

- ``__main__``: wiring and lifecycle (start, handover, stop);
- ``serving``: the kubelet-facing gRPC servers, handover between instances, the HTTP endpoint;
- ``health`` | ``usage`` (independent of each other): GPU health from NVML and the device nodes; memory used
  per claim;
- ``prepare``: one claim's way from the API to its CDI spec, info files and checkpoint entry;
- ``publishing``: discovery, the GPU inventory, ResourceSlices, the heartbeat Lease;
- ``enforcement``: which memory-enforcement tier each GPU offers and each share gets;
- ``core``: settings, value types, file primitives, metrics, Events.

May import: ``api`` (never ``controller``). Imported by: nothing (the ``fracgpu-kubelet-plugin`` entry point).
"""
