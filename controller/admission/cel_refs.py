"""What a DRA CEL selector reads of a device: its attribute and capacity names and the driver it compares
(pure; CEL's own parser via cel-expr-python).

The expression is parsed, not type-checked (the API server has already checked it against Kubernetes' full CEL
environment, whose functions this one lacks), and the parsed expression is read from its serialized form: a
`cel.expr.ParsedExpr` protobuf, walked through protobuf's unknown-field view, so no generated CEL classes are
needed. Found, where the domain and the name are string literals:

- `device.attributes["<domain>"].<name>`, `device.attributes["<domain>"]["<name>"]`, the same under `has()`,
  `"<name>" in device.attributes["<domain>"]` and the optional reads `.?<name>` and `[?"<name>"]` (these four
  are tests: false or no value, never an error, when the name is absent);
- the same three spellings on `device.capacity`;
- `device.driver == "<name>"` (either side).

Not found: names or domains computed at run time (`device.attributes[d]`, a variable of `cel.bind` or a macro,
a key held in a list), and expressions this parser does not take (it knows CEL's macros, the optional syntax and
`cel.bind`; the API server has refused what does not parse at all): those read as no references, so they are
never warned of.
"""

import functools
from dataclasses import dataclass, field
from typing import Any, Literal

from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_optional
from google.protobuf import any_pb2, empty_pb2, unknown_fields

Kind = Literal["attribute", "capacity", "driver"]


@dataclass(frozen=True)
class Reference:
    """One name an expression reads: an attribute or capacity of `domain`, or the driver it compares with
    (`domain` empty). `test`: only tested for presence (`in`, `has()`)."""

    kind: Kind
    domain: str
    name: str
    test: bool = False

    @property
    def cel(self) -> str:
        """The reference as CEL writes it."""
        if self.kind == "driver":
            return f'device.driver == "{self.name}"'
        holder = f'device.{"attributes" if self.kind == "attribute" else "capacity"}["{self.domain}"]'
        return f"{holder}.{self.name}" if self.name.isidentifier() else f'{holder}["{self.name}"]'


@dataclass(frozen=True)
class _Node:
    """A parsed CEL expression, reduced to what references need."""

    kind: str  # ident, select, call, const, other
    text: str = ""  # the ident's name, select's field, call's function or a string constant
    children: tuple["_Node", ...] = ()
    test: bool = False  # a select under has()
    const: bool = False  # a string constant


_EXPR_KIND = {3: "const", 4: "ident", 5: "select", 6: "call", 7: "list", 8: "struct", 9: "comprehension"}
# The fields of each kind that hold expressions (cel/expr/syntax.proto), besides the struct's entries.
_EXPR_FIELDS = {"select": (1,), "call": (1, 3), "list": (1,), "comprehension": (2, 4, 5, 6, 7)}


def _fields(data: bytes) -> list[tuple[int, Any]]:
    """The (field number, value) pairs of a serialized protobuf message, in order."""
    message = empty_pb2.Empty.FromString(data)
    fields = unknown_fields.UnknownFieldSet(message)
    return [(fields[i].field_number, fields[i].data) for i in range(len(fields))]


def _text(data: Any) -> str:
    return data.decode("utf-8", errors="replace") if isinstance(data, bytes) else str(data)


def _node(data: bytes, depth: int = 0) -> _Node:
    """The node of one serialized `cel.expr.Expr`."""
    if depth > 200:  # the API server's limits keep expressions far shallower
        return _Node("other")
    for number, value in _fields(data):
        kind = _EXPR_KIND.get(number)
        if kind is None or not isinstance(value, bytes):
            continue
        parts = _fields(value)
        if kind == "const":
            strings = [_text(v) for n, v in parts if n == 6]
            return _Node("const", strings[0], const=True) if strings else _Node("const")
        if kind == "ident":
            return _Node("ident", next((_text(v) for n, v in parts if n == 1), ""))
        children: list[_Node] = []
        text = ""
        test = False
        if kind == "struct":  # entries (2): their map key (3) and value (4)
            for n, entry in parts:
                if n == 2 and isinstance(entry, bytes):
                    children += [_node(v, depth + 1) for m, v in _fields(entry) if m in (3, 4) and isinstance(v, bytes)]
            return _Node("other", children=tuple(children))
        wanted = _EXPR_FIELDS[kind]
        target: _Node | None = None
        for n, v in parts:
            if n in wanted and isinstance(v, bytes):
                child = _node(v, depth + 1)
                if kind == "call" and n == 1:
                    target = child
                else:
                    children.append(child)
            elif n == 2 and kind in ("select", "call"):
                text = _text(v)
            elif n == 3 and kind == "select":
                test = bool(v)
        if kind == "select":
            return _Node("select", text, tuple(children), test=test)
        if kind == "call":
            return _Node("call" if target is None else "member", text, (*((target,) if target else ()), *children))
        return _Node("other", children=tuple(children))
    return _Node("other")


@functools.cache
def _env() -> Any:
    extensions = [ext_optional.ExtOptional(), ext_bindings.ExtBindings()]  # `.?name`, `[?"name"]`, `cel.bind`
    return cel.NewEnv(variables={"device": cel.Type.DYN}, extensions=extensions)


def _parse(expression: str) -> _Node | None:
    """The parsed expression, or None when this parser does not take it."""
    try:
        serialized = _env().compile(expression, disable_check=True).serialize()
    except RuntimeError:
        return None
    parsed = any_pb2.Any.FromString(serialized)  # a cel.expr.ParsedExpr: its expr is field 2
    expr = next((v for n, v in _fields(parsed.value) if n == 2 and isinstance(v, bytes)), None)
    return None if expr is None else _node(expr)


def _device_map(node: _Node) -> tuple[Kind, str] | None:
    """("attribute", domain) for `device.attributes["<domain>"]` (and capacity alike), else None."""
    if node.kind != "call" or node.text != "_[_]" or len(node.children) != 2:
        return None
    holder, key = node.children
    if not key.const or holder.kind != "select" or holder.text not in ("attributes", "capacity"):
        return None
    (operand,) = holder.children or (_Node("other"),)
    if operand.kind != "ident" or operand.text != "device":
        return None
    return ("attribute" if holder.text == "attributes" else "capacity"), key.text


def _is_device_driver(node: _Node) -> bool:
    return (
        node.kind == "select"
        and node.text == "driver"
        and len(node.children) == 1
        and node.children[0].kind == "ident"
        and node.children[0].text == "device"
    )


def _reference(node: _Node) -> Reference | None:
    """The reference `node` makes by itself (its children are looked at by the caller)."""
    if node.kind == "select" and len(node.children) == 1 and (found := _device_map(node.children[0])):
        return Reference(found[0], found[1], node.text, node.test)
    if node.kind == "call" and len(node.children) == 2:
        left, right = node.children
        if node.text == "_[_]" and right.const and (found := _device_map(left)):
            return Reference(found[0], found[1], right.text)
        if node.text in ("_?._", "_[?_]") and right.const and (found := _device_map(left)):
            return Reference(found[0], found[1], right.text, test=True)  # optional: absent is no error
        if node.text == "@in" and left.const and (found := _device_map(right)):
            return Reference(found[0], found[1], left.text, test=True)
        if node.text == "_==_":
            for a, b in ((left, right), (right, left)):
                if _is_device_driver(a) and b.const:
                    return Reference("driver", "", b.text)
    return None


@dataclass
class _Found:
    references: list[Reference] = field(default_factory=list)

    def walk(self, node: _Node) -> None:
        ref = _reference(node)
        if ref is not None and ref not in self.references:
            self.references.append(ref)
        for child in node.children:
            self.walk(child)


@functools.lru_cache(maxsize=512)
def references(expression: str) -> tuple[Reference, ...]:
    """The names `expression` reads (see the module docstring), in the order written; none when it does not
    parse here."""
    parsed = _parse(expression)
    if parsed is None:
        return ()
    found = _Found()
    found.walk(parsed)
    return tuple(found.references)
