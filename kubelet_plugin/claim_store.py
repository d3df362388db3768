"""The files a prepared claim has on the node: its CDI spec, its per-request info files and its HAMi-core files.

Replacing writes are atomic (``filelock.atomic_write``): a reader sees the old or the new file, never a torn
one; the info files of a claim's new directory are written in place (``container_info.write_claim_files``).
None of them is fsynced: only a power loss or a kernel crash loses or tears a written but unsynced file, and
both change the node's boot ID. After a boot ID change recovery re-writes every claim's files from the API
before the plugin serves, and the kubelet prepares every claim again (which re-writes them) before any of its
containers starts. On the usual tmpfs CDI dir (``/var/run/cdi``) the specs die with a reboot anyway; a
persistent CDI dir gets the same guarantee, not a weaker one. The one fsynced write is the checkpoint's.
Callers hold the node lock.
"""

import contextlib
import shutil
from pathlib import Path

from kubelet_plugin import cdi, container_info
from kubelet_plugin.claim_spec import ClaimPlan, hami_cache_dir, hami_cache_root, hami_preload_file
from kubelet_plugin.filelock import atomic_write, remove_temp_files
from kubelet_plugin.settings import Settings

HAMI_PRELOAD = b"/usr/local/vgpu/libvgpu.so\n"


class ClaimStore:
    """Writes, lists and removes this driver's per-claim files under the settings' CDI and plugin data dirs."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._cdi_dir = settings.cdi_dir
        self._driver = settings.driver_name

    def write(self, claim_uid: str, plan: ClaimPlan) -> None:
        """Write the plan's info files, HAMi-core files, then its spec (everything the spec mounts exists before
        the spec does). Nothing is written for a plan without a spec. Raises OSError."""
        if plan.spec is None:
            return
        container_info.write_claim_files(
            container_info.claim_info_dir(self._settings.plugin_data_dir, claim_uid), list(plan.files)
        )
        if plan.hami_core:
            self._write_hami_files(claim_uid)
        cdi.write_spec(self._cdi_dir, claim_uid, plan.spec, self._driver)

    def _write_hami_files(self, claim_uid: str) -> None:
        preload = hami_preload_file(self._settings)
        try:
            current = preload.read_bytes()
        except FileNotFoundError:
            current = None
        if current != HAMI_PRELOAD:
            atomic_write(preload, HAMI_PRELOAD, 0o644)
        hami_cache_dir(self._settings, claim_uid).mkdir(parents=True, exist_ok=True)
        self._settings.hami_core_lock_dir.mkdir(parents=True, exist_ok=True)

    def remove(self, claim_uid: str) -> None:
        """Delete the claim's spec, then its HAMi-core cache and info files; absent ones are fine. Raises OSError."""
        cdi.remove_spec(self._cdi_dir, self._driver, claim_uid)
        shutil.rmtree(hami_cache_dir(self._settings, claim_uid), ignore_errors=True)
        container_info.remove_claim_files(self._settings.plugin_data_dir, claim_uid)

    def remove_spec(self, claim_uid: str) -> None:
        """Delete the claim's spec only (absent is fine)."""
        cdi.remove_spec(self._cdi_dir, self._driver, claim_uid)

    def spec_uids(self) -> set[str]:
        """UIDs of the claims that have a spec file of this driver."""
        return cdi.list_spec_claim_uids(self._cdi_dir, self._driver)

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
        removed += [("claim info files", uid) for uid in container_info.remove_orphan_claim_files(data_dir, keep)]
        caches = hami_cache_root(self._settings)
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
