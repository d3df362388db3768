#!/usr/bin/env bash
# Builds the mock NVML library (libnvidia-ml.so.1) from e2e/mocknvml/mock_nvml.c.
# Usage: e2e/mocknvml/build.sh [outdir]   (default build/mocknvml; a relative outdir is taken from the repo root)
# Use it with: LD_LIBRARY_PATH=<outdir> FRACGPU_MOCK_NVML_PROFILE=e2e/mocknvml/profiles/h100x8.profile
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
outdir="${1:-build/mocknvml}"
mkdir -p "$outdir"
"${CC:-cc}" -shared -fPIC -O2 -Wall -Wextra -Werror -Wl,-soname,libnvidia-ml.so.1 \
    -o "$outdir/libnvidia-ml.so.1" e2e/mocknvml/mock_nvml.c
echo "built $outdir/libnvidia-ml.so.1"
