"""The import contracts of pyproject.toml hold on the tree, and each one fails on a deliberate violation (checked on
a copy of the packages with one bad import added), so none of them is decorative."""

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
CONTRACTS = {
    c["id"]: c["name"]
    for c in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
}

VIOLATIONS = {
    "api-is-shared": ("api/names.py", "import controller.core.claims"),
    "components-independent": ("controller/core/claims.py", "import kubelet_plugin.core.model"),
    "plugin-without-kubernetes-client": ("kubelet_plugin/core/model.py", "import kopf"),
    "controller-without-kubernetes-client": ("controller/core/metrics.py", "import kubernetes.utils"),
    "product-without-tests": ("controller/core/metrics.py", "import harness.lock"),
    "test-tiers-independent": ("tests/integration/test_control_plane.py", "import e2e.workloads"),
    "harness-below-tests": ("harness/lock.py", "import tests.unit.fake_apiserver"),
    "plugin-layers": ("kubelet_plugin/prepare/plan.py", "import kubelet_plugin.serving.handover"),
    "controller-layers": ("controller/status/plan.py", "import controller.loops"),
    "kinds-independent": ("kubelet_plugin/kinds/mps/plan.py", "import kubelet_plugin.kinds.gpu.plan"),
    "pure-planning": ("kubelet_plugin/enforcement/tiers.py", "import subprocess"),
    "no-package-cycles": ("api/names.py", "import api.gpu"),
}


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=120, check=False
    )


def broken(output: str) -> set[str]:
    """Ids of the contracts the report calls BROKEN."""
    flat = " ".join(output.split())
    return {cid for cid, name in CONTRACTS.items() if f"{name} BROKEN" in flat}


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tree")
    for package in ("api", "controller", "kubelet_plugin", "harness", "e2e", "tests"):
        shutil.copytree(REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def test_every_contract_has_a_violation_here() -> None:
    assert set(VIOLATIONS) == set(CONTRACTS)


def test_the_tree_keeps_every_contract(copy: Path) -> None:
    run = lint(copy)
    assert run.returncode == 0 and broken(run.stdout) == set(), run.stdout + run.stderr


@pytest.mark.parametrize("contract", sorted(VIOLATIONS))
def test_a_deliberate_violation_breaks_its_contract(copy: Path, contract: str) -> None:
    module, line = VIOLATIONS[contract]
    path = copy / module
    clean = path.read_text()
    path.write_text(f"{line}  # deliberate violation\n{clean}")
    try:
        run = lint(copy)
    finally:
        path.write_text(clean)
    assert run.returncode != 0, run.stdout
    assert contract in broken(run.stdout), run.stdout
