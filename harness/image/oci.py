"""Reproducible OCI pieces written with tarfile, gzip, hashlib and json only.

`write_layer` packs a directory (or chosen paths of it) into a gzip layer blob: entries in path order, every
mtime set to one epoch, numeric owners kept and names dropped, gzip header without name or time. The same
tree and epoch give the same bytes, hence the same digest. `write_image_archive` writes an OCI image layout
(oci-layout, index.json, blobs/sha256/...) as one tar that `ctr images import` accepts.
"""

import contextlib
import gzip
import hashlib
import json
import os
import tarfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
# containerd names an imported image after this annotation (full reference); OCI's ref.name holds the tag.
ANNOTATION_CONTAINERD_NAME = "io.containerd.image.name"
ANNOTATION_REF_NAME = "org.opencontainers.image.ref.name"
GZIP_LEVEL = 6  # zlib's default: a few seconds for the base layer; level 9 gains ~2 % for twice the time


@dataclass(frozen=True)
class Layer:
    """A gzip layer blob on disk with its OCI digests (`sha256:<hex>`)."""

    path: Path
    digest: str  # of the compressed blob (what the manifest names)
    size: int  # of the compressed blob
    diff_id: str  # of the uncompressed tar (what the image config names)

    def descriptor(self) -> dict[str, Any]:
        return {"mediaType": MEDIA_LAYER_GZIP, "digest": self.digest, "size": self.size}

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "path": str(self.path)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Layer":
        return cls(Path(data["path"]), str(data["digest"]), int(data["size"]), str(data["diff_id"]))


@dataclass(frozen=True)
class ImageArchive:
    """An OCI image-layout tar and the digests inside it."""

    path: Path
    name: str  # full reference containerd gives the image, e.g. fracgpu.local/fracgpu:0.1.0-abc1234
    manifest_digest: str
    config_digest: str
    layers: tuple[Layer, ...]


class _HashingWriter:
    """A write-only file object that hashes and counts what passes through to `target` (if any)."""

    def __init__(self, target: BinaryIO | gzip.GzipFile | None) -> None:
        self.target = target
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes, /) -> int:
        self.sha.update(data)
        self.size += len(data)
        if self.target is not None:
            self.target.write(data)
        return len(data)

    def flush(self) -> None:
        if self.target is not None:
            self.target.flush()

    @property
    def digest(self) -> str:
        return f"sha256:{self.sha.hexdigest()}"


def canonical_json(obj: object) -> bytes:
    """JSON with sorted keys and no whitespace: equal objects give equal bytes (and digests)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def rfc3339(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _walk(root: Path, rel: str) -> Iterator[str]:
    """`rel` and, if it is a real directory, everything below it, depth first in name order."""
    yield rel
    path = root / rel
    if path.is_dir() and not path.is_symlink():
        for name in sorted(os.listdir(path)):
            yield from _walk(root, f"{rel}/{name}")


def layer_entries(root: Path, paths: Iterable[str] | None = None) -> list[str]:
    """Relative paths a layer of `root` holds: all of it, or `paths` with their parent directories."""
    tops = sorted(os.listdir(root)) if paths is None else sorted({p.strip("/") for p in paths})
    entries: set[str] = set()
    for top in tops:
        parts = top.split("/")
        entries.update("/".join(parts[:i]) for i in range(1, len(parts)))  # parents, for their metadata
        if not os.path.lexists(root / top):
            raise FileNotFoundError(root / top)
        entries.update(_walk(root, top))
    return sorted(entries, key=lambda p: p.split("/"))


def write_layer(root: Path, out: Path, *, epoch: int, paths: Iterable[str] | None = None) -> Layer:
    """Pack `root` (or `paths` below it) into the gzip tar `out`; reproducible for equal trees and epochs."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("wb") as raw:
        compressed = _HashingWriter(raw)
        with gzip.GzipFile(filename="", mode="wb", compresslevel=GZIP_LEVEL, fileobj=compressed, mtime=0) as gz:
            plain = _HashingWriter(gz)
            # A stream ("w|") only ever writes; typeshed wants a full file object.
            with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
                for rel in layer_entries(root, paths):
                    _add(tar, root / rel, rel, epoch)
    tmp.replace(out)
    return Layer(out, compressed.digest, compressed.size, plain.digest)


def _add(tar: tarfile.TarFile, path: Path, arcname: str, epoch: int) -> None:
    info = tar.gettarinfo(str(path), arcname)  # tracks hard links between the files added so far
    if info is None:  # a socket: nothing a layer can hold
        return
    info.mtime = epoch
    info.uname = info.gname = ""  # numeric owners only: the host's user names mean nothing in the image
    if info.isreg():
        with path.open("rb") as f:
            tar.addfile(info, f)
    else:
        tar.addfile(info)


def _tar_bytes(tar: tarfile.TarFile, name: str, data: bytes, epoch: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), epoch, 0o644
    tar.addfile(info, _BytesReader(data))


class _BytesReader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n < 0 else self.pos + n
        chunk, self.pos = self.data[self.pos : end], min(end, len(self.data))
        return chunk


def write_image_archive(
    out: Path,
    *,
    layers: Sequence[Layer],
    config: Mapping[str, Any],
    name: str,
    epoch: int,
    annotations: Mapping[str, str] | None = None,
) -> ImageArchive:
    """Write an OCI image layout tar with one linux/amd64 manifest named `name` (`repo:tag`).

    `config` is the image config without `rootfs` (filled from `layers`). The index entry carries both
    containerd's full-name annotation and OCI's tag-only ref.name, as `ctr images export` writes them.
    """
    image_config = {**config, "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]}}
    config_bytes = canonical_json(image_config)
    config_digest = f"sha256:{hashlib.sha256(config_bytes).hexdigest()}"
    manifest: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": config_digest, "size": len(config_bytes)},
        "layers": [layer.descriptor() for layer in layers],
    }
    if annotations:
        manifest["annotations"] = dict(annotations)
    manifest_bytes = canonical_json(manifest)
    manifest_digest = f"sha256:{hashlib.sha256(manifest_bytes).hexdigest()}"
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [
            {
                "mediaType": MEDIA_MANIFEST,
                "digest": manifest_digest,
                "size": len(manifest_bytes),
                "platform": {"architecture": config.get("architecture", "amd64"), "os": config.get("os", "linux")},
                "annotations": {ANNOTATION_CONTAINERD_NAME: name, ANNOTATION_REF_NAME: tag},
            }
        ],
    }
    blobs: dict[str, bytes | Path] = {config_digest: config_bytes, manifest_digest: manifest_bytes}
    blobs.update({layer.digest: layer.path for layer in layers})

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, epoch
            tar.addfile(info)
        for digest in sorted(blobs):
            blob, arcname = blobs[digest], f"blobs/sha256/{digest.removeprefix('sha256:')}"
            if isinstance(blob, bytes):
                _tar_bytes(tar, arcname, blob, epoch)
                continue
            info = tarfile.TarInfo(arcname)
            info.size, info.mtime, info.mode = blob.stat().st_size, epoch, 0o644
            with blob.open("rb") as f:
                tar.addfile(info, f)
        _tar_bytes(tar, "index.json", canonical_json(index), epoch)
        _tar_bytes(tar, "oci-layout", canonical_json({"imageLayoutVersion": "1.0.0"}), epoch)
    tmp.replace(out)
    return ImageArchive(out, name, manifest_digest, config_digest, tuple(layers))


def read_archive_index(path: Path) -> dict[str, Any]:
    """index.json of an OCI image-layout tar."""
    with tarfile.open(path) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ValueError(f"{path}: no index.json")
        with contextlib.closing(member):
            data: dict[str, Any] = json.loads(member.read())
            return data
