"""Unit tests of the CDI spec model, names and writer (kubelet_plugin/state/cdi.py)."""

from __future__ import annotations

import json
import os
import stat
import string
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from api.names import DRIVER_NAME
from kubelet_plugin.state import cdi
from kubelet_plugin.state.cdi import (
    ContainerEdits,
    Device,
    DeviceNode,
    Hook,
    Mount,
    Spec,
    cdi_device_id,
    cdi_device_name,
    cdi_kind,
    minimum_version,
    spec_path,
)
from kubelet_plugin.state.claim_files import list_spec_claim_uids, remove_spec, write_spec

CLAIM_UID = "0b6f3c2e-5d1a-4b8e-9c7f-2a1d3e4f5a6b"
SHARE_ID = "a671734a-e8e5-11e4-8fde-42010af09327"
KIND = "k8s.gpu.fracgpu.dev/claim"

# --------------------------------------------------------------------------------------------------
# An independent checker of the CDI specification's rules, applied to the JSON
# as a runtime would read it. Deliberately does not use the module's own regexes or version logic.

KNOWN_CDI_VERSIONS = ["0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0"]
_LETTERS = set(string.ascii_letters)
_ALNUM = _LETTERS | set(string.digits)
SPEC_KEYS = {"cdiVersion", "kind", "annotations", "devices", "containerEdits"}
DEVICE_KEYS = {"name", "annotations", "containerEdits"}
EDIT_KEYS = {"env", "deviceNodes", "mounts", "hooks", "intelRdt", "additionalGids", "netDevices"}
NODE_KEYS = {"path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid", "gid"}
MOUNT_KEYS = {"hostPath", "containerPath", "options", "type"}
HOOK_KEYS = {"hookName", "path", "args", "env", "timeout"}
HOOK_NAMES = {"prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"}


def vendor_or_class_ok(name: str) -> bool:
    """vendor/class: chars A-Z a-z 0-9 . - _, starts with a letter, ends with a letter or digit."""
    return bool(name) and name[0] in _LETTERS and name[-1] in _ALNUM and all(c in _ALNUM or c in "._-" for c in name)


def device_name_ok(name: str) -> bool:
    """device name: chars A-Z a-z 0-9 - _ . :, starts and ends with a letter or digit."""
    return bool(name) and name[0] in _ALNUM and name[-1] in _ALNUM and all(c in _ALNUM or c in "-_.:" for c in name)


def required_version(doc: dict[str, Any]) -> str:
    """Minimum CDI version for the fields a spec document uses (§7.1)."""
    edits = [d["containerEdits"] for d in doc["devices"]] + [doc.get("containerEdits", {})]
    if any("netDevices" in e for e in edits):
        return "1.1.0"
    if any("additionalGids" in e or "intelRdt" in e for e in edits):
        return "0.7.0"
    if "annotations" in doc or any("annotations" in d for d in doc["devices"]) or "." in doc["kind"].partition("/")[2]:
        return "0.6.0"
    if any("hostPath" in n for e in edits for n in e.get("deviceNodes", [])) or any(
        d["name"][0].isdigit() for d in doc["devices"]
    ):
        return "0.5.0"
    if any("type" in m for e in edits for m in e.get("mounts", [])):
        return "0.4.0"
    return "0.3.0"


def check_env(entries: Any, where: str) -> None:
    assert isinstance(entries, list), where
    for entry in entries:
        assert isinstance(entry, str), where
        assert "=" in entry and entry.index("=") > 0, f"{where}: env entry {entry!r} is not K=V"


def check_edits(edits: Any, where: str) -> None:
    assert isinstance(edits, dict), where
    assert set(edits) <= EDIT_KEYS, f"{where}: unknown fields {set(edits) - EDIT_KEYS}"
    for key, value in edits.items():
        assert value not in ([], {}, None), f"{where}: empty {key} emitted"
    check_env(edits.get("env", []), where)
    for node in edits.get("deviceNodes", []):
        assert set(node) <= NODE_KEYS, f"{where}: unknown device node fields {set(node) - NODE_KEYS}"
        assert node["path"].startswith("/"), f"{where}: device node path {node['path']!r} not absolute"
        if "hostPath" in node:
            assert node["hostPath"].startswith("/"), where
        if "type" in node:
            assert node["type"] in {"b", "c", "u", "p"}, where
        if "permissions" in node:
            assert node["permissions"] and set(node["permissions"]) <= set("rwm"), where
        for num in ("major", "minor", "fileMode", "uid", "gid"):
            if num in node:
                assert isinstance(node[num], int) and node[num] >= 0, where
    for mount in edits.get("mounts", []):
        assert set(mount) <= MOUNT_KEYS, where
        assert mount["hostPath"] and mount["containerPath"], where
        assert all(isinstance(o, str) for o in mount.get("options", [])), where
    for hook in edits.get("hooks", []):
        assert set(hook) <= HOOK_KEYS, where
        assert hook["hookName"] in HOOK_NAMES, where
        assert hook["path"].startswith("/"), where
        check_env(hook.get("env", []), where)
        if "timeout" in hook:
            assert hook["timeout"] > 0, where
    for gid in edits.get("additionalGids", []):
        assert isinstance(gid, int) and 0 <= gid < 2**32, where


def check_cdi_schema_rules(doc: Any) -> None:
    """Assert that a parsed spec file obeys the CDI rules a runtime enforces when loading it."""
    assert isinstance(doc, dict)
    assert set(doc) <= SPEC_KEYS, f"unknown top-level fields {set(doc) - SPEC_KEYS}"
    for required in ("cdiVersion", "kind", "devices"):
        assert required in doc, f"missing {required}"
    vendor, sep, cls = doc["kind"].partition("/")
    assert sep == "/" and vendor_or_class_ok(vendor) and vendor_or_class_ok(cls), f"bad kind {doc['kind']}"
    assert len(vendor) <= 253 and len(cls) <= 63
    assert isinstance(doc["devices"], list) and doc["devices"], "a spec needs at least one device"
    assert doc["cdiVersion"] in KNOWN_CDI_VERSIONS, f"unknown cdiVersion {doc['cdiVersion']}"
    assert doc["cdiVersion"] == required_version(doc), "cdiVersion is not the minimum for the fields used"
    names = [d.get("name") for d in doc["devices"]]
    assert len(set(names)) == len(names), "duplicate device names"
    for dev in doc["devices"]:
        assert set(dev) <= DEVICE_KEYS, f"unknown device fields {set(dev) - DEVICE_KEYS}"
        assert device_name_ok(dev["name"]), f"bad device name {dev['name']!r}"
        assert dev.get("containerEdits"), f"device {dev['name']} has empty containerEdits"
        check_edits(dev["containerEdits"], dev["name"])
        for key, value in dev.get("annotations", {}).items():
            assert isinstance(key, str) and key and isinstance(value, str)
    if "containerEdits" in doc:
        check_edits(doc["containerEdits"], "spec")


# --------------------------------------------------------------------------------------------------
# fixtures


def gpu_edits(driver_root: str = "/run/nvidia/driver", host_paths: bool = True) -> ContainerEdits:
    def node(name: str, minor: int) -> DeviceNode:
        return DeviceNode(
            path=f"/dev/{name}",
            host_path=f"{driver_root}/dev/{name}" if host_paths else None,
            type="c",
            major=195,
            minor=minor,
            permissions="rw",
        )

    return ContainerEdits(
        env=[
            "NVIDIA_VISIBLE_DEVICES=GPU-8f6c1a2e-0000-1111-2222-333344445555",
            "FRACGPU_MEMORY_LIMIT_MIB=10240",
            f"FRACGPU_CLAIM=default/my-claim/{CLAIM_UID}",
            f"FRACGPU_SHARE_ID={SHARE_ID}",
            "EMPTY=",
        ],
        device_nodes=[node("nvidia0", 0), node("nvidiactl", 255)],
    )


def claim_spec(**extra: Any) -> Spec:
    device = Device(name=cdi_device_name(CLAIM_UID, "gpu-0", SHARE_ID), container_edits=gpu_edits())
    return Spec(kind=cdi_kind(DRIVER_NAME), devices=[device], **extra)


# --------------------------------------------------------------------------------------------------
# names


def test_names_follow_the_architecture() -> None:
    assert cdi_kind(DRIVER_NAME) == KIND
    assert cdi_device_name(CLAIM_UID, "gpu-0", None) == f"{CLAIM_UID}-gpu-0"
    assert cdi_device_name(CLAIM_UID, "gpu-0", SHARE_ID) == f"{CLAIM_UID}-gpu-0-{SHARE_ID}"
    assert cdi_device_id(DRIVER_NAME, CLAIM_UID, "gpu-1", None) == f"{KIND}={CLAIM_UID}-gpu-1"
    assert spec_path(Path("/var/run/cdi"), DRIVER_NAME, CLAIM_UID) == Path(
        f"/var/run/cdi/k8s.gpu.fracgpu.dev-claim_{CLAIM_UID}.json"
    )


@pytest.mark.parametrize(
    ("claim_uid", "device", "share_id"),
    [
        (CLAIM_UID, "gpu/0", None),
        (CLAIM_UID, "gpu 0", None),
        (CLAIM_UID, "gpu-0", ""),
        (CLAIM_UID, "gpu-0-", None),
        ("", "gpu-0", None),
        ("-abc", "gpu-0", None),
        (CLAIM_UID, "gpü", None),
    ],
)
def test_invalid_device_names_refused(claim_uid: str, device: str, share_id: str | None) -> None:
    with pytest.raises(ValueError, match="invalid CDI device name"):
        cdi_device_name(claim_uid, device, share_id)


@pytest.mark.parametrize("claim_uid", ["../etc/passwd", "a/b", "", ".hidden"])
def test_spec_path_refuses_unsafe_uids(claim_uid: str) -> None:
    with pytest.raises(ValueError):
        spec_path(Path("/var/run/cdi"), DRIVER_NAME, claim_uid)


@pytest.mark.parametrize("driver", ["", "gpu fracgpu", "gpu.fracgpu.dev-", "gpu/x"])
def test_invalid_driver_names_refused(driver: str) -> None:
    with pytest.raises(ValueError):
        cdi_kind(driver)


@pytest.mark.parametrize("kind", ["nokind", "1vendor.com/x", "vendor.com/", "/class", "v.com/c-", "v.com/c/d"])
def test_invalid_kind_refused(kind: str) -> None:
    with pytest.raises(ValidationError):
        Spec(kind=kind, devices=[Device(name="a", container_edits=ContainerEdits(env=["A=1"]))])


# --------------------------------------------------------------------------------------------------
# schema rules


def _variants() -> dict[str, Spec]:
    letter_uid = "f" + CLAIM_UID[1:]
    plain = Device(
        name=cdi_device_name(letter_uid, "gpu-0", None),
        container_edits=ContainerEdits(env=["A=1"], device_nodes=[DeviceNode(path="/dev/nvidia0")]),
    )
    typed_mount = Device(
        name=cdi_device_name(letter_uid, "gpu-1", None),
        container_edits=ContainerEdits(
            mounts=[
                Mount(
                    host_path="/usr/local/vgpu/libvgpu.so",
                    container_path="/usr/local/vgpu/libvgpu.so",
                    options=["ro", "nosuid", "nodev", "bind"],
                    type="bind",
                )
            ]
        ),
    )
    hooked = Device(
        name=cdi_device_name(letter_uid, "gpu-2", None),
        container_edits=ContainerEdits(
            hooks=[
                Hook(
                    hook_name="createContainer",
                    path="/usr/bin/nvidia-cdi-hook",
                    args=["nvidia-cdi-hook", "update-ldcache"],
                    env=["NVIDIA_CTK_DEBUG=false"],
                    timeout=10,
                )
            ]
        ),
    )
    kind = cdi_kind(DRIVER_NAME)
    return {
        "baseline": Spec(kind=kind, devices=[plain, hooked]),
        "mount-type": Spec(kind=kind, devices=[plain, typed_mount]),
        "claim-gpu": claim_spec(),
        "digit-name-no-hostpath": Spec(
            kind=kind,
            devices=[
                Device(name=cdi_device_name(CLAIM_UID, "gpu-0", None), container_edits=gpu_edits(host_paths=False))
            ],
        ),
        "common-edits": claim_spec(container_edits=ContainerEdits(env=["COMMON=1"])),
        "empty-common-edits": claim_spec(container_edits=ContainerEdits()),
        "annotations": claim_spec(annotations={"fracgpu.dev/claim": "default/my-claim"}),
        "device-annotations": Spec(
            kind=kind, devices=[plain.model_copy(update={"annotations": {"fracgpu.dev/gpu": "0"}})]
        ),
        "additional-gids": Spec(
            kind=kind, devices=[Device(name="gpu0", container_edits=ContainerEdits(additional_gids=[44]))]
        ),
    }


EXPECTED_VERSIONS = {
    "baseline": "0.3.0",
    "mount-type": "0.4.0",
    "claim-gpu": "0.5.0",
    "digit-name-no-hostpath": "0.5.0",
    "common-edits": "0.5.0",
    "empty-common-edits": "0.5.0",
    "annotations": "0.6.0",
    "device-annotations": "0.6.0",
    "additional-gids": "0.7.0",
}


@pytest.mark.parametrize("variant", sorted(EXPECTED_VERSIONS))
def test_written_spec_obeys_cdi_schema_rules(tmp_path: Path, variant: str) -> None:
    spec = _variants()[variant]
    assert minimum_version(spec) == EXPECTED_VERSIONS[variant]
    path = write_spec(tmp_path, CLAIM_UID, spec, DRIVER_NAME)
    doc = json.loads(path.read_text())
    check_cdi_schema_rules(doc)
    assert doc["cdiVersion"] == EXPECTED_VERSIONS[variant]
    # what we wrote parses back into a model that writes the same JSON
    assert Spec.model_validate_json(path.read_text()).to_json() == path.read_text()


def test_claim_spec_content(tmp_path: Path) -> None:
    doc = json.loads(write_spec(tmp_path, CLAIM_UID, claim_spec(), DRIVER_NAME).read_text())
    assert doc["kind"] == KIND
    (dev,) = doc["devices"]
    assert dev["name"] == f"{CLAIM_UID}-gpu-0-{SHARE_ID}"
    assert "NVIDIA_VISIBLE_DEVICES=GPU-8f6c1a2e-0000-1111-2222-333344445555" in dev["containerEdits"]["env"]
    assert "EMPTY=" in dev["containerEdits"]["env"]
    assert dev["containerEdits"]["deviceNodes"][0] == {
        "path": "/dev/nvidia0",
        "hostPath": "/run/nvidia/driver/dev/nvidia0",
        "type": "c",
        "major": 195,
        "minor": 0,
        "permissions": "rw",
    }
    assert set(dev["containerEdits"]) == {"env", "deviceNodes"}  # empty lists are not emitted


def test_checker_rejects_what_runtimes_reject() -> None:
    """The schema checker itself catches the mistakes it is there for."""
    good = json.loads(cdi.with_minimum_version(claim_spec()).to_json())
    check_cdi_schema_rules(good)
    mutations: list[Callable[[dict[str, Any]], object]] = [
        lambda d: d.update(cdiVersion="0.3.0"),  # lower than required
        lambda d: d.update(cdiVersion="0.7.0"),  # not the minimum
        lambda d: d.update(cdiVersion="0.9.0"),  # unknown
        lambda d: d.update(kind="gpu"),
        lambda d: d.update(extra=1),
        lambda d: d.pop("devices"),
        lambda d: d["devices"][0].update(name="-x"),
        lambda d: d["devices"][0]["containerEdits"].update(env=["NOEQUALS"]),
        lambda d: d["devices"][0]["containerEdits"]["deviceNodes"][0].update(path="dev/nvidia0"),
        lambda d: d["devices"][0]["containerEdits"].update(mounts=[]),
    ]
    bad_docs: list[dict[str, Any]] = []
    for mutate in mutations:
        doc = json.loads(json.dumps(good))
        mutate(doc)
        bad_docs.append(doc)
    for doc in bad_docs:
        with pytest.raises((AssertionError, KeyError)):
            check_cdi_schema_rules(doc)


def test_writer_sets_minimum_version_even_if_given_higher(tmp_path: Path) -> None:
    spec = claim_spec().model_copy(update={"cdi_version": "1.1.0"})
    doc = json.loads(write_spec(tmp_path, CLAIM_UID, spec, DRIVER_NAME).read_text())
    assert doc["cdiVersion"] == "0.5.0"


# --------------------------------------------------------------------------------------------------
# model validation


def test_device_without_edits_refused() -> None:
    with pytest.raises(ValidationError, match="empty containerEdits"):
        Device(name="gpu0", container_edits=ContainerEdits())


def test_spec_needs_devices_and_unique_names() -> None:
    with pytest.raises(ValidationError):
        Spec(kind=KIND, devices=[])
    dev = Device(name="gpu0", container_edits=ContainerEdits(env=["A=1"]))
    with pytest.raises(ValidationError, match="duplicate"):
        Spec(kind=KIND, devices=[dev, dev])


@pytest.mark.parametrize(
    "make",
    [
        lambda: DeviceNode(path="dev/nvidia0"),
        lambda: DeviceNode(path="/dev/nvidia0", host_path="relative"),
        lambda: DeviceNode(path="/dev/nvidia0", permissions="rwx"),
        lambda: DeviceNode(path="/dev/nvidia0", permissions=""),
        lambda: DeviceNode.model_validate({"path": "/dev/nvidia0", "type": "x"}),
        lambda: DeviceNode(path="/dev/nvidia0", minor=-1),
        lambda: ContainerEdits(env=["=x"]),
        lambda: ContainerEdits(env=["NOVALUE"]),
        lambda: ContainerEdits(additional_gids=[2**32]),
        lambda: Hook(hook_name="createContainer", path="relative"),
        lambda: Hook(hook_name="createContainer", path="/x", timeout=0),
        lambda: Mount(host_path="", container_path="/x"),
        lambda: Spec(kind=KIND, cdi_version="0.9.0", devices=[Device(name="a", container_edits=gpu_edits())]),
        lambda: Spec(kind=KIND, annotations={"bad key!": "x"}, devices=[Device(name="a", container_edits=gpu_edits())]),
    ],
)
def test_invalid_models_refused(make: Any) -> None:
    with pytest.raises(ValidationError):
        make()


def test_unknown_fields_refused_on_parse() -> None:
    doc = json.loads(claim_spec().to_json())
    doc["devices"][0]["containerEdits"]["deviceNodes"][0]["bogus"] = 1
    with pytest.raises(ValidationError):
        Spec.model_validate(doc)


# --------------------------------------------------------------------------------------------------
# files


def _listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_atomic_write_leaves_only_the_spec(tmp_path: Path) -> None:
    cdi_dir = tmp_path / "cdi"  # created on demand
    path = write_spec(cdi_dir, CLAIM_UID, claim_spec(), DRIVER_NAME)
    assert path == spec_path(cdi_dir, DRIVER_NAME, CLAIM_UID)
    assert _listing(cdi_dir) == [path.name]
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    # overwrite in place
    write_spec(cdi_dir, CLAIM_UID, claim_spec(annotations={"a": "b"}), DRIVER_NAME)
    assert _listing(cdi_dir) == [path.name]
    assert json.loads(path.read_text())["annotations"] == {"a": "b"}


def test_failed_write_keeps_old_spec_and_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_spec(tmp_path, CLAIM_UID, claim_spec(), DRIVER_NAME)
    before = path.read_bytes()
    temp_names: list[str] = []

    def failing_replace(src: Any, dst: Any) -> None:
        temp_names.append(Path(src).name)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space"):
        write_spec(tmp_path, CLAIM_UID, claim_spec(annotations={"a": "b"}), DRIVER_NAME)
    assert temp_names and temp_names[0].startswith(".")  # runtimes ignore dot files
    assert path.read_bytes() == before
    assert _listing(tmp_path) == [path.name]


def test_write_refuses_foreign_kind(tmp_path: Path) -> None:
    spec = Spec(kind="nvidia.com/gpu", devices=[Device(name="gpu0", container_edits=gpu_edits())])
    with pytest.raises(ValueError, match="does not match driver kind"):
        write_spec(tmp_path, CLAIM_UID, spec, DRIVER_NAME)
    assert _listing(tmp_path) == []


def test_remove_spec(tmp_path: Path) -> None:
    path = write_spec(tmp_path, CLAIM_UID, claim_spec(), DRIVER_NAME)
    assert remove_spec(tmp_path, DRIVER_NAME, CLAIM_UID) is True
    assert not path.exists()
    assert remove_spec(tmp_path, DRIVER_NAME, CLAIM_UID) is False
    assert remove_spec(tmp_path / "missing-dir", DRIVER_NAME, CLAIM_UID) is False


def test_list_spec_claim_uids(tmp_path: Path) -> None:
    other_uid = str(uuid.uuid4())
    write_spec(tmp_path, CLAIM_UID, claim_spec(), DRIVER_NAME)
    write_spec(tmp_path, other_uid, claim_spec(), DRIVER_NAME)
    (tmp_path / f".k8s.gpu.fracgpu.dev-claim_{CLAIM_UID}.json.abc.tmp").write_text("{}")
    (tmp_path / "k8s.gpu.nvidia.com-claim_1234.json").write_text("{}")
    (tmp_path / "k8s.gpu.fracgpu.dev-claim_5678.yaml").write_text("")
    (tmp_path / "nvidia.yaml").write_text("")
    assert list_spec_claim_uids(tmp_path, DRIVER_NAME) == {CLAIM_UID, other_uid}
    assert list_spec_claim_uids(tmp_path / "missing", DRIVER_NAME) == set()


# --------------------------------------------------------------------------------------------------
# property: generated names always pass the CDI rules

_dns_labels = st.from_regex(r"\A[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")
_device_names = st.one_of(st.integers(0, 1023).map(lambda i: f"gpu-{i}"), _dns_labels)


@given(st.uuids(), _device_names, st.one_of(st.none(), st.uuids().map(str)))
def test_generated_device_names_pass_cdi_rules(claim_uid: uuid.UUID, device: str, share_id: str | None) -> None:
    name = cdi_device_name(str(claim_uid), device, share_id)
    assert device_name_ok(name)
    qualified = cdi_device_id(DRIVER_NAME, str(claim_uid), device, share_id)
    kind, _, tail = qualified.partition("=")
    vendor, _, cls = kind.partition("/")
    assert tail == name
    assert vendor_or_class_ok(vendor) and vendor_or_class_ok(cls)
    assert spec_path(Path("/var/run/cdi"), DRIVER_NAME, str(claim_uid)).parent == Path("/var/run/cdi")
