"""A MIG manager with the driver's semantics over a dict (for the Preparer's tests; ``NvmlMig`` itself is tested on
the mock NVML): partitions at placements, refused when their memory slices or the compute slices are taken,
``IN_USE`` while marked in use, every created partition another MIG UUID. And the MIG facts of an H100 80GB as
NVML reports them, and of the other MIG products the mock models (A100 40GB, A100 80GB, H200 141GB):
``harness/mocknvml/mock_mig.c`` has the same tables, ``tests/unit/harness/test_mock_mig.py`` holds it to them."""

from __future__ import annotations

from dataclasses import dataclass, field

import pynvml

from kubelet_plugin.core.model import GpuInfo, MigGpu, MigProfile, MigRecord
from kubelet_plugin.kinds.mig.nvml import LiveInstance, MigError

H100_PROFILES = (
    MigProfile(name="1g.10gb", profile_id=19, compute_slices=1, memory_slices=1, memory_mib=9984,
               multiprocessors=16, placements=(0, 1, 2, 3, 4, 5, 6)),
    MigProfile(name="1g.20gb", profile_id=15, compute_slices=1, memory_slices=2, memory_mib=20096,
               multiprocessors=26, placements=(0, 2, 4, 6)),
    MigProfile(name="2g.20gb", profile_id=14, compute_slices=2, memory_slices=2, memory_mib=20096,
               multiprocessors=32, placements=(0, 2, 4)),
    MigProfile(name="3g.40gb", profile_id=9, compute_slices=3, memory_slices=4, memory_mib=40448,
               multiprocessors=60, placements=(0, 4)),
    MigProfile(name="4g.40gb", profile_id=5, compute_slices=4, memory_slices=4, memory_mib=40448,
               multiprocessors=64, placements=(0,)),
    MigProfile(name="7g.80gb", profile_id=0, compute_slices=7, memory_slices=8, memory_mib=81152,
               multiprocessors=132, placements=(0,)),
)  # fmt: skip
H100_MIG = MigGpu(state="enabled", memory_slices=8, compute_slices=7, profiles=H100_PROFILES)


def _product(rows: tuple[tuple[str, int, int, int, int, int], ...]) -> tuple[MigProfile, ...]:
    """A product's profiles from (name, id, compute slices, memory slices, memory MiB, multiprocessors), at the
    placements every MIG product has for each size."""
    starts = {(1, 1): (0, 1, 2, 3, 4, 5, 6), (1, 2): (0, 2, 4, 6), (2, 2): (0, 2, 4), (3, 4): (0, 4), (4, 4): (0,),
              (7, 8): (0,)}  # fmt: skip
    return tuple(
        MigProfile(
            name=name,
            profile_id=pid,
            compute_slices=c,
            memory_slices=m,
            memory_mib=mib,
            multiprocessors=sms,
            placements=starts[c, m],
        )
        for name, pid, c, m, mib, sms in rows
    )


A100_40GB_PROFILES = _product((
    ("1g.5gb", 19, 1, 1, 4864, 14), ("1g.10gb", 15, 1, 2, 9984, 14), ("2g.10gb", 14, 2, 2, 9984, 28),
    ("3g.20gb", 9, 3, 4, 20096, 42), ("4g.20gb", 5, 4, 4, 20096, 56), ("7g.40gb", 0, 7, 8, 40448, 98),
))  # fmt: skip
A100_80GB_PROFILES = _product((
    ("1g.10gb", 19, 1, 1, 9728, 14), ("1g.20gb", 15, 1, 2, 19968, 14), ("2g.20gb", 14, 2, 2, 19968, 28),
    ("3g.40gb", 9, 3, 4, 40192, 42), ("4g.40gb", 5, 4, 4, 40192, 56), ("7g.80gb", 0, 7, 8, 80896, 98),
))  # fmt: skip
H200_PROFILES = _product((
    ("1g.18gb", 19, 1, 1, 16384, 16), ("1g.35gb", 15, 1, 2, 33280, 26), ("2g.35gb", 14, 2, 2, 33280, 32),
    ("3g.71gb", 9, 3, 4, 66816, 60), ("4g.71gb", 5, 4, 4, 66816, 64), ("7g.141gb", 0, 7, 8, 143360, 132),
))  # fmt: skip
PRODUCTS = {
    "NVIDIA A100-SXM4-40GB": A100_40GB_PROFILES,
    "NVIDIA A100-SXM4-80GB": A100_80GB_PROFILES,
    "NVIDIA H100 80GB HBM3": H100_PROFILES,
    "NVIDIA H200": H200_PROFILES,
}
"""Each MIG product's profiles (media variants left out, as discovery leaves them), by NVML's product name."""


def profile(name: str) -> MigProfile:
    return next(p for p in H100_PROFILES if p.name == name)


@dataclass
class _Instance:
    profile: MigProfile
    start: int
    serial: int
    compute_instances: tuple[int, ...] = (0,)


@dataclass
class FakeMig:
    """The MigManager protocol over `live` (GPU UUID -> GPU instance id -> instance)."""

    live: dict[str, dict[int, _Instance]] = field(default_factory=dict)
    in_use: set[str] = field(default_factory=set)  # MIG UUIDs a process holds
    serial: int = 0
    calls: list[str] = field(default_factory=list)

    @staticmethod
    def uuid(gpu: str, gi: int, serial: int) -> str:
        return f"MIG-{serial:08x}-{gi:04x}-4000-8000-{int(gpu[-12:], 16):012x}"

    def create(self, gpu: GpuInfo, profile: MigProfile, start: int) -> MigRecord:
        self.calls.append(f"create {profile.name}@{start}")
        on_gpu = self.live.setdefault(gpu.uuid, {})
        end = start + profile.memory_slices
        taken = any(i.start < end and start < i.start + i.profile.memory_slices for i in on_gpu.values())
        compute = sum(i.profile.compute_slices for i in on_gpu.values()) + profile.compute_slices
        if taken or compute > 7:
            raise MigError("Insufficient resources", pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi = 20 + start * 4 + profile.memory_slices  # unique among live instances, as the driver's ids are
        self.serial += 1
        on_gpu[gi] = _Instance(profile, start, self.serial)
        return MigRecord(
            parent_uuid=gpu.uuid,
            gpu_instance=gi,
            compute_instance=0,
            profile=profile.name,
            profile_id=profile.profile_id,
            placement_start=start,
            memory_slices=profile.memory_slices,
            uuid=self.uuid(gpu.uuid, gi, self.serial),
            memory_mib=profile.memory_mib,
            multiprocessors=profile.multiprocessors,
        )

    def _of(self, record: MigRecord) -> _Instance | None:
        found = self.live.get(record.parent_uuid, {}).get(record.gpu_instance)
        if found is None or found.start != record.placement_start or found.profile.profile_id != record.profile_id:
            return None
        return found

    def alive(self, record: MigRecord) -> bool:
        found = self._of(record)
        return found is not None and self.uuid(record.parent_uuid, record.gpu_instance, found.serial) == record.uuid

    def destroy(self, record: MigRecord) -> None:
        self.calls.append(f"destroy {record.profile}@{record.placement_start}")
        if self._of(record) is None:
            return
        if record.uuid in self.in_use:
            raise MigError("In use by another client", pynvml.NVML_ERROR_IN_USE)
        del self.live[record.parent_uuid][record.gpu_instance]

    def instances(self, gpus: list[GpuInfo]) -> list[LiveInstance]:
        return [
            LiveInstance(g.uuid, gi, i.profile.profile_id, i.start, i.compute_instances)
            for g in gpus
            for gi, i in sorted(self.live.get(g.uuid, {}).items())
        ]

    def destroy_instance(self, instance: LiveInstance) -> None:
        self.calls.append(f"destroy-orphan {instance.gpu_instance}")
        self.live.get(instance.parent_uuid, {}).pop(instance.gpu_instance, None)

    def count(self) -> int:
        return sum(len(v) for v in self.live.values())
