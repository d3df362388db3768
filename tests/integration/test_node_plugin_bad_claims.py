"""The node plugin against claims the real kube-apiserver stores but Python's `json` cannot decode (issue 9).

kube-apiserver limits opaque parameters to 10 KiB and keeps them byte for byte: nested arrays 5117 levels
deep and strings that are not UTF-8 are stored and served as sent. Such a claim must fail alone, with a
clear error, beside good claims of the same NodePrepareResources call. The module runs a control plane of
its own: other components of the session would meet these claims too.
"""

import functools
import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from api.kube_rest import JSON, RESOURCE_V1, claim_path
from harness import kube
from harness.nodeplugin import DRIVER
from kubelet_plugin.state import cdi
from tests.integration import own_plane
from tests.integration import test_node_plugin as node_plugin

pytestmark = pytest.mark.integration
# claims other components cannot decode stay out of the session's control plane
control_plane, api_client, dyn = own_plane.control_plane, own_plane.api_client, own_plane.dyn
plugin = node_plugin.plugin  # a plugin process and fake node of this module's own
Plugin = node_plugin.Plugin

MAX_PARAMETERS = 10 * 1024  # kube-apiserver's limit for opaque parameters
PLACEHOLDER = "__raw_parameters__"


def nested_arrays(depth: int) -> bytes:
    return b'{"a":' + b"[" * depth + b"]" * depth + b"}"


def nested_objects(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


def claim_body(name: str, parameters: bytes) -> bytes:
    """A ResourceClaim for 1Gi of a fracgpu GPU whose opaque parameters are the raw bytes `parameters`."""
    spec = kube.claim_template(name, DRIVER, "1Gi", config=PLACEHOLDER)["spec"]["spec"]
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name}, "spec": spec}
    return json.dumps(body, separators=(",", ":")).encode().replace(json.dumps(PLACEHOLDER).encode(), parameters)


def post_raw(api_client: client.ApiClient, path: str, body: bytes) -> tuple[int, bytes]:
    """POST `body` exactly as given (the client's serializers would re-encode it); status and answer."""
    answer = api_client.rest_client.pool_manager.request(
        "POST", api_client.configuration.host + path, body=body, headers={"Content-Type": JSON, "Accept": JSON}
    )
    return answer.status, answer.data


def get_raw(api_client: client.ApiClient, path: str) -> bytes:
    """GET `path`; the answer undecoded."""
    answer = api_client.rest_client.pool_manager.request(
        "GET", api_client.configuration.host + path, headers={"Accept": JSON}
    )
    assert answer.status == 200, (answer.status, answer.data[:300])
    data: bytes = answer.data
    return data


def read_claim(api_client: client.ApiClient, namespace: str, name: str, parameters: bytes) -> dict[str, Any]:
    """The claim, decoded after cutting out its opaque parameters (served byte for byte)."""
    data = get_raw(api_client, claim_path(namespace, name))
    assert parameters in data, "kube-apiserver serves opaque parameters as they were sent"
    decoded: dict[str, Any] = json.loads(data.replace(parameters, b"{}"))
    return decoded


def test_apiserver_stores_parameters_python_cannot_decode(api_client: client.ApiClient, namespace: str) -> None:
    """What kube-apiserver accepts: the bound the plugin's decoding must cope with."""
    path = f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaims"
    deepest = (MAX_PARAMETERS - len(nested_arrays(0))) // 2
    cases = {
        "arrays": (nested_arrays(deepest), nested_arrays(deepest + 1), RecursionError),
        "objects": (nested_objects(1706), nested_objects(1707), RecursionError),
    }
    for kind, (stored, refused, python_error) in cases.items():
        assert len(stored) <= MAX_PARAMETERS < len(refused)
        status, answer = post_raw(api_client, path, claim_body(f"deepest-{kind}", stored))
        assert status == 201, answer[:300]
        status, answer = post_raw(api_client, path, claim_body(f"too-big-{kind}", refused))
        assert status == 422 and b"may not be more than 10240 bytes" in answer, answer[:300]
        served = get_raw(api_client, claim_path(namespace, f"deepest-{kind}"))
        assert stored in served
        with pytest.raises(python_error):
            json.loads(served)
    assert deepest == 5117
    status, answer = post_raw(api_client, path, claim_body("not-utf8", b'{"a":"\xff"}'))
    assert status == 201, answer[:300]
    with pytest.raises(UnicodeDecodeError):
        json.loads(get_raw(api_client, claim_path(namespace, "not-utf8")))


def test_a_claim_that_cannot_be_decoded_fails_alone(
    plugin: Plugin, api_client: client.ApiClient, dyn: DynamicClient, namespace: str
) -> None:
    (good,) = kube.allocate_claims(api_client, dyn, namespace, plugin.node, device_class=DRIVER, memories=["1Gi"])
    bad = {"deep": nested_arrays(5117), "not-utf8": b'{"env":{"A":"\xff"}}'}
    core = client.CoreV1Api(api_client)
    for name, parameters in bad.items():
        status, answer = post_raw(
            api_client, f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaims", claim_body(name, parameters)
        )
        assert status == 201, answer[:300]
        core.create_namespaced_pod(namespace, kube.pod_with_claim(f"pod-{name}", None, plugin.node, {"gpu": name}))

    def allocated(name: str) -> dict[str, Any] | None:
        claim = read_claim(api_client, namespace, name, bad[name])
        return claim if (claim.get("status") or {}).get("allocation") else None

    claims = {name: kube.wait_for(functools.partial(allocated, name), 60, what=f"allocation of {name}") for name in bad}
    refs = [
        (namespace, c["metadata"]["uid"], c["metadata"]["name"]) for c in [claims["deep"], good, claims["not-utf8"]]
    ]
    response = plugin.kubelet.prepare(refs)
    errors = {name: response.claims[uid].error for _, uid, name in refs}
    assert errors[good["metadata"]["name"]] == ""
    assert len(response.claims[good["metadata"]["uid"]].devices) == 1
    assert errors["deep"].startswith(f"ResourceClaim {namespace}/deep cannot be read: ")
    assert "nested deeper than the JSON decoder's limit" in errors["deep"]
    assert "not valid UTF-8" in errors["not-utf8"]
    for name in bad:
        assert "delete the claim and create it again" in errors[name]
        uid = claims[name]["metadata"]["uid"]
        assert not response.claims[uid].devices
        assert not cdi.spec_path(plugin.process.cdi_dir, DRIVER, uid).exists()
    checkpoint = json.loads(plugin.process.checkpoint.read_text())
    assert set(checkpoint["claims"]) == {good["metadata"]["uid"]}
    done = plugin.kubelet.unprepare(refs)
    assert all(r.error == "" for r in done.claims.values())
