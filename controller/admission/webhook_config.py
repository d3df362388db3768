"""The controller's ValidatingWebhookConfiguration and its MutatingWebhookConfiguration of the same name: the chart
creates them empty, the controller patches them.

RBAC cannot scope `create` to a name, so the controller may not create webhook configurations at all, and
kopf's own configuration manager (which always tries to create first) stays off. Instead the controller
merge-patches the webhooks of its handlers, with the CA bundle of the certificate its server serves, into
the configuration the chart made. Its only rights on webhook configurations: `get` and `patch` of that one name.

Failure policies. The webhooks of claims and templates follow `--webhook-failure-policy` (`Ignore` by default: a
controller outage blocks no claim, and the node plugin still refuses a bad GpuConfig at prepare). So does the
mutating webhook that writes the opaque parameters of the driver's configs in a new claim as the API server
encodes them (`controller/admission/canonical.py`; a claim with none is not sent to it): admitted unrewritten during
an outage, a claim whose parameters were sent otherwise can never have its status written, which the controller
then tells on the claim (`controller/status/manager.py`). With MPS GPUs
(`--mps`), the claims with a request of one of the driver's DeviceClasses (those a trust domain's toleration is
given to, `controller/admission/mps_tolerations.py`) are mutated and reviewed by webhooks of their own that fail
closed (`Fail`), selected by a `matchCondition` on their requests' classes: a claim created without its domain's
toleration could never join its own domain's MPS GPUs once they carry its taint (tolerations are immutable), and
one created unreviewed could carry a toleration of another domain's taint or of every taint. So while no replica
answers, creating such a claim fails with the webhook's error, to be retried; every other claim, template and
object is admitted as the configured policy says.

Every replica keeps them there: it re-reads the configuration every `check_seconds` and patches its webhooks
back in when any is missing (emptied by a replica of an older release at its exit during `helm upgrade`, or by
hand). It does not patch over webhooks that are present but differ: during a certificate rotation or a rollout
two replicas may rightly serve different CA bundles or handlers for a while. A process whose certificate is its
own (self-signed at its start, neither shared through the Secret nor read from files) empties them again at a clean
exit (`controller/admission/webhook.py`).
"""

import asyncio
import copy
import json
import logging
import urllib.parse
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import kopf

from api.kube_errors import ApiError, ApiForbidden, ApiNotFound
from api.kube_rest import KubeRest

log = logging.getLogger(__name__)
CONFIGS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
MUTATING_CONFIGS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
MERGE = "application/merge-patch+json"
Kind = Literal["validating", "mutating"]
Scope = Literal["all", "classes", "others", "config"]


@dataclass(frozen=True)
class Validated:
    """A resource checked at admission by the kopf handler with id `id` (kopf's server routes `/<id>` to it)."""

    id: str
    group: str
    version: str
    plural: str
    operations: tuple[Literal["CREATE", "UPDATE", "DELETE", "CONNECT"], ...] = ("CREATE",)
    kind: Kind = "validating"
    name: str = ""
    """The webhook's name before ``.<configuration>``; empty: `id`."""
    scope: Scope = "all"
    """The claims it is called for: all; ``classes``: those with a request or `firstAvailable` alternative of one
    of `classes` (a matchCondition), always with failurePolicy Fail; ``others``: all but those; ``config``: those
    with an opaque config of `driver`."""
    classes: tuple[str, ...] = ()
    driver: str = ""


CLAIMS = Validated("resourceclaims", "resource.k8s.io", "v1", "resourceclaims")
TEMPLATES = Validated("resourceclaimtemplates", "resource.k8s.io", "v1", "resourceclaimtemplates")
VALIDATED = (CLAIMS, TEMPLATES)
MUTATED_CLAIMS = Validated("mutate-resourceclaims", "resource.k8s.io", "v1", "resourceclaims", kind="mutating")
"""Claims get their MPS trust domain's toleration at creation (`controller.admission.mps_tolerations`)."""
CANONICAL_CLAIMS = Validated(
    "canonical-resourceclaims", "resource.k8s.io", "v1", "resourceclaims", kind="mutating", scope="config"
)
"""Claims get their driver's opaque parameters in canonical bytes at creation (`controller.admission.canonical`);
served by `controller.admission.webhook` itself, not by a kopf handler."""
MPS_CLAIMS = "mps-resourceclaims"
"""The name of the webhook that reviews, with MPS GPUs, the claims of the driver's DeviceClasses."""


def registered(mps_classes: Collection[str] = (), driver: str | None = None) -> tuple[Validated, ...]:
    """The webhooks the controller registers: `VALIDATED`; with MPS GPUs (`mps_classes`: the DeviceClasses whose
    requests are given a trust domain's toleration, never empty then), the claims of those classes reviewed by a
    webhook of their own and mutated by `MUTATED_CLAIMS`, both failing closed, and the other claims as before; with
    `driver`, `CANONICAL_CLAIMS` for the claims with an opaque config of `driver`."""
    canonical = (replace(CANONICAL_CLAIMS, driver=driver),) if driver else ()
    if not mps_classes:
        return (*VALIDATED, *canonical)
    classes = tuple(sorted(mps_classes))
    return (
        replace(CLAIMS, scope="others", classes=classes),
        replace(CLAIMS, name=MPS_CLAIMS, scope="classes", classes=classes),
        TEMPLATES,
        replace(MUTATED_CLAIMS, scope="classes", classes=classes),
        *canonical,
    )


def names_classes(classes: Sequence[str]) -> str:
    """A CEL expression over a ResourceClaim `object` (a webhook's matchCondition): whether one of its requests, or
    one of their `firstAvailable` alternatives, names one of `classes`. Every field it reads is guarded by
    ``has()``, so it is never an error (which a `Fail` webhook would answer with a refusal)."""
    listed = "[" + ", ".join(json.dumps(c) for c in classes) + "]"
    return (
        "has(object.spec) && has(object.spec.devices) && has(object.spec.devices.requests) && "
        "object.spec.devices.requests.exists(r, "
        f"(has(r.exactly) && has(r.exactly.deviceClassName) && r.exactly.deviceClassName in {listed}) || "
        "(has(r.firstAvailable) && r.firstAvailable.exists(s, "
        f"has(s.deviceClassName) && s.deviceClassName in {listed})))"
    )


def configures_driver(driver: str) -> str:
    """A CEL expression over a ResourceClaim `object`: whether it has an opaque config of `driver` (never an error)."""
    return (
        "has(object.spec) && has(object.spec.devices) && has(object.spec.devices.config) && "
        f"object.spec.devices.config.exists(c, has(c.opaque) && c.opaque.driver == {json.dumps(driver)})"
    )


def match_conditions(v: Validated) -> list[dict[str, str]]:
    """The matchConditions of `v`'s webhook (none for scope ``all``)."""
    if v.scope == "all":
        return []
    if v.scope == "config":
        return [{"name": "configures-the-driver", "expression": configures_driver(v.driver)}]
    if v.scope == "classes":
        return [{"name": "requests-a-driver-class", "expression": names_classes(v.classes)}]
    return [{"name": "requests-no-driver-class", "expression": f"!({names_classes(v.classes)})"}]


def config_path(name: str, kind: Kind = "validating") -> str:
    """API path of the Validating (or Mutating) WebhookConfiguration `name`."""
    return f"{CONFIGS if kind == 'validating' else MUTATING_CONFIGS}/{name}"


def webhooks(
    config_name: str,
    client_config: kopf.WebhookClientConfig,
    *,
    fail: bool,
    validated: tuple[Validated, ...] = VALIDATED,
) -> list[dict[str, Any]]:
    """The `webhooks` of the configuration: one per validated resource, named `<name or id>.<config_name>`,
    calling `client_config` with the handler id appended to its URL or service path (as kopf lays them out).
    failurePolicy: Fail for scope ``classes``; else Fail when `fail`, Ignore otherwise."""
    out = []
    for v in validated:
        target: dict[str, Any] = copy.deepcopy(dict(client_config))
        segment = urllib.parse.quote(v.id)
        if "url" in target:
            target["url"] = f"{target['url'].rstrip('/')}/{segment}"
        if "service" in target:
            target["service"]["path"] = f"{target['service'].get('path', '')}/{segment}"
        closed = v.scope == "classes" or fail
        hook: dict[str, Any] = {
            "name": f"{v.name or v.id}.{config_name}",
            "sideEffects": "None",
            "failurePolicy": "Fail" if closed else "Ignore",
            "matchPolicy": "Equivalent",  # also the requests of older served versions (converted to v1)
            "rules": [
                {
                    "apiGroups": [v.group],
                    "apiVersions": [v.version],
                    "resources": [v.plural],
                    "operations": list(v.operations),
                    "scope": "*",
                }
            ],
            "clientConfig": target,
            "timeoutSeconds": 30,
            "admissionReviewVersions": ["v1", "v1beta1"],
        }
        if conditions := match_conditions(v):
            hook["matchConditions"] = conditions
        if v.kind == "mutating":
            hook["reinvocationPolicy"] = "Never"
        out.append(hook)
    return out


class Registration:
    """Patches the webhooks into the chart-made configurations `name`, and out again: `registered(mps_classes,
    driver)`, with failure policy Fail where `fail` says so (`webhooks`)."""

    def __init__(
        self,
        rest: KubeRest,
        name: str,
        *,
        fail: bool,
        retry: tuple[float, float] = (2.0, 60.0),
        check_seconds: float = 10.0,
        mps_classes: Collection[str] = (),
        driver: str | None = None,
    ) -> None:
        self.rest = rest
        self.name = name
        self.fail = fail
        self.resources = registered(mps_classes, driver)
        self.at: Kind = "validating"
        """The configuration of the last request (the one that failed, when one did): what `_why` names."""
        self.retry = retry  # first and longest wait between attempts, seconds
        self.check_seconds = check_seconds  # between reads of the configuration once registered
        self.registered = False

    def _kinds(self) -> list[Kind]:
        return sorted({v.kind for v in self.resources}, reverse=True)  # validating first

    def _hooks(self, client_config: kopf.WebhookClientConfig) -> dict[Kind, list[dict[str, Any]]]:
        return {
            kind: webhooks(
                self.name, client_config, fail=self.fail, validated=tuple(v for v in self.resources if v.kind == kind)
            )
            for kind in self._kinds()
        }

    def _patch(self, hooks: dict[Kind, list[dict[str, Any]]]) -> None:
        for kind in self._kinds():
            body = {"webhooks": hooks.get(kind, [])}
            self.at = kind
            self.rest.request("PATCH", config_path(self.name, kind), body=body, content_type=MERGE)

    async def register(self, client_config: kopf.WebhookClientConfig) -> None:
        """Patch the webhooks calling `client_config` in; retry (logging why) until it works."""
        await self._register(self._hooks(client_config))

    async def _register(self, hooks: dict[Kind, list[dict[str, Any]]]) -> None:
        delay, longest = self.retry
        while True:
            try:
                await asyncio.to_thread(self._patch, hooks)
            except ApiError as err:
                log.error(
                    "cannot register the admission webhooks; retrying",
                    extra={"configuration": self.name, "problem": _why(err, self.name, self.at)},
                )
            else:
                self.registered = True
                log.info("admission webhooks registered", extra={"configuration": self.name})
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, longest)

    def _missing(self, hooks: dict[Kind, list[dict[str, Any]]]) -> list[str]:
        """Names of `hooks` the live configurations lack (raises ApiError)."""
        missing = []
        for kind, wanted in hooks.items():
            self.at = kind
            live = self.rest.request("GET", config_path(self.name, kind))
            present = {h.get("name") for h in live.get("webhooks") or []}
            missing += [h["name"] for h in wanted if h["name"] not in present]
        return missing

    async def keep(self, client_config: kopf.WebhookClientConfig) -> None:
        """Register (as `register`), then every `check_seconds` patch the webhooks back in when any is
        missing from the configuration; runs until cancelled, logging what fails."""
        hooks = self._hooks(client_config)
        await self._register(hooks)
        while True:
            await asyncio.sleep(self.check_seconds)
            try:
                missing = await asyncio.to_thread(self._missing, hooks)
                if missing:
                    await asyncio.to_thread(self._patch, hooks)
                    log.warning(
                        "admission webhooks were removed from the configuration; registered them again",
                        extra={"configuration": self.name, "missing": missing},
                    )
            except ApiError as err:
                log.error(
                    "cannot check the admission webhooks; checking again later",
                    extra={"configuration": self.name, "problem": _why(err, self.name, self.at)},
                )

    async def unregister(self) -> None:
        """Empty the webhooks again (so that no request goes to a stopped controller); never raises."""
        try:
            await asyncio.to_thread(self._patch, {})
        except ApiError as err:
            log.warning(
                "cannot unregister the admission webhooks",
                extra={"configuration": self.name, "problem": _why(err, self.name, self.at)},
            )
        else:
            self.registered = False
            log.info("admission webhooks unregistered", extra={"configuration": self.name})


_UNTIL = {
    "validating": "claims are not checked at admission (the node plugin still refuses a bad GpuConfig at prepare)",
    "mutating": "new claims are not mutated at admission (their GpuConfig bytes kept as sent; with MPS GPUs, those "
    "of the driver's DeviceClasses not given their trust domain's toleration)",
}


def _why(err: ApiError, name: str, kind: Kind) -> str:
    """What a failed request on the `kind` configuration `name` means, and what to do."""
    what = f"{kind.capitalize()}WebhookConfiguration {name}"
    if isinstance(err, ApiNotFound):
        return (
            f"the {what} does not exist. The Helm chart creates it (empty) and the controller may only patch it:"
            f" `helm upgrade` the release to restore it. Until then {_UNTIL[kind]}."
        )
    if isinstance(err, ApiForbidden):
        return (
            f"the controller may not get or patch the {what}: its ClusterRole must allow both on that name (chart"
            " value controller.webhook.configName, controller flag --webhook-config-name)"
        )
    return str(err)
