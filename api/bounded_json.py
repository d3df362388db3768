"""JSON decoding whose nesting depth is bounded, for documents an API server stores (pure; no I/O).

The API server stores JSON nested thousands of levels deep (an opaque config's parameters may be 10 KiB
of ``[[[...]]]``) and integers longer than Python converts (``int`` refuses more than 4300 digits).
``json.loads`` raises ``RecursionError`` or ``ValueError`` on such documents, and code walking a decoded
value recursively (``copy.deepcopy``, ``==``, pydantic) fails at a few hundred levels.

``loads`` returns what ``json.loads`` returns, except that each array or object nested deeper than
``max_depth`` levels, and each integer Python cannot convert, is replaced by a ``Skipped`` marker (a
``str`` saying what was left out, so the result still serialises). Everything else, object metadata
included, is decoded exactly as ``json.loads`` decodes it; the content of a skipped subtree is not
validated. Nothing here recurses: the depth scan and the search for markers are iterative.
"""

import json
import re
import sys
import uuid
from collections.abc import Iterator, Mapping
from itertools import accumulate
from typing import Any

MAX_DEPTH = 100
"""Levels of arrays/objects kept (a ResourceClaim's own fields end within 15; 2 Python frames per level
in ``copy.deepcopy`` stay far below the interpreter's recursion limit of 1000)."""

REASON_DEEP = "deep"
REASON_NUMBER = "number"

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STRUCTURE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.S)
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
_PLACEHOLDER = f"fracgpu-skipped-{uuid.uuid4().hex}"
"""Stands in the rewritten text for a skipped subtree: random per process, so no document contains it."""


class Skipped(str):
    """Marker for a part of a document that was not decoded; the text says what it was and why."""

    reason: str

    def __new__(cls, text: str, reason: str = REASON_DEEP) -> "Skipped":
        out = super().__new__(cls, text)
        out.reason = reason
        return out

    def __reduce__(self) -> tuple[Any, ...]:  # copy/deepcopy/pickle keep the class and the reason
        return (Skipped, (str(self), self.reason))


def nesting_depth(text: str) -> int:
    """Deepest nesting of arrays and objects in JSON `text` (exact for valid JSON; regular expressions only)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


class _Decoding:
    """One decode: counts the markers it makes."""

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.skipped = 0

    def integer(self, digits: str) -> int | Skipped:
        limit = sys.get_int_max_str_digits()
        count = len(digits.lstrip("-"))
        if limit and count > limit:
            self.skipped += 1
            return Skipped(f"<integer of {count} digits, not decoded>", REASON_NUMBER)
        return int(digits)

    def flat(self, text: str) -> Any:
        """`json.loads` of text nested at most max_depth deep; over-long integers become markers."""
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise
        except ValueError:  # an integer beyond the int conversion limit: only then a Python call per int
            return json.loads(text, parse_int=self.integer)

    def without_deep_subtrees(self, text: str) -> str:
        """`text` with each array/object at depth max_depth + 1 replaced by the placeholder string."""
        pieces: list[str] = []
        depth = start = end = 0
        for match in _STRUCTURE.finditer(text):
            token = match.group()
            if token in "[{":
                depth += 1
                if depth == self.max_depth + 1:
                    pieces.append(text[end : match.start()])
                    start = match.start()
            elif token in "]}":
                depth -= 1
                if depth == self.max_depth:
                    pieces.append(f'"{_PLACEHOLDER}"')
                    end = match.end()
                    self.skipped += 1
        if depth > self.max_depth:  # never closed: json.loads would recurse into it to say so
            raise json.JSONDecodeError("unterminated array or object", text, start)
        pieces.append(text[end:])
        return "".join(pieces)

    def replace_placeholders(self, value: Any) -> Any:
        marker = Skipped(f"<array or object nested deeper than {self.max_depth} levels, not decoded>")
        if type(value) is str and value == _PLACEHOLDER:
            return marker
        stack = [value]
        while stack:
            node = stack.pop()
            items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
            for key, child in list(items):
                if type(child) is str and child == _PLACEHOLDER:
                    node[key] = marker
                elif isinstance(child, dict | list):
                    stack.append(child)
        return value


def decode(text: str | bytes | bytearray, max_depth: int = MAX_DEPTH) -> tuple[Any, int]:
    """`loads`, and how many markers it put in (0: the value equals `json.loads(text)`)."""
    if isinstance(text, bytes | bytearray):
        text = text.decode("utf-8")
    decoding = _Decoding(max_depth)
    if nesting_depth(text) <= max_depth:
        return decoding.flat(text), decoding.skipped
    value = decoding.replace_placeholders(decoding.flat(decoding.without_deep_subtrees(text)))
    return value, decoding.skipped


def loads(text: str | bytes | bytearray, max_depth: int = MAX_DEPTH) -> Any:
    """Decode JSON `text` like `json.loads`, with subtrees deeper than `max_depth` and over-long integers
    replaced by `Skipped` markers. Raises `json.JSONDecodeError` (or `UnicodeDecodeError`) for invalid input.
    """
    return decode(text, max_depth)[0]


def skipped_parts(value: Any, path: str = "") -> Iterator[tuple[str, Skipped]]:
    """Each `Skipped` marker in a decoded value with its field path (`spec.devices.config[0]...`), in
    document order; iterative, so any depth is fine."""
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, Skipped):
            yield where, node
        elif isinstance(node, Mapping):
            prefix = f"{where}." if where else ""
            stack.extend((f"{prefix}{k}", v) for k, v in reversed(list(node.items())))
        elif isinstance(node, list | tuple):
            stack.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(node))))


def short_path(path: str, segments: int = 8) -> str:
    """A field path cut to its first `segments` parts (deep paths are thousands of characters long)."""
    parts = re.findall(r"[^.\[]+|\[\d+\]", path)
    if len(parts) <= segments:
        return path
    head = re.sub(r"\.\[", "[", ".".join(parts[:segments]))
    return f"{head}... ({len(parts) - segments} more levels)"
