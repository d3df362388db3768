"""Generated gRPC/protobuf modules of the kubelet's DRA, health and plugin-registration APIs.

The ``.proto`` sources live here; regenerate with ``python -m kubelet_plugin.serving.proto.generate``.
"""
