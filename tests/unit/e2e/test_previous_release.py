"""Unit tests of finding the previous release in a clone (e2e/upgrade/release.py), on a scratch git repository."""

import subprocess
from pathlib import Path

import pytest

from e2e.install import accepted_by
from e2e.upgrade import release


def git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env)
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "chart.yaml").write_text("version: 0.1.0\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "release")
    return repo


def pin(tmp_path: Path, tag: str, commit: str) -> Path:
    env = tmp_path / "previous-release.env"
    env.write_text(f"# comment\nPREVIOUS_RELEASE_TAG={tag}\nPREVIOUS_RELEASE_COMMIT={commit}\n")
    return env


def test_the_repository_pins_the_tag_and_a_full_commit() -> None:
    tag, commit = release.pinned()
    assert tag == "v0.1.0" and len(commit) == 40 and int(commit, 16) >= 0


def test_found_by_tag_and_by_the_pinned_commit_without_tags(repo: Path, tmp_path: Path) -> None:
    head = git(repo, "rev-parse", "HEAD")
    env = pin(tmp_path, "v0.1.0", head)
    assert release.find(repo, env) == release.Release("v0.1.0", head, "commit"), "no tag fetched: by commit"
    git(repo, "tag", "-a", "v0.1.0", "-m", "fracgpu 0.1.0")
    assert release.find(repo, env) == release.Release("v0.1.0", head, "tag"), "annotated tag peeled to its commit"


def test_neither_tag_nor_commit_fails_saying_how_to_fetch(repo: Path, tmp_path: Path) -> None:
    env = pin(tmp_path, "v0.1.0", "d6100b36d5231bc30a414c198e1a7b9cec84bacb")
    with pytest.raises(release.ReleaseNotFoundError) as err:
        release.find(repo, env)
    message = str(err.value)
    assert "neither tag v0.1.0 nor commit d6100b36d5231bc30a414c198e1a7b9cec84bacb" in message
    assert "git fetch origin tag v0.1.0" in message and str(env) in message


def test_a_tag_on_another_commit_than_the_pinned_one_is_refused(repo: Path, tmp_path: Path) -> None:
    first = git(repo, "rev-parse", "HEAD")
    git(repo, "commit", "-q", "--allow-empty", "-m", "later")
    git(repo, "tag", "v0.1.0")
    with pytest.raises(release.ReleaseNotFoundError, match=f"tag v0.1.0 is commit .* but .* pins {first}"):
        release.find(repo, pin(tmp_path, "v0.1.0", first))


def test_export_writes_the_commits_tree(repo: Path, tmp_path: Path) -> None:
    head = git(repo, "rev-parse", "HEAD")
    (repo / "chart.yaml").write_text("version: changed after the release\n")
    tree = release.export(release.Release("v0.1.0", head, "commit"), tmp_path / "tree", repo)
    assert (tree / "chart.yaml").read_text() == "version: 0.1.0\n"
    assert not (tmp_path / "tree.tar").exists(), "the archive is removed after extraction"


def test_an_older_chart_gets_only_the_values_it_declares() -> None:
    defaults = {"controller": {"replicas": 1, "nodeSelector": {}}, "kubeletPlugin": {"image": "x"}}
    values = {
        "controller": {"replicas": 2, "leaderElection": {"enabled": True}, "nodeSelector": {"kubernetes.io/os": "l"}},
        "kubeletPlugin": {"image": "y", "health": {"enabled": True}},
        "deviceClass": {"extendedResource": {"enabled": True}},
    }
    assert accepted_by(values, defaults) == {
        "controller": {"replicas": 2, "nodeSelector": {"kubernetes.io/os": "l"}},
        "kubeletPlugin": {"image": "y"},
    }
