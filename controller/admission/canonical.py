"""Canonical opaque parameters at admission (pure): the JSON-patch that rewrites a new claim's GpuConfig bytes.

The API server stores a claim's `spec.devices.config[].opaque.parameters` (a raw JSON value) byte for byte as
its author sent it, and the scheduler copies those bytes into `status.allocation.devices.config`. Every later
write to the claim's status (server-side apply, merge patch) re-encodes the allocation the way the API server's
Go code encodes JSON, then compares it byte for byte with the stored one, and refuses the write (422,
``status.allocation: field cannot be modified once set``) when they differ. So a claim whose parameters were not
sent in that encoding (Python's ``json.dumps`` with its spaces, a Go client marshalling a struct in field order)
can never have its status written: not by the controller, not by the node plugin.

The mutating webhook answers every new claim that has an opaque config of the driver with a JSON-patch that
replaces each such `parameters` by the same value, written as the API server writes it (`canonical_json`): keys
sorted, no spaces, ``<``, ``>`` and ``&`` escaped, other non-ASCII characters as they are, numbers as Go writes
what it decodes. The API server keeps a patch value's bytes (compacted), so the stored bytes become those. The
webhook sees the object compacted by the API server, not the bytes stored, so it replaces every such value, not
only the unsorted ones. Values it cannot reproduce exactly (a part `api.bounded_json` skipped, a number that is
not finite) are left as they are.
"""

import base64
import json
import math
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

from api.bounded_json import Skipped

_INT64 = range(-(2**63), 2**63)
_HTML = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


class NotCanonicalError(ValueError):
    """A value `canonical_json` cannot write as the API server would (a skipped part, a number not finite)."""


def _float(value: float) -> str:
    """A float as Go's encoding/json writes a float64: positional from 1e-6 to 1e21, else exponent (``1e-7``)."""
    if not math.isfinite(value):
        raise NotCanonicalError(f"the number {value} is not finite")
    if value == 0:
        return "0"  # -0.0 too: the API server's decoding loses the sign
    if 1e-6 <= abs(value) < 1e21:
        return format(Decimal(repr(value)).normalize(), "f")
    text = repr(value)  # Python writes these with an exponent too, with the same shortest digits
    mantissa, exponent = text.split("e")
    sign, digits = exponent[0], exponent[1:].lstrip("0")
    return f"{mantissa}e{sign}{digits.zfill(1) if sign == '-' else digits.zfill(2)}"


def _string(value: str) -> str:
    """A string as Go writes it: HTML characters and line separators escaped. One with a lone surrogate, which Go
    would decode as U+FFFD, is not rewritten: the value would change (`NotCanonicalError`)."""
    if any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise NotCanonicalError("a string holds a lone surrogate, which the API server would turn into U+FFFD")
    text = json.dumps(value, ensure_ascii=False)
    return "".join(_HTML.get(c, c) for c in text)


def _encode(value: Any) -> Iterator[str]:
    if isinstance(value, Skipped):
        raise NotCanonicalError("a part was not decoded")
    if value is None or isinstance(value, bool):
        yield json.dumps(value)
    elif isinstance(value, int):
        if value not in _INT64:  # Go decodes it as a float64: rewriting it would change the value
            raise NotCanonicalError(f"the integer {value} is beyond int64, which the API server would round")
        yield str(value)
    elif isinstance(value, float):
        yield _float(value)
    elif isinstance(value, str):
        yield _string(value)
    elif isinstance(value, list):
        yield "["
        for i, item in enumerate(value):
            yield "," if i else ""
            yield from _encode(item)
        yield "]"
    elif isinstance(value, Mapping):
        yield "{"
        for i, key in enumerate(sorted(value)):
            yield f"{',' if i else ''}{_string(key)}:"
            yield from _encode(value[key])
        yield "}"
    else:
        raise NotCanonicalError(f"a {type(value).__name__} is not a JSON value")


def canonical_json(value: Any) -> str:
    """`value` (as `json.loads` decodes it) written as the API server writes it; raises `NotCanonicalError`."""
    return "".join(_encode(value))


def parameters_patch(spec: Any, driver: str) -> str | None:
    """The JSON-patch (text, as sent) that replaces the `parameters` of each opaque config of `driver` in a
    claim's `spec` (at ``/spec``) by their canonical bytes; None when there is none to replace."""
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    configs = devices.get("config") if isinstance(devices, Mapping) else None
    ops = []
    for i, config in enumerate(configs if isinstance(configs, list) else []):
        opaque = config.get("opaque") if isinstance(config, Mapping) else None
        if not isinstance(opaque, Mapping) or opaque.get("driver") != driver or "parameters" not in opaque:
            continue
        try:
            value = canonical_json(opaque["parameters"])
        except NotCanonicalError:
            continue
        ops.append(f'{{"op":"replace","path":"/spec/devices/config/{i}/opaque/parameters","value":{value}}}')
    return f"[{','.join(ops)}]" if ops else None


def canonical_review(review: Any, driver: str) -> dict[str, Any]:
    """The answer to an AdmissionReview of a new claim (`review`, decoded): always allowed, with the patch of
    `parameters_patch` for `driver` when there is one. Raises ValueError when `review` is not an admission review."""
    request = review.get("request") if isinstance(review, Mapping) else None
    if not isinstance(request, Mapping) or not isinstance(request.get("uid"), str):
        raise ValueError("not an admission review request")
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    obj = request.get("object")
    patch = parameters_patch(obj.get("spec") if isinstance(obj, Mapping) else None, driver)
    if patch is not None:
        response |= {"patchType": "JSONPatch", "patch": base64.b64encode(patch.encode()).decode("ascii")}
    return {
        "apiVersion": review.get("apiVersion", "admission.k8s.io/v1"),
        "kind": "AdmissionReview",
        "response": response,
    }
