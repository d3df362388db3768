"""The files a prepared claim has on the node: its CDI spec, its per-request info and device metadata files and its
HAMi-core files.

Replacing writes are atomic (``filelock.atomic_write``): a reader sees the old or the new file, never a torn
one; the info files of a claim's new directory are written in place (``write_claim_files``).
None of them is fsynced: only a power loss or a kernel crash loses or tears a written but unsynced file, and
both change the node's boot ID. After a boot ID change recovery re-writes every claim's files from the API
before the plugin serves, and the kubelet prepares every claim again (which re-writes them) before any of its
containers starts. On the usual tmpfs CDI dir (``/var/run/cdi``) the specs die with a reboot anyway; a
persistent CDI dir gets the same guarantee, not a weaker one. The one fsynced write is the checkpoint's.
Callers hold the node lock.
"""

import contextlib
import os
import shutil
from pathlib import Path

from kubelet_plugin.core.filelock import atomic_write, remove_temp_files, write_new
from kubelet_plugin.core.settings import Settings
from kubelet_plugin.state import cdi, container_info, device_metadata

HAMI_PRELOAD = b"/usr/local/vgpu/libvgpu.so\n"
ClaimFile = container_info.InfoFile | device_metadata.MetadataFile
"""A file of a claim's directory: a request's info file or its device metadata."""


class ClaimStore:
    """Writes, lists and removes this driver's per-claim files under the settings' CDI and plugin data dirs."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._cdi_dir = settings.cdi_dir
        self._driver = settings.driver_name

    def write(self, claim_uid: str, spec: cdi.Spec, files: list[ClaimFile], *, hami_core: bool) -> None:
        """Write the claim's info and metadata `files`, its HAMi-core files (with `hami_core`), then its `spec`
        (everything the spec mounts exists before the spec does). Raises OSError."""
        directory = container_info.claim_info_dir(self._settings.plugin_data_dir, claim_uid)
        write_claim_files(directory, files)
        if hami_core:
            self._write_hami_files(claim_uid)
        write_spec(self._cdi_dir, claim_uid, spec, self._driver)

    def _write_hami_files(self, claim_uid: str) -> None:
        preload = container_info.hami_preload_file(self._settings)
        try:
            current = preload.read_bytes()
        except FileNotFoundError:
            current = None
        if current != HAMI_PRELOAD:
            atomic_write(preload, HAMI_PRELOAD, 0o644)
        container_info.hami_cache_dir(self._settings, claim_uid).mkdir(parents=True, exist_ok=True)
        self._settings.hami_core_lock_dir.mkdir(parents=True, exist_ok=True)

    def remove(self, claim_uid: str) -> None:
        """Delete the claim's spec, then its HAMi-core cache and info files; absent ones are fine. Raises OSError."""
        remove_spec(self._cdi_dir, self._driver, claim_uid)
        shutil.rmtree(container_info.hami_cache_dir(self._settings, claim_uid), ignore_errors=True)
        remove_claim_files(self._settings.plugin_data_dir, claim_uid)

    def remove_spec(self, claim_uid: str) -> None:
        """Delete the claim's spec only (absent is fine)."""
        remove_spec(self._cdi_dir, self._driver, claim_uid)

    def spec_uids(self) -> set[str]:
        """UIDs of the claims that have a spec file of this driver."""
        return list_spec_claim_uids(self._cdi_dir, self._driver)

    def read_spec(self, claim_uid: str) -> str | None:
        """The text of the claim's spec file; None if it cannot be read."""
        try:
            return cdi.spec_path(self._cdi_dir, self._driver, claim_uid).read_text()
        except (OSError, UnicodeDecodeError):
            return None

    def remove_orphans(self, keep: set[str]) -> list[tuple[str, str]]:
        """Delete specs, info files and HAMi-core caches of claims not in `keep`, and temp files of interrupted
        spec writes; return (what, claim UID or path) for each removal, for the log."""
        removed = []
        for uid in sorted(self.spec_uids() - keep):
            self.remove_spec(uid)
            removed.append(("CDI spec", uid))
        data_dir = self._settings.plugin_data_dir
        removed += [("claim info files", uid) for uid in remove_orphan_claim_files(data_dir, keep)]
        caches = container_info.hami_cache_root(self._settings)
        with contextlib.suppress(FileNotFoundError):
            for entry in sorted(caches.iterdir()):
                if entry.name not in keep and entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                    removed.append(("HAMi-core cache", entry.name))
        removed += [("temp file", str(p)) for p in remove_temp_files(self._cdi_dir, cdi.spec_file_prefix(self._driver))]
        return removed

    @property
    def cdi_dir(self) -> Path:
        """Where the specs are."""
        return self._cdi_dir


# ---------------------------------------------------------------------------------------------------
# a claim's CDI spec and info files (ClaimStore's primitives; module level so that tests can fail them)


def write_spec(cdi_dir: Path, claim_uid: str, spec: cdi.Spec, driver: str) -> Path:
    """Atomically write the claim's spec (mode 0644, JSON, minimum cdiVersion); return its path.

    Not fsynced: only a power loss or a kernel crash can lose or tear an unsynced file, both change the boot
    ID, and after a boot ID change recovery re-writes every spec (and the kubelet prepares every claim again
    before any container of it starts), so an fsync would protect nothing (see this module's docstring).
    Raises ``ValueError`` if ``spec.kind`` is not this driver's kind or a name is invalid.
    """
    expected_kind = cdi.cdi_kind(driver)
    if spec.kind != expected_kind:
        raise ValueError(f"CDI spec kind {spec.kind!r} does not match driver kind {expected_kind!r}")
    path = cdi.spec_path(cdi_dir, driver, claim_uid)
    atomic_write(path, cdi.with_minimum_version(spec).to_json().encode(), cdi.SPEC_FILE_MODE, durable=False)
    return path


def remove_spec(cdi_dir: Path, driver: str, claim_uid: str) -> bool:
    """Delete the claim's spec; ``False`` if there was none (not an error)."""
    try:
        cdi.spec_path(cdi_dir, driver, claim_uid).unlink()
    except FileNotFoundError:
        return False
    return True


def list_spec_claim_uids(cdi_dir: Path, driver: str) -> set[str]:
    """Claim UIDs that have a spec file of this driver in ``cdi_dir`` (for orphan cleanup)."""
    prefix = cdi.spec_file_prefix(driver)
    try:
        entries = list(cdi_dir.iterdir())
    except FileNotFoundError:
        return set()
    uids: set[str] = set()
    for entry in entries:
        name = entry.name
        if name.startswith(prefix) and name.endswith(".json"):
            uid = name[len(prefix) : -len(".json")]
            if cdi.DEVICE_NAME_RE.fullmatch(uid):
                uids.add(uid)
    return uids


def write_claim_files(directory: Path, files: list[ClaimFile]) -> None:
    """Write each file whose content changed and delete files of requests the claim no longer has. All files
    must be in `directory`. Raises OSError.

    In an existing directory a changed file is replaced atomically (a bind-mounted inode stays put). In a
    directory this call created (the common case, a claim prepared anew) nothing can read the files yet, so
    they are written in place, without a temp file: a crash in the middle leaves a torn file only in the
    directory of a claim whose prepare did not complete, and the checkpoint saved after the files decides.
    A claim new to the checkpoint is an orphan that recovery removes; a claim already completed (its directory
    deleted meanwhile) is prepared again by the kubelet's retry, which finds the file differs and replaces it.
    Not durable: after a power loss every claim's files are written again (this module's docstring)."""
    wanted = {f.host_path.name for f in files}
    try:
        directory.mkdir(mode=0o755, parents=True)
        created = True  # empty: nothing to compare with or delete
    except FileExistsError:
        created = False
    for f in files:
        if f.host_path.parent != directory:
            raise ValueError(f"{f.host_path} is not in {directory}")
        content = f.content()
        if created:
            write_new(f.host_path, content, container_info.INFO_FILE_MODE)
            continue
        try:
            if f.host_path.read_bytes() == content:
                continue
        except FileNotFoundError:
            pass
        atomic_write(f.host_path, content, container_info.INFO_FILE_MODE, durable=False)
    for existing in () if created else directory.iterdir():
        if existing.name.endswith(container_info.INFO_SUFFIX) and existing.name not in wanted:
            existing.unlink()


def remove_claim_files(plugin_data_dir: Path, claim_uid: str) -> bool:
    """Delete a claim's directory of files; False if there was none. Raises OSError on other failures.

    The directory holds only the files ``write_claim_files`` wrote (and temp files of its writes): they are
    unlinked and the directory removed, a third cheaper than ``shutil.rmtree``'s descriptor walk; anything else
    found there (a subdirectory) is left to ``shutil.rmtree``."""
    directory = container_info.claim_info_dir(plugin_data_dir, claim_uid)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return False
    try:
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(directory / name)
        os.rmdir(directory)
    except FileNotFoundError:
        pass
    except OSError:  # not only files: remove it all
        shutil.rmtree(directory)
    return True


def remove_orphan_claim_files(plugin_data_dir: Path, keep: set[str]) -> list[str]:
    """Delete the file directories of claims not in `keep` (recovery); return their UIDs. Entries that are
    not claim directories are left alone."""
    root = container_info.claim_info_root(plugin_data_dir)
    try:
        entries = sorted(root.iterdir())
    except FileNotFoundError:
        return []
    removed = []
    for entry in entries:
        if entry.name in keep or not container_info.KEYABLE_RE.fullmatch(entry.name) or not entry.is_dir():
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry.name)
    return removed


def info_file_paths(plugin_data_dir: Path, claim_uid: str) -> list[Path]:
    """The paths of a prepared claim's info files (one per request), sorted; none when it has no directory. The
    directory also holds the requests' device metadata (``<request>.metadata``), which is not an info file."""
    directory = container_info.claim_info_dir(plugin_data_dir, claim_uid)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return [directory / n for n in sorted(names) if n.endswith(container_info.INFO_SUFFIX)]


def read_request_infos(plugin_data_dir: Path, claim_uid: str) -> list[container_info.RequestInfo]:
    """A prepared claim's info files, parsed. Raises OSError and pydantic's ValidationError (a file being
    replaced, or one of a newer schema)."""
    return [
        container_info.RequestInfo.model_validate_json(p.read_bytes())
        for p in info_file_paths(plugin_data_dir, claim_uid)
    ]


def prepared_claim_uids(plugin_data_dir: Path) -> list[str]:
    """The UIDs of the claims that have a directory of files, sorted."""
    root = container_info.claim_info_root(plugin_data_dir)
    try:
        return sorted(e.name for e in os.scandir(root) if e.is_dir() and container_info.KEYABLE_RE.fullmatch(e.name))
    except FileNotFoundError:
        return []
