"""The real-GPU check: fracgpu's discovery, driver edits and claim spec on a machine with an NVIDIA GPU.

`make gpu-check-bundle` builds what travels (bundle.py); `harness/gpu/check.sh` runs it there (check.py).
"""
