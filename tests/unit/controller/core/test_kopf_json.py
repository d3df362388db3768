"""Unit tests of controller/core/kopf_json.py: kopf's own list, watch and webhook code on deep documents.

These fail when kopf's decoding sites change (an upgrade must not silently undo the bounded decoder):
the call sites are compared with the known list, and kopf's real `kopf_api.get`/`kopf_api.stream` and webhook
server are run against a local HTTP server.
"""

import asyncio
import inspect
import json
import logging
import re
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any, cast

import aiohttp
import aiohttp.web
import kopf
import pytest
from kopf._cogs.clients import api as kopf_api
from kopf._cogs.clients import auth
from kopf._cogs.structs import credentials
from kopf._kits import webhooks as kopf_webhooks
from prometheus_client import REGISTRY

from api.bounded_json import Skipped
from controller.admission.webhook import WebhookServer
from controller.core import kopf_json, metrics

DEEP = "[" * 5000 + "]" * 5000
CLAIM = '{"kind":"ResourceClaim","metadata":{"name":"deep","namespace":"ns","uid":"u1"},"spec":{"p":' + DEEP + "}}"
NOT_UTF8 = b'{"kind":"ResourceClaim","metadata":{"name":"bytes","namespace":"ns","uid":"u3"},"spec":{"p":"\xff"}}'
GOOD = '{"kind":"ResourceClaim","metadata":{"name":"good","namespace":"ns","uid":"u2"},"spec":{"p":[1]}}'

# every place kopf decodes JSON (file, code); a new one must be checked and added to kopf_json
KNOWN_DECODE_SITES = {
    ("_cogs/clients/api.py", "return await response.json()"),  # get (replaced), post, patch, delete
    ("_cogs/clients/api.py", "yield json.loads(line.decode('utf-8'))"),  # watch stream (json replaced)
    ("_cogs/clients/errors.py", "payload = await response.json()"),  # error Status bodies
    ("_cogs/configs/progress.py", "decoded = json.loads(encoded) if encoded is not None else None"),  # own
    ("_cogs/configs/diffbase.py", "decoded = json.loads(encoded) if encoded is not None else None"),  # annotations
    (
        "_cogs/configs/diffbase.py",
        "essence: bodies.BodyEssence | None = json.loads(encoded) if encoded is not None else None",
    ),
    ("_kits/webhooks.py", "data = json.loads(text)"),  # admission requests (json replaced)
}


def _decode_sites() -> set[tuple[str, str]]:
    root = Path(kopf.__file__).parent
    sites = set()
    for path in root.rglob("*.py"):
        for line in path.read_text().splitlines():
            if re.search(r"json\.loads?\(|\.json\(\)", line) and not line.strip().startswith("#"):
                sites.add((str(path.relative_to(root)), line.strip()))
    return sites


def test_kopf_decodes_json_where_kopf_json_expects() -> None:
    assert _decode_sites() == KNOWN_DECODE_SITES
    for module in (kopf_api, kopf_webhooks):
        assert getattr(module, "json", None) in (json, kopf_json.BoundedJson), module
    assert "json.loads(line.decode('utf-8'))" in inspect.getsource(kopf_api.stream)
    assert "json.loads(text)" in inspect.getsource(kopf_webhooks.WebhookServer._serve)

    # kopf_json.get repeats kopf's get: same parameters, and kopf's get still reads as it did
    def parameters(fn: Any) -> list[tuple[str, Any, Any]]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    assert parameters(kopf_json.get) == parameters(kopf_json.ORIGINAL_GET)
    source = inspect.getsource(kopf_json.ORIGINAL_GET)
    body = re.sub(r"\s+", " ", source[source.index("response = await request(") :])
    assert body.strip() == (
        "response = await request( method='get', url=url, payload=payload, headers=headers, timeout=timeout, "
        "settings=settings, logger=logger, ) async with response: return await response.json()"
    )


@pytest.fixture
def patched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kopf_api, "json", json)
    monkeypatch.setattr(kopf_webhooks, "json", json)
    monkeypatch.setattr(kopf_api, "get", kopf_json.ORIGINAL_GET)
    monkeypatch.setattr(kopf_api, "iter_jsonlines", kopf_json.ORIGINAL_ITER_JSONLINES)
    kopf_json.install()
    assert kopf_json.installed()


@pytest.fixture
def unpatched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kopf_api, "json", json)
    monkeypatch.setattr(kopf_webhooks, "json", json)
    monkeypatch.setattr(kopf_api, "get", kopf_json.ORIGINAL_GET)
    monkeypatch.setattr(kopf_api, "iter_jsonlines", kopf_json.ORIGINAL_ITER_JSONLINES)
    assert not kopf_json.installed()


async def _api_server() -> AsyncGenerator[str, None]:
    async def listing(request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        if request.query.get("watch") == "true":
            out = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
            await out.prepare(request)
            for obj in (CLAIM.encode(), NOT_UTF8, GOOD.encode()):
                await out.write(b'{"type":"ADDED","object":' + obj + b"}\n")
            await out.write_eof()
            return out
        body = b'{"kind":"ResourceClaimList","metadata":{"resourceVersion":"1"},"items":['
        body += CLAIM.encode() + b"," + NOT_UTF8 + b"," + GOOD.encode() + b"]}"
        return aiohttp.web.Response(body=body, content_type="application/json")

    app = aiohttp.web.Application()
    app.router.add_get("/claims", listing)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def _list_and_watch() -> tuple[Any, list[Any]]:
    servers = _api_server()
    server = await servers.__anext__()
    auth.vault_var.set(credentials.Vault({"test": credentials.ConnectionInfo(server=server)}))
    settings = kopf.OperatorSettings()
    logger = logging.getLogger("test")
    try:
        listed = await kopf_api.get("/claims", settings=settings, logger=logger)
        watched = [e async for e in kopf_api.stream("/claims?watch=true", settings=settings, logger=logger)]
    finally:
        await servers.aclose()
    return listed, watched


def _skipped(resource: str, reason: str = "deep") -> float:
    return (
        REGISTRY.get_sample_value(metrics.OBJECTS_SKIPPED._name + "_total", {"resource": resource, "reason": reason})
        or 0.0
    )


def test_without_it_kopf_list_and_watch_die_on_a_deep_object(unpatched: None) -> None:
    with pytest.raises((RecursionError, UnicodeDecodeError)):
        asyncio.run(_list_and_watch())


def test_without_it_kopf_watch_dies_on_bytes_that_are_not_utf8(
    unpatched: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kopf_api, "json", kopf_json.BoundedJson)  # the deep object alone is handled
    monkeypatch.setattr(kopf_api, "get", kopf_json.get)
    with pytest.raises(UnicodeDecodeError):
        asyncio.run(_list_and_watch())


def test_kopf_lists_and_watches_deep_objects_with_the_deep_part_skipped_and_reported(
    patched: None, caplog: pytest.LogCaptureFixture
) -> None:
    before = _skipped("ResourceClaim")
    before_bytes = _skipped("ResourceClaim", kopf_json.REASON_NOT_UTF8)
    with caplog.at_level(logging.WARNING, logger="controller.core.kopf_json"):
        listed, watched = asyncio.run(_list_and_watch())
    deep, odd, good = listed["items"]
    assert deep["metadata"] == {"name": "deep", "namespace": "ns", "uid": "u1"}
    assert isinstance(deep["spec"]["p"][0][0], list)
    assert odd["spec"] == {"p": "\ufffd"}
    assert good == json.loads(GOOD)
    assert [e["object"]["metadata"]["name"] for e in watched] == ["deep", "bytes", "good"]
    assert watched[1]["object"]["spec"] == {"p": "\ufffd"}
    assert watched[2]["object"] == json.loads(GOOD)
    assert _skipped("ResourceClaim") == before + 2, "one per object read: the listed one and the watched one"
    assert _skipped("ResourceClaim", kopf_json.REASON_NOT_UTF8) == before_bytes + 2
    messages = [r for r in caplog.records if r.name == "controller.core.kopf_json" and "skipped" in r.__dict__]
    assert len(messages) == 2
    assert all(r.__dict__["object"] == "ResourceClaim ns/deep" for r in messages)
    assert "spec.p[0][0][0][0][0][0]... (90 more levels)" in messages[0].__dict__["skipped"]


async def _admission(
    fn: Any, obj: bytes = CLAIM.encode(), server_class: type = kopf_webhooks.WebhookServer
) -> tuple[int, Any]:
    server = server_class(addr="127.0.0.1", port=0, insecure=True)
    configs = cast(AsyncGenerator[kopf.WebhookClientConfig, None], server(fn))
    config = await configs.__anext__()
    review = (
        b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"r1","object":' + obj + b"}}"
    )
    try:
        async with aiohttp.ClientSession() as session, session.post(f"{config['url']}/x", data=review) as answer:
            return answer.status, await answer.json() if answer.status == 200 else None
    finally:
        await configs.aclose()


def test_the_webhook_server_hands_deep_requests_to_the_handler(patched: None) -> None:
    seen: list[Any] = []

    async def fn(data: Any, **_: Any) -> dict[str, Any]:
        seen.append(data)
        return {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": "r1", "allowed": False},
        }

    status, answer = asyncio.run(_admission(fn))
    assert status == 200 and answer["response"]["allowed"] is False
    [data] = seen
    assert data["request"]["object"]["metadata"]["name"] == "deep"
    assert any(isinstance(v, Skipped) for v in _walk(data["request"]["object"]["spec"]))


def test_without_it_the_webhook_answers_500(unpatched: None) -> None:
    async def fn(data: Any, **_: Any) -> dict[str, Any]:
        raise AssertionError("never called")

    status, _ = asyncio.run(_admission(fn))
    assert status == 500


def _walk(value: Any) -> Iterator[Any]:
    stack = [value]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            stack.extend(node.values())


def test_our_webhook_server_reviews_a_claim_with_bytes_that_are_not_utf8(patched: None) -> None:
    """The API server sends a claim's bytes as stored; kopf's own server answers 500 (`request.text()`
    raises), ours hands the review to the handler with the bytes read as U+FFFD."""
    seen: list[Any] = []

    async def fn(data: Any, **_: Any) -> dict[str, Any]:
        seen.append(data)
        return {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": "r1", "allowed": True},
        }

    status, _ = asyncio.run(_admission(fn, NOT_UTF8))
    assert status == 500 and not seen
    before = _skipped("ResourceClaim", kopf_json.REASON_NOT_UTF8)
    status, answer = asyncio.run(_admission(fn, NOT_UTF8, WebhookServer))
    assert status == 200 and answer["response"]["allowed"] is True
    assert seen[0]["request"]["object"]["spec"] == {"p": "\ufffd"}
    assert _skipped("ResourceClaim", kopf_json.REASON_NOT_UTF8) == before + 1
