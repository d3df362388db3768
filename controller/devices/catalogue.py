"""The catalogue of published devices, recomputed from the slice index only when a slice changes.

Each device of our driver (newest pool generation) by its key, the name of its GPU object and back, what the ledger
says is free on it, the nodes that publish devices, and the `AdmissionFacts` the webhook's thread reads (published
by one attribute assignment).
"""

from collections.abc import Mapping

from api.gpu import gpu_object_name
from api.mig import TYPE_MIG
from api.names import MPS_DEVICE_CLASS_NAME
from api.quantity import to_bytes
from controller.core.context import Context
from controller.core.slices import DeviceKey, DeviceRecord, current_devices
from controller.devices.facts import AdmissionFacts, admission_facts


class DeviceCatalogue:
    """Published devices of our driver and what follows from them, cached until the slices change."""

    def __init__(self, context: Context) -> None:
        self._context = context
        self._devices: dict[DeviceKey, DeviceRecord] | None = None
        self._names: dict[DeviceKey, str] = {}  # published device -> its GPU object's name
        self._keys: dict[str, DeviceKey] = {}  # and back
        self.admission = AdmissionFacts()
        """What admission reviews read (from the webhook's thread; see `AdmissionFacts`)."""

    def reset(self) -> None:
        """Forget the catalogue (new indexes bound): recomputed at the next read."""
        self._devices = None
        self.admission = AdmissionFacts()

    def refresh(self) -> bool:
        """Recompute from the slices; whether the published devices differ from before (a re-list delivers every
        slice again without changing any)."""
        previous = self._devices
        return self._recompute() != previous

    def _recompute(self) -> dict[DeviceKey, DeviceRecord]:
        devices = current_devices(self._context.slices())
        if devices != self._devices:
            self._devices = devices
            self._names = {key: gpu_object_name(d.node, d.ledger_device) for key, d in devices.items()}
            # a MIG partition's object is its GPU's: the name leads back to the GPU, not to a partition
            self._keys = {name: key for key, name in self._names.items() if devices[key].kind != TYPE_MIG}
            self.publish_admission()
        return devices

    def publish_admission(self) -> None:
        """Publish the admission facts of the devices and our DeviceClass as it is now."""
        mps_class = self._context.has_class(MPS_DEVICE_CLASS_NAME)
        self.admission = admission_facts(self.devices().values(), self._context.device_class(), mps_class)

    def devices(self) -> Mapping[DeviceKey, DeviceRecord]:
        """Published devices of our driver (newest pool generations)."""
        return self._devices if self._devices is not None else self._recompute()

    def object_name(self, key: DeviceKey) -> str | None:
        """The GPU object of a published device; None for a device not published (no object is desired)."""
        self.devices()
        return self._names.get(key)

    def device_of(self, name: str) -> DeviceKey | None:
        """The published device of the GPU object `name`; None when it has none."""
        self.devices()
        return self._keys.get(name)

    def free(self, key: DeviceKey) -> tuple[int, int] | None:
        """What the ledger's GPU object of a published device says is free now: (`freeMemory` in bytes, its `compute`
        capacity (0 where it publishes none) less `allocatedCompute`, in percent); None while the object has no
        figures. A MIG partition's object is its GPU's: for a partition these are its GPU's."""
        name = self.object_name(key)
        existing = self._context.gpu(name) if name else None
        status = (existing.status if existing is not None else None) or {}
        free = status.get("freeMemory")
        device = self.devices().get(key)
        if free is None or device is None:
            return None
        return to_bytes(free), max(0, (device.compute_total or 0) - int(status.get("allocatedCompute") or 0))

    def nodes(self) -> set[str]:
        """The nodes that publish devices."""
        return {d.node for d in self.devices().values()}
