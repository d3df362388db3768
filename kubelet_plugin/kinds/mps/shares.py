"""The MPS side of prepare and unprepare: a claim's MPS shares admitted to their GPU's daemon, under the node lock.

For each MPS GPU of a claim, `admit`:

1. refuses the claim when another claim prepared on that GPU belongs to another trust domain (the scheduler keeps
   domains apart; this is the safety net, and its message names both domains);
2. has the GPU's daemon serve the claim's domain: a daemon that served another domain is replaced by a fresh
   one, with a fresh pipe directory and /dev/shm, by the MPS supervisor (``tenant.json``), and the prepare
   waits for it (``--mps-domain-switch-timeout``);
3. sets the GPU's ceiling (``kubelet_plugin/kinds/mps/limits.py``) to admit the claim's grants and those of the other
   claims there.

`lower` brings a GPU's ceiling down to the remaining shares' after an unprepare, `refresh` sets it again on a
daemon that came back, and `repair` reads it back and sets it again where a client changed it.

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


class MpsShares:
    """The MPS GPUs' daemons as the preparer uses them; every method runs under the node lock."""

    def __init__(self, settings: Settings, limits: MpsLimits | None = None) -> None:
        self._settings = settings
        self.limits = limits or MpsLimits(MpsControl(settings.mps_control_binary, settings.mps_root))

    def admit(
        self, uuid: str, domain: TrustDomain, grants: list[Grant], claim_uid: str, checkpoint: Checkpoint
    ) -> None:
        """Admit claim `claim_uid` (trust `domain`, MPS shares `grants` on GPU `uuid`) to the GPU's daemon, given
        the other claims `checkpoint` holds; raises PrepareError."""
        others = [u for u in checkpoint.claims_on(uuid) if u != claim_uid]
        for other in others:
            theirs = checkpoint.claims[other].mps_trust_domain
            if theirs is not None and theirs != domain.id:
                entry = checkpoint.claims[other]
                raise PrepareError(
                    ErrorKind.ENFORCEMENT_UNAVAILABLE,
                    f"GPU {uuid} is an MPS GPU whose daemon serves {_describe(theirs)} (claim {entry.namespace}/"
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
        """Have GPU `uuid`'s daemon serve `domain`; raises PrepareError when its supervisor is not there, predates
        trust domains, or does not switch within ``--mps-domain-switch-timeout``."""
        root = self._settings.mps_root
        status, problem = layout.read_status(root, uuid)
        if status is not None and status.trust_domain == domain.id and problem is None:
            return
        if status is None or not layout.is_fresh(status) or status.state == "down":
            raise PrepareError(ErrorKind.ENFORCEMENT_UNAVAILABLE, f"GPU {uuid} is an MPS GPU, and {problem}")
        if not status.trust_domains:
            raise PrepareError(
                ErrorKind.ENFORCEMENT_UNAVAILABLE,
                f"GPU {uuid}'s MPS supervisor predates trust domains (its fracgpu-mps pod was not updated: the "
                "DaemonSet updates OnDelete): delete that pod so that the new one starts, which restarts the GPU's "
                "MPS daemon; until then MPS shares there are refused",
            )
        tenant = layout.read_tenant(root, uuid)
        if tenant is None or tenant.domain != domain.id:
            try:
                request = layout.TenantRequest(domain=domain.id).to_json()
                atomic_write(layout.tenant_path(root, uuid), request, 0o644, durable=False)
            except OSError as err:
                raise PrepareError(
                    ErrorKind.ENFORCEMENT_UNAVAILABLE,
                    f"cannot ask for GPU {uuid}'s MPS daemon of {domain.describe()}: {err}",
                ) from None
        deadline = time.monotonic() + self._settings.mps_domain_switch_timeout_seconds
        while time.monotonic() < deadline:
            time.sleep(POLL_S)
            status, problem = layout.read_status(root, uuid)
            if status is not None and status.trust_domain == domain.id and problem is None:
                return
            if status is None or status.state == "down":
                break
        serves = status.trust_domain if status is not None else None
        raise PrepareError(
            ErrorKind.ENFORCEMENT_UNAVAILABLE,
            f"GPU {uuid}'s MPS supervisor did not start a daemon for {domain.describe()} within "
            f"{self._settings.mps_domain_switch_timeout_seconds:g} s (its daemon serves "
            f"{_describe(serves) if serves else 'no trust domain yet'}{'; ' + problem if problem else ''}); "
            "the kubelet retries",
        )


def _describe(domain_id: str) -> str:
    try:
        return TrustDomain.parse(domain_id).describe()
    except TrustDomainError:
        return domain_id
