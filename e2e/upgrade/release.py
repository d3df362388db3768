"""The previous release, built from its own sources: the chart and image that e2e/test_upgrade.py upgrades from.

"Previous release" is the git tag in ``previous-release.env`` (``PREVIOUS_RELEASE_TAG``), whose commit is pinned
next to it (``PREVIOUS_RELEASE_COMMIT``): a clone without tags (CI clones main afresh) still finds it by commit.
``export`` writes that commit's tree (``git archive``) to a directory; ``build_image`` runs that tree's own image
build (``image_build_module``: ``python -m harness.image.build``, or the image build under e2e/ in a tree from
before the harness moved out of it), so the old image is made exactly as its release made it, and its
chart is the tree's ``charts/fracgpu``.
"""

import json
import os
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RELEASE_FILE = Path(__file__).resolve().parent / "previous-release.env"


class ReleaseNotFoundError(RuntimeError):
    """Neither the release's tag nor its pinned commit is in the clone; the message says how to fetch it."""


@dataclass(frozen=True)
class Release:
    """A release found in the clone: its tag, its full commit and how it was found."""

    tag: str
    commit: str
    found_by: str  # "tag" or "commit"


@dataclass(frozen=True)
class ReleaseImage:
    """An image archive a release's own build wrote, and its name (`repository:tag`)."""

    name: str
    archive: Path


def pinned(path: Path = RELEASE_FILE) -> tuple[str, str]:
    """(tag, commit) from the release file; ValueError naming what is missing."""
    values: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip()
    missing = [k for k in ("PREVIOUS_RELEASE_TAG", "PREVIOUS_RELEASE_COMMIT") if not values.get(k)]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}")
    return values["PREVIOUS_RELEASE_TAG"], values["PREVIOUS_RELEASE_COMMIT"]


def _commit_of(repo: Path, rev: str) -> str | None:
    done = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() if done.returncode == 0 else None


def find(repo: Path = REPO, release_file: Path = RELEASE_FILE) -> Release:
    """The previous release in the clone at `repo`: by its tag, else by its pinned commit.

    A tag that names another commit than the pinned one is refused (one of them is wrong). Raises
    ReleaseNotFoundError when neither is there."""
    tag, commit = pinned(release_file)
    by_tag = _commit_of(repo, f"refs/tags/{tag}")
    by_commit = _commit_of(repo, commit)
    if by_tag is not None:
        if by_commit is not None and by_commit != by_tag:
            raise ReleaseNotFoundError(
                f"tag {tag} is commit {by_tag}, but {release_file} pins {commit}: correct the file or the tag"
            )
        return Release(tag, by_tag, "tag")
    if by_commit is not None:
        return Release(tag, by_commit, "commit")
    raise ReleaseNotFoundError(
        f"the previous release is not in this clone ({repo}): neither tag {tag} nor commit {commit} (pinned in "
        f"{release_file}) exists. Fetch it: `git fetch origin tag {tag}`, or `git fetch --unshallow` in a shallow "
        "clone"
    )


def export(release: Release, dest: Path, repo: Path = REPO) -> Path:
    """The release's tree (`git archive` of its commit) extracted into `dest`; returns `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = dest.parent / f"{dest.name}.tar"
    subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", f"--output={archive}", release.commit], check=True
    )
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="tar")
    archive.unlink()
    return dest


def commit_time(release: Release, repo: Path = REPO) -> int:
    """The commit's time (the release build's SOURCE_DATE_EPOCH, as a build from its checkout would use)."""
    out = subprocess.run(
        ["git", "-C", str(repo), "log", "-1", "--format=%ct", release.commit],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip())


def image_build_module(tree: Path) -> str:
    """The image build of a source tree: `harness.image.build`, or the one under e2e/ in a release before the move."""
    return "harness.image.build" if (tree / "harness" / "image" / "build.py").is_file() else "e2e.image.build"


def build_image(release: Release, tree: Path, out: Path, repo: Path = REPO) -> ReleaseImage:
    """Run the release tree's own image build (`python -m <image_build_module(tree)>` in `tree`) into `out`.

    The exported tree is no git checkout, so the tag (`<tag without v>-<short commit>`) and SOURCE_DATE_EPOCH
    are given as a build from the release's checkout would compute them."""
    tag = f"{release.tag.removeprefix('v')}-{release.commit[:7]}"
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(commit_time(release, repo)), "PYTHONSAFEPATH": ""}
    env.pop("PYTHONPATH", None)
    argv = [sys.executable, "-m", image_build_module(tree), "--out", str(out), "--tag", tag]
    done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, check=False, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"the image build of {release.tag} failed ({done.returncode}):\n{done.stdout[-3000:]}"
                           f"{done.stderr[-3000:]}")  # fmt: skip
    described = json.loads((out / "image.json").read_text())
    return ReleaseImage(str(described["name"]), Path(described["archive"]))
