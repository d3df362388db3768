#!/usr/bin/env bash
# Builds the mock driver from harness/mocknvml/*.c: NVML, the CUDA driver library, nvidia-smi, the CUDA probe and
# the MPS control daemon (nvidia-cuda-mps-control, with nvidia-cuda-mps-server a hard link to it).
#
#   harness/mocknvml/build.sh [outdir]
#       libnvidia-ml.so.1, libcuda.so.1 (read the profile named by FRACGPU_MOCK_NVML_PROFILE), nvidia-smi,
#       cuda-probe, nvidia-cuda-mps-control and nvidia-cuda-mps-server; and without-memory-limits/libnvidia-ml.so.1,
#       an NVML without nvmlDeviceSetMemoryLimits_v1 (a driver older than r615). Use with: LD_LIBRARY_PATH=<outdir> FRACGPU_MOCK_NVML_PROFILE=harness/mocknvml/profiles/h100x8.profile
#   harness/mocknvml/build.sh --embed-profile PROFILE outdir
#       the files of a driver installation for PROFILE's driver_version <ver>: libnvidia-ml.so.<ver> and
#       libcuda.so.<ver> with PROFILE compiled in (they enumerate the GPUs whose /dev/nvidia<minor> the
#       process can open, with no environment needed), stub ELF libraries with the real drivers' sonames
#       (STUB_LIBS below), each with its soname link, nvidia-smi, cuda-probe and the two MPS programs (profile
#       compiled in). harness/mocknvml/__init__.py lays them out as a driver root.
#
# Default outdir build/mocknvml; a relative outdir is taken from the repo root. Everything links only libc.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
src=harness/mocknvml
profile=""
if [ "${1:-}" = "--embed-profile" ]; then
  [ $# -eq 3 ] || { echo "usage: $0 --embed-profile PROFILE outdir" >&2; exit 2; }
  profile=$2; shift 2
  [ -r "$profile" ] || { echo "$0: cannot read profile '$profile'" >&2; exit 2; }
fi
outdir="${1:-build/mocknvml}"
mkdir -p "$outdir"
cc=("${CC:-cc}" -O2 -Wall -Wextra -Werror)

# The libraries named by soname <soname> into file <file>; extra args are cc flags.
lib() {
  local file=$1 soname=$2; shift 2
  "${cc[@]}" -shared -fPIC -Wl,-soname,"$soname" -o "$outdir/$file" "$@"
}
# The MPS control daemon from the given sources and cc flags, and the server as a hard link to it.
mps() {
  "${cc[@]}" -o "$outdir/nvidia-cuda-mps-control" "$@"
  ln -f "$outdir/nvidia-cuda-mps-control" "$outdir/nvidia-cuda-mps-server"
}

# Every NVML build has these; the full one adds mock_nvml_limits.c.
nvml=("$src/mock_nvml.c" "$src/mock_nvml_events.c" "$src/mock_nvml_mig.c" "$src/mock_mig.c" "$src/mock_profile.c")

"${cc[@]}" -o "$outdir/nvidia-smi" "$src/mock_nvidia_smi.c" -ldl
"${cc[@]}" -o "$outdir/cuda-probe" "$src/cuda_probe.c" -ldl

if [ -z "$profile" ]; then
  lib libnvidia-ml.so.1 libnvidia-ml.so.1 "${nvml[@]}" "$src/mock_nvml_limits.c" -lpthread
  mkdir -p "$outdir/without-memory-limits"
  lib without-memory-limits/libnvidia-ml.so.1 libnvidia-ml.so.1 "${nvml[@]}" -lpthread
  lib libcuda.so.1 libcuda.so.1 "$src/mock_cuda.c" "$src/mock_mig.c" "$src/mock_profile.c" -lpthread
  mps "$src/mock_mps_control.c" "$src/mock_profile.c"
  echo "built $outdir/{libnvidia-ml.so.1,libcuda.so.1,nvidia-smi,cuda-probe,nvidia-cuda-mps-control,nvidia-cuda-mps-server}"
  exit 0
fi

version=$(sed -n 's/^[[:space:]]*driver_version[[:space:]]*=[[:space:]]*\([^[:space:]#]*\).*/\1/p' "$profile" | head -n1)
[ -n "$version" ] || { echo "$0: profile '$profile' has no driver_version" >&2; exit 2; }
# The profile as a C array (NUL-terminated) for mock_profile.c.
gen=$(mktemp -d); trap 'rm -rf "$gen"' EXIT
{
  printf 'static const char mock_embedded_profile_name[] = "%s";\n' "$(basename "$profile" | tr -cd 'A-Za-z0-9._-')"
  printf 'static const char mock_embedded_profile[] = {\n'
  od -An -v -tx1 "$profile" | sed -e 's/\([0-9a-f][0-9a-f]\)/0x\1,/g'
  printf '0x00};\n'
} > "$gen/embedded_profile.h"
embed=(-DMOCK_EMBEDDED_PROFILE_H="\"$gen/embedded_profile.h\"")  # mktemp gives an absolute path
# The libraries named by soname <soname> into file <file>, with the soname link the driver installer makes.
driver_lib() {
  lib "$@"
  [ "$2" = "$1" ] || ln -sfn "$1" "$outdir/$2"
}
driver_lib "libnvidia-ml.so.$version" libnvidia-ml.so.1 "${nvml[@]}" "$src/mock_nvml_limits.c" "${embed[@]}" -lpthread
driver_lib "libcuda.so.$version" libcuda.so.1 "$src/mock_cuda.c" "$src/mock_mig.c" "$src/mock_profile.c" "${embed[@]}" -lpthread
mps "$src/mock_mps_control.c" "$src/mock_profile.c" "${embed[@]}"

# Other libraries of a compute driver installation, as stubs: <name> <soname> (the real drivers' sonames).
STUB_LIBS=(
  "libnvidia-ptxjitcompiler libnvidia-ptxjitcompiler.so.1"
  "libnvidia-nvvm libnvidia-nvvm.so.4"
  "libnvidia-gpucomp libnvidia-gpucomp.so.$version"
  "libnvidia-allocator libnvidia-allocator.so.1"
  "libnvidia-cfg libnvidia-cfg.so.1"
  "libcudadebugger libcudadebugger.so.1"
)
echo 'int fracgpu_mock_driver_stub(void) { return 0; }' > "$gen/stub.c"
for entry in "${STUB_LIBS[@]}"; do
  read -r name soname <<<"$entry"
  driver_lib "$name.so.$version" "$soname" "$gen/stub.c"
done
echo "built driver $version in $outdir: libnvidia-ml.so.$version libcuda.so.$version, ${#STUB_LIBS[@]} stub libraries, nvidia-smi, cuda-probe, nvidia-cuda-mps-control, nvidia-cuda-mps-server"
