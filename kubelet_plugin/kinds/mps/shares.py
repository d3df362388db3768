"""The MPS side of prepare and unprepare: a claim's MPS shares admitted to their GPU's daemon.

For each MPS GPU of a claim, under the node lock, `admit`:

1. refuses the claim when another claim on that GPU belongs to another trust domain: a prepared one, or one
   waiting for the GPU's daemon to switch to its domain until its checkpoint entry's ``mpsSwitchUntil`` (the
   scheduler keeps domains apart; this is the safety net, and its message names both domains);
2. has the GPU's daemon serve the claim's domain: when it serves another, asks the MPS supervisor for a fresh
   daemon, pipe directory and /dev/shm of this domain (``tenant.json``) and raises `DomainSwitchPendingError`, which
   the preparer records as the claim's waiting entry before it lets go of the lock;
3. sets the GPU's ceiling (``kubelet_plugin/kinds/mps/limits.py``) to admit the claim's grants and those of the other
   claims there.

`wait_served` waits, without the lock, until the supervisor says the domains asked for are served (or gives up
after ``--mps-domain-switch-timeout``); the preparer then takes the lock again and admits the claim anew, every
check repeated against the checkpoint of that moment. `lower` brings a GPU's ceiling down to the remaining
shares' after an unprepare, `refresh` sets it again on a daemon that came back, and `repair` reads it back and
sets it again where a client changed it.

An adminAccess share (monitoring) is no MPS client: the plan gives it no grant here, so it has no trust domain,
asks for no daemon and counts towards no ceiling (`grants_in` leaves it out).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

from pydantic import ValidationError

from api.mps_trust import TrustDomain, TrustDomainError
from kubelet_plugin.core.errors import ErrorKind, PrepareError
from kubelet_plugin.core.filelock import atomic_write
from kubelet_plugin.core.settings import Settings
from kubelet_plugin.kinds.mps.control import Limits, MpsControl, MpsControlError
from kubelet_plugin.kinds.mps.limits import Grant, MpsLimits, ceiling
from kubelet_plugin.state import mps_files as layout
from kubelet_plugin.state.checkpoint import Checkpoint
from kubelet_plugin.state.claim_files import info_file_paths
from kubelet_plugin.state.container_info import RequestInfo

POLL_S = 0.05
HOLD_MARGIN_S = 5.0
"""How much longer than the wait and the node lock taken again a waiting claim holds its GPU for its domain."""


def grants_in(plugin_data_dir: Path, claim_uids: Iterable[str], uuid: str) -> list[Grant]:
    """The MPS shares on GPU `uuid` of the given prepared claims, from their request files (unreadable ones are
    skipped: a file being rewritten belongs to a claim whose own prepare sets the ceiling)."""
    found: list[Grant] = []
    for uid in claim_uids:
        for path in info_file_paths(plugin_data_dir, uid):
            try:
                request = RequestInfo.model_validate_json(path.read_bytes())
            except (OSError, ValidationError):
                continue
            found += [
                (d.memory_mib, d.active_thread_percentage)
                for d in request.devices
                if d.uuid == uuid and d.enforcement == "mps" and not d.admin_access
            ]
    return found


class DomainSwitchPendingError(PrepareError):
    """GPU `uuid`'s daemon does not serve `domain` yet, and its supervisor was asked for one that does. The claim
    waits outside the node lock until `deadline` (``time.monotonic``) and holds the GPU for its domain until `until`
    (``time.time``): the wait, then the node lock taken again, and a margin."""

    def __init__(self, uuid: str, domain: TrustDomain, status: str, *, deadline: float, until: float) -> None:
        super().__init__(
            ErrorKind.ENFORCEMENT_UNAVAILABLE,
            f"GPU {uuid}'s MPS supervisor was asked for a daemon of {domain.describe()} ({status}); the kubelet "
            "retries",
        )
        self.uuid, self.domain, self.deadline, self.until = uuid, domain, deadline, until


class MpsShares:
    """The MPS GPUs' daemons as the preparer uses them; every method but `wait_served` runs under the node lock."""

    def __init__(self, settings: Settings, limits: MpsLimits | None = None) -> None:
        self._settings = settings
        self.limits = limits or MpsLimits(MpsControl(settings.mps_control_binary, settings.mps_root))

    def admit(
        self, uuid: str, domain: TrustDomain, grants: list[Grant], claim_uid: str, checkpoint: Checkpoint
    ) -> None:
        """Admit claim `claim_uid` (trust `domain`, MPS shares `grants` on GPU `uuid`) to the GPU's daemon, given
        the other claims `checkpoint` holds; raises DomainSwitchPendingError once the daemon of `domain` was asked for,
        PrepareError otherwise."""
        others = [u for u in checkpoint.claims_on(uuid) if u != claim_uid]
        now = time.time()
        for other in others:
            entry = checkpoint.claims[other]
            theirs = entry.mps_trust_domain
            if theirs is not None and theirs != domain.id and entry.holds_domain(now):
                whose = "is being switched to" if entry.mps_switch_until is not None else "serves"
                raise PrepareError(
                    ErrorKind.ENFORCEMENT_UNAVAILABLE,
                    f"GPU {uuid} is an MPS GPU whose daemon {whose} {_describe(theirs)} (claim {entry.namespace}/"
                    f"{entry.name}), and this claim belongs to {domain.describe()}: claims of two trust domains "
                    "never share an MPS daemon. The scheduler keeps them apart; this claim was allocated there "
                    "before the GPU's domain was known. Delete the pod so that its claim is allocated again, or "
                    "widen the trust domain (chart value mps.trustDomain) if these namespaces trust each other",
                )
        self._serve(uuid, domain)
        top = ceiling([*grants, *grants_in(self._settings.plugin_data_dir, others, uuid)])
        assert top is not None
        try:
            self.limits.ensure(uuid, top, self._daemon(uuid))
        except MpsControlError as err:
            raise PrepareError(
                ErrorKind.ENFORCEMENT_UNAVAILABLE,
                f"the MPS daemon of GPU {uuid} did not take the ceiling {top.describe()} that admits this claim's "
                f"grant: {err}",
            ) from None

    def wait_served(self, switches: Iterable[DomainSwitchPendingError]) -> dict[tuple[str, str], str | None]:
        """Wait, without the node lock, until each GPU's supervisor says its daemon serves the domain asked for (a
        switch asked twice is waited for once); per (GPU UUID, domain id) None once it does, else why not: the
        daemon went down or its status file is gone, or the switch's deadline passed."""
        waiting = {(s.uuid, s.domain.id): s for s in switches}
        outcome: dict[tuple[str, str], str | None] = {}
        root = self._settings.mps_root
        while waiting:
            time.sleep(POLL_S)
            for key, switch in list(waiting.items()):
                status, problem = layout.read_status(root, switch.uuid)
                if status is not None and status.trust_domain == switch.domain.id and problem is None:
                    outcome[key] = None
                elif status is None or status.state == "down":
                    outcome[key] = (
                        f"GPU {switch.uuid}'s MPS supervisor was asked for a daemon of {switch.domain.describe()}, "
                        f"and {problem}; the kubelet retries"
                    )
                elif time.monotonic() >= switch.deadline:
                    outcome[key] = self._too_late(switch, status, problem)
                else:
                    continue
                del waiting[key]
        return outcome

    def _too_late(self, switch: DomainSwitchPendingError, status: layout.DaemonStatus, problem: str | None) -> str:
        return (
            f"GPU {switch.uuid}'s MPS supervisor did not start a daemon for {switch.domain.describe()} within "
            f"{self._settings.mps_domain_switch_timeout_seconds:g} s ({_status(status, problem)}); the kubelet retries"
        )

    def lower(self, uuid: str, checkpoint: Checkpoint) -> None:
        """After an unprepare: the ceiling of the shares left on GPU `uuid` (none left: unchanged, a stale higher one
        only admits more until the next share). Raises MpsControlError."""
        top = self._ceiling(uuid, checkpoint)
        if top is not None:
            self.limits.ensure(uuid, top, self._daemon(uuid))

    def refresh(self, uuid: str, checkpoint: Checkpoint) -> Limits | None:
        """Set GPU `uuid`'s ceiling again (its daemon restarted without one); the ceiling, None without shares.
        Raises MpsControlError."""
        top = self._ceiling(uuid, checkpoint)
        if top is not None:
            self.limits.ensure(uuid, top, self._daemon(uuid), force=True)
        return top

    def repair(self, uuid: str, checkpoint: Checkpoint) -> list[str]:
        """Read GPU `uuid`'s limits back and set them again where they differ; what differed (MpsLimits.repair).
        Raises MpsControlError."""
        top = self._ceiling(uuid, checkpoint)
        if top is None:
            return []
        return self.limits.repair(uuid, top, self._daemon(uuid))

    def _ceiling(self, uuid: str, checkpoint: Checkpoint) -> Limits | None:
        return ceiling(grants_in(self._settings.plugin_data_dir, checkpoint.claims_on(uuid), uuid))

    def _daemon(self, uuid: str) -> int | None:
        status = layout.read_status(self._settings.mps_root, uuid)[0]
        return status.pid if status is not None else None

    def _serve(self, uuid: str, domain: TrustDomain) -> None:
        """Return when GPU `uuid`'s daemon serves `domain` (withdrawing a request for another domain, which no
        claim holds any more: `admit` checked); else ask its supervisor for a daemon of `domain` and raise
        DomainSwitchPendingError. Raises PrepareError when the supervisor is not there or predates trust domains."""
        root = self._settings.mps_root
        status, problem = layout.read_status(root, uuid)
        tenant = layout.read_tenant(root, uuid)
        served = status is not None and status.trust_domain == domain.id and problem is None
        if served and (tenant is None or tenant.domain == domain.id):
            return
        if status is None or (not served and (not layout.is_fresh(status) or status.state == "down")):
            raise PrepareError(ErrorKind.ENFORCEMENT_UNAVAILABLE, f"GPU {uuid} is an MPS GPU, and {problem}")
        if not status.trust_domains:
            raise PrepareError(
                ErrorKind.ENFORCEMENT_UNAVAILABLE,
                f"GPU {uuid}'s MPS supervisor predates trust domains (its fracgpu-mps pod was not updated: the "
                "DaemonSet updates OnDelete): delete that pod so that the new one starts, which restarts the GPU's "
                "MPS daemon; until then MPS shares there are refused",
            )
        if tenant is None or tenant.domain != domain.id:
            try:
                request = layout.TenantRequest(domain=domain.id).to_json()
                atomic_write(layout.tenant_path(root, uuid), request, 0o644, durable=False)
            except OSError as err:
                raise PrepareError(
                    ErrorKind.ENFORCEMENT_UNAVAILABLE,
                    f"cannot ask for GPU {uuid}'s MPS daemon of {domain.describe()}: {err}",
                ) from None
        if served:
            return
        wait = self._settings.mps_domain_switch_timeout_seconds
        holds = wait + self._settings.node_lock_timeout_seconds + HOLD_MARGIN_S
        raise DomainSwitchPendingError(
            uuid, domain, _status(status, problem), deadline=time.monotonic() + wait, until=time.time() + holds
        )


def _status(status: layout.DaemonStatus, problem: str | None) -> str:
    """What the GPU's status file says of its daemon: the trust domain it names, and what is wrong."""
    domain = _describe(status.trust_domain) if status.trust_domain else "no trust domain yet"
    return f"its status file names {domain}" + (f"; {problem}" if problem else "")


def _describe(domain_id: str) -> str:
    try:
        return TrustDomain.parse(domain_id).describe()
    except TrustDomainError:
        return domain_id
