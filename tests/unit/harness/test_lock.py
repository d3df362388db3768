"""constraints.txt pins every dependency pyproject.toml declares, within its specifier (harness/lock.py).

A pyproject.toml change without `make lock` fails here, before `make venv`, CI or the image install anything else.
"""

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from harness import lock

PYPROJECT = lock.REPO / "pyproject.toml"
PYTHONS = ("3.11", "3.12", "3.13")  # the interpreters the lock is for


def declared() -> list[Requirement]:
    """Runtime and dev requirements of pyproject.toml."""
    with PYPROJECT.open("rb") as f:
        project = tomllib.load(f)["project"]
    extras = [r for group in project["optional-dependencies"].values() for r in group]
    return [Requirement(r) for r in [*project["dependencies"], *extras]]


def applies(requirement: Requirement) -> bool:
    """The requirement holds on one of the locked interpreters (on linux x86-64)."""
    marker = requirement.marker
    return marker is None or any(
        marker.evaluate({"python_version": v, "sys_platform": "linux", "platform_machine": "x86_64"}) for v in PYTHONS
    )


@pytest.mark.parametrize("requirement", [r for r in declared() if applies(r)], ids=str)
def test_every_dependency_is_pinned_within_its_specifier(requirement: Requirement) -> None:
    pins = lock.read_pins()
    name = canonicalize_name(requirement.name)
    assert name in pins, f"constraints.txt has no pin for {requirement.name}: run `make lock`"
    assert requirement.specifier.contains(pins[name], prereleases=True), (
        f"constraints.txt pins {requirement.name}=={pins[name]}, outside pyproject's {requirement}: run `make lock`"
    )


def test_the_lock_holds_only_exact_pins() -> None:
    pins = lock.read_pins()
    assert len(pins) >= len(declared()), "the lock also pins what the dependencies need"
    assert canonicalize_name("fracgpu") not in pins, "the project itself is installed from the tree"


def test_a_malformed_or_missing_lock_says_how_to_fix_it(tmp_path: Path) -> None:
    bad = tmp_path / "constraints.txt"
    bad.write_text("# comment\npydantic==2.14.4\nkopf>=1.38\n")
    with pytest.raises(lock.LockError, match=r"constraints.txt:3: 'kopf>=1.38' is not a `name==version` pin"):
        lock.read_pins(bad)
    with pytest.raises(lock.LockError, match=r"run `make lock` to write it"):
        lock.read_pins(tmp_path / "absent.txt")
    bad.write_text("pydantic==2.14.4  # via fracgpu\n")
    assert lock.pinned(["Pydantic"], bad) == {"Pydantic": "2.14.4"}
    with pytest.raises(lock.LockError, match=r"no pin for kopf; run `make lock` after changing pyproject\.toml"):
        lock.pinned(["kopf"], bad)
