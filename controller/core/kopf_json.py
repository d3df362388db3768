"""kopf decodes with `api.bounded_json`: no object the API server stores can stop a watch or the webhook.

kopf parses API answers with the standard `json` module in three places (kopf 1.45): the watch stream
(`kopf._cogs.clients.api.stream`: `json.loads` per line), lists and other GETs (`kopf_api.get`:
`response.json()`) and admission requests (`kopf._kits.webhooks.WebhookServer._serve`: `json.loads`).
A claim nested a few thousand levels deep makes each raise `RecursionError`: the watch dies, the operator
exits, and does so again after every restart. `install()` replaces the `json` name of those two kopf
modules, and `kopf_api.get`, with versions that decode through `api.bounded_json` (subtrees deeper than
`MAX_DEPTH` and unconvertible integers become `Skipped` markers; the rest, metadata included, is kept);
bytes that are not UTF-8 (stored and served as sent) are read as U+FFFD, in the watch stream too (kopf's
`iter_jsonlines` is wrapped: kopf decodes each line as UTF-8 itself). Every such object is reported: a warning
log line and `fracgpu_controller_objects_skipped_total{resource,reason}`.

These are kopf internals: tests/unit/controller/core/test_kopf_json.py fails when kopf's decoding sites change, so an
upgrade cannot silently undo this.
"""

import json
import logging
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

import aiohttp
from kopf._cogs.clients import api as kopf_api
from kopf._kits import webhooks as kopf_webhooks

from api import bounded_json
from controller.core import metrics

log = logging.getLogger(__name__)

REASON_NOT_UTF8 = "not-utf8"
SHOWN_PARTS = 5
"""Skipped parts named per object in a log line."""


def _objects(doc: Any) -> Iterable[tuple[str, Mapping[str, Any]]]:
    """(kind, object) of each Kubernetes object in a decoded answer: a watch event, a list, an admission
    review or a single object."""
    if not isinstance(doc, dict):
        return []
    if isinstance(doc.get("object"), dict) and "type" in doc:  # watch event
        return [(str(doc["object"].get("kind", "")), doc["object"])]
    if isinstance(doc.get("items"), list):  # list: items carry no kind of their own
        kind = str(doc.get("kind", "")).removesuffix("List")
        return [(str(i.get("kind", kind)), i) for i in doc["items"] if isinstance(i, dict)]
    request = doc.get("request")
    if doc.get("kind") == "AdmissionReview" and isinstance(request, dict):
        objects = [request.get("object"), request.get("oldObject")]
        return [(str(o.get("kind", "")), o) for o in objects if isinstance(o, dict)]
    return [(str(doc.get("kind", "")), doc)]


def report(doc: Any) -> None:
    """Log and count each object of `doc` that has skipped parts (once per object and reason)."""
    for kind, obj in _objects(doc):
        parts = list(bounded_json.skipped_parts(obj))
        if not parts:
            continue
        meta = obj.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        reasons = sorted({marker.reason for _, marker in parts})
        for reason in reasons:
            metrics.OBJECTS_SKIPPED.labels(kind or "unknown", reason).inc()
        shown = "; ".join(f"{bounded_json.short_path(p)}: {m}" for p, m in parts[:SHOWN_PARTS])
        more = f"; and {len(parts) - SHOWN_PARTS} more" if len(parts) > SHOWN_PARTS else ""
        log.warning(
            "object has parts that cannot be decoded safely; they are skipped, the rest is handled",
            extra={
                "object": f"{kind} {meta.get('namespace') or ''}/{meta.get('name') or ''}",
                "uid": meta.get("uid"),
                "skipped": shown + more,
            },
        )


def report_not_utf8(doc: Any) -> None:
    """Log and count each object of `doc` that had bytes that are not UTF-8 (read as U+FFFD)."""
    for kind, obj in _objects(doc):
        if not _has_replacement(obj):
            continue
        meta = obj.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        metrics.OBJECTS_SKIPPED.labels(kind or "unknown", REASON_NOT_UTF8).inc()
        log.warning(
            "object has bytes that are not UTF-8; they are read as U+FFFD, the rest is handled",
            extra={"object": f"{kind} {meta.get('namespace') or ''}/{meta.get('name') or ''}", "uid": meta.get("uid")},
        )


def _has_replacement(value: Any) -> bool:
    """Whether U+FFFD occurs in a key or string of `value` (iterative: any depth)."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if "\ufffd" in node:
                return True
        elif isinstance(node, Mapping):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def _utf8(data: bytes | bytearray) -> tuple[bytes | bytearray, bool]:
    """`data`, or its bytes that are not UTF-8 replaced by U+FFFD (the API server stores and serves them
    as sent); whether anything was replaced."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("utf-8", errors="replace").encode("utf-8"), True
    return data, False


def loads(text: str | bytes | bytearray, **_: Any) -> Any:
    """`json.loads` for kopf: bounded depth, bytes that are not UTF-8 read as U+FFFD, both reported."""
    replaced = False
    if isinstance(text, bytes | bytearray):
        text, replaced = _utf8(text)
    value, skipped = bounded_json.decode(text)
    if skipped:
        report(value)
    if replaced:
        report_not_utf8(value)
    return value


async def iter_jsonlines(content: aiohttp.StreamReader, chunk_size: int = 1024 * 1024) -> AsyncIterator[bytes]:
    """kopf's `iter_jsonlines`, each line made valid UTF-8 first: kopf's watch stream decodes every line with
    `line.decode('utf-8')` before `json.loads`, and one object with other bytes would end the watch."""
    async for line in ORIGINAL_ITER_JSONLINES(content, chunk_size):
        fixed, replaced = _utf8(line)
        if replaced:
            report_not_utf8(bounded_json.loads(fixed))
        yield bytes(fixed)


class BoundedJson:
    """Stands in for the `json` module inside kopf's modules (they use `loads` and `JSONDecodeError`)."""

    JSONDecodeError = json.JSONDecodeError
    loads = staticmethod(loads)
    dumps = staticmethod(json.dumps)


async def get(
    url: str,
    *,
    settings: Any,
    payload: object | None = None,
    headers: dict[str, str] | None = None,
    timeout: aiohttp.ClientTimeout | None = None,
    logger: Any,
) -> Any:
    """`kopf._cogs.clients.api.get` (same signature and request), decoding the answer with `loads`."""
    response = await kopf_api.request(
        method="get", url=url, payload=payload, headers=headers, timeout=timeout, settings=settings, logger=logger
    )
    async with response:
        return loads(await response.read())


ORIGINAL_GET = kopf_api.get
ORIGINAL_ITER_JSONLINES = kopf_api.iter_jsonlines


def install() -> None:
    """Make kopf decode API answers and admission requests with `loads` (idempotent)."""
    kopf_api.json = BoundedJson  # type: ignore[attr-defined,assignment]
    kopf_webhooks.json = BoundedJson  # type: ignore[attr-defined,assignment]
    kopf_api.get = get
    kopf_api.iter_jsonlines = iter_jsonlines


def installed() -> bool:
    """Whether kopf decodes with `loads` now."""
    modules_json = (getattr(kopf_api, "json", None), getattr(kopf_webhooks, "json", None))
    return (
        modules_json == (BoundedJson, BoundedJson) and kopf_api.get is get and kopf_api.iter_jsonlines is iter_jsonlines
    )
