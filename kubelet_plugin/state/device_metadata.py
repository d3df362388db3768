"""Kubernetes' DRA device metadata (KEP-5304): the file that tells a container which devices its claim got.

Kubernetes defines the protocol and leaves it to the driver (no feature gate, no kubelet part):

- **path** in the container: ``/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claimName>/<request>/
  <driver>-metadata.json``; for a claim made from a ResourceClaimTemplate (annotation
  ``resource.kubernetes.io/pod-claim-name`` on the claim) ``resourceclaimtemplates/<podClaimName>/<request>/...``.
  ``<request>`` is the base request: a ``firstAvailable`` subrequest shows only in the file's ``requests[].name``;
- **content**: a JSON stream of ``DeviceMetadata`` objects, the same metadata once per API version, newest first:
  ``metadata.resource.k8s.io/v1beta1`` (what Kubernetes 1.37's readers require), then ``v1alpha1`` (1.36's
  readers); a reader takes the first object whose version it knows. ``metadata`` names the claim
  (name, namespace, uid) and ``generation`` 1; ``requests`` holds the one request of the file, with each of its
  devices as ``driver``, ``pool``, ``name`` and ``attributes`` (ResourceSlice attribute values, at most 32).
  The schema has no capacity: a share's grant is in fracgpu's own file (``container_info``);
- **exposure**: read-only, by a CDI bind mount, only into containers that get the request's devices.

fracgpu writes one file per request of a claim, next to the request's info file
(``<plugin data dir>/claim-info/<claimUID>/<request>.metadata``; not ``*.json``, which are the info files that
the usage sampler, of this release and earlier ones, reads; removed with the claim), and mounts it
from each CDI device of the request, as it mounts the info file. Pure: ``claim_files`` writes the files.
"""

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ModelWrapValidatorHandler, model_validator

CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
KIND: Final = "DeviceMetadata"
ApiVersion = Literal["metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1"]
VERSIONS: tuple[ApiVersion, ...] = ("metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1")
"""Written in this order, newest first (a reader uses the first it knows)."""
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
"""Set by the ResourceClaim controller on a claim it made from a template: the pod's name for the claim."""
MAX_ATTRIBUTES = 32
HOST_SUFFIX = ".metadata"
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid", strict=True)


class Attribute(_Model):
    """One ResourceSlice attribute value: exactly one of the fields is set."""

    int_: int | None = Field(None, alias="int")
    bool_: bool | None = Field(None, alias="bool")
    string: str | None = None
    version: str | None = None
    ints: list[int] | None = None
    bools: list[bool] | None = None
    strings: list[str] | None = None
    versions: list[str] | None = None

    @model_validator(mode="wrap")
    @classmethod
    def _one_value(cls, data: Any, handler: ModelWrapValidatorHandler["Attribute"]) -> "Attribute":
        if isinstance(data, cls):  # checked when it was made (a Device of published attributes passes them on)
            return data
        attribute = handler(data)
        set_ = [cls.model_fields[k].alias or k for k, v in attribute.__dict__.items() if v is not None]
        if len(set_) != 1:
            raise ValueError(f"an attribute has exactly one value, this one has {set_ or 'none'}")
        return attribute


class ObjectMeta(_Model):
    """The claim the file describes."""

    name: str
    namespace: str
    uid: str
    generation: int = Field(1, ge=1)


class Device(_Model):
    """One allocated device of the request."""

    driver: str
    pool: str
    name: str
    attributes: dict[str, Attribute] = Field(default_factory=dict, max_length=MAX_ATTRIBUTES)


class Request(_Model):
    """A request of the claim; ``name`` is ``<request>`` or ``<request>/<subrequest>``."""

    name: str
    devices: list[Device] = Field(default_factory=list)


class DeviceMetadata(_Model):
    """One object of the stream, in the field order Kubernetes writes."""

    kind: Literal["DeviceMetadata"] = KIND
    api_version: ApiVersion = Field(VERSIONS[0], alias="apiVersion")
    metadata: ObjectMeta
    pod_claim_name: str | None = Field(None, alias="podClaimName")
    requests: list[Request] = Field(default_factory=list)

    def to_json(self) -> str:
        """Indented JSON with Kubernetes' names, unset values left out (pydantic's serializer: the indenting one of
        ``json`` runs in Python, at a third of a millisecond per object)."""
        return self.model_dump_json(by_alias=True, exclude_none=True, indent=2)


def to_stream(metadata: DeviceMetadata) -> bytes:
    """The file's content: ``metadata`` once per version in ``VERSIONS``, each followed by a newline."""
    return "".join(metadata.model_copy(update={"api_version": v}).to_json() + "\n" for v in VERSIONS).encode()


def read_stream(text: str) -> list[DeviceMetadata]:
    """Every object of a metadata file, in order (raises ValueError on anything else)."""
    decoder, at = json.JSONDecoder(), 0
    out: list[DeviceMetadata] = []
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text):
            return out
        obj, at = decoder.raw_decode(text, at)
        out.append(DeviceMetadata.model_validate(obj, strict=False))


def attributes(published: Mapping[str, Mapping[str, Any]]) -> dict[str, Attribute]:
    """A device's ResourceSlice ``attributes`` as metadata attributes (the same names and values)."""
    return {name: Attribute.model_validate(value, strict=False) for name, value in published.items()}


@dataclass(frozen=True)
class MetadataFile:
    """A request's metadata file: where it lives on the host, where the container sees it, and what it says."""

    host_path: Path
    container_path: str
    metadata: DeviceMetadata

    def content(self) -> bytes:
        return to_stream(self.metadata)


def container_path(driver: str, claim: Mapping[str, Any], request: str) -> str:
    """Where the container finds the metadata of `claim`'s (base) request `request`."""
    pod_claim = pod_claim_name(claim)
    if pod_claim:
        return f"{CONTAINER_DIR}/resourceclaimtemplates/{pod_claim}/{request}/{driver}-metadata.json"
    return f"{CONTAINER_DIR}/resourceclaims/{claim['metadata']['name']}/{request}/{driver}-metadata.json"


class MetadataNameError(ValueError):
    """A name that would make the file's path in the container is not a name Kubernetes allows there."""


def pod_claim_name(claim: Mapping[str, Any]) -> str | None:
    """The pod's name for a claim made from a template; None for a claim the pod names itself. Raises
    MetadataNameError when the annotation is no DNS label (anyone who may create claims can set it)."""
    name = (claim["metadata"].get("annotations") or {}).get(POD_CLAIM_NAME_ANNOTATION) or None
    if name is not None and not _DNS_LABEL_RE.fullmatch(name):
        raise MetadataNameError(
            f"the claim's annotation {POD_CLAIM_NAME_ANNOTATION}={name!r} is not a pod's claim name (a DNS label), "
            "and it would name the device metadata's directory in the container"
        )
    return name


def metadata_file(
    claim: Mapping[str, Any], driver: str, request: str, *, request_ref: str, devices: Sequence[Device], info_dir: Path
) -> MetadataFile:
    """The file of `claim`'s base request `request` (allocated as `request_ref`, which names the subrequest of a
    ``firstAvailable`` request) with its `devices`, on the host in the claim's `info_dir`."""
    meta = claim["metadata"]
    metadata = DeviceMetadata(
        metadata=ObjectMeta(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"]),
        pod_claim_name=pod_claim_name(claim),
        requests=[Request(name=request_ref, devices=list(devices))],
    )
    return MetadataFile(info_dir / f"{request}{HOST_SUFFIX}", container_path(driver, claim, request), metadata)
