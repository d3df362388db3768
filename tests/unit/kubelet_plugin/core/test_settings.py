"""Node plugin settings: flags, environment defaults and clear refusals (kubelet_plugin/core/settings.py)."""

from pathlib import Path

import pytest
from pydantic import BaseModel

from api.options import options
from api.quantity import MiB
from kubelet_plugin.core import settings as settings_module
from kubelet_plugin.core.settings import Settings, parse_settings


def test_environment_supplies_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "node-a")
    monkeypatch.setenv("FRACGPU_MEMORY_STEP", "1Gi")
    monkeypatch.setenv("FRACGPU_DRIVER_ROOT", "/run/nvidia/driver")
    settings = parse_settings([])
    assert settings.node_name == "node-a"
    assert settings.memory_step_bytes == 1024 * MiB
    assert settings.driver_root == Path("/run/nvidia/driver")
    assert settings.plugin_data_dir == Path("/var/lib/kubelet/plugins/gpu.fracgpu.dev")
    assert settings.checkpoint_path.name == "checkpoint.json"


def test_flags_override_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "node-a")
    settings = parse_settings(["--node-name", "node-b", "--memory-reserve", "512Mi", "--enforcement", "hami-core"])
    assert (settings.node_name, settings.memory_reserve_bytes, settings.enforcement) == (
        "node-b",
        512 * MiB,
        "hami-core",
    )


def test_api_and_lock_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "node-a")
    defaults = parse_settings([])
    assert (defaults.api_timeout_seconds, defaults.node_lock_timeout_seconds) == (10.0, 10.0)
    monkeypatch.setenv("FRACGPU_API_TIMEOUT", "4.5")
    monkeypatch.setenv("FRACGPU_NODE_LOCK_TIMEOUT", "20")
    settings = parse_settings(["--node-lock-timeout", "15"])
    assert (settings.api_timeout_seconds, settings.node_lock_timeout_seconds) == (4.5, 15.0)


def test_usage_sampling_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "node-a")
    defaults = parse_settings([])
    assert (defaults.usage_interval_seconds, defaults.usage_ledger_interval_seconds) == (0.0, 30.0), "off by default"
    assert defaults.proc_root == Path("/proc")
    monkeypatch.setenv("FRACGPU_USAGE_INTERVAL", "15")
    monkeypatch.setenv("FRACGPU_PROC_ROOT", "/host/proc")
    settings = parse_settings(["--usage-ledger-interval", "5"])
    assert (settings.usage_interval_seconds, settings.usage_ledger_interval_seconds) == (15.0, 5.0)
    assert settings.proc_root == Path("/host/proc")


def test_the_hosts_sysfs_is_slash_sys_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "node-a")
    assert parse_settings([]).sys_root == Path("/sys")
    assert parse_settings(["--sys-root", "/root/sys"]).sys_root == Path("/root/sys")
    monkeypatch.setenv("FRACGPU_SYS_ROOT", "/driver/sys")
    assert parse_settings([]).sys_root == Path("/driver/sys")


def test_handover_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "node-a")
    assert parse_settings([]).handover_timeout_seconds == 25.0
    monkeypatch.setenv("FRACGPU_HANDOVER_TIMEOUT", "0")  # the chart: grace period less 5 s
    assert parse_settings([]).handover_timeout_seconds == 0.0
    assert parse_settings(["--handover-timeout", "7.5"]).handover_timeout_seconds == 7.5


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--node-name (or env NODE_NAME) is required: this node's name"),
        (["--node-name", "n", "--memory-step", "100k"], "memory step must be a whole number of MiB"),
        (["--node-name", "n", "--memory-step", "ten"], "--memory-step=ten: 'ten' is not a Kubernetes quantity"),
        (["--node-name", "n", "--enforcement", "strict"], "invalid choice: 'strict'"),
        (["--node-name", "n", "--enforcement", "nvml"], "--enforcement=nvml needs --driver-edits=toolkit"),
        (["--node-name", "n", "--api-timeout", "0"], "--api-timeout=0: Input should be greater than 0"),
        (["--node-name", "n", "--api-timeout", "ten"], "--api-timeout=ten: Input should be a valid number"),
        (
            ["--node-name", "n", "--handover-timeout", "-1"],
            "--handover-timeout=-1: Input should be greater than or equal to 0",
        ),
        (
            ["--node-name", "n", "--usage-interval", "-1"],
            "--usage-interval=-1: Input should be greater than or equal to 0",
        ),
        (
            ["--node-name", "n", "--usage-ledger-interval", "0"],
            "--usage-ledger-interval=0: Input should be greater than 0",
        ),
        (
            ["--node-name", "n", "--health-ignored-xids", "13,x9"],
            "--health-ignored-xids=13,x9: XIDs must be non-negative integers separated by commas (e.g. 13,31,43), "
            "got ['x9']",
        ),
        (
            ["--node-name", "n", "--health-fatal-effect", "Evict"],
            "argument --health-fatal-effect: invalid choice: 'Evict'",
        ),
        (
            ["--node-name", "n", "--api-timeout", "35"],
            "API timeout plus node lock timeout plus MPS domain switch timeout must be at most 40 s (the kubelet "
            "gives a prepare call 45 s), got 35 s + 10 s + 15 s",
        ),
        (
            ["--node-name", "n", "--mps-trust-scope", "namespaceLabel"],
            "--mps-trust-scope=namespaceLabel needs --mps-trust-label (chart mps.trustDomain.label)",
        ),
    ],
)
def test_bad_settings_are_refused_with_a_reason(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    with pytest.raises(SystemExit) as exited:
        parse_settings(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FRACGPU_API_TIMEOUT": "0"}, "env FRACGPU_API_TIMEOUT=0: Input should be greater than 0"),
        ({"FRACGPU_MEMORY_RESERVE": "lots"}, "env FRACGPU_MEMORY_RESERVE=lots: 'lots' is not a Kubernetes quantity"),
        ({"FRACGPU_ENFORCEMENT": "strict"}, "env FRACGPU_ENFORCEMENT=strict: Input should be 'auto', 'none'"),
    ],
)
def test_bad_environment_is_refused_naming_the_variable(
    env: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NODE_NAME", "n")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exited:
        parse_settings([])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_empty_values_count_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "n")
    monkeypatch.setenv("FRACGPU_HOST_DRIVER_ROOT", "")
    settings = parse_settings(["--toolkit-driver-root="])
    assert (settings.host_driver_root, settings.toolkit_driver_root) == (None, None)


def test_gpu_health_options() -> None:
    defaults = parse_settings(["--node-name", "n"])
    assert (defaults.health_nvml, defaults.ignored_xids) == (True, frozenset())
    assert (defaults.health_degraded_effect, defaults.health_fatal_effect) == ("NoSchedule", "NoExecute")
    custom = parse_settings(["--node-name", "n", "--health-ignored-xids", " 13, 92,", "--health-fatal-effect=None"])
    assert custom.ignored_xids == frozenset({13, 92}) and custom.health_fatal_effect == "None"


@pytest.mark.parametrize(
    ("mig", "mps", "named"), [("0,1", "1", "1"), ("all", "2", "2, all"), ("GPU-aa", "GPU-aa,3", "GPU-aa")]
)
def test_a_gpu_cannot_be_both_a_mig_gpu_and_an_mps_gpu(
    mig: str, mps: str, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_settings(["--node-name", "n", "--mig-gpus", mig, "--mps-gpus", mps])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"GPUs {named} are named both MIG GPUs" in err and "never an MPS GPU" in err


def test_mig_gpus_are_indices_uuids_or_all() -> None:
    assert parse_settings(["--node-name", "n", "--mig-gpus", " 1, GPU-ab ", "--mps-gpus", "0"]).mig_gpus == "1,GPU-ab"
    with pytest.raises(SystemExit):
        parse_settings(["--node-name", "n", "--mig-gpus", "gpu1"])


def test_the_flags_follow_the_themes_of_the_settings_bases() -> None:
    themes: list[type[BaseModel]] = [settings_module.NodeFields, settings_module.MpsFields, settings_module.MigFields]
    themes += [settings_module.DriverEditsFields, settings_module.HealthFields, settings_module.ServiceFields]
    declared = [name for theme in themes for name in theme.model_fields]
    own = ["instance_id", "namespace", "heartbeat_interval_seconds", "handover_timeout_seconds"]
    assert [o.field for o in options(Settings)] == declared + own, "--help lists the themes in order, then the pod's"
    assert len(set(declared + own)) == len(declared + own), "a field belongs to one theme"
    assert all(issubclass(Settings, theme) for theme in themes)
