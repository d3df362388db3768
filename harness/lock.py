"""The pins of constraints.txt (`make lock` writes it with pip-compile): what `make venv`, CI, the image and the
real-GPU bundle install, for CPython 3.11-3.13 on linux x86-64."""

import re
from pathlib import Path

from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / "constraints.txt"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)\s*(?:#.*)?$")


class LockError(ValueError):
    """constraints.txt is missing, unreadable, or lacks a pin; the message says how to regenerate it."""


def read_pins(path: Path = CONSTRAINTS) -> dict[NormalizedName, Version]:
    """Distribution (canonical name) -> pinned version; every line is a `name==version` pin, a comment or blank."""
    try:
        text = path.read_text()
    except OSError as err:
        raise LockError(f"cannot read {path}: {err}; run `make lock` to write it") from err
    pins: dict[NormalizedName, Version] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _PIN.match(line.strip())
        if match is None:
            raise LockError(f"{path}:{number}: {line.strip()!r} is not a `name==version` pin; run `make lock`")
        pins[canonicalize_name(match[1])] = Version(match[2])
    return pins


def pinned(names: list[str], path: Path = CONSTRAINTS) -> dict[str, str]:
    """`names` with their pinned versions (as `pip download name==version` takes them)."""
    pins = read_pins(path)
    missing = [n for n in names if canonicalize_name(n) not in pins]
    if missing:
        raise LockError(f"{path} has no pin for {', '.join(missing)}; run `make lock` after changing pyproject.toml")
    return {n: str(pins[canonicalize_name(n)]) for n in names}
