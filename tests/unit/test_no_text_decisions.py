"""No decision in the product matches the text of an error or a log record (issue 29): an API failure is decided
by its type (`api.kube_rest` parses the API server's `Status` once into one), anything else by a field.

The check reads every product module's syntax tree. Error text is what an exception or a log record says: a name
bound by `except ... as`, a parameter typed as an error or a `LogRecord`, their `body`, `message`, `reason` and
`args`, `str()`/`repr()` of them, `getMessage()`, and whatever is computed from those in the same function. A
decision on it is an `in`/`not in`/`==`/`!=` test or a `startswith`/`endswith`/`find`/`re.search`-style call.
A string naming an HTTP status (`": 404 "`) tested with `in` is one too, whatever it is tested against.
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("api", "controller", "kubelet_plugin")
TEXT_ATTRIBUTES = {"body", "message", "reason", "args", "msg"}
TEXT_TESTS = {"startswith", "endswith", "find", "rfind", "index", "count", "search", "match", "fullmatch", "findall"}
ERROR_TYPES = re.compile(r"([\w.]*(Error|Exception|LogRecord|Warning)|BaseException)( \| None)?")
STATUS_LITERAL = re.compile(r"\b[1-5]\d\d\b")


def _bound(target: ast.AST) -> set[str]:
    """The names an assignment target binds (not those it only reads, as `d[k] = ...` reads `d` and `k`)."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, ast.Tuple | ast.List):
        return {name for element in target.elts for name in _bound(element)}
    if isinstance(target, ast.Starred):
        return _bound(target.value)
    return set()


def product_modules() -> list[Path]:
    return sorted(
        p for package in PRODUCT for p in (ROOT / package).rglob("*.py") if not re.search(r"_pb2(_grpc)?\.py$", p.name)
    )


def _error_objects(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The names that hold an error or a log record in `function`: `except ... as` names, typed parameters."""
    arguments = [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs]
    return {
        *(n.name for n in ast.walk(function) if isinstance(n, ast.ExceptHandler) and n.name),
        *(a.arg for a in arguments if a.annotation is not None and ERROR_TYPES.fullmatch(ast.unparse(a.annotation))),
    }


class TextDecisions:
    """The decisions on error text in one function: (line, source) of each."""

    def __init__(self, source: str, function: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.source = source
        self.function = function
        self.errors = _error_objects(function)
        self.texts: set[str] = set()
        for _ in range(3):  # what is computed from error text is error text: a few rounds reach a fixed point
            for node in ast.walk(function):
                if not isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr) or node.value is None:
                    continue
                if self.is_text(node.value):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    self.texts |= {name for target in targets for name in _bound(target)}

    def _mentions_error(self, node: ast.AST) -> bool:
        return any(isinstance(n, ast.Name) and n.id in self.errors | self.texts for n in ast.walk(node))

    def is_text(self, node: ast.AST) -> bool:
        """Whether `node` is (or is computed from) the text of an error or log record, not its type or a field."""
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and sub.id in self.texts:
                return True
            if isinstance(sub, ast.Attribute) and (
                sub.attr == "getMessage" or (sub.attr in TEXT_ATTRIBUTES and self._mentions_error(sub.value))
            ):
                return True
            if (
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Name)
                and sub.func.id in ("str", "repr", "format")
                and any(self._mentions_error(a) for a in sub.args)
            ):
                return True
        return False

    def found(self) -> list[tuple[int, str]]:
        out = []
        for node in ast.walk(self.function):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                on_text = any(isinstance(op, ast.In | ast.NotIn | ast.Eq | ast.NotEq) for op in node.ops) and any(
                    self.is_text(o) for o in operands
                )
                on_status = any(isinstance(op, ast.In | ast.NotIn) for op in node.ops) and any(
                    isinstance(o, ast.Constant) and isinstance(o.value, str) and STATUS_LITERAL.search(o.value)
                    for o in operands
                )
                decides = on_text or on_status
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in TEXT_TESTS:
                decides = any(self.is_text(s) for s in [node.func.value, *node.args])
            else:
                decides = False
            if decides:
                out.append((getattr(node, "lineno", 0), ast.get_source_segment(self.source, node) or ""))
        return out


def decisions_on_text(source: str) -> list[tuple[int, str]]:
    """Every decision on error text in the module `source`."""
    functions = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    return sorted({found for f in functions for found in TextDecisions(source, f).found()})


@pytest.mark.parametrize("path", product_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_product_module_decides_by_the_text_of_an_error(path: Path) -> None:
    found = decisions_on_text(path.read_text())
    assert not found, f"{path.relative_to(ROOT)} decides by error text (test a type or a field instead): {found}"


#: What this check must catch: the text matches issue 29 found (reconstructed), and kinds of it.
CAUGHT = {
    "a uid in a 409's body": """
def retry(key, err: Exception):
    status = err.status if isinstance(err, ApiError) else None
    body = str(err.body).lower() if isinstance(err, ApiError) else ""
    if status == 404 or (status == 409 and "uid" in body):
        return
""",
    "a status in a string built from errors": """
async def ledger(failures):
    if any(": 404 " in f for f in failures):
        hint = "crd"
""",
    "a terminating namespace": """
def post(rest, body):
    try:
        rest.create(body)
    except ApiError as err:
        if err.status == 403 and "terminat" in str(err.body):
            return True
""",
    "kopf's log text": """
def filter(self, record: logging.LogRecord) -> bool:
    if record.getMessage().startswith("Webhook ") and "failed permanently" in record.getMessage():
        return False
""",
    "a message compared": """
def f():
    try:
        g()
    except OSError as err:
        text = err.args[0]
        if text == "busy":
            return
""",
    "a regular expression on str(err)": """
def f():
    try:
        g()
    except ValueError as e:
        if re.search("digits", str(e)):
            return
""",
}
#: What it must let pass: decisions by type or by field, and error text only passed on.
PASSED = """
def retry(key, err: Exception):
    if isinstance(err, ApiNotFound | ApiUidMismatch):
        log.info("gone", extra={"status": err.status, "error": str(err)})
    if err is None or err.status == 409:
        return f"{err.status} {err.message}"
    for cause in causes:
        if "uid" in metadata and cause in ("NamespaceTerminating",):
            return
"""


@pytest.mark.parametrize("source", list(CAUGHT.values()), ids=list(CAUGHT))
def test_the_check_catches_decisions_on_error_text(source: str) -> None:
    assert decisions_on_text(source)


def test_the_check_passes_decisions_by_type_and_by_field() -> None:
    assert decisions_on_text(PASSED) == []
