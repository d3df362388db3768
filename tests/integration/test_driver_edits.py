"""Driver edits (``--driver-edits=toolkit``) with the real nvidia-ctk against the faithful fake driver root.

Needs root (mknod'd device nodes). The recorded fixture the unit tests use is regenerated here and compared,
so it cannot drift from what the pinned nvidia-ctk prints: regenerate it with
``python -m tests.integration.test_driver_edits`` (as root) after a toolkit upgrade.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from harness import kube, mocknvml
from harness.cluster import binaries
from harness.cluster.controlplane import ControlPlane
from harness.mocknvml import PROFILES, make_driver_root, read_profile
from harness.mocknvml.driver_root import LIBDIR, DriverInstall, install_driver, make_faithful_driver_root
from harness.nodeplugin import DRIVER, NodePluginProcess, toolkit_args
from kubelet_plugin.prepare.driver_edits import (
    DriverEditsError,
    GeneratorConfig,
    generate_argv,
    generate_driver_edits,
    transform_argv,
)
from kubelet_plugin.state import cdi

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: mknod'd device nodes"),
]

PROFILE = PROFILES / "gpu80x2.profile"
FIXTURE = Path(__file__).resolve().parents[1] / "unit" / "fixtures" / "nvidia-ctk-management.json"
FIXTURE_ROOT = Path("/driver-root")
"""The fixture's driver root: the generator's output with the real root rewritten to this by nvidia-ctk."""
FIXTURE_HOOK = Path(f"/var/lib/kubelet/plugins/{DRIVER}/nvidia-cdi-hook")
CONTAINER_LIBDIR = "/" + LIBDIR


@pytest.fixture(scope="module")
def toolkit() -> dict[str, Path]:
    return binaries.ensure_built("nvidia-ctk", "nvidia-cdi-hook")


@pytest.fixture(scope="module")
def driver() -> Iterator[DriverInstall]:
    base = Path(tempfile.mkdtemp(prefix="fracgpu-edits-", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield make_faithful_driver_root(base / "root", PROFILE, base / "build")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def recorded_spec(nvidia_ctk: Path, root: Path, work: Path) -> dict[str, Any]:
    """What the plugin's generate command prints for `root`, with `root` rewritten to /driver-root."""
    config = GeneratorConfig(nvidia_ctk, root, FIXTURE_ROOT, FIXTURE_HOOK, f"k8s.{DRIVER}")
    generated, moved = work / "generated.json", work / "moved.json"
    for argv in (generate_argv(config, generated), transform_argv(config, generated, moved)):
        subprocess.run(argv, capture_output=True, check=True, timeout=60)
    spec: dict[str, Any] = json.loads(moved.read_text())
    return spec


def test_the_recorded_fixture_is_what_nvidia_ctk_prints(
    toolkit: dict[str, Path], driver: DriverInstall, tmp_path: Path
) -> None:
    assert recorded_spec(toolkit["nvidia-ctk"], driver.root, tmp_path) == json.loads(FIXTURE.read_text()), (
        "the recorded nvidia-ctk output drifted: regenerate it (see the module docstring)"
    )


def test_generated_edits_point_to_the_host_driver_root(toolkit: dict[str, Path], driver: DriverInstall) -> None:
    host_root = Path("/run/nvidia/driver")
    hook = Path("/var/lib/kubelet/plugins/x/nvidia-cdi-hook")
    edits = generate_driver_edits(GeneratorConfig(toolkit["nvidia-ctk"], driver.root, host_root, hook, "k8s.x"))
    mounts = {m.container_path: m.host_path for m in edits.mounts}
    ver = driver.version
    for lib in (f"libcuda.so.{ver}", f"libnvidia-ml.so.{ver}"):
        assert mounts[f"{CONTAINER_LIBDIR}/{lib}"] == f"{host_root}/{LIBDIR}/{lib}"
    assert mounts["/usr/bin/nvidia-smi"] == f"{host_root}/usr/bin/nvidia-smi"
    assert not [p for p in mounts.values() if p.startswith(str(driver.root))]
    assert {h.path for h in edits.hooks} == {str(hook)}
    assert edits.device_nodes == []
    assert [e for e in edits.env if e.startswith("NVIDIA_VISIBLE_DEVICES=")] == ["NVIDIA_VISIBLE_DEVICES=void"]


def test_a_root_without_libraries_is_an_error_naming_the_cause(toolkit: dict[str, Path], tmp_path: Path) -> None:
    root = tmp_path / "root"
    make_driver_root(root, PROFILE)  # device nodes only: no driver installed
    config = GeneratorConfig(toolkit["nvidia-ctk"], root, root, tmp_path / "hook", "k8s.x")
    with pytest.raises(DriverEditsError) as raised:
        generate_driver_edits(config)
    message = str(raised.value)
    assert str(root) in message
    assert "exited with 1" in message and 'failed to locate \\"libcuda.so.\\"' in message, message
    assert "level=warning" not in message, "the generator's warnings are left out"


def test_plugin_with_toolkit_edits_writes_self_contained_claim_specs(
    toolkit: dict[str, Path],
    control_plane: ControlPlane,
    *,
    api_client: client.ApiClient,
    dyn: DynamicClient,
    namespace: str,
) -> None:
    """The real plugin process, --driver-edits=toolkit, on the faithful root: a prepared claim's spec carries
    the driver's libraries and hooks, void, and only its GPU's device nodes."""
    node = kube.unique("editsnode")
    kube.create_fake_node(api_client, node)
    kube.ensure_device_class(dyn, DRIVER, DRIVER)
    workdir = Path(tempfile.mkdtemp(prefix="fgde-", dir="/tmp"))  # short: unix socket paths
    workdir.chmod(0o755)
    process = NodePluginProcess(
        workdir, node, control_plane.kubeconfig, PROFILE, mocknvml.build(workdir / "nvml"), *toolkit_args(toolkit)
    )
    driver = install_driver(process.driver_root, PROFILE, workdir / "build")
    kubelet = process.start()
    try:
        (claim,) = kube.allocate_claims(api_client, dyn, namespace, node, device_class=DRIVER, memories=["10Gi"])
        uid = claim["metadata"]["uid"]
        response = kubelet.prepare([(namespace, uid, claim["metadata"]["name"])])
        assert response.claims[uid].error == "", process.log()
        text = cdi.spec_path(process.cdi_dir, DRIVER, uid).read_text()
        spec = cdi.Spec.model_validate_json(text)  # valid CDI by our model
        hook = process.kubelet_dir / "plugins" / DRIVER / "nvidia-cdi-hook"
        assert hook.read_bytes() == toolkit["nvidia-cdi-hook"].read_bytes()
        assert hook.stat().st_mode & 0o777 == 0o755
        edits = spec.container_edits
        assert edits is not None
        mounts = {m.container_path: m.host_path for m in edits.mounts}
        for lib in (f"libcuda.so.{driver.version}", f"libnvidia-ml.so.{driver.version}"):
            assert mounts[f"{CONTAINER_LIBDIR}/{lib}"] == str(driver.libdir / lib)
        names = {h.args[1]: h for h in edits.hooks}
        assert {"create-symlinks", "update-ldcache"} <= set(names)
        assert {h.path for h in edits.hooks} == {str(hook)}
        assert "NVIDIA_VISIBLE_DEVICES=void" in edits.env
        assert edits.device_nodes == []
        (device,) = spec.devices
        assert "NVIDIA_VISIBLE_DEVICES=void" in device.container_edits.env
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        minor = int(read_profile(PROFILE)[f"gpu.{result['device'].removeprefix('gpu-')}.minor"])
        others = {f"/dev/nvidia{m}" for m in (0, 1) if m != minor}
        paths = {n.path for n in device.container_edits.device_nodes}
        assert f"/dev/nvidia{minor}" in paths
        assert not paths & others
        assert json.loads(text)["cdiVersion"] == cdi.minimum_version(spec)
        kubelet.unprepare([(namespace, uid, claim["metadata"]["name"])])
    finally:
        kubelet.close()
        process.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _break(case: str, driver: DriverInstall, workdir: Path) -> tuple[list[str], list[str]]:
    """Break the node's toolkit setup as `case` says: extra plugin flags, and fragments prepare's error must hold."""
    if case == "driver root without libraries":
        for lib in driver.libdir.iterdir():
            if lib.name.startswith(("libcuda.so", "libnvidia-ml.so")):
                lib.unlink()
        return [], ['failed to locate \\"libcuda.so.\\"', str(driver.root), "driverRoot"]
    if case == "generator exits non-zero":
        fake = workdir / "failing-nvidia-ctk"
        fake.write_text("#!/bin/sh\necho 'level=error msg=\"driver root is not readable\"' >&2\nexit 3\n")
        fake.chmod(0o755)
        return [f"--nvidia-ctk={fake}"], ["exited with 3", "driver root is not readable", "driverRoot"]
    assert case == "hook path not writable"
    blocker = workdir / "not-a-directory"
    blocker.write_text("a file where the hook's directory should be\n")
    return [f"--nvidia-cdi-hook-path={blocker}/nvidia-cdi-hook"], [
        f"cannot install nvidia-cdi-hook at {blocker}/nvidia-cdi-hook",
        "--nvidia-cdi-hook-path",
    ]


@pytest.mark.parametrize(
    "case", ["driver root without libraries", "generator exits non-zero", "hook path not writable"]
)
def test_a_broken_toolkit_setup_fails_new_claims_and_keeps_prepared_ones(
    case: str,
    toolkit: dict[str, Path],
    control_plane: ControlPlane,
    *,
    api_client: client.ApiClient,
    dyn: DynamicClient,
    namespace: str,
) -> None:
    """The real plugin: claim A prepared on a good setup; the setup broken and the plugin restarted; claim B
    fails with what went wrong and what to fix, gets no spec, a DriverEditsFailed Node Event is posted;
    A's spec is untouched and A unprepares."""
    node = kube.unique("brokenedits")
    kube.create_fake_node(api_client, node)
    kube.ensure_device_class(dyn, DRIVER, DRIVER)
    workdir = Path(tempfile.mkdtemp(prefix="fgbe-", dir="/tmp"))  # short: unix socket paths
    workdir.chmod(0o755)
    nvml = mocknvml.build(workdir / "nvml")
    good = toolkit_args(toolkit)
    process = NodePluginProcess(workdir, node, control_plane.kubeconfig, PROFILE, nvml, *good)
    driver = install_driver(process.driver_root, PROFILE, workdir / "build")
    kubelet = process.start()
    try:
        a, b = kube.allocate_claims(api_client, dyn, namespace, node, device_class=DRIVER, memories=["10Gi", "10Gi"])
        ref_a = (namespace, a["metadata"]["uid"], a["metadata"]["name"])
        ref_b = (namespace, b["metadata"]["uid"], b["metadata"]["name"])
        assert kubelet.prepare([ref_a]).claims[ref_a[1]].error == "", process.log()
        spec_a = cdi.spec_path(process.cdi_dir, DRIVER, ref_a[1])
        before = spec_a.read_bytes()
        kubelet.close()
        process.stop()

        flags, fragments = _break(case, driver, workdir)
        process = NodePluginProcess(workdir, node, control_plane.kubeconfig, PROFILE, nvml, *good, *flags)
        kubelet = process.start()
        error = kubelet.prepare([ref_b]).claims[ref_b[1]].error
        for fragment in fragments:
            assert fragment in error, f"{fragment!r} not in {error!r}"
        assert not cdi.spec_path(process.cdi_dir, DRIVER, ref_b[1]).exists(), "no library-less spec"
        assert spec_a.read_bytes() == before, "the prepared claim's spec is untouched"

        def node_event() -> dict[str, Any] | None:
            events = client.CoreV1Api(api_client).list_namespaced_event("default").to_dict()["items"]
            mine = [e for e in events if e["involved_object"]["name"] == node and e["reason"] == "DriverEditsFailed"]
            return mine[0] if mine else None

        event = kube.wait_for(node_event, 30, what="the DriverEditsFailed Node Event")
        assert fragments[0] in event["message"]
        assert kubelet.unprepare([ref_a]).claims[ref_a[1]].error == ""
        assert not spec_a.exists()
    finally:
        kubelet.close()
        process.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":  # regenerate the fixture (as root)
    with tempfile.TemporaryDirectory(prefix="fracgpu-edits-", dir="/tmp") as tmp:
        base = Path(tmp)
        base.chmod(0o755)
        install = make_faithful_driver_root(base / "root", PROFILE, base / "build")
        ctk = binaries.ensure_built("nvidia-ctk")["nvidia-ctk"]
        spec = recorded_spec(ctk, install.root, base)
    FIXTURE.write_text(json.dumps(spec, indent=2) + "\n")
    sys.stdout.write(f"wrote {FIXTURE}\n")
