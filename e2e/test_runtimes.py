"""End to end (issue #10): which runtime gives a claim's container its driver, and never more than its GPU.

The session's node runs NVIDIA's `nvidia-container-runtime` as containerd's default runtime in `cdi` mode with a
node-level `nvidia.com/gpu` spec (devices `0`, `1`, `GPU-<uuid>`, `all`) made by the real `nvidia-ctk cdi
generate` from the faithful driver root; RuntimeClass `runc` is plain runc. In that mode an image's
`NVIDIA_VISIBLE_DEVICES=all` really widens (the control pod proves it), so a claim container that still sees
only its GPU shows the claim spec's `NVIDIA_VISIBLE_DEVICES=void` at work. Then, with `driverEdits: none`
(one `helm upgrade` round trip), the old behaviour: device node and `<UUID>` only under runc, that UUID's driver
injected by NVIDIA's runtime.
"""

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e import workloads as w
from e2e.install import CHART, NAMESPACE, PROFILE, RELEASE, Installation
from harness import mocknvml
from harness.cluster.node import RUNC
from harness.cluster.nvidia_runtime import DEFAULT_KIND
from harness.image import oci, rootfs
from harness.image.glibc import build_glibc_workload

pytestmark = pytest.mark.e2e

ALL_GPUS_IMAGE = "fracgpu.local/debian-cuda-probe-all-gpus:1"
"""The glibc workload image with the env of NVIDIA's CUDA images: it asks NVIDIA's runtime for every GPU."""
ALL_GPUS_ENV = ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]
# Device nodes first, then CUDA_REPORT (ldconfig, nvidia-smi -L, the CUDA probe, NVIDIA_VISIBLE_DEVICES)
REPORT = r"""
for d in /dev/nvidia*; do [ -e "$d" ] && echo "NODE ${d#/dev/}"; done
""" + w.CUDA_REPORT.lstrip("\n")
SMI_LINE = re.compile(r"GPU \d+: .* \(UUID: (GPU-[0-9a-f-]+)\)")


def _gpus() -> dict[str, int]:
    """UUID -> minor of the simulated GPUs (the profile the driver root and the plugin's NVML were made from)."""
    profile = mocknvml.read_profile(PROFILE)
    return {v: int(profile[k.replace(".uuid", ".minor")]) for k, v in profile.items() if k.endswith(".uuid")}


def _report(installation: Installation, ns: str, pod: str) -> dict[str, list[str]]:
    return w.cuda_report(installation.cluster, ns, pod)


def _probe(seen: dict[str, list[str]]) -> dict[str, Any]:
    """The CUDA probe's JSON line."""
    (line,) = seen["PROBE"]
    probe: dict[str, Any] = json.loads(line)
    return probe


def _gpu_nodes(seen: dict[str, list[str]]) -> set[str]:
    return {n for n in seen.get("NODE", []) if re.fullmatch(r"nvidia\d+", n)}


def _smi_uuids(seen: dict[str, list[str]]) -> list[str]:
    return [m.group(1) for line in seen.get("SMI", []) if (m := SMI_LINE.fullmatch(line))]


def _injected(installation: Installation) -> list[str]:
    """The CDI device lists NVIDIA's runtime logged injecting (its debug log, set by the harness's config)."""
    log = installation.cluster.nvidia_runtime_dir / "runtime.log"
    return re.findall(r"Injecting devices using CDI: \[([^\]]*)\]", log.read_text() if log.is_file() else "")


def _claim_spec(installation: Installation, ns: str, pod: str) -> str:
    """The text of the CDI spec fracgpu wrote for the pod's claim."""
    uid = w.claim_of(installation.cluster, ns, pod)["metadata"]["uid"]
    (spec,) = [p for p in Path(installation.cluster.cdi_dir).glob("*.json") if uid in p.name]
    return spec.read_text()


def _uuid_of(installation: Installation, ns: str, pod: str) -> str:
    uuid: str = w.recorded_gpu(w.claim_of(installation.cluster, ns, pod))["uuid"]
    return uuid


@pytest.fixture(scope="module")
def all_gpus_image(installation: Installation) -> str:
    """ALL_GPUS_IMAGE (the glibc workload's layers, ALL_GPUS_ENV added), imported into the node."""
    out = installation.cluster.state_dir / "image-all-gpus"
    workload = build_glibc_workload(out, installation.driver.cuda_probe)
    path = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    config = {"architecture": rootfs.ARCH, "os": "linux", "config": {"Env": [path, *ALL_GPUS_ENV], "Cmd": ["/bin/sh"]}}
    archive = oci.write_image_archive(
        out / "all-gpus.oci.tar", layers=workload.layers, config=config, name=ALL_GPUS_IMAGE, epoch=0
    )
    installation.cluster.import_image(archive.path)
    return ALL_GPUS_IMAGE


def test_an_image_asking_for_all_gpus_sees_only_its_claim_under_nvidia_runtime(
    installation: Installation, ns: str, all_gpus_image: str
) -> None:
    """Default runtime NVIDIA's (cdi mode): the control pod (no claim) gets every GPU from the image's env; the
    claim's pod, same image, gets only its GPU: device nodes, nvidia-smi -L and the CUDA probe agree."""
    cluster = installation.cluster
    control = w.pod("control", {}, {"app": []}, image=all_gpus_image, script=REPORT)
    claimed = w.pod("claimed", {"gpu": "share-40gi"}, {"app": ["gpu"]}, image=all_gpus_image, script=REPORT)
    w.apply(cluster, ns, w.claim_template("share-40gi", "40Gi"), control, claimed)
    w.wait_running(cluster, ns, ["control", "claimed"])
    gpus = _gpus()
    assert w.get(cluster, "pod", "-n", ns, "claimed")["spec"].get("runtimeClassName") is None, "the default runtime"
    # the log is named only in the harness's config, never in /etc's
    assert f"{DEFAULT_KIND}=all" in _injected(installation), "NVIDIA's runtime did not inject the control's `all`"

    every = _report(installation, ns, "control")
    assert _gpu_nodes(every) == {f"nvidia{m}" for m in gpus.values()}, every
    assert sorted(_smi_uuids(every)) == sorted(gpus), every
    assert _probe(every)["device_count"] == len(gpus), every

    seen = _report(installation, ns, "claimed")
    uuid = _uuid_of(installation, ns, "claimed")
    assert _gpu_nodes(seen) == {f"nvidia{gpus[uuid]}"}, f"another GPU's device node is visible: {seen}"
    assert _smi_uuids(seen) == [uuid] and len(seen["SMI"]) == 1, seen
    probe = _probe(seen)
    assert probe["device_count"] == 1, probe
    assert [d["uuid"] for d in probe["devices"]] == [uuid], probe
    assert seen["ENV"] == ["NVIDIA_VISIBLE_DEVICES=void"], "the claim spec's void overrides the image's all"


def _set_driver_edits(installation: Installation, mode: str) -> None:
    """`helm upgrade --reuse-values --set driverEdits=<mode>`, then until the plugin's DaemonSet has rolled."""
    installation.helm(
        "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reuse-values",
        "--set", f"driverEdits={mode}", "--wait", "--timeout=300s",
    )  # fmt: skip
    cluster = installation.cluster
    selector = "app.kubernetes.io/component=kubelet-plugin"
    (daemonset,) = cluster.kubectl("get", "daemonset", "-n", NAMESPACE, "-l", selector, "-o", "name").stdout.split()
    # helm's --wait counts a DaemonSet with maxUnavailable 1 on one node as ready before its new pod is
    cluster.kubectl("rollout", "status", "-n", NAMESPACE, daemonset, "--timeout=300s")
    env = w.get(cluster, "-n", NAMESPACE, daemonset)["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "FRACGPU_DRIVER_EDITS", "value": mode} in env, env


@pytest.fixture(scope="module")
def driver_edits_none(installation: Installation) -> Iterator[None]:
    """The release with `driverEdits: none`; `toolkit` again afterwards, whatever happened."""
    try:
        _set_driver_edits(installation, "none")
        yield
    finally:
        _set_driver_edits(installation, "toolkit")


def test_driver_edits_none_under_runc_gives_the_device_node_and_uuid_only(
    installation: Installation, driver_edits_none: None, ns: str
) -> None:
    """driverEdits: none, plain runc: the container has its GPU's device node and NVIDIA_VISIBLE_DEVICES=<UUID>,
    and no libcuda, libnvidia-ml or nvidia-smi (nothing injects them)."""
    cluster = installation.cluster
    pod = w.pod("plain", {"gpu": "share-40gi"}, {"app": ["gpu"]}, image=installation.workload_image, script=REPORT)
    w.apply(cluster, ns, w.claim_template("share-40gi", "40Gi"), w.on_runtime(pod, RUNC))
    w.wait_running(cluster, ns, ["plain"])
    seen = _report(installation, ns, "plain")
    uuid = _uuid_of(installation, ns, "plain")
    assert _gpu_nodes(seen) == {f"nvidia{_gpus()[uuid]}"}, seen
    assert {"nvidiactl", "nvidia-uvm"} <= set(seen["NODE"]), seen
    assert seen["ENV"] == [f"NVIDIA_VISIBLE_DEVICES={uuid}"], seen
    assert "LDCONFIG" not in seen, f"a driver library is on the loader cache: {seen}"
    assert len(seen["SMI"]) == 1 and "not found" in seen["SMI"][0], seen
    assert _probe(seen)["error"] == "dlopen", seen
    spec = _claim_spec(installation, ns, "plain")
    assert f"NVIDIA_VISIBLE_DEVICES={uuid}" in spec and "libcuda" not in spec, spec


def test_driver_edits_none_under_nvidia_runtime_gets_the_driver_of_that_uuid(
    installation: Installation, driver_edits_none: None, ns: str
) -> None:
    """driverEdits: none, NVIDIA's runtime the default (cdi mode, node-level nvidia.com/gpu spec): the runtime
    turns NVIDIA_VISIBLE_DEVICES=<UUID> into nvidia.com/gpu=<UUID> and injects that GPU's driver, no other GPU."""
    cluster = installation.cluster
    pod = w.pod("viaenv", {"gpu": "share-40gi"}, {"app": ["gpu"]}, image=installation.workload_image, script=REPORT)
    w.apply(cluster, ns, w.claim_template("share-40gi", "40Gi"), pod)
    w.wait_running(cluster, ns, ["viaenv"])
    seen = _report(installation, ns, "viaenv")
    uuid = _uuid_of(installation, ns, "viaenv")
    assert _gpu_nodes(seen) == {f"nvidia{_gpus()[uuid]}"}, seen
    resolved = dict(line.split(" ", 1) for line in seen.get("LDCONFIG", []))
    assert sorted(resolved) == ["libcuda.so.1", "libnvidia-ml.so.1"], seen
    assert _smi_uuids(seen) == [uuid] and len(seen["SMI"]) == 1, seen
    probe = _probe(seen)
    assert probe["device_count"] == 1, probe
    assert [d["uuid"] for d in probe["devices"]] == [uuid], probe
    # the driver came from NVIDIA's runtime, not from fracgpu's spec
    assert f"{DEFAULT_KIND}={uuid}" in _injected(installation), _injected(installation)
    assert "libcuda" not in _claim_spec(installation, ns, "viaenv")
    # the runtime applied the node spec's edits, whose env says void
    assert seen["ENV"] == ["NVIDIA_VISIBLE_DEVICES=void"], seen
