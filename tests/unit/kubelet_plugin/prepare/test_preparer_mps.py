"""Unit tests of MPS shares in the Preparer (kubelet_plugin/prepare/preparer.py with kubelet_plugin/kinds/mps/shares.py
and kubelet_plugin/kinds/mps/): the ceiling (raised to the largest grant and percentage before a new share's files are
written, refused when the daemon refuses it, lowered after an unprepare, set again on demand, read back and
repaired), and the trust domains (a claim of another domain on the GPU is refused naming both; a GPU whose claims
are gone serves the next domain after the supervisor's switch).

The daemon is `FakeDaemon` (``mps_host``), the control client's commands interpreted as the mock driver's daemon
answers them (tests/integration/test_mps_supervisor.py runs the same control client against that daemon)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from api.names import DRIVER_NAME
from kubelet_plugin.enforcement.probe import EnforcementDetector
from kubelet_plugin.kinds.mps.control import Limits
from kubelet_plugin.kinds.mps.limits import MpsLimits, ceiling
from kubelet_plugin.kinds.mps.shares import MpsShares, grants_in
from kubelet_plugin.state import cdi
from kubelet_plugin.state import mps_files as mps
from kubelet_plugin.state.claim_files import info_file_paths
from kubelet_plugin.state.container_info import RequestInfo
from tests.unit.fake_apiserver import connection, refused_url
from tests.unit.kubelet_plugin.prepare.mps_host import FakeDaemon, domain_of, mps_claim, mps_env, write_status
from tests.unit.plugin_host import (
    GPUS,
    NODE,
    NS,
    SHARE_A,
    SHARE_B,
    UID_A,
    UID_B,
    UUID0,
    Env,
    make_claim,
    make_env,
    make_preparer,
    ref,
)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Env, FakeDaemon]]:
    yield mps_env(tmp_path, monkeypatch)


def test_the_ceiling_follows_the_largest_grant_and_percentage_on_the_gpu(env: tuple[Env, FakeDaemon]) -> None:
    e, daemon = env
    small = e.api.add(mps_claim(UID_A, "small", SHARE_A, "10Gi", 30))
    big = e.api.add(mps_claim(UID_B, "big", SHARE_B, "20Gi", 50))
    assert e.preparer.prepare([ref(small)])[UID_A].error == ""
    assert daemon.ceiling == ("10240M", "30.0")
    daemon.start_server(7001)
    assert e.preparer.prepare([ref(big)])[UID_B].error == ""
    assert daemon.ceiling == ("20480M", "50.0") and daemon.servers_[7001] == ["20480M", "50.0"], "running servers too"
    assert e.preparer.unprepare([ref(big)]) == {UID_B: ""}
    assert daemon.ceiling == ("10240M", "30.0"), "lowered to the remaining share's"
    daemon.defaults = ["0", "100.0"]  # the daemon came back without one
    e.preparer.refresh_mps_ceiling(UUID0)
    assert daemon.ceiling == ("10240M", "30.0")


def test_a_share_without_a_percentage_lifts_the_thread_ceiling(env: tuple[Env, FakeDaemon]) -> None:
    e, daemon = env
    e.preparer.prepare([ref(e.api.add(mps_claim(UID_A, "a", SHARE_A, "10Gi", 30)))])
    e.preparer.prepare([ref(e.api.add(mps_claim(UID_B, "b", SHARE_B, "4Gi", None)))])
    assert daemon.ceiling == ("10240M", "100.0")
    assert ceiling([]) is None
    assert ceiling([(4096, 20), (1024, 70)]) == Limits(memory_mib=4096, percentage=70)


def test_a_daemon_that_refuses_the_ceiling_refuses_the_share_before_any_file(env: tuple[Env, FakeDaemon]) -> None:
    e, daemon = env
    daemon.refuse = True
    result = e.preparer.prepare([ref(e.api.add(mps_claim(UID_A, "a", SHARE_A, "10Gi", 30)))])[UID_A]
    assert "did not take the ceiling 10240 MiB / 30 %" in result.error, result.error
    assert "Error: the daemon refused set_default_device_pinned_mem_limit" in result.error, "the daemon's words"
    assert not cdi.spec_path(e.settings.cdi_dir, DRIVER_NAME, UID_A).exists()
    assert UID_A not in e.checkpoint().claims


def test_a_ceiling_the_same_daemon_already_has_is_not_sent_again(env: tuple[Env, FakeDaemon]) -> None:
    e, daemon = env
    domain = domain_of(make_claim(UID_A, "a"))
    write_status(e.settings.mps_root, pid=4242, domain=domain)
    claim = e.api.add(mps_claim(UID_A, "a", SHARE_A, "10Gi", 30))
    e.preparer.prepare([ref(claim)])
    e.preparer.unprepare([ref(claim)])
    e.preparer.prepare([ref(claim)])
    sets = [c for c in daemon.commands if c.startswith("set_default_device")]
    assert len(sets) == 1, "prepare, unprepare (no share left) and the same prepare again: one ceiling"
    write_status(e.settings.mps_root, pid=4343, domain=domain)  # the supervisor restarted the daemon
    e.preparer.unprepare([ref(claim)])
    e.preparer.prepare([ref(claim)])
    assert len([c for c in daemon.commands if c.startswith("set_default_device")]) == 2
    assert daemon.ceiling == ("10240M", "30.0")


def test_limits_a_client_changed_are_read_back_and_set_again(env: tuple[Env, FakeDaemon]) -> None:
    e, daemon = env
    e.preparer.prepare([ref(e.api.add(mps_claim(UID_A, "a", SHARE_A, "10Gi", 30)))])
    assert e.preparer.repair_mps_limits(UUID0) == []
    daemon.defaults = ["81920M", "100.0"]  # `set_default_*` sent by a client of the domain
    daemon.start_server(7002)  # a server started meanwhile, with the raised defaults
    changed = e.preparer.repair_mps_limits(UUID0)
    assert changed == [
        "the daemon's defaults are pinned memory 81920M, active threads 100.0 %, not pinned memory 10240M, "
        "active threads 30.0 %",
        "server 7002 has pinned memory 81920M, active threads 100.0 %, not pinned memory 10240M, active threads 30.0 %",
    ]
    assert daemon.ceiling == ("10240M", "30.0") and daemon.servers_[7002] == ["10240M", "30.0"]
    assert e.preparer.repair_mps_limits(UUID0) == [], "repaired once, quiet after"


def test_a_claim_of_another_namespace_on_the_gpu_is_refused_naming_both(env: tuple[Env, FakeDaemon]) -> None:
    e, _ = env
    first = e.api.add(mps_claim(UID_A, "a", SHARE_A, "10Gi", 30))
    assert e.preparer.prepare([ref(first)])[UID_A].error == ""
    assert e.checkpoint().claims[UID_A].mps_trust_domain == domain_of(first)
    other = e.api.add(mps_claim(UID_B, "b", SHARE_B, "10Gi", 30, namespace="team-b"))
    error = e.preparer.prepare([ref(other)])[UID_B].error
    assert "whose daemon serves namespace team-a" in error, error
    assert "this claim belongs to namespace team-b" in error and "never share an MPS daemon" in error
    assert UID_B not in e.checkpoint().claims
    assert not cdi.spec_path(e.settings.cdi_dir, DRIVER_NAME, UID_B).exists()


def test_a_gpu_without_claims_serves_the_next_domain_once_the_supervisor_switched(
    env: tuple[Env, FakeDaemon],
) -> None:
    e, daemon = env
    root = e.settings.mps_root
    other = e.api.add(mps_claim(UID_B, "b", SHARE_B, "10Gi", 30, namespace="team-b"))

    def supervisor() -> None:  # sees the tenant request, switches, says so
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            tenant = mps.read_tenant(root, UUID0)
            if tenant is not None:
                write_status(root, pid=5151, domain=tenant.domain)
                return
            time.sleep(0.02)

    switching = threading.Thread(target=supervisor)
    switching.start()
    assert e.preparer.prepare([ref(other)])[UID_B].error == ""
    switching.join()
    assert mps.read_tenant(root, UUID0) == mps.TenantRequest(domain="namespace/team-b")
    assert daemon.ceiling == ("10240M", "30.0")


def test_a_switch_the_supervisor_does_not_make_refuses_the_share(env: tuple[Env, FakeDaemon]) -> None:
    e, _ = env
    other = e.api.add(mps_claim(UID_B, "b", SHARE_B, "10Gi", 30, namespace="team-b"))
    error = e.preparer.prepare([ref(other)])[UID_B].error
    assert "did not start a daemon for namespace team-b within 2 s" in error, error
    assert "(its status file names namespace team-a)" in error, error


def test_a_supervisor_from_before_trust_domains_refuses_mps_shares(env: tuple[Env, FakeDaemon]) -> None:
    e, _ = env
    write_status(e.settings.mps_root, trust_domains=False)
    error = e.preparer.prepare([ref(e.api.add(mps_claim(UID_A, "a", SHARE_A, "10Gi", 30)))])[UID_A].error
    assert "predates trust domains" in error and "delete that pod" in error, error


def test_with_cluster_scope_every_namespace_shares_the_daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    e = make_env(tmp_path, monkeypatch, mps_gpus="0", mps_root=tmp_path / "mps", mps_trust_scope="cluster")
    write_status(e.settings.mps_root, domain="cluster")
    daemon = FakeDaemon(e.settings.mps_root)
    e.preparer = make_preparer(
        connection(refused_url()), e.settings, e.store, e.metrics, nodes=e.nodes,
        enforcement=EnforcementDetector.without_nvml(e.settings, GPUS, "no nvml"),
        mps=MpsShares(e.settings, MpsLimits(daemon)),
    )  # fmt: skip
    a = e.api.add(mps_claim(UID_A, "a", SHARE_A, "10Gi", 30))
    b = e.api.add(mps_claim(UID_B, "b", SHARE_B, "20Gi", 50, namespace="team-b"))
    results = e.preparer.prepare([ref(a), ref(b)])
    assert (results[UID_A].error, results[UID_B].error) == ("", "")
    assert {c.mps_trust_domain for c in e.checkpoint().claims.values()} == {"cluster"}
    assert daemon.ceiling == ("20480M", "50.0")


def test_the_claims_status_says_the_tier_the_grant_and_the_thread_percentage(env: tuple[Env, FakeDaemon]) -> None:
    e, _ = env
    e.preparer.prepare([ref(e.api.add(mps_claim(UID_A, "a", SHARE_A, "10Gi", 30)))])
    assert e.preparer.wait_ready_writes(10)
    (patch,) = [p for p in e.api.status_patches if p["name"] == "a"]
    (entry,) = patch["body"]["status"]["devices"]
    (condition,) = [c for c in entry["conditions"] if c["type"] == "MemoryEnforcement"]
    assert (condition["status"], condition["reason"]) == ("True", "Mps")
    assert condition["message"].startswith("MPS limits: memory 10Gi, active threads 30 %; GPU memory and compute")


# --- adminAccess on an MPS GPU: a monitor, not a tenant ------------------------------------------------------------


def admin_result(share: str) -> dict[str, object]:
    return {"request": "monitor", "driver": DRIVER_NAME, "pool": NODE, "device": "gpu-0", "shareID": share,
            "consumedCapacity": {"memory": "0"}, "adminAccess": True}  # fmt: skip


def admin_claim(uid: str, name: str, namespace: str) -> dict[str, object]:
    claim = make_claim(uid, name)
    claim["metadata"]["namespace"] = namespace
    claim["status"]["allocation"]["devices"]["results"] = [admin_result("c3e4d5f6-2222-4333-8444-555566667777")]
    return claim


def env_of(device: dict[str, Any]) -> dict[str, str]:
    return dict(entry.partition("=")[::2] for entry in device["containerEdits"]["env"])


def test_an_admin_access_claim_on_an_mps_gpu_of_another_domain_monitors_it_and_is_no_tenant(
    env: tuple[Env, FakeDaemon],
) -> None:
    """GPU 0's daemon serves team-a, which holds a share there; a monitoring claim (adminAccess, memory 0) of
    another namespace is prepared, not refused: no trust domain, no daemon asked for, no pipe directory, /dev/shm
    or MPS variables, the ceiling untouched; the GPU's device nodes, and the truth in its variables, its file and its
    MemoryEnforcement condition."""
    e, daemon = env
    assert e.preparer.prepare([ref(e.api.add(mps_claim(UID_A, "a", SHARE_A, "10Gi", 30)))])[UID_A].error == ""
    commands = list(daemon.commands)
    monitor = e.api.add(admin_claim(UID_B, "monitor", "monitoring"))
    assert e.preparer.prepare([ref(monitor)])[UID_B].error == ""
    assert e.checkpoint().claims[UID_B].mps_trust_domain is None
    assert mps.read_tenant(e.settings.mps_root, UUID0) is None, "no daemon asked for"
    assert daemon.commands == commands and daemon.ceiling == ("10240M", "30.0"), "the ceiling untouched"
    (device,) = json.loads(e.spec_file(UID_B).read_text())["devices"]
    variables = env_of(device)
    assert not [
        k for k in variables if k.startswith("CUDA_MPS_") or k in {"CUDA_VISIBLE_DEVICES", "FRACGPU_ENFORCEMENT"}
    ]
    assert not [m for m in device["containerEdits"]["mounts"] if m["hostPath"].startswith(str(e.settings.mps_root))]
    assert {n["path"] for n in device["containerEdits"]["deviceNodes"]} == {
        "/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}  # fmt: skip
    own = {k.rsplit("_", 1)[-1]: v for k, v in variables.items() if k.endswith(("_ADMIN_ACCESS", "_ENFORCEMENT"))}
    assert own == {"ACCESS": "true", "ENFORCEMENT": "none"}
    (info_file,) = info_file_paths(e.settings.plugin_data_dir, UID_B)
    (written,) = json.loads(info_file.read_text())["devices"]
    assert (written["adminAccess"], written["enforcement"]) == (True, "none")
    assert e.preparer.wait_ready_writes(10)
    (patch,) = [p for p in e.api.status_patches if p["name"] == "monitor"]
    (entry,) = patch["body"]["status"]["devices"]
    (condition,) = [c for c in entry["conditions"] if c["type"] == "MemoryEnforcement"]
    assert (condition["status"], condition["reason"]) == ("False", "None")
    assert condition["message"].startswith("admin access (monitoring): the whole GPU's memory is visible")
    assert "monitor it through NVML" in condition["message"] and "cannot create a CUDA context" in condition["message"]
    assert e.preparer.unprepare([ref(monitor)]) == {UID_B: ""}
    assert daemon.ceiling == ("10240M", "30.0"), "nor lowered when it goes"


def test_an_admin_access_claim_holds_no_domain_so_the_next_tenant_of_any_domain_is_admitted(
    env: tuple[Env, FakeDaemon],
) -> None:
    e, _ = env
    assert e.preparer.prepare([ref(e.api.add(admin_claim(UID_A, "monitor", "monitoring")))])[UID_A].error == ""
    write_status(e.settings.mps_root, domain="namespace/team-b")  # as if the supervisor switched at once
    tenant = e.api.add(mps_claim(UID_B, "b", SHARE_B, "10Gi", 30, namespace="team-b"))
    assert e.preparer.prepare([ref(tenant)])[UID_B].error == ""
    assert e.checkpoint().claims[UID_B].mps_trust_domain == "namespace/team-b"


def test_a_claim_with_an_admin_share_and_a_tenant_share_has_the_tenants_domain_and_ceiling(
    env: tuple[Env, FakeDaemon],
) -> None:
    """One request monitors GPU 0 (adminAccess), the other is a 10Gi MPS share there: the claim's domain is its
    namespace's, the ceiling the share's grant (not the whole GPU the admin share sees), and only the share's device
    is an MPS client."""
    e, daemon = env
    claim = mps_claim(UID_A, "mixed", SHARE_A, "10Gi", 30)
    claim["status"]["allocation"]["devices"]["results"].append(admin_result(SHARE_B))
    assert e.preparer.prepare([ref(e.api.add(claim))])[UID_A].error == ""
    assert e.checkpoint().claims[UID_A].mps_trust_domain == domain_of(claim)
    assert daemon.ceiling == ("10240M", "30.0")
    devices = json.loads(e.spec_file(UID_A).read_text())["devices"]
    by_share = {share: env_of(d) for d in devices for share in (SHARE_A, SHARE_B) if d["name"].endswith(share)}
    assert "CUDA_MPS_PIPE_DIRECTORY" in by_share[SHARE_A], "the share is a client"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in by_share[SHARE_B], "the admin device is not"


def test_the_mps_ceiling_leaves_admin_access_devices_out(tmp_path: Path) -> None:
    """`grants_in` reads the request files: a device written as adminAccess is left out even if a file says mps."""
    uid = UID_A
    base = {"uuid": UUID0, "shareID": SHARE_A, "device": "gpu-0", "pciBusID": "0000:01:00.0", "minor": 0,
            "cdiDevice": "x", "envPrefix": "FRACGPU_DEV_X_", "enforcement": "mps"}  # fmt: skip
    request = RequestInfo.model_validate({
        "claim": {"namespace": NS, "name": "a", "uid": uid}, "request": "gpu", "enforcement": "mps",
        "devices": [{**base, "memoryMiB": 4096}, {**base, "shareID": SHARE_B, "memoryMiB": 81408, "adminAccess": True}],
    })  # fmt: skip
    path = tmp_path / "claim-info" / uid / "gpu.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(request.to_json())
    assert grants_in(tmp_path, [uid], UUID0) == [(4096, None)]
