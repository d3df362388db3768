#!/usr/bin/env bash
# The real-GPU check, on a machine with an NVIDIA driver and GPU and nothing else installed (no network).
#
#   harness/gpu/check.sh [--bundle DIR] [--driver-root DIR] [--nvml-library-dir DIR] [--ldconfig]
#                        [--create-device-nodes] [--memory 10Gi] [--no-mps] [--no-mig] [--keep]
#
# Needs root, python3 >= 3.11 (FRACGPU_GPU_CHECK_PYTHON names another) and the bundle `make gpu-check-bundle`
# builds (default build/gpu-check). Unpacks the bundle into a temporary work dir, installs the bundle's wheels
# offline into a fresh venv there, and runs `python -m harness.gpu.check` from this repository (see check.py for
# what it prints). --nvml-library-dir puts a directory first on the loader path (e.g. a driver root's libdir);
# --ldconfig first runs the host's ldconfig, as a driver installation does (nvidia-ctk finds the driver's
# libraries through the loader cache or standard directories); --create-device-nodes first runs the bundled
# `nvidia-ctk system create-device-nodes --control-devices` (as NVIDIA's nvidia-cdi-refresh does: the plugin
# needs nvidiactl, nvidia-uvm and nvidia-uvm-tools); --no-mps and --no-mig skip those steps; --keep leaves the
# work dir.
# Exit status: check.py's (0 PASS, 1 FAIL), 2 for a bad setup, 124 past the deadline (240 s).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bundle="$repo/build/gpu-check"
driver_root=/
memory=10Gi
keep=0
skip=()
ldconfig=0
device_nodes=0
deadline_s=${FRACGPU_GPU_CHECK_DEADLINE_S:-240}
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) bundle=$2; shift 2 ;;
    --driver-root) driver_root=$2; shift 2 ;;
    --nvml-library-dir) export LD_LIBRARY_PATH="$2${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; shift 2 ;;
    --memory) memory=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --no-mps|--no-mig) skip+=("$1"); shift ;;
    --ldconfig) ldconfig=1; shift ;;
    --create-device-nodes) device_nodes=1; shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
say() { printf '[gpu-check] %s\n' "$*"; }
fail() { say "FAIL: $*"; exit 2; }
start=$(date +%s)

[ "$(id -u)" = 0 ] || fail "run as root: runc creates the container and mounts the driver into it"
for f in payload.tar.gz requirements.txt manifest.json; do
  [ -f "$bundle/$f" ] || fail "$bundle/$f is missing: build the bundle with 'make gpu-check-bundle' and carry build/gpu-check"
done
py=${FRACGPU_GPU_CHECK_PYTHON:-$(command -v python3 || true)}
[ -n "$py" ] || fail "no python3 on PATH: the check needs CPython >= 3.11 (set FRACGPU_GPU_CHECK_PYTHON)"
pyver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])') || fail "$py does not run"
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || fail "$py is Python $pyver; the check needs CPython >= 3.11 (set FRACGPU_GPU_CHECK_PYTHON to one)"
need=$(sed -n 's/.*"host_glibc": "\([0-9.]*\)".*/\1/p' "$bundle/manifest.json")
have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}' || true)
if [ -n "$need" ] && [ -n "$have" ] && [ "$(printf '%s\n' "$need" "$have" | sort -V | head -n1)" != "$need" ]; then
  fail "the bundled NVIDIA tools run on this host and need glibc >= $need; it has $have: build the bundle on a machine whose glibc is not newer than $have"
fi
say "bundle: $bundle, $(du -sh "$bundle" | cut -f1) ($(du -sb "$bundle" | cut -f1) bytes); python: $py ($pyver); host glibc ${have:-unknown} (tools need ${need:-?})"

if [ "$ldconfig" = 1 ]; then
  timeout 30 ldconfig || say "warning: ldconfig failed (exit $?); going on with the loader cache as it is"
fi
cache=$(ldconfig -p 2>/dev/null | grep -E 'lib(cuda|nvidia-ml)\.so' | sed 's/^[[:space:]]*//' | tr '\n' ';' || true)
say "loader cache (ldconfig -p): ${cache:-no libcuda or libnvidia-ml}"

work=$(mktemp -d /tmp/fracgpu-gpu-check.XXXXXX)
chmod 755 "$work"
cleanup() { if [ "$keep" = 1 ]; then say "work dir kept: $work"; else rm -rf "$work"; fi; }
trap cleanup EXIT
tar -xzf "$bundle/payload.tar.gz" -C "$work"
if [ "$device_nodes" = 1 ]; then
  timeout 30 "$work/bin/nvidia-ctk" system create-device-nodes --control-devices --driver-root "$driver_root" \
    || say "warning: nvidia-ctk system create-device-nodes failed (exit $?); going on with the nodes there are"
fi
say "device nodes: $(cd "$driver_root/dev" 2>/dev/null && ls -d nvidia* 2>/dev/null | tr '\n' ' ' || true)"

# A fresh venv holding exactly the bundle's wheels (no index, no dependency resolution beyond the pinned list).
if "$py" -m venv "$work/venv" >/dev/null 2>&1; then
  timeout 60 "$work/venv/bin/python" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
    --find-links "$bundle/wheels" -r "$bundle/requirements.txt" || fail "installing the bundle's wheels failed (above)"
else  # no ensurepip (e.g. Debian without python3-venv): the interpreter's own pip installs into the venv
  "$py" -m venv --without-pip "$work/venv" || fail "$py -m venv failed"
  site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  timeout 60 "$py" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check --target "$site" \
    --find-links "$bundle/wheels" -r "$bundle/requirements.txt" \
    || fail "$py has neither ensurepip nor a working pip to install the bundle's wheels with"
fi
say "venv: $work/venv ($(wc -l < "$bundle/requirements.txt") distributions from the bundle's wheels) after $(( $(date +%s) - start )) s"

left=$(( deadline_s - ($(date +%s) - start) ))
rc=0
PYTHONPATH="$repo" PYTHONUNBUFFERED=1 timeout "$left" "$work/venv/bin/python" -m harness.gpu.check \
  --work "$work" --driver-root "$driver_root" --memory "$memory" "${skip[@]}" || rc=$?
[ "$rc" != 124 ] || say "FAIL: the check did not finish within the ${deadline_s} s deadline"
say "finished in $(( $(date +%s) - start )) s"
exit "$rc"
