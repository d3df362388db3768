"""Modules and classes of the product stay small enough to read (issue 35's bound): every module of controller/,
kubelet_plugin/ and api/ at most `MAX_MODULE_LINES` lines (generated protobuf code aside), every class under
`MAX_CLASS_LINES`. A module or class past the bound is split by concern, not squeezed."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("controller", "kubelet_plugin", "api")
MAX_MODULE_LINES = 450
MAX_CLASS_LINES = 200


def _modules() -> list[Path]:
    found = [
        p
        for pkg in PACKAGES
        for p in sorted((REPO / pkg).rglob("*.py"))
        if not p.name.endswith(("_pb2.py", "_pb2_grpc.py", "_pb2.pyi"))
    ]
    assert len(found) > 100, "the product's modules were not found"
    return found


def _classes(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [(n.name, (n.end_lineno or n.lineno) - n.lineno + 1) for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]


def test_every_module_is_at_most_450_lines() -> None:
    long = {
        str(p.relative_to(REPO)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_every_class_is_under_200_lines() -> None:
    big = {f"{p.relative_to(REPO)}:{name}": n for p in _modules() for name, n in _classes(p) if n >= MAX_CLASS_LINES}
    assert big == {}


@pytest.mark.parametrize(
    ("source", "counted"), [("class A:\n" + "    x = 1\n" * 250, 251), ("class B:\n    pass\n", 2)]
)
def test_a_class_is_measured_from_its_line_to_its_last(tmp_path: Path, source: str, counted: int) -> None:
    module = tmp_path / "m.py"
    module.write_text(source)
    ((_, lines),) = _classes(module)
    assert lines == counted
