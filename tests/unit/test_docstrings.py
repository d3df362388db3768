"""Docstrings name only modules that exist, as tests/unit/test_docs.py checks the pages (issue 29: after a move, ten
docstrings still named the modules from before it).

Read in every docstring and `#:` comment of the Python tree:

- a repository path (`controller/status/plan.py`, `harness/mocknvml/`) must exist;
- a dotted name from a top-level package (`controller.core.claims`, `api.gpu.GPU_PLURAL`) must be a module, and
  past the module a name it defines;
- `python -m <module>` must name a module that can run;
- a package-relative dotted name (`prepare.checkpoint`, `core.claims.ClaimView`) and a module named in double
  backticks (``node_lock``) must be a module of the file's own package, of its top-level package, or a top-level
  package;
- a dotted name `x.y` whose `x` is no module anywhere, nothing importable and no name the file uses is a module
  that went (as claim_status, whose plan_status moved to controller/status/plan.py).
"""

import ast
import importlib.util
import io
import re
import tokenize
from functools import cache
from pathlib import Path

import pytest

from tests.unit.test_docs import chart_values, unresolved_dotted

REPO = Path(__file__).resolve().parents[2]
TREES = ("api", "controller", "kubelet_plugin", "harness", "e2e", "tests")
TOP = TREES
_PATH = re.compile(r"(?<![\w/.\-])((?:api|controller|kubelet_plugin|harness|e2e|tests|charts|docs)/[\w./\-]*[\w/])")
_DOTTED = re.compile(r"(?<![\w.\-/])([a-z][a-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?![\w(/\-])")
_DOUBLE_BACKTICK = re.compile(r"``([a-z][a-z0-9_]+)``")
PRODUCT = ("api", "controller", "kubelet_plugin", "harness", "e2e")
_PYTHON_M = re.compile(r"python3? -m ([A-Za-z_][A-Za-z0-9_.]*)")


def python_files() -> list[Path]:
    return sorted(
        p for tree in TREES for p in (REPO / tree).rglob("*.py") if not re.search(r"_pb2(_grpc)?\.pyi?$", p.name)
    )


@cache
def module_names() -> frozenset[str]:
    """The base name of every module and package of the tree."""
    names = {p.stem for p in python_files() if p.name != "__init__.py"}
    names |= {p.parent.name for p in python_files() if p.name == "__init__.py"}
    return frozenset(names)


def documentation_nodes(source: str) -> list[tuple[int, ast.Constant]]:
    """(line, node) of every docstring of a module: of itself, its classes and functions, and after an assignment."""
    found: list[tuple[int, ast.Constant]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            for i, statement in enumerate(body):
                first = i == 0
                after_assignment = i > 0 and isinstance(body[i - 1], ast.Assign | ast.AnnAssign)
                if (first or after_assignment) and isinstance(statement, ast.Expr):
                    value = statement.value
                    if isinstance(value, ast.Constant) and isinstance(value.value, str):
                        found.append((statement.lineno, value))
    return found


def documentation(source: str) -> list[tuple[int, str]]:
    """(line, text) of every docstring and `#:` comment of a module."""
    found = [(line, str(node.value)) for line, node in documentation_nodes(source)]
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and token.string.startswith("#:"):
            found.append((token.start[0], token.string))
    return found


def used_names(source: str) -> set[str]:
    """Every name, parameter and attribute the module's code mentions."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
    return names


def importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def packages_of(path: Path) -> list[str]:
    """The dotted packages a relative name in `path` may start from: its own, its top-level package's."""
    parts = path.relative_to(REPO).with_suffix("").parts
    own = ".".join(parts[:-1])
    return [p for p in dict.fromkeys([own, parts[0]]) if p]


@cache
def defined_symbols() -> dict[str, frozenset[Path]]:
    """Every top-level function and class of the tree -> the modules that define it."""
    found: dict[str, set[Path]] = {}
    for path in python_files():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                found.setdefault(node.name, set()).add(path)
    return {k: frozenset(v) for k, v in found.items()}


@cache
def product_words() -> frozenset[str]:
    """Every name the product's code uses and every string it holds (docstrings apart): a name in double
    backticks that is one of these is code, not a module."""
    words: set[str] = set()
    for path in python_files():
        if path.relative_to(REPO).parts[0] not in PRODUCT:
            continue
        source = path.read_text()
        words |= used_names(source)
        documented = {id(body) for _, body in documentation_nodes(source)}
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in documented:
                words.add(node.value)
    return frozenset(words)


def _relative_problem(path: Path, dotted: str, names: set[str]) -> str | None:
    """What is wrong with `x.y...` in `path`, whose `x` is no top-level package; None when nothing is."""
    first, second = dotted.split(".")[:2]
    if first in names or importable(first):
        return None  # a variable, parameter or attribute (`err.status`), or a library (`os.environ`)
    if first in module_names():
        bases = [*packages_of(path), *TOP]
        if any(unresolved_dotted(f"{b}.{dotted}") is None for b in bases):
            return None
        definers = defined_symbols().get(second, frozenset())
        if any(first in (d.stem, *d.relative_to(REPO).parts[:-1]) for d in definers):
            return None  # `module.function` of a module elsewhere in the tree, `package.Class` of one of its modules
        if second[:1].isupper():  # a class: of a module of that name, or of a package of that name's modules
            return f"{dotted}: {first} defines no {second}"
        return None  # a field path that shares a module's name (`status.devices`)
    if "_" in first and re.fullmatch(r"[a-z_][a-z0-9_]*", second):
        return f"{dotted}: {first} is no module"  # `claim_status.plan_status`: a module that went
    return None


def problems_of(path: Path, source: str) -> list[str]:
    problems: list[str] = []
    names = used_names(source)
    for line, text in documentation(source):
        where = f"{path.relative_to(REPO)}:{line}"
        for found in _PATH.findall(text):
            if "<" not in found and not (REPO / found.rstrip("/")).exists():
                problems.append(f"{where}: {found}: no such path")
        for module in _PYTHON_M.findall(text):
            base = REPO.joinpath(*module.split("."))
            if module.startswith(TOP) and not (base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()):
                problems.append(f"{where}: python -m {module}: no such module")
        for dotted in _DOTTED.findall(text):
            if dotted in chart_values():
                continue  # a value of the chart (`controller.replicas`)
            if dotted.split(".")[0] in TOP:
                problem = unresolved_dotted(dotted)
            else:
                problem = _relative_problem(path, dotted, names)
            if problem is not None:
                problems.append(f"{where}: {problem}")
        for name in _DOUBLE_BACKTICK.findall(text):
            if name in TOP or name in names or name in product_words() or importable(name):
                continue
            if "_" not in name and name not in module_names():
                continue
            if all(unresolved_dotted(f"{b}.{name}") for b in [*packages_of(path), *TOP]):
                problems.append(f"{where}: ``{name}``: no such module in {', '.join(packages_of(path))}")
    return problems


@pytest.mark.parametrize("path", python_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_docstrings_name_only_modules_that_exist(path: Path) -> None:
    assert problems_of(path, path.read_text()) == []


STALE = '''"""Orchestrates: read the claims (``claim_reader``), plan each (``plan``), see kubelet_plugin/claim_spec.py.

Run as `python -m kubelet_plugin.prepare.gone`; the ledger is `controller.ledger.plan.no_such_name`'s, planned by
`claim_status.plan_status` (see `prepare.SpecWriter`, `gpu_health.plan_taints`; not `status.devices`, `prepare.plan_claim`).
"""

#: Writes Ready (`claim_status.apply_ready`).
WRITE = None
'''


def test_the_check_finds_every_kind_of_stale_name() -> None:
    path = REPO / "kubelet_plugin" / "prepare" / "example.py"
    found = problems_of(path, STALE)
    expected = [
        "``claim_reader``",
        "kubelet_plugin/claim_spec.py",
        "python -m kubelet_plugin.prepare.gone",
        "controller.ledger.plan defines no no_such_name",
        "claim_status.plan_status",
        "prepare.SpecWriter",
        "gpu_health.plan_taints",
        "claim_status.apply_ready",
    ]
    assert all(any(e in f for f in found) for e in expected), found
    assert not [f for f in found if "``plan``" in f or "status.devices" in f or "plan_claim" in f], found
