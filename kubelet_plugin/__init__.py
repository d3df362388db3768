"""fracgpu node plugin: speaks the kubelet's DRA gRPC protocol, publishes GPUs, prepares claims as CDI."""
