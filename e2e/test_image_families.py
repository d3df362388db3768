"""Issue #10 on the session cluster (driverEdits: toolkit, containerd 2.x + runc): a second image family
gets the driver through the toolkit's ld-cache hook, and every device node of a claim container is one its
OCI spec grants (the `daemon-reload` property). Two pods, started together, serve both tests."""

import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from e2e import workloads as w
from e2e.install import Installation
from harness.image import lib64
from harness.mocknvml.driver_root import LIBDIR
from harness.oci_devices import LIST_DEVICES, bundle_config, mismatches, parse_listing

pytestmark = pytest.mark.e2e

DRIVER_LIBS = ("libcuda.so.1", "libnvidia-ml.so.1")
# Tagged lines: the loader cache's entries for the driver and libc, the ld.so.conf drop-ins, what nvidia-smi
# and the CUDA probe see, NVIDIA_VISIBLE_DEVICES, the device nodes.
LIB64_REPORT = rf"""
ldconfig -p | awk '$1 ~ /^(libcuda\.so\.1|libnvidia-ml\.so\.1|libc\.so\.6)$/ {{print "LDCONFIG", $1, $NF}}'
for f in /etc/ld.so.conf.d/*.conf; do [ -f "$f" ] && echo "CONF ${{f##*/}} $(tr '\n' ' ' < "$f")"; done
nvidia-smi -L 2>&1 | sed 's/^/SMI /'
echo "PROBE $(cuda-probe 2>&1 | tr '\n' ' ')"
echo "ENV NVIDIA_VISIBLE_DEVICES=${{NVIDIA_VISIBLE_DEVICES-}}"
{LIST_DEVICES}
echo END
sleep 100000
"""
DEVICES_REPORT = f"{LIST_DEVICES}\necho END\nsleep 100000\n"
GPU_NODE = re.compile(r"/dev/nvidia[0-9]+")


@dataclass(frozen=True)
class Started:
    namespace: str
    build_cache: dict[str, str]  # the lib64 image's own ld.so.cache, as built: soname -> path


@pytest.fixture(scope="module")
def started(installation: Installation, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Started]:
    """The lib64 image built and imported; pods `lib64` (that image, one 40Gi claim) and `split` (busybox, a
    claim of two requests, 50Gi and 40Gi, so on both GPUs: container `all` uses both, `only-a` request a)."""
    cluster = installation.cluster
    work = tmp_path_factory.mktemp("lib64")
    root = work / "rootfs"
    root.mkdir()
    lib64.lay_out_rootfs(root, installation.driver.cuda_probe)
    build_cache = lib64.cached_libraries(root)
    cluster.import_image(lib64.pack(root, work / "image").path)

    namespace = f"e2e-families-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    deadline = time.monotonic() + 30
    while cluster.kubectl("get", "serviceaccount", "default", "-n", namespace, check=False).returncode != 0:
        assert time.monotonic() < deadline, "default ServiceAccount never appeared"
        time.sleep(0.5)
    try:
        lib64_pod = w.pod(
            "lib64", {"gpu": "share-40gi"}, {"app": ["gpu"]}, image=lib64.LIB64_IMAGE, script=LIB64_REPORT
        )
        split = w.pod("split", {"gpus": "two-requests"}, {"all": ["gpus"], "only-a": ["gpus/a"]}, script=DEVICES_REPORT)
        w.apply(
            cluster,
            namespace,
            w.claim_template("share-40gi", "40Gi"),
            w.requests_template("two-requests", {"a": "50Gi", "b": "40Gi"}),
            lib64_pod,
            split,
        )
        w.wait_running(cluster, namespace, ["lib64", "split"])
        yield Started(namespace, build_cache)
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=120s", check=False)


def test_a_lib64_image_resolves_the_driver_through_the_ld_cache_hook(
    installation: Installation, started: Started
) -> None:
    """RHEL/Fedora layout (glibc only in /usr/lib64, no multiarch dir, no /etc/debian_version): the driver's
    libraries are mounted at the driver's libdir, which only the spec's update-ldcache hook adds to the image's
    loader cache. (The image's loader is Debian's, which also searches the multiarch dirs by default, so the
    cache, not a working dlopen, is the evidence that the hook ran and did its job.)"""
    cluster, ns = installation.cluster, started.namespace
    assert "libc.so.6" in started.build_cache and not set(DRIVER_LIBS) & set(started.build_cache), (
        "as built, the image's cache lists its glibc and cannot list the driver"
    )
    seen = w.cuda_report(cluster, ns, "lib64")
    resolved = dict(line.split(" ", 1) for line in seen.get("LDCONFIG", []))
    driver_dirs = (f"/{LIBDIR}", f"/{LIBDIR.removeprefix('usr/')}")  # /lib is a link to usr/lib
    assert sorted(resolved) == sorted([*DRIVER_LIBS, "libc.so.6"]), seen
    for name in DRIVER_LIBS:
        assert resolved[name] in {f"{d}/{name}" for d in driver_dirs}, seen
    assert resolved["libc.so.6"] in ("/usr/lib64/libc.so.6", "/lib64/libc.so.6"), seen
    drop_ins = {line.split(" ", 1)[0][:7]: line.split()[1:] for line in seen.get("CONF", [])}
    assert drop_ins.get("00-nvcr") == [f"/{LIBDIR}"], seen  # the hook's --folder
    assert {"/lib64", "/usr/lib64"} <= set(drop_ins.get("zz-nvcr", [])), seen  # taken for a lib64 image

    gpu = w.recorded_gpu(w.claim_of(cluster, ns, "lib64"))["uuid"]
    assert seen.get("SMI") == [f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {gpu})"], seen
    (probe_line,) = seen["PROBE"]
    probe = json.loads(probe_line)
    assert probe["device_count"] == 1 and [d["uuid"] for d in probe["devices"]] == [gpu], probe
    assert seen["ENV"] == ["NVIDIA_VISIBLE_DEVICES=void"]


def test_every_device_node_of_a_claim_container_is_granted_by_its_oci_spec(
    installation: Installation, started: Started
) -> None:
    """For each container: its character devices under /dev, listed from inside, against the config.json
    containerd handed runc: each in linux.devices and allowed rw by linux.resources.devices."""
    cluster, ns = installation.cluster, started.namespace
    gpus_expected = {("lib64", "app"): 1, ("split", "all"): 2, ("split", "only-a"): 1}
    for (pod, container), gpus in gpus_expected.items():
        statuses = w.get(cluster, "pod", "-n", ns, pod)["status"]["containerStatuses"]
        (container_id,) = [s["containerID"] for s in statuses if s["name"] == container]
        config: Path = bundle_config(cluster.containerd.state, container_id)
        spec = json.loads(config.read_text())
        nodes = parse_listing(f"DEV {rest}" for rest in w.cuda_report(cluster, ns, pod, container=container)["DEV"])
        paths = {n.path for n in nodes}
        assert len({p for p in paths if GPU_NODE.fullmatch(p)}) == gpus, (pod, container, sorted(paths))
        assert {"/dev/nvidiactl", "/dev/nvidia-uvm"} <= paths, (pod, container, sorted(paths))
        assert mismatches(nodes, spec) == [], (pod, container, config)
