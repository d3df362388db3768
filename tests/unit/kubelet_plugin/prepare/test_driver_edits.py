"""Unit tests of driver edits (kubelet_plugin/prepare/driver_edits.py) and of claim specs that carry them.

The generator's output is a fixture recorded from the real nvidia-ctk against the faithful fake driver root
(tests/integration/test_driver_edits.py regenerates it and fails on drift). ``fake_ctk`` is a stand-in
nvidia-ctk script with the real one's file semantics: ``cdi generate`` writes the recorded spec (its /driver-root
and hook path replaced by the flags') to ``--output``, ``cdi transform root`` rewrites hostPaths under ``--from`` to
``--to`` and leaves containerPaths alone.
"""

from __future__ import annotations

import json
import stat
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from api.kube_rest import KubeRest
from api.names import DRIVER_NAME
from kubelet_plugin.__main__ import make_driver_edits
from kubelet_plugin.core.devicenodes import DeviceNodeSnapshot
from kubelet_plugin.core.errors import ErrorKind, PrepareError
from kubelet_plugin.core.metrics import PluginMetrics
from kubelet_plugin.core.settings import Settings, parse_settings
from kubelet_plugin.enforcement.probe import EnforcementDetector
from kubelet_plugin.prepare.driver_edits import (
    DriverEdits,
    DriverEditsError,
    GeneratorConfig,
    generate_argv,
    generate_driver_edits,
    install_hook,
    parse_driver_edits,
)
from kubelet_plugin.prepare.plan import ClaimPlan, HostFacts, plan_claim
from kubelet_plugin.state import cdi
from kubelet_plugin.state.checkpoint import CheckpointStore
from kubelet_plugin.state.container_info import VOID, library_problem
from tests.unit.fake_apiserver import connection, refused_url
from tests.unit.plugin_host import (
    GPUS,
    NODE,
    NODES,
    UID_A,
    UID_B,
    UUID0,
    FakeApi,
    host_root,
    host_settings,
    make_claim,
    make_preparer,
    ref,
)

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia-ctk-management.json"
FIXTURE_ROOT = "/driver-root"
FIXTURE_HOOK = f"/var/lib/kubelet/plugins/{DRIVER_NAME}/nvidia-cdi-hook"
VERSION = "580.65.06"
LIBDIR = "/usr/lib/x86_64-linux-gnu"

FAKE_CTK = """#!{python}
import json, sys
from pathlib import Path
args = sys.argv[1:]
flags = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
Path({log!r}).open("a").write(json.dumps(args) + "\\n")
fail = Path({fail!r})
if fail.exists():
    sys.stderr.write(fail.read_text())
    sys.exit(1)
if args[:2] == ["cdi", "generate"]:
    text = Path({fixture!r}).read_text().replace("/driver-root/", flags["driver-root"].rstrip("/") + "/")
    text = text.replace({hook!r}, flags["nvidia-cdi-hook-path"])
    spec = json.loads(text)
    if {no_libraries!r}:
        spec["containerEdits"]["mounts"] = [m for m in spec["containerEdits"]["mounts"] if ".so." not in m["hostPath"]]
    Path(flags["output"]).write_text(json.dumps(spec))
elif args[:3] == ["cdi", "transform", "root"]:
    spec = json.loads(Path(flags["input"]).read_text())
    src, dst = flags["from"].rstrip("/") + "/", flags["to"].rstrip("/") + "/"
    for edits in [spec.get("containerEdits") or {{}}] + [d["containerEdits"] for d in spec["devices"]]:
        for item in edits.get("mounts", []) + edits.get("deviceNodes", []):
            if item.get("hostPath", "").startswith(src):
                item["hostPath"] = dst + item["hostPath"][len(src):]
    Path(flags["output"]).write_text(json.dumps(spec))
else:
    sys.exit(2)
"""


def fake_ctk(tmp_path: Path, *, fail: str = "", no_libraries: bool = False) -> tuple[Path, Path]:
    """A stand-in nvidia-ctk (see the module docstring) and the file it logs its argv to; it exits 1 with
    the content of ``<tmp_path>/ctk.fail`` as stderr while that file exists (written here when `fail`)."""
    script, log, fail_file = tmp_path / "nvidia-ctk", tmp_path / "ctk.log", tmp_path / "ctk.fail"
    if fail:
        fail_file.write_text(fail)
    script.write_text(
        FAKE_CTK.format(
            python=sys.executable,
            log=str(log),
            fail=str(fail_file),
            fixture=str(FIXTURE),
            hook=FIXTURE_HOOK,
            no_libraries=no_libraries,
        )
    )
    script.chmod(0o755)
    return script, log


def fixture_edits() -> cdi.ContainerEdits:
    return parse_driver_edits(FIXTURE.read_text())


def config(ctk: Path, tmp_path: Path, host_root: str = "/run/nvidia/driver") -> GeneratorConfig:
    return GeneratorConfig(ctk, tmp_path / "mounted", Path(host_root), Path(FIXTURE_HOOK), f"k8s.{DRIVER_NAME}")


# --- parsing ---------------------------------------------------------------------------------------------


def test_the_fixture_parses_into_the_driver_edits() -> None:
    edits = fixture_edits()
    mounts = {m.container_path: m for m in edits.mounts}
    for lib in ("libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler"):
        mount = mounts[f"{LIBDIR}/{lib}.so.{VERSION}"]
        assert mount.host_path == f"{FIXTURE_ROOT}{LIBDIR}/{lib}.so.{VERSION}"
        assert mount.options == ["ro", "nosuid", "nodev", "rbind", "rprivate"]
    assert mounts["/usr/bin/nvidia-smi"].host_path == f"{FIXTURE_ROOT}/usr/bin/nvidia-smi"
    hooks = {h.args[1]: h for h in edits.hooks}
    assert set(hooks) == {"create-symlinks", "enable-cuda-compat", "update-ldcache", "disable-device-node-modification"}
    assert {(h.hook_name, h.path, h.args[0]) for h in edits.hooks} == {
        ("createContainer", FIXTURE_HOOK, "nvidia-cdi-hook")
    }
    assert f"libcuda.so.{VERSION}::{LIBDIR}/libcuda.so.1" in hooks["create-symlinks"].args
    assert edits.device_nodes == []  # the generator's nodes are every GPU's: dropped
    assert VOID in edits.env
    assert library_problem(edits) is None


def test_parse_forces_void_and_drops_any_other_visible_devices() -> None:
    spec = json.loads(FIXTURE.read_text())
    spec["containerEdits"]["env"] = ["NVIDIA_VISIBLE_DEVICES=all", "A=1"]
    spec["containerEdits"]["deviceNodes"] = [{"path": "/dev/nvidiactl"}]
    edits = parse_driver_edits(json.dumps(spec))
    assert edits.env == ["A=1", VOID]
    assert edits.device_nodes == []


def test_parse_refuses_what_is_not_a_cdi_spec() -> None:
    with pytest.raises(DriverEditsError, match="cannot read"):
        parse_driver_edits('{"cdiVersion": "0.5.0", "kind": "x/y", "devices": [], "bogus": 1}')


def test_edits_without_driver_libraries_are_named() -> None:
    edits = fixture_edits()
    no_libs = edits.model_copy(update={"mounts": [m for m in edits.mounts if ".so." not in m.container_path]})
    assert no_libs.mounts, "binaries and firmware stay"
    problem = library_problem(no_libs)
    assert problem is not None
    assert "libcuda.so.<version>" in problem


def test_claim_spec_with_driver_edits_keeps_the_minimum_cdi_version() -> None:
    """Hooks and mount options are baseline CDI fields: a spec carrying them needs no newer version."""
    device = cdi.Device(name="d0", container_edits=cdi.ContainerEdits(env=["A=1"]))
    spec = cdi.Spec(kind=cdi.cdi_kind(DRIVER_NAME), devices=[device], container_edits=fixture_edits())
    assert cdi.minimum_version(spec) == "0.3.0"
    typed = fixture_edits().model_copy(update={"mounts": [cdi.Mount(host_path="/a", container_path="/b", type="bind")]})
    assert cdi.minimum_version(spec.model_copy(update={"container_edits": typed})) == "0.4.0"
    assert cdi.Spec.model_validate_json(cdi.with_minimum_version(spec).to_json()) == cdi.with_minimum_version(spec)


# --- running the generator ---------------------------------------------------------------------------------


def test_generate_transforms_host_paths_and_keeps_container_paths(tmp_path: Path) -> None:
    ctk, log = fake_ctk(tmp_path)
    edits = generate_driver_edits(config(ctk, tmp_path))
    recorded = fixture_edits()
    assert [m.container_path for m in edits.mounts] == [m.container_path for m in recorded.mounts]
    for before, after in zip(recorded.mounts, edits.mounts, strict=True):
        if before.host_path.startswith(f"{FIXTURE_ROOT}/"):
            assert after.host_path == "/run/nvidia/driver" + before.host_path.removeprefix(FIXTURE_ROOT)
        else:  # /dev/null for the void marker: not the driver's
            assert after.host_path == before.host_path
    generate, transform = (json.loads(line) for line in log.read_text().splitlines())
    mounted = tmp_path / "mounted"
    assert generate[:2] == ["cdi", "generate"]
    for flag in (
        "--mode=management",
        "--format=json",
        f"--driver-root={mounted}",
        f"--dev-root={mounted}",
        f"--nvidia-cdi-hook-path={FIXTURE_HOOK}",
        f"--vendor=k8s.{DRIVER_NAME}",
        "--class=driver",
        "--enable-hook=disable-device-node-modification",
    ):
        assert flag in generate
    assert transform[:3] == ["cdi", "transform", "root"]
    assert {f"--from={mounted}", "--to=/run/nvidia/driver", "--relative-to=host"} <= set(transform)


def test_a_failing_generator_is_an_error_with_its_message(tmp_path: Path) -> None:
    stderr = 'time=t level=warning msg="Failed to load ldcache"\ntime=t level=error msg="failed to locate libcuda"\n'
    ctk, _ = fake_ctk(tmp_path, fail=stderr)
    with pytest.raises(DriverEditsError) as raised:
        generate_driver_edits(config(ctk, tmp_path))
    assert "exited with 1" in str(raised.value)
    assert 'level=error msg="failed to locate libcuda"' in str(raised.value)
    assert "ldcache" not in str(raised.value), "its warnings are left out"


def test_a_generator_without_libraries_is_an_error(tmp_path: Path) -> None:
    ctk, _ = fake_ctk(tmp_path, no_libraries=True)
    with pytest.raises(DriverEditsError, match=r"neither libcuda\.so\.<version>.*driverRoot"):
        generate_driver_edits(config(ctk, tmp_path))


def test_a_missing_nvidia_ctk_is_named(tmp_path: Path) -> None:
    with pytest.raises(DriverEditsError, match=r"nvidia-ctk not found.*--nvidia-ctk"):
        generate_driver_edits(config(tmp_path / "nvidia-ctk", tmp_path))


def test_generate_argv_writes_json_to_the_output(tmp_path: Path) -> None:
    argv = generate_argv(config(Path("/usr/bin/nvidia-ctk"), tmp_path), tmp_path / "out.json")
    assert argv[0] == "/usr/bin/nvidia-ctk"
    assert argv[-1] == f"--output={tmp_path / 'out.json'}"


# --- the hook binary --------------------------------------------------------------------------------------


def test_hook_is_installed_atomically_with_mode_0755_and_skipped_when_identical(tmp_path: Path) -> None:
    source = tmp_path / "image" / "nvidia-cdi-hook"
    source.parent.mkdir()
    source.write_bytes(b"\x7fELF hook v1")
    source.chmod(0o600)
    dest = tmp_path / "plugins" / "gpu.fracgpu.dev" / "nvidia-cdi-hook"
    assert install_hook(source, dest) is True
    assert dest.read_bytes() == b"\x7fELF hook v1"
    assert stat.S_IMODE(dest.stat().st_mode) == 0o755
    inode = dest.stat().st_ino
    assert install_hook(source, dest) is False
    assert dest.stat().st_ino == inode, "identical: not rewritten"
    source.write_bytes(b"\x7fELF hook v2")
    assert install_hook(source, dest) is True
    assert dest.read_bytes() == b"\x7fELF hook v2"
    assert dest.stat().st_ino != inode, "replaced by a rename, never rewritten in place"
    assert sorted(p.name for p in dest.parent.iterdir()) == ["nvidia-cdi-hook"], "no temp file left"


def test_hook_at_an_unwritable_path_is_a_clear_error(tmp_path: Path) -> None:
    source = tmp_path / "nvidia-cdi-hook"
    source.write_bytes(b"hook")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(DriverEditsError, match=rf"cannot install nvidia-cdi-hook at {blocker}/hook: .*writable"):
        install_hook(source, blocker / "hook")
    with pytest.raises(DriverEditsError, match=r"cannot read nvidia-cdi-hook at .*--nvidia-cdi-hook-source"):
        install_hook(tmp_path / "missing", tmp_path / "dest")


# --- the cache ------------------------------------------------------------------------------------------


class Generator:
    """Counts calls; fails with `error` while it is set."""

    def __init__(self) -> None:
        self.calls = 0
        self.error: str | None = None

    def __call__(self, _config: GeneratorConfig) -> cdi.ContainerEdits:
        self.calls += 1
        if self.error is not None:
            raise DriverEditsError(self.error)
        return fixture_edits()


def cache(tmp_path: Path, generator: Generator, version: list[str]) -> tuple[DriverEdits, list[str], list[int]]:
    source = tmp_path / "hook-src"
    source.write_bytes(b"hook")
    failures: list[str] = []
    attempts = [0]

    def attempt_failed() -> None:
        attempts[0] += 1

    edits = DriverEdits(
        GeneratorConfig(Path("/x"), tmp_path, tmp_path, tmp_path / "hook", "k8s.x"),
        source,
        lambda: version[0],
        interval=0.01,
        generate=generator,
        on_failure=failures.append,
        on_attempt_failed=attempt_failed,
    )
    return edits, failures, attempts


def test_cache_generates_once_per_driver_version(tmp_path: Path) -> None:
    generator, version = Generator(), ["580.65.06"]
    edits, failures, _ = cache(tmp_path, generator, version)
    with pytest.raises(DriverEditsError, match="not generated yet"):
        edits.current()
    edits.refresh()
    assert edits.current() == fixture_edits()
    assert (tmp_path / "hook").read_bytes() == b"hook"
    edits.refresh()
    edits.refresh()
    assert generator.calls == 1, "same version: cached"
    version[0] = "580.95.05"
    edits.refresh()
    assert generator.calls == 2, "a new driver version regenerates"
    assert failures == []


def test_an_unreadable_driver_version_keeps_good_edits_and_fails_without_them(tmp_path: Path) -> None:
    generator = Generator()

    def broken() -> str:
        raise RuntimeError("NVML: driver not loaded")

    edits, failures, _ = cache(tmp_path, generator, ["580.65.06"])
    edits.refresh()
    object.__setattr__(edits, "_driver_version", broken)
    edits.refresh()
    assert edits.current() == fixture_edits()
    fresh = DriverEdits(GeneratorConfig(Path("/x"), tmp_path, tmp_path, tmp_path / "h", "k8s.x"), tmp_path, broken)
    fresh.refresh()
    with pytest.raises(DriverEditsError, match="cannot read the driver version through NVML: NVML: driver not loaded"):
        fresh.current()
    assert failures == [] and generator.calls == 1


def test_cache_failure_is_reported_once_retried_and_recovers(tmp_path: Path) -> None:
    generator, version = Generator(), ["580.65.06"]
    edits, failures, attempts = cache(tmp_path, generator, version)
    edits.refresh()
    generator.error = "nvidia-ctk exited with 1: boom"
    version[0] = "590.1"
    edits.refresh()
    with pytest.raises(DriverEditsError, match="boom"):
        edits.current()  # never the edits of the old driver
    edits.refresh()
    assert generator.calls == 3, "a failed generation is retried"
    assert failures == ["nvidia-ctk exited with 1: boom"], "reported once per failure"
    assert attempts == [2]
    generator.error = None
    stop = threading.Event()
    runner = threading.Thread(target=edits.run, args=(stop,))
    runner.start()
    try:
        for _ in range(500):
            if generator.calls > 3:
                break
            threading.Event().wait(0.01)
    finally:
        stop.set()
        runner.join()
    assert edits.current() == fixture_edits(), "run() retried in the background and recovered"


# --- claim specs ------------------------------------------------------------------------------------------


@pytest.fixture
def driver_root(tmp_path: Path) -> Path:
    return host_root(tmp_path)


def toolkit_settings(tmp_path: Path, root: Path, **extra: Any) -> Settings:
    return host_settings(tmp_path, root, driver_edits="toolkit", **extra)


def plan_with(claim: dict[str, Any], settings: Settings, edits: cdi.ContainerEdits | None) -> ClaimPlan:
    """`plan_claim` on the test node: its GPUs and device nodes, no nvml."""
    tiers = EnforcementDetector.without_nvml(settings, GPUS, "nvml was not detected").tiers()
    nodes = DeviceNodeSnapshot.of(settings.driver_root, NODES)
    facts = HostFacts(gpus={g.device_name: g for g in GPUS}, nodes=nodes, tiers=tiers, driver_edits=edits)
    return plan_claim(claim, settings, facts)


def test_toolkit_claim_spec_carries_the_driver_and_void(tmp_path: Path, driver_root: Path) -> None:
    settings = toolkit_settings(tmp_path, driver_root)
    plan = plan_with(make_claim(UID_A, "a"), settings, fixture_edits())
    assert plan.spec is not None
    assert plan.spec.container_edits == fixture_edits()
    (device,) = plan.spec.devices
    env = dict(e.split("=", 1) for e in device.container_edits.env)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert UUID0 not in [v for k, v in env.items() if k == "NVIDIA_VISIBLE_DEVICES"]
    assert {n.path for n in device.container_edits.device_nodes} == {
        "/dev/nvidia0",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    }
    none = plan_with(make_claim(UID_A, "a"), settings.model_copy(update={"driver_edits": "none"}), fixture_edits())
    assert none.spec is not None and none.spec.container_edits is None
    assert f"NVIDIA_VISIBLE_DEVICES={UUID0}" in none.spec.devices[0].container_edits.env


@pytest.mark.parametrize("edits", [None, "no-libraries"])
def test_toolkit_without_usable_edits_writes_no_spec(tmp_path: Path, driver_root: Path, edits: str | None) -> None:
    settings = toolkit_settings(tmp_path, driver_root)
    given = None
    if edits == "no-libraries":
        full = fixture_edits()
        given = full.model_copy(update={"mounts": [m for m in full.mounts if ".so." not in m.container_path]})
    with pytest.raises(PrepareError) as raised:
        plan_with(make_claim(UID_A, "a"), settings, given)
    assert raised.value.kind == ErrorKind.DRIVER_EDITS
    assert "--driver-edits=toolkit" in str(raised.value)


def test_prepare_fails_per_claim_when_generation_failed_and_keeps_what_was_prepared(
    tmp_path: Path, driver_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeApi()
    monkeypatch.setattr(KubeRest, "get", fake.get)
    monkeypatch.setattr(KubeRest, "create", fake.create)
    monkeypatch.setattr(KubeRest, "apply", fake.apply)
    ctk, _ = fake_ctk(tmp_path)
    settings = toolkit_settings(tmp_path, driver_root, nvidia_ctk=ctk)
    source = tmp_path / "hook-src"
    source.write_bytes(b"hook")
    version = ["580.65.06"]
    edits = DriverEdits(GeneratorConfig.from_settings(settings), source, lambda: version[0])
    edits.refresh()
    metrics = PluginMetrics()
    store = CheckpointStore(tmp_path / "ckpt.json", current_boot_id="b")
    preparer = make_preparer(connection(refused_url()), settings, store, metrics, driver_edits=edits)
    first = fake.add(make_claim(UID_A, "a"))
    assert preparer.prepare([ref(first)])[UID_A].error == ""
    spec_a = cdi.spec_path(settings.cdi_dir, DRIVER_NAME, UID_A)
    written = json.loads(spec_a.read_text())
    assert written["containerEdits"]["hooks"][0]["path"] == str(settings.cdi_hook_path)
    mounts = [m["hostPath"] for m in written["containerEdits"]["mounts"]]
    assert any(m.startswith(f"{driver_root}/usr/lib/") for m in mounts), mounts  # the driver's libraries

    (tmp_path / "ctk.fail").write_text("nvidia-ctk: ERROR_LIBRARY_NOT_FOUND")
    version[0] = "590.1"  # a driver upgrade whose generation fails
    edits.refresh()
    second = fake.add(make_claim(UID_B, "b", share="c1d2e3f4-1111-4222-8333-444455556666"))
    results = preparer.prepare([ref(first), ref(second)])
    for uid in (UID_A, UID_B):
        assert "ERROR_LIBRARY_NOT_FOUND" in results[uid].error
        assert "retries every 60 s" in results[uid].error
    assert not cdi.spec_path(settings.cdi_dir, DRIVER_NAME, UID_B).exists()
    assert json.loads(spec_a.read_text()) == written, "the prepared claim's spec is untouched"
    checkpoint = store.load().checkpoint
    assert set(checkpoint.claims) == {UID_A} and checkpoint.claims[UID_A].state == "PrepareCompleted"
    assert (
        metrics.registry.get_sample_value(
            "fracgpu_plugin_errors_total", {"operation": "prepare", "type": "driver_edits"}
        )
        == 2
    )


def test_a_failed_generation_is_one_node_event_and_counted_per_attempt(
    tmp_path: Path, driver_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeApi()
    monkeypatch.setattr(KubeRest, "create", fake.create)
    ctk, _ = fake_ctk(tmp_path, fail="nvidia-ctk: no driver here")
    source = tmp_path / "hook-src"
    source.write_bytes(b"hook")
    settings = toolkit_settings(tmp_path, driver_root, nvidia_ctk=ctk, nvidia_cdi_hook_source=source)
    metrics = PluginMetrics()
    edits = make_driver_edits(settings, KubeRest(connection(refused_url())), metrics, lambda: VERSION)
    edits.refresh()
    edits.refresh()
    (event,) = fake.events
    body = event["body"]
    assert (body["reason"], body["type"], body["involvedObject"]["name"]) == ("DriverEditsFailed", "Warning", NODE)
    assert "nvidia-ctk: no driver here" in body["message"]
    assert metrics.registry.get_sample_value("fracgpu_plugin_driver_edits_failures_total") == 2


def test_settings_flags(tmp_path: Path) -> None:
    s = parse_settings(["--node-name=n", f"--kubelet-dir={tmp_path}"])
    assert s.driver_edits == "none", "off by default this release"
    assert s.cdi_hook_path == tmp_path / "plugins" / DRIVER_NAME / "nvidia-cdi-hook"
    assert s.nvidia_ctk == Path("/usr/bin/nvidia-ctk")
    assert s.nvidia_cdi_hook_source == Path("/usr/bin/nvidia-cdi-hook")
    t = parse_settings(
        [
            "--node-name=n",
            "--driver-edits=toolkit",
            "--driver-root=/run/nvidia/driver",
            "--toolkit-driver-root=/driver-root",
            "--host-driver-root=/run/nvidia/driver",
            "--nvidia-cdi-hook-path=/opt/hook",
        ]
    )
    config = GeneratorConfig.from_settings(t)
    assert (config.mounted_root, config.host_root, config.hook_path) == (
        Path("/driver-root"),
        Path("/run/nvidia/driver"),
        Path("/opt/hook"),
    )
    with pytest.raises(SystemExit):
        parse_settings(["--node-name=n", "--driver-edits=nvidia"])
