"""Unit tests of the webhook server's self-signed certificate and client config (controller/admission/webhook.py) and
of the registration of its webhooks in the chart-made configuration (controller/admission/webhook_config.py)."""

import asyncio
import base64
import copy
import json
import logging
import ssl
import threading
import urllib.request
from pathlib import Path
from typing import Any, cast

import kopf
import pytest
from cryptography import x509

from api.kube_errors import api_error
from api.names import DRIVER_NAME
from controller.admission.canonical import canonical_json, canonical_review
from controller.admission.certificate import SharedCertificate, self_signed_certificate
from controller.admission.webhook import WebhookServer
from controller.admission.webhook_config import CANONICAL_CLAIMS, CONFIGS, MERGE, VALIDATED, Registration, webhooks
from controller.core import metrics
from tests.unit.fake_objects import FakeObjects


def test_certificate_covers_names_and_ips_but_not_unspecified_addresses() -> None:
    cert_pem, key_pem = self_signed_certificate(["svc.ns.svc", "127.0.0.1", "0.0.0.0", "svc.ns.svc"])
    cert = x509.load_pem_x509_certificate(cert_pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["svc.ns.svc"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert cert.subject.rfc4514_string() == "CN=svc.ns.svc"
    assert b"PRIVATE KEY" in key_pem and b"ENCRYPTED" not in key_pem
    _, encrypted = self_signed_certificate(["127.0.0.1"], password="secret")
    assert b"ENCRYPTED" in encrypted


def _serve_once(
    server: WebhookServer, request: dict[str, Any], path: str = "handler"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Start the server, POST one admission review to `path` over TLS trusting only its CA bundle; (config,
    answer). Its kopf handling answers with the review's `uid` and the webhook (path) it was called for."""

    async def fn(data: Any, *, webhook: str | None = None, **_: Any) -> Any:
        return {"echo": data["uid"], "webhook": webhook}

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        configs = server(fn)  # type: ignore[arg-type]
        config: dict[str, Any] = dict(await anext(configs))
        try:
            context = ssl.create_default_context(cadata=base64.b64decode(config["caBundle"]).decode())
            url = f"https://127.0.0.1:{server.port}/{path}"
            req = urllib.request.Request(url, data=json.dumps(request).encode(), method="POST")

            def post() -> dict[str, Any]:
                with urllib.request.urlopen(req, context=context, timeout=5) as resp:
                    answer: dict[str, Any] = json.loads(resp.read())
                    return answer

            return config, await asyncio.to_thread(post)
        finally:
            await configs.aclose()  # type: ignore[attr-defined]  # an async generator underneath

    return asyncio.run(main())


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_server_serves_tls_with_the_ca_it_registers_by_url() -> None:
    port = _free_port()
    config, answer = _serve_once(WebhookServer(addr="127.0.0.1", port=port), {"uid": "u1"})
    assert config["url"] == f"https://127.0.0.1:{port}"
    assert answer == {"echo": "u1", "webhook": "handler"}


def test_the_server_of_a_driver_answers_the_canonical_webhook_itself_and_the_rest_through_kopf() -> None:
    parameters = {"kind": "GpuConfig", "apiVersion": "fracgpu.dev/v1alpha1", "enforcement": "nvml"}
    config = {"requests": ["gpu"], "opaque": {"driver": DRIVER_NAME, "parameters": parameters}}
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "uid": "u3",  # where the stand-in kopf handling reads it
        "request": {"uid": "r3", "object": {"spec": {"devices": {"config": [config]}}}},
    }
    server = WebhookServer(addr="127.0.0.1", port=_free_port(), driver=DRIVER_NAME)
    _, answer = _serve_once(server, review, CANONICAL_CLAIMS.id)
    assert answer == canonical_review(review, DRIVER_NAME)
    patch = base64.b64decode(answer["response"]["patch"]).decode()
    assert json.loads(patch)[0]["value"] == parameters and canonical_json(parameters) in patch
    _, other = _serve_once(WebhookServer(addr="127.0.0.1", port=_free_port(), driver=DRIVER_NAME), review, "x")
    assert other == {"echo": "u3", "webhook": "x"}
    _, without = _serve_once(WebhookServer(addr="127.0.0.1", port=_free_port()), review, CANONICAL_CLAIMS.id)
    assert without == {"echo": "u3", "webhook": CANONICAL_CLAIMS.id}, "no driver: nothing answered apart"


def _reviews_timed() -> float:
    return next(s.value for m in metrics.ADMISSION_SECONDS.collect() for s in m.samples if s.name.endswith("_count"))


def test_each_review_served_is_timed_into_the_webhooks_own_histogram() -> None:
    before = _reviews_timed()
    _, answer = _serve_once(WebhookServer(addr="127.0.0.1", port=_free_port()), {"uid": "u2"})
    assert answer == {"echo": "u2", "webhook": "handler"}
    assert _reviews_timed() == before + 1


def test_server_registers_a_service_reference_when_asked() -> None:
    port = _free_port()
    server = WebhookServer(
        addr="127.0.0.1",
        port=port,
        extra_sans=["127.0.0.1"],
        host="hook.sys.svc",
        service=("sys", "hook"),
        service_port=443,
    )
    config, answer = _serve_once(server, {"uid": "u2"})
    assert "url" not in config
    assert config["service"] == {"namespace": "sys", "name": "hook", "port": 443}
    cert = x509.load_pem_x509_certificate(base64.b64decode(config["caBundle"]))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert names == ["hook.sys.svc"]
    assert answer == {"echo": "u2", "webhook": "handler"}


class FakeConfigurations:
    """`KubeRest.request` for a caller whose only rights are GET and PATCH of ValidatingWebhookConfigurations
    (as the controller's ClusterRole): a merge patch replaces `webhooks` of an existing object, a missing one
    is 404, anything else is 403."""

    def __init__(self, *names: str) -> None:
        self.objects: dict[str, dict[str, Any]] = {n: {"metadata": {"name": n}} for n in names}
        self.patches: list[tuple[str, Any]] = []
        self.gets = 0

    def request(self, method: str, path: str, query: Any = None, *, body: Any = None, content_type: str = "") -> Any:
        name = path.removeprefix(f"{CONFIGS}/")
        if "/" in name or not (method == "GET" or (method == "PATCH" and content_type == MERGE)):
            raise api_error(403, "Forbidden")
        if method == "GET":
            self.gets += 1
        else:
            self.patches.append((name, body))
        if name not in self.objects:
            raise api_error(404, "Not Found")
        if method == "PATCH":
            self.objects[name] |= body
        return copy.deepcopy(self.objects[name])


def test_webhooks_are_laid_out_as_kopf_lays_them_out() -> None:
    """kopf's server routes `/<handler id>`: the configuration must call exactly what kopf's own manager
    would register for the controller's handlers."""
    from kopf._cogs.structs.references import Resource
    from kopf._core.engines.admission import build_webhooks

    from controller import handlers
    from controller.core.settings import Settings
    from controller.loops import Controller

    registry = kopf.OperatorRegistry()
    handlers.register(registry, Settings(), Controller.__new__(Controller))
    resources = [Resource(v.group, v.version, v.plural) for v in VALIDATED]
    for config in (
        kopf.WebhookClientConfig(url="https://127.0.0.1:9443", caBundle="Q0E="),
        kopf.WebhookClientConfig(service={"namespace": "sys", "name": "hook", "port": 443}, caBundle="Q0E="),
    ):
        theirs = build_webhooks(
            registry._webhooks.get_all_handlers(), resources=resources, name_suffix="hooks", client_config=config
        )
        expected = [{k: v for k, v in hook.items() if v is not None} for hook in theirs]
        assert webhooks("hooks", config, fail=True) == expected
    ignore = webhooks("hooks", kopf.WebhookClientConfig(url="https://h"), fail=False)
    assert [h["failurePolicy"] for h in ignore] == ["Ignore", "Ignore"]
    assert [h["clientConfig"]["url"] for h in ignore] == [
        "https://h/resourceclaims",
        "https://h/resourceclaimtemplates",
    ]


def test_registration_patches_the_existing_configuration_and_retries_while_it_is_missing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeConfigurations()
    registration = Registration(fake, "hooks", fail=False, retry=(0.01, 0.02))  # type: ignore[arg-type]
    config = kopf.WebhookClientConfig(url="https://127.0.0.1:9443", caBundle="Q0E=")

    async def main() -> None:
        task = asyncio.create_task(registration.register(config))
        while len(fake.patches) < 3:
            await asyncio.sleep(0.01)
        assert not task.done() and not registration.registered  # missing: it keeps trying, never creates
        fake.objects["hooks"] = {"metadata": {"name": "hooks"}}  # e.g. `helm upgrade` restored it
        await asyncio.wait_for(task, 5)

    with caplog.at_level(logging.ERROR, logger="controller.admission.webhook_config"):
        asyncio.run(main())
    assert registration.registered
    assert fake.objects["hooks"]["webhooks"] == webhooks("hooks", config, fail=False)
    assert {name for name, _ in fake.patches} == {"hooks"}
    problems = [r.problem for r in caplog.records]  # type: ignore[attr-defined]
    assert problems and all("ValidatingWebhookConfiguration hooks does not exist" in p for p in problems)
    assert "helm upgrade" in problems[0]

    asyncio.run(registration.unregister())
    assert fake.objects["hooks"]["webhooks"] == [] and not registration.registered


def test_kept_webhooks_are_put_back_when_removed_and_left_alone_when_present_but_different(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a replica of an older release empties the configuration at its exit during `helm upgrade`; another
    # replica mid-rotation rightly registers a different CA bundle
    fake = FakeConfigurations("hooks")
    registration = Registration(fake, "hooks", fail=False, check_seconds=0.01)  # type: ignore[arg-type]
    config = kopf.WebhookClientConfig(url="https://127.0.0.1:9443", caBundle="Q0E=")
    ours = webhooks("hooks", config, fail=False)

    async def checks(n: int) -> None:
        start = fake.gets
        while fake.gets < start + n:
            await asyncio.sleep(0.005)

    async def main() -> None:
        task = asyncio.create_task(registration.keep(config))
        await checks(2)
        assert fake.patches == [("hooks", {"webhooks": ours})]  # present: no further writes
        fake.objects["hooks"]["webhooks"] = []  # emptied by someone else
        await checks(2)
        assert fake.objects["hooks"]["webhooks"] == ours and len(fake.patches) == 2
        other = webhooks(
            "hooks", kopf.WebhookClientConfig(url="https://127.0.0.1:9443", caBundle="T1RIRVI="), fail=False
        )
        fake.objects["hooks"]["webhooks"] = other
        await checks(3)
        assert fake.objects["hooks"]["webhooks"] == other and len(fake.patches) == 2
        fake.objects["hooks"]["webhooks"] = other[:1]  # one of ours missing: all of ours go back
        await checks(2)
        assert fake.objects["hooks"]["webhooks"] == ours
        del fake.objects["hooks"]  # deleted: logged, checked again, never created
        await checks(2)
        assert not task.done()
        task.cancel()
        await asyncio.wait([task])

    with caplog.at_level(logging.WARNING, logger="controller.admission.webhook_config"):
        asyncio.run(main())
    put_back = [r for r in caplog.records if r.getMessage().startswith("admission webhooks were removed")]
    assert [r.missing for r in put_back] == [[h["name"] for h in ours], [ours[1]["name"]]]  # type: ignore[attr-defined]
    failed = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert failed and "ValidatingWebhookConfiguration hooks does not exist" in failed[0].problem  # type: ignore[attr-defined]
    assert "hooks" not in fake.objects


def test_server_registers_its_client_config_and_unregisters_when_it_stops() -> None:
    fake = FakeConfigurations("hooks")
    registration = Registration(fake, "hooks", fail=True)  # type: ignore[arg-type]
    port = _free_port()
    config, answer = _serve_once(WebhookServer(addr="127.0.0.1", port=port, registration=registration), {"uid": "u3"})
    assert answer == {"echo": "u3", "webhook": "handler"}
    registered = [body["webhooks"] for _, body in fake.patches if body["webhooks"]]
    assert registered == [webhooks("hooks", cast(kopf.WebhookClientConfig, config), fail=True)]
    assert registered[0][0]["clientConfig"]["caBundle"] == config["caBundle"]
    assert fake.patches[-1] == ("hooks", {"webhooks": []})  # emptied at the end


def test_reviews_are_served_while_the_main_event_loop_is_busy() -> None:
    # the server has its own thread and loop: a main loop busy with watch events does not hold reviews up
    port = _free_port()
    server = WebhookServer(addr="127.0.0.1", port=port)
    served_on: list[int] = []

    async def fn(data: Any, **_: Any) -> Any:
        served_on.append(threading.get_ident())
        return {"echo": data["uid"]}

    async def main() -> bool:
        configs = server(fn)  # type: ignore[arg-type]
        config: dict[str, Any] = dict(await anext(configs))
        context = ssl.create_default_context(cadata=base64.b64decode(config["caBundle"]).decode())
        req = urllib.request.Request(
            f"https://127.0.0.1:{port}/handler", data=json.dumps({"uid": "u9"}).encode(), method="POST"
        )
        answered = threading.Event()

        def post() -> None:
            with urllib.request.urlopen(req, context=context, timeout=5) as resp:
                if json.loads(resp.read()) == {"echo": "u9"}:
                    answered.set()

        threading.Thread(target=post, daemon=True).start()
        try:
            return answered.wait(5)  # blocks the main loop on purpose
        finally:
            await configs.aclose()  # type: ignore[attr-defined]

    assert asyncio.run(main()), "no answer while the main loop was blocked"
    assert served_on and served_on[0] != threading.get_ident()


def test_a_replica_on_the_shared_certificate_leaves_the_configuration_registered_when_it_stops(
    tmp_path: Path,
) -> None:
    # the other replicas serve the same CA bundle behind the same Service: emptying the webhooks at one
    # replica's exit would switch admission off for all of them
    fake = FakeConfigurations("hooks")
    shared = SharedCertificate(FakeObjects(), "ns", "cert", ["127.0.0.1"], tmp_path)
    shared.sync()
    assert shared.current is not None
    server = WebhookServer(
        addr="127.0.0.1",
        port=_free_port(),
        registration=Registration(fake, "hooks", fail=True),  # type: ignore[arg-type]
        shared=shared,
    )
    config, answer = _serve_once(server, {"uid": "u4"})
    assert answer == {"echo": "u4", "webhook": "handler"}
    assert base64.b64decode(config["caBundle"]) == shared.current.bundle
    assert fake.patches and all(body["webhooks"] for _, body in fake.patches), "emptied at the end"


def test_a_replica_on_a_certificate_from_files_leaves_the_configuration_registered_when_it_stops(
    tmp_path: Path,
) -> None:
    # --webhook-cert-dir: the chart mounts one Secret (certSecretName) in every replica, which serve the same CA
    # bundle; emptying the webhooks at one replica's exit in a rollout would open the ones that fail closed
    cert, key = self_signed_certificate(["127.0.0.1"])
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    fake = FakeConfigurations("hooks")
    server = WebhookServer(
        addr="127.0.0.1",
        port=_free_port(),
        host="127.0.0.1",
        certfile=tmp_path / "tls.crt",
        pkeyfile=tmp_path / "tls.key",
        registration=Registration(fake, "hooks", fail=False),  # type: ignore[arg-type]
    )
    config, answer = _serve_once(server, {"uid": "u5"})
    assert answer == {"echo": "u5", "webhook": "handler"} and base64.b64decode(config["caBundle"]) == cert
    assert fake.patches and all(body["webhooks"] for _, body in fake.patches), "emptied at the end"
