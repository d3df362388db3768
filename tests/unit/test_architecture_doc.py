"""docs/architecture.md matches the tree: every module is named, every package says what it may import, and its
contract table lists exactly the contracts `lint-imports` checks (that every path it names exists is
tests/unit/test_docs.py's check of every page)."""

import ast
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "architecture.md").read_text()
PACKAGES = ("api", "controller", "kubelet_plugin")
_PATH_RE = re.compile(r"`((?:api|controller|kubelet_plugin|harness|e2e|tests|charts|docs)/[^`\s]*)`")


def named_paths(text: str) -> set[str]:
    """Every repository path the text names in backticks (`kubelet_plugin/prepare/plan.py`, `harness/mocknvml/`)."""
    return {m.group(1) for m in _PATH_RE.finditer(text)}


def modules() -> set[str]:
    """Every hand-written Python module of the three packages (package markers and generated stubs left out)."""
    found = set()
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if path.name == "__init__.py" or "_pb2" in path.name:
                continue
            found.add(path.relative_to(REPO).as_posix())
    return found


def test_the_path_finder_sees_paths_and_only_paths() -> None:
    assert named_paths("see `kubelet_plugin/prepare/plan.py` and `harness/mocknvml/`, not `plan.py` or `GpuInfo`") == {
        "kubelet_plugin/prepare/plan.py",
        "harness/mocknvml/",
    }


def test_every_module_is_named_in_the_architecture_doc() -> None:
    unnamed = sorted(modules() - named_paths(DOC))
    assert unnamed == [], f"modules docs/architecture.md does not name (add them to 'Packages'): {unnamed}"


def test_every_package_docstring_says_its_job_and_what_it_may_import() -> None:
    bad = []
    for package in PACKAGES:
        for init in sorted((REPO / package).rglob("__init__.py")):
            if init.parent.name == "proto":
                continue
            doc = ast.get_docstring(ast.parse(init.read_text())) or ""
            if "May import" not in doc and init.parent.name != "crds":
                bad.append(init.relative_to(REPO).as_posix())
    assert bad == [], f"package docstrings without 'May import: ...': {bad}"


def test_the_contract_table_lists_exactly_the_checked_contracts() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    checked = {c["id"] for c in config["contracts"]}
    section = DOC.split("## Packages and who may import whom", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([a-z]+(?:-[a-z]+)+)` \|", section, re.MULTILINE))
    assert checked and listed == checked, f"doc lists {sorted(listed)}, pyproject checks {sorted(checked)}"
