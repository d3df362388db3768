"""The one claim -> devices index of the controller, and its inverse: which published devices each indexed claim's
shares are on, and which claims are on each device.

The entry (`controller/loops.py`) updates it once per claim event (`update`, `remove`), before it tells the
managers which devices the claim was and is on; the ledger (the claims of a GPU object) and the MPS trust domains
(the claims of an MPS GPU) read it, and keep no claim index of their own. Rebuilt from kopf's claim index at a
start and a resync (`rebuild`), so a missed event cannot leave it wrong for longer than a resync.
"""

from controller.core.context import ClaimKey, Context
from controller.core.slices import DeviceKey

_NONE: frozenset[DeviceKey] = frozenset()


class ClaimIndex:
    """Claim -> the devices its shares are on (as at its last event), and device -> its claims."""

    def __init__(self, context: Context) -> None:
        self._context = context
        self._of: dict[ClaimKey, frozenset[DeviceKey]] = {}
        self._on: dict[DeviceKey, set[ClaimKey]] = {}

    def reset(self) -> None:
        """New indexes bound: forget every claim (they come back with their events)."""
        self._of, self._on = {}, {}

    def knows(self, key: ClaimKey) -> bool:
        """Whether the claim was in kopf's claim index at its last event."""
        return key in self._of

    def update(self, key: ClaimKey) -> frozenset[DeviceKey]:
        """The claim `key` changed (its kopf index entry is updated; gone from it: `remove`): the devices its shares
        were on before and are on now, which the managers re-check."""
        view = self._context.claim(key)
        if view is None:
            return self.remove(key)
        now = frozenset(s.device_key for s in view.shares)
        before = self._of.get(key, _NONE)
        self._of[key] = now
        self._move(key, before, now)
        return before | now

    def remove(self, key: ClaimKey) -> frozenset[DeviceKey]:
        """The claim `key` left kopf's index (deleted, or no longer ours): the devices its shares were on."""
        before = self._of.pop(key, _NONE)
        self._move(key, before, _NONE)
        return before

    def _move(self, key: ClaimKey, before: frozenset[DeviceKey], now: frozenset[DeviceKey]) -> None:
        for device in before - now:
            claims = self._on.get(device)
            if claims is not None:
                claims.discard(key)
                if not claims:
                    del self._on[device]
        for device in now - before:
            self._on.setdefault(device, set()).add(key)

    def claims_on(self, device: DeviceKey) -> frozenset[ClaimKey]:
        """The claims with a share on `device`."""
        return frozenset(self._on.get(device, ()))

    def devices_of(self, key: ClaimKey) -> frozenset[DeviceKey]:
        """The devices the claim's shares are on."""
        return self._of.get(key, _NONE)

    def rebuild(self) -> None:
        """Recompute both directions from kopf's claim index."""
        self._of, self._on = {}, {}
        for view in self._context.claims():
            devices = frozenset(s.device_key for s in view.shares)
            if view.key in self._of:
                continue  # kopf keeps a collection per key: the first view, as `Context.claim` reads it
            self._of[view.key] = devices
            self._move(view.key, _NONE, devices)
