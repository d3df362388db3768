"""The controller's ValidatingWebhookConfiguration (and, with MPS GPUs, its MutatingWebhookConfiguration of the same
name): the chart creates them empty, the controller patches them.

RBAC cannot scope `create` to a name, so the controller may not create webhook configurations at all, and
kopf's own configuration manager (which always tries to create first) stays off. Instead the controller
merge-patches the webhooks of its handlers, with the CA bundle of the certificate its server serves, into
the configuration the chart made. Its only rights on webhook configurations: `get` and `patch` of that one name.

Every replica keeps them there: it re-reads the configuration every `check_seconds` and patches its webhooks
back in when any is missing (emptied by a replica of an older release at its exit during `helm upgrade`, or by
hand). It does not patch over webhooks that are present but differ: during a certificate rotation or a rollout
two replicas may rightly serve different CA bundles or handlers for a while. A process without a shared
certificate (one replica) empties them again at a clean exit.
"""

import asyncio
import copy
import logging
import urllib.parse
from dataclasses import dataclass
from typing import Any, Literal

import kopf

from api.kube_errors import ApiError, ApiForbidden, ApiNotFound
from api.kube_rest import KubeRest

log = logging.getLogger(__name__)
CONFIGS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
MUTATING_CONFIGS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
MERGE = "application/merge-patch+json"
Kind = Literal["validating", "mutating"]


@dataclass(frozen=True)
class Validated:
    """A resource checked at admission by the kopf handler with id `id` (kopf's server routes `/<id>` to it)."""

    id: str
    group: str
    version: str
    plural: str
    operations: tuple[Literal["CREATE", "UPDATE", "DELETE", "CONNECT"], ...] = ("CREATE",)
    kind: Kind = "validating"


CLAIMS = Validated("resourceclaims", "resource.k8s.io", "v1", "resourceclaims")
TEMPLATES = Validated("resourceclaimtemplates", "resource.k8s.io", "v1", "resourceclaimtemplates")
VALIDATED = (CLAIMS, TEMPLATES)
MUTATED_CLAIMS = Validated("mutate-resourceclaims", "resource.k8s.io", "v1", "resourceclaims", kind="mutating")
"""Claims get their MPS trust domain's toleration at creation (`controller.mps.plan.tolerations_patch`)."""


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
    """The `webhooks` of the configuration: one per validated resource, named `<id>.<config_name>`, calling
    `client_config` with the handler id appended to its URL or service path (as kopf lays them out)."""
    out = []
    for v in validated:
        target: dict[str, Any] = copy.deepcopy(dict(client_config))
        segment = urllib.parse.quote(v.id)
        if "url" in target:
            target["url"] = f"{target['url'].rstrip('/')}/{segment}"
        if "service" in target:
            target["service"]["path"] = f"{target['service'].get('path', '')}/{segment}"
        hook: dict[str, Any] = {
            "name": f"{v.id}.{config_name}",
            "sideEffects": "None",
            # a mutation only adds what keeps a claim off other domains' GPUs, which the scheduler's binding
            # conditions and the node plugin enforce anyway: a controller outage never blocks claims there
            "failurePolicy": "Fail" if fail and v.kind == "validating" else "Ignore",
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
        if v.kind == "mutating":
            hook["reinvocationPolicy"] = "Never"
        out.append(hook)
    return out


class Registration:
    """Patches the webhooks into the chart-made configuration `name`, and out again."""

    def __init__(
        self,
        rest: KubeRest,
        name: str,
        *,
        fail: bool,
        retry: tuple[float, float] = (2.0, 60.0),
        check_seconds: float = 10.0,
        mutated: tuple[Validated, ...] = (),
    ) -> None:
        self.rest = rest
        self.name = name
        self.fail = fail
        self.resources = (*VALIDATED, *mutated)
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
                    extra={"configuration": self.name, "problem": _why(err, self.name)},
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
                    extra={"configuration": self.name, "problem": _why(err, self.name)},
                )

    async def unregister(self) -> None:
        """Empty the webhooks again (so that no request goes to a stopped controller); never raises."""
        try:
            await asyncio.to_thread(self._patch, {})
        except ApiError as err:
            log.warning(
                "cannot unregister the admission webhooks",
                extra={"configuration": self.name, "problem": _why(err, self.name)},
            )
        else:
            self.registered = False
            log.info("admission webhooks unregistered", extra={"configuration": self.name})


def _why(err: ApiError, name: str) -> str:
    """What a failed patch of the configuration `name` means, and what to do."""
    if isinstance(err, ApiNotFound):
        return (
            f"the ValidatingWebhookConfiguration {name} does not exist. The Helm chart creates it (empty) and"
            " the controller may only patch it: `helm upgrade` the release to restore it. Until then claims"
            " are not checked at admission (the node plugin still refuses a bad GpuConfig at prepare)."
        )
    if isinstance(err, ApiForbidden):
        return (
            f"the controller may not get or patch the ValidatingWebhookConfiguration {name}: its ClusterRole"
            " must allow both on that name (chart value controller.webhook.configName, controller flag"
            " --webhook-config-name)"
        )
    return str(err)
