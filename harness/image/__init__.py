"""The fracgpu container image assembled without Docker: a debootstrap rootfs plus our wheel, as an OCI archive.

`python -m harness.image.build` writes `build/image/fracgpu-<tag>.oci.tar` (importable with `ctr images import`).
"""
