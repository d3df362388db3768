"""kopf handlers and operator settings of the controller.

As the kopf pitfalls require: on ResourceClaims and ResourceSlices only `on.event` and `index` (no
kopf annotations, finalizers or status written on objects we do not own); admission through kopf's
webhook server, registered by patching the chart-made configuration (kopf's manager would create it);
Event posting lowered to WARNING; no peering; liveness endpoint.
"""

import asyncio
import logging
import os
import socket
from collections.abc import Mapping
from typing import Any

import jsonpatch
import kopf

from api.gpu import GPU_PLURAL, GPU_VERSION
from api.kube_rest import KubeConnection, KubeRest
from api.kube_retry import REFLECTOR_FIRST_S
from api.mps_trust import TrustDomain, trust_domain
from api.names import API_GROUP
from controller.admission.certificate import SharedCertificate
from controller.admission.mps_tolerations import foreign_tolerations, tolerations_patch
from controller.admission.verdict import Review, is_extended_resource_claim, review_claim_spec
from controller.admission.webhook import WebhookServer, refuse
from controller.admission.webhook_config import CLAIMS, MUTATED_CLAIMS, TEMPLATES, Registration
from controller.core import kube, metrics
from controller.core.claims import ClaimView, DeviceClassView, claim_view, device_class_view
from controller.core.settings import COMPONENT, Settings
from controller.core.slices import MPS_DOMAIN_ANNOTATION, SliceView, TaintRuleView, slice_view, taint_rule_view
from controller.leadership.gate import Leadership
from controller.ledger.plan import ExistingGpu
from controller.loops import Controller

log = logging.getLogger(__name__)
RESOURCE_GROUP = "resource.k8s.io"
RESOURCE_VERSION = "v1"
INDEX_IDS = ("fracgpu_slices", "fracgpu_claims", "fracgpu_gpus", "fracgpu_classes", "fracgpu_nodes")
"""The ids of the indexes, in the order `Controller.bind` takes them (kopf passes each as a keyword argument)."""
TAINT_RULES_INDEX = "fracgpu_taint_rules"
"""DeviceTaintRule name -> its view, for the rules that may select our devices (the ledger's `status.taints`; each
MPS GPU's rule, the trust domain it records: controller/mps, which has no other copy of the rules)."""
NAMESPACES_INDEX = "fracgpu_namespaces"
"""Namespace name -> labels: only with MPS trust scope namespaceLabel (the only reader of namespace labels)."""


def webhook_hosts(settings: Settings) -> tuple[str | None, list[str]]:
    """The host name in the webhook's URL (None: kopf's default) and the certificate's further names."""
    service = settings.webhook_service.split("/", 1) if settings.webhook_service else None
    host = settings.webhook_host
    if service is not None and host is None:
        host = f"{service[1]}.{service[0]}.svc"
    return host, [f"{service[1]}.{service[0]}.svc.cluster.local"] if service else []


def shared_certificate(settings: Settings, connection: KubeConnection) -> SharedCertificate | None:
    """The certificate the replicas share (`--webhook-cert-secret`), or None: each process makes its own."""
    if not settings.admission or settings.webhook_cert_secret is None or settings.webhook_cert_dir is not None:
        return None
    namespace, name = settings.webhook_cert_secret.split("/", 1)
    host, extra = webhook_hosts(settings)
    hostnames = [h for h in (host or "127.0.0.1", *extra) if h]
    return SharedCertificate(KubeRest(connection, timeout=10.0, budget=20.0), namespace, name, hostnames)


def operator_settings(
    settings: Settings, connection: KubeConnection, shared: SharedCertificate | None = None
) -> kopf.OperatorSettings:
    """kopf settings: standalone, quiet Event posting, our webhook server registering itself on `connection`.

    kopf does not manage the webhook configuration (`admission.managed` stays None): its manager creates
    the configuration first, which the controller may not; our server patches the chart-made one instead.
    """
    out = kopf.OperatorSettings()
    out.peering.standalone = True
    # Throttled (429) lists and watch starts wait what the API server asks, as client-go does (kopf otherwise waits
    # its own backoff when that is longer); a watch that ends (410, or 429 past kopf's retries) starts again after
    # client-go's reflector's first backoff rather than kopf's 0.1 s.
    out.networking.enforce_retry_after = True
    out.watching.reconnect_backoff = REFLECTOR_FIRST_S
    out.posting.level = logging.WARNING
    out.posting.reporting_component = COMPONENT
    out.posting.reporting_instance = (os.environ.get("POD_NAME") or socket.gethostname())[:128]
    if settings.admission:
        cert_dir = settings.webhook_cert_dir
        service = tuple(settings.webhook_service.split("/", 1)) if settings.webhook_service else None
        host, extra_sans = webhook_hosts(settings)
        out.admission.server = WebhookServer(
            addr=settings.webhook_address,
            port=settings.webhook_port,
            host=host,
            certfile=cert_dir / "tls.crt" if cert_dir else None,
            pkeyfile=cert_dir / "tls.key" if cert_dir else None,
            extra_sans=extra_sans,
            service=(service[0], service[1]) if service else None,
            service_port=settings.webhook_port if service else None,
            registration=Registration(
                KubeRest(connection),
                settings.webhook_config_name,
                fail=settings.webhook_failure_policy == "Fail",
                check_seconds=settings.webhook_check_seconds,
                mps_classes=settings.device_classes if settings.mps else (),
                driver=settings.driver_name,
            ),
            shared=shared,
            shared_check_seconds=settings.webhook_cert_check_seconds,
            driver=settings.driver_name,
        )
    return out


def _review(
    controller: Controller, spec: Any, prefix: str, namespace: str | None, *, standalone: bool = False
) -> Review:
    """Review a claim spec against what the controller published for admission (called on the webhook's
    thread: it reads `controller.admission.verdict` only), and its tolerations against the claim's MPS trust
    domain (with --mps). `standalone`: a ResourceClaim pods name directly (`review_claim_spec`)."""
    s = controller.settings
    facts = controller.admission
    refused: list[str] = []
    if s.mps and namespace and isinstance(spec, Mapping):
        refused = foreign_tolerations(spec, _domain(controller, namespace), s.device_classes, prefix)
    review = review_claim_spec(
        spec,
        prefix,
        driver=s.driver_name,
        device_class=s.device_class,
        largest=facts.largest,
        class_configs=facts.device_class.configs if facts.device_class else (),
        hami_core_offered=facts.hami_core,
        nvml_offered=facts.nvml,
        mps_offered=facts.mps,
        mps_class=facts.mps_class,
        request_ranges=facts.request_ranges,
        our_classes={*s.device_classes, *s.claim_classes},
        shared_classes=s.device_classes,
        standalone=standalone,
    )
    return Review(problems=(*refused, *review.problems), warnings=review.warnings) if refused else review


def _domain(controller: Controller, namespace: str) -> TrustDomain:
    """The MPS trust domain of a claim in `namespace` (the namespaces' labels as the main loop indexed them)."""
    s = controller.settings
    labels = controller.context.namespace_labels(namespace) if s.mps_trust_scope == "namespaceLabel" else None
    return trust_domain(s.mps_trust_scope, s.mps_trust_label, namespace, labels)


def register(
    registry: kopf.OperatorRegistry, settings: Settings, controller: Controller, leadership: Leadership | None = None
) -> None:
    """Register every handler of the controller in `registry`; with `leadership`, the controller's loops run
    only while its elector leads (controller/leadership/gate.py)."""
    driver = settings.driver_name

    @kopf.on.login(registry=registry, id="login")
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kube.connection_info(kube.credentials(settings))

    @kopf.on.startup(registry=registry, id="startup")
    async def startup(**kwargs: Any) -> None:
        # kopf passes every index as a keyword argument named after its id (still empty at startup)
        controller.bind(
            *(kwargs[i] for i in INDEX_IDS),
            namespaces=kwargs.get(NAMESPACES_INDEX),
            taint_rules=kwargs.get(TAINT_RULES_INDEX),
        )
        if leadership is None or leadership.elector is None:
            await controller.start()
        else:
            campaign.append(asyncio.create_task(leadership.elector.run(), name="leader-election"))

    campaign: list[asyncio.Task[None]] = []

    @kopf.on.cleanup(registry=registry, id="cleanup")
    async def cleanup(**_: Any) -> None:
        if campaign:  # stops leading (the controller's loops) first, then releases the Lease
            campaign[0].cancel()
            await asyncio.wait(campaign)
        else:
            await controller.stop()

    # ----- indexes: compact views, recomputed on every watch event ----------------------------------

    @kopf.index(RESOURCE_GROUP, RESOURCE_VERSION, "resourceslices", registry=registry, id="fracgpu_slices")
    async def index_slice(body: kopf.Body, name: str, **_: Any) -> dict[str, SliceView]:
        # `{}`, never None: kopf keeps an object's previous entries when its indexer returns None
        try:
            view = slice_view(body, driver)
        except (KeyError, TypeError, ValueError):
            log.exception("cannot read ResourceSlice %s", name)
            metrics.OBJECTS_SKIPPED.labels("ResourceSlice", "unreadable").inc()
            return {}
        return {name: view} if view is not None else {}

    @kopf.index(RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims", registry=registry, id="fracgpu_claims")
    async def index_claim(body: kopf.Body, **_: Any) -> dict[tuple[str, str], ClaimView]:
        # `{}` when the claim does not (or no longer) concern us: see index_slice
        try:
            view = claim_view(body, driver, settings.claim_classes)
        except (KeyError, TypeError, ValueError):
            log.exception("cannot read ResourceClaim %s/%s", body.metadata.namespace, body.metadata.name)
            metrics.OBJECTS_SKIPPED.labels("ResourceClaim", "unreadable").inc()
            return {}
        return {view.key: view} if view is not None else {}

    @kopf.index(RESOURCE_GROUP, RESOURCE_VERSION, "deviceclasses", registry=registry, id="fracgpu_classes")
    async def index_class(body: kopf.Body, name: str, **_: Any) -> dict[str, DeviceClassView]:
        # only our DeviceClasses: their selectors and configs apply to our claims, and whether the MPS class
        # exists decides what advice naming it says (`{}`: see index_slice)
        return {name: device_class_view(body, driver)} if name in settings.indexed_classes else {}

    @kopf.index(API_GROUP, GPU_VERSION, GPU_PLURAL, registry=registry, id="fracgpu_gpus")
    async def index_gpu(body: kopf.Body, name: str, **_: Any) -> dict[str, ExistingGpu]:
        return {
            name: ExistingGpu(
                name=name,
                labels=dict(body.metadata.labels),
                spec=dict(body.get("spec") or {}),
                status=dict(body["status"]) if body.get("status") else None,
                owners=tuple(
                    str(o.get("uid")) for o in body.metadata.get("ownerReferences") or [] if o.get("kind") == "Node"
                ),
            )
        }

    @kopf.index(RESOURCE_GROUP, RESOURCE_VERSION, "devicetaintrules", registry=registry, id=TAINT_RULES_INDEX)
    async def index_taint_rule(body: kopf.Body, name: str, **_: Any) -> dict[str, TaintRuleView]:
        # `{}` for a rule that selects none of our devices (see index_slice)
        try:
            view = taint_rule_view(body, driver)
        except (KeyError, TypeError, ValueError):
            log.exception("cannot read DeviceTaintRule %s", name)
            metrics.OBJECTS_SKIPPED.labels("DeviceTaintRule", "unreadable").inc()
            return {}
        return {name: view} if view is not None else {}

    @kopf.index("v1", "nodes", registry=registry, id="fracgpu_nodes")
    async def index_node(name: str, uid: str, **_: Any) -> dict[str, str]:
        return {name: uid}  # only which Nodes exist: claims on a deleted one are reported

    if settings.mps and settings.mps_trust_scope == "namespaceLabel":
        label = settings.mps_trust_label

        @kopf.index("v1", "namespaces", registry=registry, id=NAMESPACES_INDEX)
        async def index_namespace(name: str, labels: kopf.Labels, **_: Any) -> dict[str, dict[str, str]]:
            return {name: {label: labels[label]} if label in labels else {}}  # the one label that matters

    # ----- events: only wake the managers (controller/loops.py); they read the indexes ------------------

    @kopf.on.event(RESOURCE_GROUP, RESOURCE_VERSION, "resourceslices", registry=registry, id="slice_event")
    async def slice_event(**_: Any) -> None:
        controller.slices_changed()  # also for a slice that stopped being ours; unchanged devices: no-op

    @kopf.on.event(RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims", registry=registry, id="claim_event")
    async def claim_event(*, type: str, namespace: str | None, name: str, uid: str, **kwargs: Any) -> None:
        claims: kopf.Index[tuple[str, str], ClaimView] = kwargs["fracgpu_claims"]
        key = (namespace or "", name)
        controller.claim_event(key, uid, deleted=type == "DELETED", indexed=key in claims)

    @kopf.on.event("v1", "nodes", registry=registry, id="node_event")
    async def node_event(*, type: str, name: str, **_: Any) -> None:
        if type == "DELETED":
            controller.node_deleted(name)

    @kopf.on.event(RESOURCE_GROUP, RESOURCE_VERSION, "deviceclasses", registry=registry, id="class_event")
    async def class_event(name: str, **_: Any) -> None:
        if name in settings.indexed_classes:
            controller.classes_changed()

    @kopf.on.event(RESOURCE_GROUP, RESOURCE_VERSION, "devicetaintrules", registry=registry, id="taint_rule_event")
    async def taint_rule_event(*, type: str, name: str, body: kopf.Body, **_: Any) -> None:
        # a deleted MPS GPU's rule: the domain it recorded, for the Event when it is created again
        recorded = body.metadata.annotations.get(MPS_DOMAIN_ANNOTATION) if type == "DELETED" else None
        controller.taint_rule_changed(name, deleted=type == "DELETED", recorded=recorded)

    @kopf.on.event(API_GROUP, GPU_VERSION, GPU_PLURAL, registry=registry, id="gpu_event")
    async def gpu_event(name: str, **_: Any) -> None:
        controller.gpus_changed(name)

    # ----- admission ---------------------------------------------------------------------------------

    if not settings.admission:
        return

    @kopf.on.validate(
        CLAIMS.group,
        CLAIMS.version,
        CLAIMS.plural,
        registry=registry,
        id=CLAIMS.id,
        operations=list(CLAIMS.operations),  # CREATE: the spec is immutable
    )
    async def validate_claim(body: kopf.Body, warnings: list[str], namespace: str | None, **_: Any) -> None:
        standalone = not is_extended_resource_claim(body)
        _respond(_review(controller, body.get("spec"), "spec", namespace, standalone=standalone), warnings, body)

    @kopf.on.validate(
        TEMPLATES.group,
        TEMPLATES.version,
        TEMPLATES.plural,
        registry=registry,
        id=TEMPLATES.id,
        operations=list(TEMPLATES.operations),
    )
    async def validate_template(body: kopf.Body, warnings: list[str], namespace: str | None, **_: Any) -> None:
        _respond(_review(controller, (body.get("spec") or {}).get("spec"), "spec.spec", namespace), warnings, body)

    if settings.mps:

        @kopf.on.mutate(
            MUTATED_CLAIMS.group,
            MUTATED_CLAIMS.version,
            MUTATED_CLAIMS.plural,
            registry=registry,
            id=MUTATED_CLAIMS.id,
            operations=list(MUTATED_CLAIMS.operations),
        )
        async def tolerate_own_domain(body: kopf.Body, patch: kopf.Patch, namespace: str | None, **_: Any) -> None:
            spec = body.get("spec")
            if not namespace or not isinstance(spec, Mapping):
                return
            ops = tolerations_patch(spec, settings.device_classes, _domain(controller, namespace))
            if ops:
                metrics.ADMISSION.labels("ResourceClaim", "tolerated").inc()
                patch.fns.append(lambda raw: jsonpatch.apply_patch(raw, ops, in_place=True))


def _respond(review: Review, warnings: list[str], body: kopf.Body) -> None:
    """Add the review's warnings to the response; refuse (HTTP 422 to the user) when it has problems."""
    kind = str(body.get("kind", ""))
    metrics.ADMISSION.labels(kind, str(review.allowed).lower()).inc()
    warnings.extend(review.warnings)
    if not review.allowed:
        meta = body.get("metadata") or {}
        name = meta.get("name") or f"{meta.get('generateName', '')}*"
        log.info(
            "admission refused", extra={"object": f"{kind} {meta.get('namespace')}/{name}", "problems": review.message}
        )
        refuse(review.message)
