"""A refused claim is logged once, by the controller, not echoed as an error by kopf (controller/admission/webhook.py
`refuse`, `is_refusal_echo`; controller/__main__.py `KopfRecordFilter`): reviews sent over HTTPS to our webhook
server running kopf's own admission handling with the controller's real handlers."""

import asyncio
import base64
import functools
import http.client
import json
import logging
import ssl
import urllib.parse
from typing import Any

import kopf
import pytest
from kopf._cogs.structs.ephemera import AnyMemo
from kopf._cogs.structs.references import Insights, Resource
from kopf._core.engines.admission import serve_admission_request
from kopf._core.engines.indexing import OperatorIndexers
from kopf._core.reactor.inventory import ResourceMemories

from api.names import DEVICE_CLASS_NAME
from controller import handlers
from controller.__main__ import KopfRecordFilter
from controller.admission.webhook import WebhookServer
from controller.admission.webhook_config import CLAIMS
from controller.core.settings import Settings
from controller.loops import Controller
from tests.unit.controller_factories import FakeWriter


def review(uid: str, memory: str) -> dict[str, Any]:
    """An AdmissionReview of a claim asking `memory` of our DeviceClass, as kube-apiserver sends it."""
    request = {"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS_NAME}}
    request["exactly"]["capacity"] = {"requests": {"memory": memory}}  # type: ignore[index]
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"c-{uid}", "namespace": "ns", "uid": uid},
        "spec": {"devices": {"requests": [request]}},
    }
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "resource": {"group": CLAIMS.group, "version": CLAIMS.version, "resource": CLAIMS.plural},
            "operation": "CREATE",
            "userInfo": {"username": "someone"},
            "object": claim,
            "dryRun": False,
        },
    }


def serve(reviews: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Send `reviews` in turn over one kept-alive connection to the controller's webhook; their responses."""
    settings = Settings()
    registry = kopf.OperatorRegistry()
    handlers.register(registry, settings, Controller(settings, FakeWriter()))
    insights = Insights()
    insights.webhook_resources.add(Resource(CLAIMS.group, CLAIMS.version, CLAIMS.plural, namespaced=True))
    fn = functools.partial(
        serve_admission_request,
        settings=kopf.OperatorSettings(),
        memories=ResourceMemories(),
        memobase=AnyMemo(kopf.Memo()),
        registry=registry,
        insights=insights,
        indices=OperatorIndexers().indices,
    )
    server = WebhookServer(addr="127.0.0.1", port=0, host="127.0.0.1")

    async def main() -> list[dict[str, Any]]:
        configs = server(fn)
        config: dict[str, Any] = dict(await anext(configs))
        try:
            context = ssl.create_default_context(cadata=base64.b64decode(config["caBundle"]).decode())

            def post_all() -> list[dict[str, Any]]:
                url = urllib.parse.urlsplit(config["url"])
                connection = http.client.HTTPSConnection(url.hostname or "", url.port, context=context, timeout=10)
                answers = []
                for body in reviews:
                    connection.request("POST", f"/{CLAIMS.id}", json.dumps(body), {"Content-Type": "application/json"})
                    answers.append(json.loads(connection.getresponse().read())["response"])
                connection.close()
                return answers

            return await asyncio.to_thread(post_all)
        finally:
            await configs.aclose()  # type: ignore[attr-defined]  # an async generator underneath

    return asyncio.run(main())


def test_kopfs_echo_of_a_refusal_is_dropped_and_the_next_review_on_the_connection_logs_as_usual(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.handler.addFilter(KopfRecordFilter())
    with caplog.at_level(logging.INFO):
        refused, allowed = serve([review("u1", "banana"), review("u2", "10Gi")])
    assert refused["allowed"] is False and refused["status"]["code"] == 422
    assert "banana" in refused["status"]["message"]
    assert allowed["allowed"] is True
    ours = [r for r in caplog.records if r.name == "controller.handlers" and r.getMessage() == "admission refused"]
    assert len(ours) == 1, "the controller logs the refusal itself, once"
    assert not [r for r in caplog.records if r.name == "kopf.objects" and r.levelno >= logging.ERROR], (
        "kopf's echo of the refusal is dropped"
    )


def test_a_kopf_error_outside_a_refusal_is_kept() -> None:
    record = logging.LogRecord("kopf.objects", logging.ERROR, __file__, 1, "Handler 'x' failed", None, None)
    assert KopfRecordFilter().filter(record)
    other = logging.LogRecord(
        "kopf.objects", logging.ERROR, __file__, 1, "Webhook 'x' failed permanently: y", None, None
    )
    assert KopfRecordFilter().filter(other), "decided by what is being served, not by what the text says"
