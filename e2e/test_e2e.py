"""End to end (issue #6): an unmodified kubelet calls our plugin, containerd applies our CDI spec, the
container sees its GPU and only its GPU. Driver installed by `helm install`; simulated GPUs (2 x 80Gi)."""

import json
import time
from pathlib import Path
from typing import Any

import pytest

from api.names import NUMA_NODE_ATTRIBUTE, PCIE_ROOT_ATTRIBUTE
from api.quantity import MiB, to_bytes
from e2e import workloads as w
from e2e.install import NAMESPACE, Installation
from harness.cluster.node import RUNC
from kubelet_plugin.state import device_metadata

pytestmark = pytest.mark.e2e


def _minor(device: str, installation: Installation) -> int:
    slices = w.get(installation.cluster, "resourceslices")["items"]
    for item in slices:
        for d in item["spec"]["devices"]:
            if d["name"] == device:
                return int(d["attributes"]["minor"]["int"])
    raise AssertionError(f"{device} not published")


def _ledger(installation: Installation) -> dict[str, dict[str, object]]:
    return {g["metadata"]["name"]: g["status"] for g in w.get(installation.cluster, "gpus")["items"]}


def _allocated(claim: dict[str, Any]) -> list[tuple[str, int, str | None, str]]:
    """(uuid, granted MiB, share ID, device) per result of our driver, from the claim's status."""
    uuids = {d["device"]: d["data"]["uuid"] for d in claim["status"]["devices"] if d["driver"] == w.DEVICE_CLASS}
    return sorted(
        (uuids[r["device"]], to_bytes(r["consumedCapacity"]["memory"]) // MiB, r.get("shareID"), r["device"])
        for r in claim["status"]["allocation"]["devices"]["results"]
        if r["driver"] == w.DEVICE_CLASS
    )


def _told(seen: w.Seen, claim: dict[str, Any]) -> list[tuple[str, int, str | None, str]]:
    """The same tuples from the claim's file in the container, after checking the per-device env agrees."""
    uid, name = claim["metadata"]["uid"], claim["metadata"]["name"]
    (file,) = [f for n, f in seen.files.items() if n.startswith(f"{uid}_")]
    assert file["claim"] == {"namespace": claim["metadata"]["namespace"], "name": name, "uid": uid}
    for device in file["devices"]:
        assert seen.device_vars()[device["envPrefix"]] == {
            "UUID": device["uuid"],
            "MEMORY_LIMIT_MIB": str(device["memoryMiB"]),
            "CLAIM": f"{claim['metadata']['namespace']}/{name}",
            "REQUEST": file["request"],
            "ENFORCEMENT": device["enforcement"],
            "SHARE_ID": device["shareID"],
        }
        assert device["enforcement"] == "none", "this cgroup-v1 node without HAMi-core enforces nothing"
    return sorted((d["uuid"], d["memoryMiB"], d["shareID"], d["device"]) for d in file["devices"])


def test_a_pod_sees_exactly_its_gpu_share(installation: Installation, ns: str) -> None:
    cluster = installation.cluster
    w.apply(cluster, ns, w.claim_template("share-10gi", "10Gi"), w.gpu_pod("solo", "share-10gi"))
    w.wait_running(cluster, ns, ["solo"])
    seen = w.report(cluster, ns, "solo")
    claim = w.claim_of(cluster, ns, "solo")
    recorded = w.recorded_gpu(claim)
    assert seen.uuids() == {recorded["uuid"]}
    assert seen.env["NVIDIA_VISIBLE_DEVICES"] == "void", "driverEdits: toolkit: no NVIDIA runtime may inject"
    assert _told(seen, claim) == _allocated(claim)
    assert [d[1] for d in _allocated(claim)] == [10240]
    minor = _minor(recorded["device"], installation)
    other = {f"nvidia{m}" for m in (0, 1) if m != minor}
    assert f"nvidia{minor}" in seen.nodes
    assert not set(seen.nodes) & other, f"another GPU's device node is visible: {seen.nodes}"
    assert {"nvidiactl", "nvidia-uvm"} <= set(seen.nodes)


def test_one_container_with_two_claims_is_told_both(installation: Installation, ns: str) -> None:
    """50Gi + 40Gi cannot share one 80Gi GPU, so the container `both` gets two GPUs, from two claims."""
    cluster = installation.cluster
    pod = w.pod("pair", {"big": "share-50gi", "small": "share-40gi"}, {"both": ["big", "small"], "one": ["small"]})
    w.apply(cluster, ns, w.claim_template("share-50gi", "50Gi"), w.claim_template("share-40gi", "40Gi"), pod)
    w.wait_running(cluster, ns, ["pair"])
    both, one = w.report(cluster, ns, "pair", "both"), w.report(cluster, ns, "pair", "one")
    claims = {c: w.claim_of(cluster, ns, "pair", c) for c in ("big", "small")}
    uuids = {c: w.recorded_gpu(claim)["uuid"] for c, claim in claims.items()}
    assert uuids["big"] != uuids["small"]

    assert sorted(both.files) == sorted(f"{c['metadata']['uid']}_gpu.json" for c in claims.values())
    for claim in claims.values():
        assert _told(both, claim) == _allocated(claim)
    assert len(both.device_vars()) == 2
    assert sorted(k for k in both.env if k.startswith("FRACGPU_DEV_")) == sorted(
        f"{prefix}{suffix}"
        for prefix in both.device_vars()
        for suffix in ("UUID", "MEMORY_LIMIT_MIB", "CLAIM", "REQUEST", "ENFORCEMENT", "SHARE_ID")
    ), "every FRACGPU_DEV_ variable belongs to a device of the files"
    assert not {"FRACGPU_MEMORY_LIMIT_MIB", "FRACGPU_CLAIM", "FRACGPU_SHARE_ID"} & set(both.env)
    assert both.env["FRACGPU_INFO_DIR"] == "/run/fracgpu" and both.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert both.uuids() == set(uuids.values())
    assert both.env["NVIDIA_VISIBLE_DEVICES"] == "void"
    minors = {c: _minor(w.recorded_gpu(claim)["device"], installation) for c, claim in claims.items()}
    assert {f"nvidia{m}" for m in minors.values()} <= set(both.nodes)

    assert list(one.files) == [f"{claims['small']['metadata']['uid']}_gpu.json"]
    assert _told(one, claims["small"]) == _allocated(claims["small"])
    (prefix,) = one.device_vars()
    assert all(k.startswith(prefix) for k in one.env if k.startswith("FRACGPU_DEV_")), "only its own device's names"
    assert one.uuids() == {uuids["small"]}
    assert f"nvidia{minors['big']}" not in one.nodes and f"nvidia{minors['small']}" in one.nodes


def test_a_claim_with_two_requests_tells_each_container_what_it_references(installation: Installation, ns: str) -> None:
    """Requests of 50Gi and 40Gi land on the two GPUs; `all` uses the whole claim, `only-a` its request `a`."""
    cluster = installation.cluster
    template = w.requests_template("two-requests", {"a": "50Gi", "b": "40Gi"})
    pod = w.pod("split", {"gpus": "two-requests"}, {"all": ["gpus"], "only-a": ["gpus/a"]})
    w.apply(cluster, ns, template, pod)
    w.wait_running(cluster, ns, ["split"])
    every, only_a = w.report(cluster, ns, "split", "all"), w.report(cluster, ns, "split", "only-a")
    claim = w.claim_of(cluster, ns, "split", "gpus")
    uid = claim["metadata"]["uid"]
    results = {r["request"]: r for r in claim["status"]["allocation"]["devices"]["results"]}
    assert results["a"]["device"] != results["b"]["device"]
    uuids = {d["device"]: d["data"]["uuid"] for d in claim["status"]["devices"] if d["driver"] == w.DEVICE_CLASS}

    assert sorted(every.files) == [f"{uid}_a.json", f"{uid}_b.json"]
    for request in ("a", "b"):
        (device,) = every.files[f"{uid}_{request}.json"]["devices"]
        result = results[request]
        granted = to_bytes(result["consumedCapacity"]["memory"]) // MiB
        assert (device["uuid"], device["memoryMiB"], device["shareID"]) == (
            uuids[result["device"]],
            granted,
            result["shareID"],
        )
        assert every.device_vars()[device["envPrefix"]]["MEMORY_LIMIT_MIB"] == str(granted)
        assert f"nvidia{device['minor']}" in every.nodes
    assert every.uuids() == set(uuids.values())

    assert list(only_a.files) == [f"{uid}_a.json"]
    (device,) = only_a.files[f"{uid}_a.json"]["devices"]
    assert only_a.uuids() == {device["uuid"]} == {uuids[results["a"]["device"]]}
    assert list(only_a.device_vars()) == [device["envPrefix"]]
    assert len([k for k in only_a.env if k.startswith("FRACGPU_DEV_")]) == 6
    other = every.files[f"{uid}_b.json"]["devices"][0]["minor"]
    assert f"nvidia{other}" not in only_a.nodes and f"nvidia{device['minor']}" in only_a.nodes


def test_match_attribute_on_pcie_root_keeps_a_claims_requests_under_one_root(
    installation: Installation, ns: str
) -> None:
    """The simulated GPUs sit on two PCIe roots and NUMA nodes (the driver root's sysfs, sim80gi-x2.profile),
    published as Kubernetes' standard attributes. On the real scheduler, two requests constrained to one
    `resource.kubernetes.io/pcieRoot` stay Pending when no one GPU holds both (50Gi + 40Gi, which the two free GPUs
    hold unconstrained, as in the test above) and land on one GPU when it does (40Gi + 40Gi)."""
    cluster = installation.cluster
    published = {
        d["name"]: d["attributes"] for s in w.get(cluster, "resourceslices")["items"] for d in s["spec"]["devices"]
    }
    topology = {
        name: (a[PCIE_ROOT_ATTRIBUTE]["string"], a[NUMA_NODE_ATTRIBUTE]["int"]) for name, a in published.items()
    }
    assert topology == {"gpu-0": ("pci0000:17", 0), "gpu-1": ("pci0000:29", 1)}
    deadline = time.monotonic() + 30
    while any(g.get("shares") for g in _ledger(installation).values()):  # the GPUs are free: the tests before are gone
        assert time.monotonic() < deadline, _ledger(installation)
        time.sleep(1)

    def same_root(name: str, memories: dict[str, str]) -> dict[str, Any]:
        template = w.requests_template(name, memories)
        template["spec"]["spec"]["devices"]["constraints"] = [{"matchAttribute": PCIE_ROOT_ATTRIBUTE}]
        return template

    w.apply(
        cluster,
        ns,
        same_root("apart", {"a": "50Gi", "b": "40Gi"}),
        w.pod("apart", {"gpus": "apart"}, {"app": ["gpus"]}),
    )
    assert "cannot allocate all claims" in w.unschedulable(cluster, ns, "apart")
    w.apply(
        cluster,
        ns,
        same_root("together", {"a": "40Gi", "b": "40Gi"}),
        w.pod("together", {"gpus": "together"}, {"app": ["gpus"]}),
    )
    w.wait_running(cluster, ns, ["together"])
    results = w.claim_of(cluster, ns, "together", "gpus")["status"]["allocation"]["devices"]["results"]
    assert sorted(r["request"] for r in results) == ["a", "b"]
    assert len({r["device"] for r in results}) == 1, results
    assert w.get(cluster, "pod", "-n", ns, "apart")["status"].get("phase") == "Pending"


# The Kubernetes docs' device metadata example (task "Access DRA Device Metadata"): its command, verbatim.
METADATA_DIR = "/var/run/kubernetes.io/dra-device-attributes"
DOCS_EXAMPLE = f"""echo "=== DRA device metadata ==="
find {METADATA_DIR} -name '*-metadata.json' -print -exec cat {{}} \\;
echo END
sleep 100000
"""


def _metadata_printed(cluster: w.Cluster, namespace: str, pod: str, container: str) -> dict[str, list[Any]]:
    """Path -> the DeviceMetadata objects of each file the docs' command printed."""
    deadline = time.monotonic() + 30
    while "\nEND" not in (out := cluster.kubectl("logs", "-n", namespace, pod, "-c", container).stdout):
        assert time.monotonic() < deadline, out
        time.sleep(0.5)
    texts: dict[str, str] = {}
    for line in out.split("\nEND")[0].splitlines()[1:]:
        if line.startswith(METADATA_DIR):
            path = line
            texts[path] = ""
        else:
            texts[path] += line + "\n"
    return {path: device_metadata.read_stream(text) for path, text in texts.items()}


def test_the_docs_device_metadata_example_prints_exactly_the_claims_devices(
    installation: Installation, ns: str
) -> None:
    """A claim the pod names (`gpu-claim`, as in the docs) and a template's claim: `both` is shown the files of
    both, `own` only its template claim's (v1beta1 first, then v1alpha1), each listing the claim's allocation."""
    cluster = installation.cluster
    direct = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "gpu-claim"},
        "spec": w.claim_template("unused", "10Gi")["spec"]["spec"],
    }
    pod = w.pod(
        "reader", {"my-gpu": "share-20gi"}, {"both": ["my-gpu", "direct"], "own": ["my-gpu"]}, script=DOCS_EXAMPLE
    )
    pod["spec"]["resourceClaims"].append({"name": "direct", "resourceClaimName": "gpu-claim"})
    w.apply(cluster, ns, direct, w.claim_template("share-20gi", "20Gi"), pod)
    w.wait_running(cluster, ns, ["reader"])
    claims = {
        "direct": w.get(cluster, "resourceclaim", "-n", ns, "gpu-claim"),
        "my-gpu": w.claim_of(cluster, ns, "reader", "my-gpu"),
    }
    paths = {
        "direct": f"{METADATA_DIR}/resourceclaims/gpu-claim/gpu/{w.DEVICE_CLASS}-metadata.json",
        "my-gpu": f"{METADATA_DIR}/resourceclaimtemplates/my-gpu/gpu/{w.DEVICE_CLASS}-metadata.json",
    }
    both, own = (_metadata_printed(cluster, ns, "reader", c) for c in ("both", "own"))
    assert sorted(both) == sorted(paths.values())
    assert list(own) == [paths["my-gpu"]], "a container is shown only the claims it uses"
    for name, claim in claims.items():
        beta, alpha = both[paths[name]]
        assert (beta.api_version, alpha.api_version) == device_metadata.VERSIONS
        assert beta.requests == alpha.requests
        assert (beta.metadata.name, beta.metadata.namespace, beta.metadata.uid) == (
            claim["metadata"]["name"],
            ns,
            claim["metadata"]["uid"],
        )
        assert beta.pod_claim_name == (None if name == "direct" else "my-gpu")
        (request,) = beta.requests
        results = claim["status"]["allocation"]["devices"]["results"]
        assert request.name == "gpu"
        assert [(d.driver, d.pool, d.name) for d in request.devices] == [
            (r["driver"], r["pool"], r["device"]) for r in results
        ]
        (device,) = request.devices
        assert device.attributes["uuid"].string == w.recorded_gpu(claim)["uuid"]
        slices = w.get(cluster, "resourceslices")["items"]
        (published,) = [d for s in slices for d in s["spec"].get("devices", []) if d["name"] == device.name]
        assert {k: v.model_dump(by_alias=True, exclude_none=True) for k, v in device.attributes.items()} == (
            published["attributes"]
        )
    assert own[paths["my-gpu"]] == both[paths["my-gpu"]]


def test_a_non_root_container_opens_its_gpu(installation: Installation, ns: str) -> None:
    cluster = installation.cluster
    w.apply(cluster, ns, w.claim_template("share-2gi", "2Gi"), w.gpu_pod("nonroot", "share-2gi", run_as_user=1000))
    w.wait_running(cluster, ns, ["nonroot"])
    seen = w.report(cluster, ns, "nonroot")
    claim = w.claim_of(cluster, ns, "nonroot")
    own = f"nvidia{_minor(w.recorded_gpu(claim)['device'], installation)}"
    assert seen.uid == 1000
    assert all(mode == "666" for mode in seen.nodes.values()), seen.nodes  # like the NVIDIA driver's nodes
    assert seen.opened[own] in w.OPENED, f"uid 1000 cannot open /dev/{own}: {seen.opened[own]}"
    assert _told(seen, claim) == _allocated(claim), "the request file is readable by a non-root user"


def test_the_first_kubectl_get_gpus_after_install_shows_every_gpu_reporting(installation: Installation) -> None:
    # the first table in which the GPU objects exist (after helm's --wait and the slices): the plugin renewed its
    # heartbeat Lease before publishing, and the controller read it before writing the objects' first status
    first = installation.first_gpus
    assert first and {row["REPORTING"] for row in first.values()} == {"True"}, first


def test_shares_pack_onto_gpus_and_the_ledger_shows_them(installation: Installation, ns: str) -> None:
    cluster = installation.cluster
    w.apply(cluster, ns, w.claim_template("share-40gi", "40Gi"), w.claim_template("share-100gi", "100Gi"))
    # one after the other: two created together may land on different GPUs (seen once in CI): the upstream
    # scheduler can count an in-flight share twice (docs/operations.md "Packing")
    for name in ("a", "b"):
        w.apply(cluster, ns, w.gpu_pod(name, "share-40gi"))
        w.wait_running(cluster, ns, [name])
    w.apply(cluster, ns, w.gpu_pod("c", "share-40gi"), w.gpu_pod("too-big", "share-100gi"))
    w.wait_running(cluster, ns, ["c"])
    gpu = {p: w.recorded_gpu(w.claim_of(cluster, ns, p)) for p in ("a", "b", "c")}
    seen = {p: w.report(cluster, ns, p) for p in ("a", "b", "c")}
    assert gpu["a"]["uuid"] == gpu["b"]["uuid"] != gpu["c"]["uuid"], "two 40Gi shares fill one 80Gi GPU"
    assert seen["a"].uuids() == seen["b"].uuids() == {gpu["a"]["uuid"]}
    share_ids = [d["SHARE_ID"] for p in ("a", "b") for d in seen[p].device_vars().values()]
    assert len(share_ids) == 2 and share_ids[0] != share_ids[1]
    assert seen["c"].uuids() == {gpu["c"]["uuid"]}

    deadline = time.monotonic() + 60
    condition: dict[str, str] = {}
    while time.monotonic() < deadline:
        conditions = w.get(cluster, "pod", "-n", ns, "too-big")["status"].get("conditions", [])
        condition = next((c for c in conditions if c["type"] == "PodScheduled"), {})
        if condition.get("reason") == "Unschedulable":
            break
        time.sleep(1)
    assert condition.get("reason") == "Unschedulable", condition
    assert "claim" in condition["message"].lower(), condition["message"]

    expected = {gpu["a"]["uuid"]: ("80Gi", 2), gpu["c"]["uuid"]: ("40Gi", 1)}

    def allocations() -> dict[object, tuple[object, object]]:
        return {s["uuid"]: (s["allocatedMemory"], s["shares"]) for s in _ledger(installation).values()}

    deadline = time.monotonic() + 30
    while allocations() != expected and time.monotonic() < deadline:
        time.sleep(1)
    assert allocations() == expected
    table = cluster.kubectl("get", "gpus").stdout
    assert "ALLOCATED" in table and "80Gi" in table and "40Gi" in table, table


def _gpu_table(installation: Installation) -> dict[str, dict[str, str]]:
    """`kubectl get gpus -o wide`, each row by column name."""
    return w.gpu_table(installation.cluster, "-o", "wide")


def test_kubectl_get_gpus_shows_a_device_taint_rule_and_a_pod_lands_once_it_is_deleted(
    installation: Installation, ns: str
) -> None:
    cluster = installation.cluster
    rule = "e2e-maintenance"
    w.apply(
        cluster,
        ns,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceTaintRule",
            "metadata": {"name": rule},
            "spec": {
                "deviceSelector": {"driver": w.DEVICE_CLASS, "pool": cluster.node_name},  # every GPU of the node
                "taint": {"key": "example.com/maintenance", "value": "planned", "effect": "NoSchedule"},
            },
        },
    )
    try:
        tainted = {"TAINTS": "NoSchedule=1", "TAINTED-BY": "example.com/maintenance=planned:NoSchedule"}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            table = _gpu_table(installation)
            if table and all({k: r[k] for k in tainted} == tainted for r in table.values()):
                break
            time.sleep(1)
        assert table and all({k: r[k] for k in tainted} == tainted for r in table.values()), table
        assert all(r["FREE"] != "0" for r in table.values()), "free memory, and yet nothing lands: the column says why"
        w.apply(cluster, ns, w.claim_template("share-1gi", "1Gi"), w.gpu_pod("waits", "share-1gi"))
        deadline = time.monotonic() + 60
        condition: dict[str, str] = {}
        while time.monotonic() < deadline and condition.get("reason") != "Unschedulable":
            conditions = w.get(cluster, "pod", "-n", ns, "waits")["status"].get("conditions", [])
            condition = next((c for c in conditions if c["type"] == "PodScheduled"), {})
            time.sleep(1)
        assert condition.get("reason") == "Unschedulable", condition
    finally:
        cluster.kubectl("delete", "devicetaintrule", rule, "--ignore-not-found", "--wait=true")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(r["TAINTS"] for r in _gpu_table(installation).values()):
        time.sleep(1)
    assert {r["TAINTS"] for r in _gpu_table(installation).values()} == {""}, "blank: no taint"
    w.wait_running(cluster, ns, ["waits"])


def test_two_containers_of_one_pod_share_one_claim(installation: Installation, ns: str) -> None:
    cluster = installation.cluster
    w.apply(cluster, ns, w.claim_template("share-8gi", "8Gi"), w.gpu_pod("duo", "share-8gi", containers=2))
    w.wait_running(cluster, ns, ["duo"])
    first, second = (w.report(cluster, ns, "duo", c) for c in ("app0", "app1"))
    assert first.uuids() == second.uuids() and len(first.uuids()) == 1
    assert next(iter(first.uuids())).startswith("GPU-")
    assert first.nodes == second.nodes
    assert first.files == second.files and len(first.files) == 1


def test_deleting_pods_unprepares_and_frees_the_ledger(installation: Installation, ns: str) -> None:
    cluster = installation.cluster
    w.apply(
        cluster,
        ns,
        w.claim_template("share-20gi", "20Gi"),
        w.gpu_pod("p1", "share-20gi"),
        w.gpu_pod("p2", "share-20gi"),
    )
    w.wait_running(cluster, ns, ["p1", "p2"])
    uids = {w.claim_of(cluster, ns, p)["metadata"]["uid"] for p in ("p1", "p2")}
    specs = {p.name for p in Path(cluster.cdi_dir).glob("*.json")}
    assert all(any(uid in name for name in specs) for uid in uids)
    info_root = Path(cluster.kubelet_dir) / "plugins" / w.DEVICE_CLASS / "claim-info"
    assert all((info_root / uid / "gpu.json").is_file() for uid in uids)
    cluster.kubectl("delete", "pod", "-n", ns, "p1", "p2", "--wait=true", "--timeout=60s")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        left = [p.name for p in Path(cluster.cdi_dir).glob("*.json") if any(uid in p.name for uid in uids)]
        shares = sum(int(str(s["shares"])) for s in _ledger(installation).values())
        if not left and shares == 0:
            break
        time.sleep(1)
    assert not left, f"CDI specs left after unprepare: {left}"
    assert not [uid for uid in uids if (info_root / uid).exists()], "request files left after unprepare"
    assert all(s["allocatedMemory"] == "0" and s["shares"] == 0 for s in _ledger(installation).values()), _ledger(
        installation
    )


def test_a_glibc_container_runs_cuda_on_its_share(installation: Installation, ns: str) -> None:
    """driverEdits: toolkit against the node's faithful driver root, under plain runc (RuntimeClass `runc`: no
    NVIDIA runtime): a Debian image without any driver file gets libcuda and libnvidia-ml on its loader cache
    and nvidia-smi, and sees (the mocks enumerate only the GPUs whose device node the process can open)
    exactly its claim's GPU."""
    cluster = installation.cluster
    w.apply(
        cluster,
        ns,
        w.claim_template("share-40gi", "40Gi"),
        w.on_runtime(w.cuda_pod("cuda", "share-40gi", installation.workload_image), RUNC),
    )
    w.wait_running(cluster, ns, ["cuda"])
    seen = w.cuda_report(cluster, ns, "cuda")
    uuid = w.recorded_gpu(w.claim_of(cluster, ns, "cuda"))["uuid"]
    resolved = dict(line.split(" ", 1) for line in seen.get("LDCONFIG", []))
    assert sorted(resolved) == ["libcuda.so.1", "libnvidia-ml.so.1"], seen
    for name, path in resolved.items():  # the driver's LIBDIR; /lib is /usr/lib in Debian (merged /usr)
        assert path in (f"/usr/lib/x86_64-linux-gnu/{name}", f"/lib/x86_64-linux-gnu/{name}"), seen
    assert seen.get("SMI") == [f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {uuid})"], seen
    (probe_line,) = seen["PROBE"]
    probe = json.loads(probe_line)
    assert probe["device_count"] == 1 and [d["uuid"] for d in probe["devices"]] == [uuid], probe
    assert probe["devices"][0]["total_mib"] == 81920 and probe["devices"][0]["free_mib"] > 0, probe
    assert seen["ENV"] == ["NVIDIA_VISIBLE_DEVICES=void"]


def test_kubelet_restart_leaves_running_pods_alone(installation: Installation, ns: str) -> None:
    cluster = installation.cluster
    w.apply(cluster, ns, w.claim_template("share-5gi", "5Gi"), w.gpu_pod("steady", "share-5gi"))
    w.wait_running(cluster, ns, ["steady"])
    before = w.get(cluster, "pod", "-n", ns, "steady")["status"]["containerStatuses"][0]
    cluster.restart_kubelet()
    cluster.wait_node_ready(120)
    time.sleep(5)  # a kubelet restart re-prepares the claims of running pods
    after = w.get(cluster, "pod", "-n", ns, "steady")["status"]["containerStatuses"][0]
    assert after["containerID"] == before["containerID"]
    assert after["restartCount"] == 0 and "running" in after["state"]
    assert w.recorded_gpu(w.claim_of(cluster, ns, "steady"))["memory"] == "5Gi"


def test_a_deleted_plugin_pod_comes_back_and_serves(installation: Installation, ns: str) -> None:
    cluster = installation.cluster
    selector = "app.kubernetes.io/component=kubelet-plugin"
    old = w.get(cluster, "pods", "-n", NAMESPACE, "-l", selector)["items"][0]["metadata"]["uid"]
    cluster.kubectl("delete", "pod", "-n", NAMESPACE, "-l", selector, "--wait=true", "--timeout=60s")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pods = w.get(cluster, "pods", "-n", NAMESPACE, "-l", selector)["items"]
        ready = [
            p
            for p in pods
            if p["metadata"]["uid"] != old
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
        ]
        if ready:
            break
        time.sleep(1)
    assert ready, "the DaemonSet did not bring the plugin back"
    w.apply(cluster, ns, w.claim_template("share-3gi", "3Gi"), w.gpu_pod("after", "share-3gi"))
    w.wait_running(cluster, ns, ["after"])
    assert [d["MEMORY_LIMIT_MIB"] for d in w.report(cluster, ns, "after").device_vars().values()] == ["3072"]


def test_a_claim_with_a_bad_config_is_refused_at_admission(installation: Installation, ns: str) -> None:
    bad = w.claim_template(
        "bad-config", "1Gi", {"apiVersion": "fracgpu.dev/v1alpha1", "kind": "GpuConfig", "computeLimitPercent": 150}
    )
    result = installation.cluster.kubectl("apply", "-n", ns, "-f", "-", input_=json.dumps(bad), check=False)
    assert result.returncode != 0
    assert "computeLimitPercent" in result.stderr and "between 1 and 100" in result.stderr, result.stderr


def test_this_cgroup_v1_node_enforces_nothing_says_so_and_refuses_nvml_and_mps(
    installation: Installation, ns: str
) -> None:
    """Hybrid cgroup v1, no HAMi-core, no MPS GPU: GPUs publish memoryEnforcement none, a pod runs with tier none
    reported in its claim's status and env and no NVIDIA hook in its spec, and claims demanding nvml or mps each
    get a prepare error that names what the node lacks."""
    cluster = installation.cluster
    slices = w.get(cluster, "resourceslices")["items"]
    tiers = {d["attributes"]["memoryEnforcement"]["string"] for s in slices for d in s["spec"]["devices"]}
    assert tiers == {"none"}
    nvml = {"apiVersion": "fracgpu.dev/v1alpha1", "kind": "GpuConfig", "enforcement": "nvml"}
    w.apply(
        cluster,
        ns,
        w.claim_template("plain-2gi", "2Gi"),
        w.gpu_pod("plain", "plain-2gi"),
        w.claim_template("nvml-2gi", "2Gi", nvml),
        w.gpu_pod("strict", "nvml-2gi"),
        w.claim_template("mps-2gi", "2Gi", {**nvml, "enforcement": "mps", "computeLimitPercent": 30}),
        w.gpu_pod("mps", "mps-2gi"),
    )
    w.wait_running(cluster, ns, ["plain"])
    seen = w.report(cluster, ns, "plain")
    assert [v["ENFORCEMENT"] for v in seen.device_vars().values()] == ["none"]
    assert "NVIDIA_GPU_MEMORY_LIMIT" not in seen.env
    deadline = time.monotonic() + 60
    while w.recorded_gpu(w.claim_of(cluster, ns, "plain")).get("enforcement") != "none":
        assert time.monotonic() < deadline, w.claim_of(cluster, ns, "plain")["status"]
        time.sleep(1)
    deadline = time.monotonic() + 120
    for pod, tier, lacking in (
        ("strict", "nvml", "no cgroup v2 unified hierarchy at /sys/fs/cgroup"),
        ("mps", "mps", "it is not an MPS GPU (chart value mps.gpus, plugin flag --mps-gpus)"),
    ):
        message = ""
        while f"asks for enforcement '{tier}'" not in message:
            assert time.monotonic() < deadline, f"no prepare error for the {tier} claim; events: {message[-2000:]}"
            time.sleep(2)
            events = w.get(cluster, "events", "-n", ns, f"--field-selector=involvedObject.name={pod}")["items"]
            message = "\n".join(e.get("message", "") for e in events)
        assert lacking in message, message
        assert w.get(cluster, "pod", "-n", ns, pod)["status"].get("phase") == "Pending"


def test_an_admin_access_pod_reaches_a_busy_gpu_whole_and_unlimited(installation: Installation, ns: str) -> None:
    """A monitoring claim (`adminAccess: true`, `memory: 0`, in a namespace labelled for admin access) on the GPU a
    70Gi share holds: it runs there, with that GPU's device node, told it is admin access with the whole GPU's
    memory and tier none, and the claim's status records that it reserves nothing."""
    cluster = installation.cluster
    cluster.kubectl("label", "namespace", ns, "resource.kubernetes.io/admin-access=true")
    w.apply(cluster, ns, w.claim_template("share-70gi", "70Gi"), w.gpu_pod("busy", "share-70gi"))
    w.wait_running(cluster, ns, ["busy"])
    busy = w.recorded_gpu(w.claim_of(cluster, ns, "busy"))
    monitor = w.claim_template("monitor", "0")
    exactly = monitor["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    exactly["adminAccess"] = True
    exactly["selectors"] = [{"cel": {"expression": f'device.attributes["{w.DEVICE_CLASS}"].uuid == "{busy["uuid"]}"'}}]
    w.apply(cluster, ns, monitor, w.gpu_pod("monitor", "monitor"))
    w.wait_running(cluster, ns, ["monitor"])
    seen = w.report(cluster, ns, "monitor")
    (file,) = seen.files.values()
    (device,) = file["devices"]
    whole = to_bytes(busy["memoryTotal"]) // MiB
    assert (device["uuid"], device["adminAccess"], device["memoryMiB"], device["enforcement"], file["version"]) == (
        busy["uuid"],
        True,
        whole,
        "none",
        3,
    )
    own = seen.device_vars()[device["envPrefix"]]
    assert (own["ADMIN_ACCESS"], own["MEMORY_LIMIT_MIB"], own["ENFORCEMENT"]) == ("true", str(whole), "none")
    assert f"nvidia{_minor(busy['device'], installation)}" in seen.nodes
    recorded = w.recorded_gpu(w.claim_of(cluster, ns, "monitor"))
    assert (recorded["uuid"], recorded["memory"], recorded["adminAccess"]) == (busy["uuid"], "0", True)
