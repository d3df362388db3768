"""The container image assembled without Docker (issue #5): it builds, imports into containerd, runs.

Builds the OCI archive with `harness.image.build` (base rootfs and wheels cached under FRACGPU_CACHE), starts a
private containerd 2.x, `ctr images import`s the archive and `ctr run`s both commands in it. Needs root (for
debootstrap, chroot and containers); installs debootstrap and runc with apt-get when they are missing.
"""

import json
import os
import re
import shutil
import tarfile
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from packaging.utils import NormalizedName, canonicalize_name

from harness import lock
from harness.cluster import binaries
from harness.cluster.containerd import Containerd
from harness.image import build, oci

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: debootstrap, chroot and containers"),
]


@pytest.fixture(scope="session")
def image(tmp_path_factory: pytest.TempPathFactory) -> build.BuildResult:
    """The image archive, built into a temporary directory (reusing the cached base and wheels)."""
    return build.build_image(tmp_path_factory.mktemp("image"))


@pytest.fixture(scope="module")
def containerd() -> Iterator[Containerd]:
    state_dir = Path(tempfile.mkdtemp(prefix="fracgpu-ctd-", dir="/tmp"))  # short: sockets live here
    ctd = Containerd(state_dir)
    ctd.start()
    try:
        yield ctd
    finally:
        ctd.stop()
        shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def imported(containerd: Containerd, image: build.BuildResult) -> str:
    """The image's name after `ctr images import`."""
    containerd.ctr("images", "import", image.archive.path, timeout=300)
    return image.name


INSTALLED = "import importlib.metadata as m, json; print(json.dumps({d.name: d.version for d in m.distributions()}))"


def run(containerd: Containerd, image: str, *argv: str) -> tuple[int, str]:
    """`ctr run --rm` the image with `argv` (the image's CMD when empty): exit status and output."""
    result = containerd.ctr("run", "--rm", image, f"t-{uuid.uuid4().hex[:8]}", *argv, check=False, timeout=120)
    return result.returncode, result.stdout + result.stderr


def test_tag_is_version_and_commit(image: build.BuildResult) -> None:
    assert re.fullmatch(rf"{re.escape(build.project_version())}-([0-9a-f]{{7,}}|unknown)(-dirty)?", image.tag)
    assert image.name == f"{build.IMAGE_REPO}:{image.tag}"
    assert image.archive.path.name == f"fracgpu-{image.tag}.oci.tar"


def test_archive_is_an_oci_layout_with_two_layers(image: build.BuildResult) -> None:
    with tarfile.open(image.archive.path) as tar:
        names = set(tar.getnames())
        config: dict[str, Any] = json.loads(_read(tar, f"blobs/sha256/{image.archive.config_digest[7:]}"))
        manifest: dict[str, Any] = json.loads(_read(tar, f"blobs/sha256/{image.archive.manifest_digest[7:]}"))
    assert {"oci-layout", "index.json"} <= names
    (entry,) = oci.read_archive_index(image.archive.path)["manifests"]
    assert entry["digest"] == image.archive.manifest_digest
    assert entry["annotations"] == {oci.ANNOTATION_CONTAINERD_NAME: image.name, oci.ANNOTATION_REF_NAME: image.tag}
    assert [layer["digest"] for layer in manifest["layers"]] == [layer.digest for layer in image.archive.layers]
    assert len(manifest["layers"]) == 2
    assert config["rootfs"]["diff_ids"] == [layer.diff_id for layer in image.archive.layers]
    assert config["config"]["User"] == "65532:65532"
    assert config["config"]["Env"][0].startswith("PATH=/opt/fracgpu/bin:")
    assert config["config"]["Labels"]["org.opencontainers.image.version"] == build.project_version()


def _read(tar: tarfile.TarFile, name: str) -> bytes:
    member = tar.extractfile(name)
    assert member is not None
    return member.read()


def test_app_layer_is_reproducible(image: build.BuildResult, tmp_path: Path) -> None:
    """The same base, wheels and SOURCE_DATE_EPOCH give the same app layer, byte for byte."""
    base, app = image.archive.layers
    again = build.build_app_layer(
        base, image.inputs, tmp_path / "app.tar.gz", epoch=image.epoch, work=tmp_path / "work"
    )
    assert (again.digest, again.diff_id, again.size) == (app.digest, app.diff_id, app.size)


def test_image_imports_under_its_name(containerd: Containerd, imported: str) -> None:
    assert imported in containerd.image_names()


@pytest.mark.parametrize("command", ["fracgpu-controller", "fracgpu-kubelet-plugin"])
def test_command_help_runs_in_the_image(containerd: Containerd, imported: str, command: str) -> None:
    code, output = run(containerd, imported, command, "--help")
    assert code == 0, output
    assert f"usage: {command}" in output


@pytest.mark.parametrize("command", ["nvidia-ctk", "nvidia-cdi-hook"])
def test_nvidia_toolkit_runs_in_the_image(containerd: Containerd, imported: str, command: str) -> None:
    """The node plugin's driver edits run nvidia-ctk and install nvidia-cdi-hook from /usr/bin."""
    code, output = run(containerd, imported, f"/usr/bin/{command}", "--version")
    assert code == 0, output
    assert binaries.version_of(command).removeprefix("v") in output


def test_image_holds_exactly_the_pinned_versions(containerd: Containerd, imported: str) -> None:
    """The venv in the image has constraints.txt's versions, the ones `make venv` and CI test."""
    code, output = run(containerd, imported, "python", "-c", INSTALLED)
    assert code == 0, output
    lines = [line.strip() for line in output.splitlines() if line.strip().startswith("{")]
    assert lines, f"no JSON in the output: {output!r}"
    installed: dict[NormalizedName, str] = {canonicalize_name(n): v for n, v in json.loads(lines[-1]).items()}
    assert installed.pop(canonicalize_name("fracgpu")) == build.project_version()
    pins = lock.read_pins()
    assert {n: str(pins.get(n)) for n in installed} == installed, "every distribution in the image is pinned"
    assert {"pydantic", "pydantic-settings", "kopf", "grpcio"} <= set(installed)


def test_default_command_is_controller_help(containerd: Containerd, imported: str) -> None:
    code, output = run(containerd, imported)
    assert code == 0, output
    assert "usage: fracgpu-controller" in output


def test_default_user_is_non_root(containerd: Containerd, imported: str) -> None:
    code, output = run(containerd, imported, "id")
    assert code == 0, output
    assert "uid=65532(fracgpu) gid=65532(fracgpu)" in output
    code, output = run(containerd, imported, "sh", "-c", "touch /opt/fracgpu/x")
    assert code != 0, "the venv must not be writable by the default user"
