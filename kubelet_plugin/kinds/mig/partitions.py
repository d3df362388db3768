"""The MIG partitions of claims on this node: made for a prepare, destroyed at unprepare, reconciled at recovery.

A claim's result on a published partition (``kinds/mig/publish.py``: a GPU-instance profile at one placement of a
``--mig-gpus`` GPU) needs that partition to exist before its CDI spec can name it. ``make`` creates it
(``MigManager.create``) or, on a repeat prepare, reuses the one the claim's checkpoint entry records when it is
still there (a recorded partition that is gone, e.g. after a reboot, is created again: another MIG UUID, which
the rewritten spec and the claim status then carry). The order the preparer keeps makes every crash repairable:
- prepare makes the partitions, then writes the files, then saves the entry that records them; a crash before
  the save leaves instances no entry owns: ``sweep`` at the next start destroys them (the kubelet retries);
- unprepare destroys the partitions first, then saves the checkpoint without the entry; a crash in between
  leaves an entry whose partitions are gone, which recovery re-creates only for a claim that still exists and
  is still allocated (the kubelet's retry of the unprepare then destroys them again);
- a partition that cannot be destroyed (a process still holds it) fails the unprepare of its claim, whose entry
  stays: the kubelet retries.
Every GPU instance on a MIG GPU that no entry owns is an orphan: GPUs named in ``--mig-gpus`` are fracgpu's.
Callers hold the node lock.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubelet_plugin.core.devicenodes import (
    DeviceNodeError,
    DeviceNodeSnapshot,
    caps_major,
    mig_cap_minors,
    stat_cap_nodes,
)
from kubelet_plugin.core.errors import ErrorKind, PrepareError
from kubelet_plugin.core.model import GpuInfo, MigGpu, MigRecord
from kubelet_plugin.kinds.mig.nvml import LiveInstance, MigError, MigManager
from kubelet_plugin.kinds.mig.publish import MigDevice, mig_catalog
from kubelet_plugin.kinds.share import PreparedPartition
from kubelet_plugin.state.checkpoint import Checkpoint, ClaimEntry

log = logging.getLogger(__name__)


class Partitioner:
    """Makes and destroys the MIG partitions of this node's claims (see the module docstring)."""

    def __init__(
        self,
        gpus: list[GpuInfo],
        mig: Mapping[str, MigGpu],
        manager: MigManager | None,
        *,
        node: str,
        driver: str,
        driver_root: Path,
        minors_file: Path,
        proc_devices: Path,
    ) -> None:
        """`mig`: the MIG GPUs (``--mig-gpus``) by device name and what they offer; `manager`: the driver's MIG
        calls (needed only where a MIG GPU's mode is on)."""
        self.devices: dict[str, MigDevice] = mig_catalog(gpus, mig)
        """The published partitions by device name."""
        self._enabled = [g for g in gpus if (m := mig.get(g.device_name)) is not None and m.state == "enabled"]
        self._manager = manager
        self._node = node
        self._driver = driver
        self._driver_root = driver_root
        self._minors_file = minors_file
        self._proc_devices = proc_devices

    def _mig(self) -> MigManager:
        if self._manager is None:
            raise PrepareError(ErrorKind.INTERNAL, "this plugin was started without a MIG manager")
        return self._manager

    def partition_results(self, claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        """The claim's allocation results of this driver on this node's published partitions."""
        results = claim["status"]["allocation"]["devices"].get("results") or []
        return [
            r
            for r in results
            if r["driver"] == self._driver and r["pool"] == self._node and r["device"] in self.devices
        ]

    def make(
        self, claim: Mapping[str, Any], prepared: ClaimEntry | None
    ) -> tuple[dict[str, PreparedPartition], list[MigRecord]]:
        """The partition of each of the claim's partition results (device name -> it) and those made now (the
        rest were `prepared`'s and are still there). On a failure every partition made now is destroyed again
        and PrepareError says why."""
        recorded = {d.device_name: d.mig for d in (prepared.devices if prepared else []) if d.mig is not None}
        made: list[MigRecord] = []
        out: dict[str, PreparedPartition] = {}
        try:
            for result in self.partition_results(claim):
                device = self.devices[str(result["device"])]
                record = recorded.get(device.name)
                if record is None or not self._alive(record):
                    if record is not None:
                        log.warning(
                            "a prepared claim's MIG partition is gone; creating it again",
                            extra={"device": device.name, "mig_uuid": record.uuid},
                        )
                    record = self._create(device)
                    made.append(record)
                out[device.name] = PreparedPartition(record, self._cap_minors(device.gpu, record))
        except Exception:
            self.undo(made)
            raise
        return out, made

    def _alive(self, record: MigRecord) -> bool:
        try:
            return self._mig().alive(record)
        except MigError as err:
            raise PrepareError(ErrorKind.MIG, f"cannot check MIG partition {record.uuid}: {err}") from None

    def _create(self, device: MigDevice) -> MigRecord:
        try:
            return self._mig().create(device.gpu, device.profile, device.start)
        except MigError as err:
            raise PrepareError(
                ErrorKind.MIG,
                f"cannot create MIG partition {device.profile.name} at placement {device.start} of GPU "
                f"{device.gpu.index} ({device.gpu.uuid}) for device {device.name}: {err}",
            ) from None

    def _cap_minors(self, gpu: GpuInfo, record: MigRecord) -> tuple[int, ...]:
        try:
            return mig_cap_minors(self._minors_file, gpu.minor, record.gpu_instance, record.compute_instance)
        except DeviceNodeError as err:
            raise PrepareError(ErrorKind.DEVICE_NODE_MISSING, str(err)) from None

    def with_cap_nodes(
        self, nodes: DeviceNodeSnapshot, partitions: Mapping[str, PreparedPartition]
    ) -> DeviceNodeSnapshot:
        """`nodes` with the capability nodes of `partitions` stat-ed (made where missing and the kernel lists the
        nvidia-caps major)."""
        minors = sorted({m for p in partitions.values() for m in p.cap_minors})
        if not minors:
            return nodes
        return nodes.with_found(stat_cap_nodes(self._driver_root, minors, caps_major(self._proc_devices)))

    def undo(self, records: list[MigRecord]) -> None:
        """Destroy partitions made for a prepare that failed afterwards; failures are logged (the next start's
        sweep destroys what remains)."""
        for record in records:
            try:
                self._mig().destroy(record)
            except (MigError, PrepareError) as err:
                log.error(
                    "cannot destroy a MIG partition of a failed prepare",
                    extra={"mig_uuid": record.uuid, "error": str(err)},
                )

    def destroy(self, uid: str, entry: ClaimEntry) -> None:
        """Destroy the partitions of a claim being unprepared; PrepareError when one cannot be (its entry stays)."""
        for device in entry.devices:
            if device.mig is None:
                continue
            try:
                self._mig().destroy(device.mig)
            except MigError as err:
                hint = "; the pod's processes still run on it, the kubelet retries" if err.in_use else ""
                raise PrepareError(
                    ErrorKind.MIG,
                    f"cannot destroy MIG partition {device.mig.uuid} of claim {uid} ({device.device_name}): {err}{hint}",
                ) from None
            log.info("destroyed a MIG partition", extra={"claim": uid, "mig_uuid": device.mig.uuid})

    def sweep(self, checkpoint: Checkpoint) -> list[str]:
        """At start: destroy every GPU instance on the MIG GPUs that no entry of `checkpoint` owns; return the
        UIDs of claims whose recorded partitions are gone (to make again). Logs, never raises."""
        if not self._enabled or self._manager is None:
            return []
        owned = checkpoint.mig_records()
        try:
            live = self._manager.instances(self._enabled)
        except MigError as err:
            log.error(
                "cannot list the MIG GPUs' instances; orphans stay until the next start", extra={"error": str(err)}
            )
            return []
        for instance in live:
            if not any(_owns(record, instance) for _, record in owned):
                self._destroy_orphan(instance)
        gone = []
        for uid, record in owned:
            if not any(_owns(record, instance) for instance in live):
                gone.append(uid)
        return sorted(set(gone))

    def _destroy_orphan(self, instance: LiveInstance) -> None:
        what = {
            "gpu": instance.parent_uuid,
            "gpu_instance": instance.gpu_instance,
            "placement": instance.placement_start,
        }
        try:
            self._mig().destroy_instance(instance)
        except (MigError, PrepareError) as err:
            log.error(
                "cannot destroy a MIG instance no claim owns; its placement stays taken",
                extra={**what, "error": str(err)},
            )
            return
        log.warning("destroyed a MIG instance no claim owns (left by a prepare that did not complete)", extra=what)


def _owns(record: MigRecord, instance: LiveInstance) -> bool:
    return (
        record.parent_uuid == instance.parent_uuid
        and record.gpu_instance == instance.gpu_instance
        and record.placement_start == instance.placement_start
        and record.profile_id == instance.profile_id
        and record.compute_instance in instance.compute_instances
    )
