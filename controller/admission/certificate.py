"""One webhook certificate for every controller replica, shared through a Secret (no cert-manager).

The first replica to start finds no Secret, makes a self-signed certificate and creates the Secret; a replica
that loses that race gets AlreadyExists and reads the winner's. So the CA bundle in the webhook configuration is
the same whichever replica registers it, across pods and restarts. Why the controller and not the chart (`genCA`
with `lookup`): `lookup` is empty under `helm template` and GitOps renderers (a new CA at every render), and
the private key would sit in every Helm release record; here it is made in the cluster and stored only there.

Rotation: a certificate is valid `validity` (a year); any replica renews it once less than a third of that is
left, or when it does not cover the webhook's host names, by a PUT carrying the Secret's resourceVersion (of two
renewing replicas one wins; the other gets 409 Conflict and reads the winner's). `ca.crt` holds the new and the
previous certificate, so a replica still serving the previous one stays trusted until it re-reads the Secret
(every `--webhook-cert-check` seconds; kopf's server restarts with the new files within a minute).
"""

import asyncio
import base64
import datetime
import ipaddress
import logging
import os
import tempfile
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from api.kube_errors import ApiConflict, ApiError, ApiNotFound

log = logging.getLogger(__name__)
VALIDITY = datetime.timedelta(days=365)
ATTEMPTS = 3  # races lost in a row before giving up (each loss means another replica just wrote a usable one)

CERT_VALIDITY = datetime.timedelta(days=3650)


def self_signed_certificate(
    hostnames: Collection[str],
    password: str | None = None,
    validity: datetime.timedelta = CERT_VALIDITY,
    now: datetime.datetime | None = None,
) -> tuple[bytes, bytes]:
    """A self-signed CA certificate valid for `hostnames` (DNS names and IPs) and its key, both PEM.

    Same contract as `kopf.WebhookServer.build_certificate`: unspecified addresses (0.0.0.0, ::) are left
    out; the first DNS name (else the first IP) is the common name.
    """
    names: list[x509.GeneralName] = []
    dns: list[str] = []
    ips: list[str] = []
    for host in dict.fromkeys(hostnames):
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            names.append(x509.DNSName(host))
            dns.append(host)
            continue
        if not ip.is_unspecified:
            names.append(x509.IPAddress(ip))
            ips.append(str(ip))
    common_name = (dns or ips or ["fracgpu-controller"])[0]
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = now or datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + validity)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode()) if password else serialization.NoEncryption()
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


class SecretApi(Protocol):
    """The requests sent for the Secret (`api.kube_rest.KubeRest`; blocking)."""

    def get(self, path: str) -> dict[str, Any]: ...
    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...
    def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...


Make = Callable[[Collection[str], datetime.timedelta, datetime.datetime], tuple[bytes, bytes]]


def _make(hostnames: Collection[str], validity: datetime.timedelta, now: datetime.datetime) -> tuple[bytes, bytes]:
    return self_signed_certificate(hostnames, validity=validity, now=now)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass(frozen=True)
class Pair:
    """A certificate and its key (PEM), and the CA bundle clients trust (this certificate, maybe the previous)."""

    cert: bytes
    key: bytes
    bundle: bytes

    @classmethod
    def of_secret(cls, secret: dict[str, Any]) -> "Pair | None":
        """The pair a Secret holds; None when it holds none that can be read."""
        data = secret.get("data") or {}
        try:
            cert, key = base64.b64decode(data["tls.crt"]), base64.b64decode(data["tls.key"])
            bundle = base64.b64decode(data.get("ca.crt") or data["tls.crt"])
            x509.load_pem_x509_certificate(cert)
        except (KeyError, ValueError, TypeError):
            return None
        return cls(cert, key, bundle)

    def data(self) -> dict[str, str]:
        return {
            k: base64.b64encode(v).decode()
            for k, v in (("tls.crt", self.cert), ("tls.key", self.key), ("ca.crt", self.bundle))
        }


def renewal_due(
    cert_pem: bytes, hostnames: Collection[str], now: datetime.datetime, validity: datetime.timedelta
) -> str | None:
    """Why the certificate must be replaced (expiring within a third of `validity`, or missing a host name);
    None when it is fine."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    if cert.not_valid_after_utc - now < validity / 3:
        return f"it expires at {cert.not_valid_after_utc.isoformat()}"
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return "it names no host"
    covered = {*san.get_values_for_type(x509.DNSName), *(str(ip) for ip in san.get_values_for_type(x509.IPAddress))}
    wanted = set()
    for host in hostnames:
        try:
            if ipaddress.ip_address(host).is_unspecified:
                continue
        except ValueError:
            pass
        wanted.add(host)
    missing = sorted(wanted - covered)
    return f"it does not cover {', '.join(missing)}" if missing else None


def _still_valid(cert_pem: bytes, now: datetime.datetime) -> bool:
    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc > now


class SharedCertificate:
    """The webhook certificate in the Secret `namespace/name`, mirrored into files for kopf's server."""

    def __init__(
        self,
        rest: SecretApi,
        namespace: str,
        name: str,
        hostnames: Collection[str],
        directory: Path | None = None,
        *,
        validity: datetime.timedelta = VALIDITY,
        make: Make = _make,
        now: Callable[[], datetime.datetime] = _now,
    ) -> None:
        self.rest = rest
        self.namespace = namespace
        self.name = name
        self.hostnames = tuple(hostnames)
        self.directory = directory or Path(tempfile.mkdtemp(prefix="fracgpu-webhook-"))
        self.validity = validity
        self._make = make
        self._now = now
        self.current: Pair | None = None

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/secrets/{self.name}"

    @property
    def certfile(self) -> Path:
        return self.directory / "tls.crt"

    @property
    def keyfile(self) -> Path:
        return self.directory / "tls.key"

    @property
    def cafile(self) -> Path:
        return self.directory / "ca.crt"

    def _generate(self, previous: Pair | None) -> Pair:
        cert, key = self._make(self.hostnames, self.validity, self._now())
        keep = previous is not None and _still_valid(previous.cert, self._now())
        return Pair(cert, key, cert + (previous.cert if keep and previous is not None else b""))

    def _body(self, pair: Pair, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        meta = metadata or {"name": self.name, "namespace": self.namespace}
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta,
            "type": "kubernetes.io/tls",
            "data": pair.data(),
        }

    def obtain(self) -> Pair:
        """The Secret's usable pair: created if there is no Secret, renewed if due; a lost race reads the
        winner's. Blocking; raises ApiError (e.g. 403: the controller's Role must name the Secret)."""
        for _ in range(ATTEMPTS):
            try:
                secret = self.rest.get(self.path)
            except ApiNotFound:
                pair = self._generate(None)
                try:
                    self.rest.create(f"/api/v1/namespaces/{self.namespace}/secrets", self._body(pair))
                except ApiConflict:  # AlreadyExists: another replica was first; read its certificate
                    continue
                log.info("created the shared webhook certificate", extra={"secret": f"{self.namespace}/{self.name}"})
                return pair
            found = Pair.of_secret(secret)
            why = (
                "it holds no readable certificate"
                if found is None
                else renewal_due(found.cert, self.hostnames, self._now(), self.validity)
            )
            if why is None and found is not None:
                return found
            pair = self._generate(found)
            try:  # the resourceVersion in the metadata makes this a compare-and-swap
                self.rest.replace(self.path, self._body(pair, secret.get("metadata")))
            except ApiConflict:  # another replica renewed it first; read its certificate
                continue
            log.info(
                "renewed the shared webhook certificate", extra={"secret": f"{self.namespace}/{self.name}", "why": why}
            )
            return pair
        raise ApiError(reason=f"the Secret {self.namespace}/{self.name} changed under every one of {ATTEMPTS} attempts")

    def sync(self) -> bool:
        """Obtain the pair and write it to the files kopf's server reads; True when the files changed."""
        pair = self.obtain()
        if pair == self.current:
            return False
        for path, content in ((self.keyfile, pair.key), (self.certfile, pair.cert), (self.cafile, pair.bundle)):
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(content)
            os.chmod(tmp, 0o600)
            tmp.replace(path)
        self.current = pair
        return True

    async def keep(self, interval: float) -> None:
        """Re-read (and renew when due) every `interval` seconds until cancelled; a failure is logged and retried."""
        while True:
            await asyncio.sleep(interval)
            try:
                if await asyncio.to_thread(self.sync):
                    log.info("the shared webhook certificate changed; the server reloads it")
            except ApiError as err:
                log.warning(
                    "cannot read the shared webhook certificate", extra={"secret": self.path, "error": str(err)}
                )
