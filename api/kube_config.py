"""Where the API server is and how to authenticate to it: the in-cluster service account or a kubeconfig.

`load()` picks like the kubernetes clients do: the pod's service account when `KUBERNETES_SERVICE_HOST` is
set, else the kubeconfig files in `$KUBECONFIG` (a `:`-separated list, merged as kubectl merges them: the
first file to name a cluster, user or context wins) or `~/.kube/config`. A kubeconfig may authenticate with a
client certificate and key (files or inline `-data`), a bearer `token` or `tokenFile`; it verifies the server
against `certificate-authority(-data)` or the system's CAs, and skips verification only where the file says
`insecure-skip-tls-verify: true`. `exec` and `auth-provider` users are refused with a `ConfigError`.

Token files (the service account's projected token, a kubeconfig `tokenFile`) are read again whenever the
file changes: the kubelet rotates a projected token by swapping the file under a symlink.
"""

import base64
import binascii
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_KUBECONFIG = Path("~/.kube/config")
#: Connections kept open per process; prepare reads claims from 16 threads, a few more write in the background.
POOL_SIZE = 32


class ConfigError(Exception):
    """The cluster credentials cannot be loaded; the message says what is wrong and what to do."""


def _no_authorization() -> str | None:
    return None


@dataclass(frozen=True)
class KubeConfig:
    """One API server and the credentials for it (TLS material as file paths or PEM text).

    `authorization` gives the `Authorization` header for the next request, or None (client certificate only).
    """

    server: str
    ca_file: str | None = None
    ca_data: str | None = None
    cert_file: str | None = None
    cert_data: str | None = None
    key_file: str | None = None
    key_data: str | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    authorization: Callable[[], str | None] = field(default=_no_authorization, compare=False)
    pool_size: int = POOL_SIZE


class TokenFile:
    """A bearer token read from `path`, read again when the file changes; thread-safe.

    A re-read that fails (the file is being replaced) keeps the last token: the API server then says 401 if
    it is no longer valid. The first read raises ConfigError.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._seen: tuple[int, ...] = ()
        self._token = ""
        self._read(first=True)

    def _read(self, *, first: bool = False) -> None:
        try:
            st = os.stat(self.path)
            seen = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
            if seen == self._seen:
                return
            token = self.path.read_text().strip()
        except OSError as err:
            if first:
                raise ConfigError(f"cannot read the bearer token file {self.path}: {err.strerror}") from None
            return
        if not token:
            if first:
                raise ConfigError(f"the bearer token file {self.path} is empty")
            return
        self._token, self._seen = token, seen

    def __call__(self) -> str:
        """`Bearer <token>`, the token as the file holds it now."""
        with self._lock:
            self._read()
            return f"Bearer {self._token}"


def in_cluster(env: Mapping[str, str] | None = None, account_dir: Path = SERVICE_ACCOUNT_DIR) -> KubeConfig:
    """The pod's service account: `KUBERNETES_SERVICE_HOST`/`_PORT`, the token and CA under `account_dir`."""
    env = os.environ if env is None else env
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ConfigError(
            "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must both be set in a pod; "
            "outside one, unset KUBERNETES_SERVICE_HOST and point KUBECONFIG at a kubeconfig file"
        )
    ca = account_dir / "ca.crt"
    if not ca.is_file():
        raise ConfigError(f"the service account CA {ca} is missing: mount the pod's service account token")
    token = TokenFile(account_dir / "token")
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    return KubeConfig(server=server, ca_file=str(ca), authorization=token)


# ----- kubeconfig files --------------------------------------------------------------------------------


class _Entry(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class _Cluster(_Entry):
    server: str = Field(min_length=1)
    certificate_authority: str | None = Field(None, alias="certificate-authority")
    certificate_authority_data: str | None = Field(None, alias="certificate-authority-data")
    insecure_skip_tls_verify: bool = Field(False, alias="insecure-skip-tls-verify")
    tls_server_name: str | None = Field(None, alias="tls-server-name")


class _User(_Entry):
    client_certificate: str | None = Field(None, alias="client-certificate")
    client_certificate_data: str | None = Field(None, alias="client-certificate-data")
    client_key: str | None = Field(None, alias="client-key")
    client_key_data: str | None = Field(None, alias="client-key-data")
    token: str | None = None
    token_file: str | None = Field(None, alias="tokenFile")
    exec_: Any = Field(None, alias="exec")
    auth_provider: Any = Field(None, alias="auth-provider")
    username: str | None = None


class _Context(_Entry):
    cluster: str = Field(min_length=1)
    user: str = ""


class _NamedCluster(_Entry):
    name: str
    cluster: _Cluster


class _NamedUser(_Entry):
    name: str
    user: _User = Field(default_factory=_User)


class _NamedContext(_Entry):
    name: str
    context: _Context


class _Kubeconfig(_Entry):
    clusters: list[_NamedCluster] | None = None
    users: list[_NamedUser] | None = None
    contexts: list[_NamedContext] | None = None
    current_context: str | None = Field(None, alias="current-context")


@dataclass
class _Merged:
    """Named entries of one or more kubeconfig files (first wins), each with the directory of its file."""

    clusters: dict[str, tuple[_Cluster, Path]] = field(default_factory=dict)
    users: dict[str, tuple[_User, Path]] = field(default_factory=dict)
    contexts: dict[str, _Context] = field(default_factory=dict)
    current_context: str | None = None
    files: list[Path] = field(default_factory=list)


def _parse_file(path: Path) -> _Kubeconfig:
    import yaml  # only for kubeconfig files: a pod's service account needs no YAML

    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"cannot read the kubeconfig {path}: {err.strerror}") from None
    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"the kubeconfig {path} is not valid YAML: {err}") from None
    try:
        return _Kubeconfig.model_validate(data)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'the document'}: {e['msg']}" for e in err.errors()
        )
        raise ConfigError(f"the kubeconfig {path} is not a valid kubeconfig: {problems}") from None


def _merge(paths: list[Path]) -> _Merged:
    merged = _Merged()
    for path in paths:
        parsed = _parse_file(path)
        base = path.parent
        merged.files.append(path)
        for c in parsed.clusters or []:
            merged.clusters.setdefault(c.name, (c.cluster, base))
        for u in parsed.users or []:
            merged.users.setdefault(u.name, (u.user, base))
        for x in parsed.contexts or []:
            merged.contexts.setdefault(x.name, x.context)
        if merged.current_context is None and parsed.current_context:
            merged.current_context = parsed.current_context
    return merged


def _decoded(value: str, what: str, where: str) -> str:
    try:
        return base64.b64decode(value, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise ConfigError(f"{what} of {where} is not base64-encoded PEM") from None


def _path(value: str, base: Path) -> str:
    return str(base / Path(value).expanduser())  # relative paths are relative to the kubeconfig file


def from_kubeconfig(paths: list[Path], context: str | None = None) -> KubeConfig:
    """The cluster and user of `context` (default: `current-context`) in the merged kubeconfig `paths`."""
    merged = _merge(paths)
    files = ", ".join(str(p) for p in merged.files)
    name = context or merged.current_context
    if not name:
        raise ConfigError(f"the kubeconfig {files} sets no current-context: set one (kubectl config use-context)")
    ctx = merged.contexts.get(name)
    if ctx is None:
        raise ConfigError(f"the kubeconfig {files} has no context {name!r} (it has: {sorted(merged.contexts)})")
    if ctx.cluster not in merged.clusters:
        raise ConfigError(f"context {name!r} of the kubeconfig {files} names a cluster {ctx.cluster!r} it lacks")
    cluster, cluster_dir = merged.clusters[ctx.cluster]
    if ctx.user and ctx.user not in merged.users:
        raise ConfigError(f"context {name!r} of the kubeconfig {files} names a user {ctx.user!r} it lacks")
    user, user_dir = merged.users.get(ctx.user, (_User(), cluster_dir))
    where = f"user {ctx.user!r} in {files}"
    if user.exec_ is not None or user.auth_provider is not None or user.username is not None:
        raise ConfigError(
            f"{where} authenticates with exec, auth-provider or username/password, which this client does not "
            "support: use a client certificate, token or tokenFile"
        )
    if bool(user.client_certificate or user.client_certificate_data) != bool(user.client_key or user.client_key_data):
        raise ConfigError(f"{where} has a client certificate without its key or a key without its certificate")
    authorization: Callable[[], str | None] = _no_authorization
    if user.token_file:  # as in client-go, the file's token wins over `token`
        try:
            authorization = TokenFile(Path(_path(user.token_file, user_dir)))
        except ConfigError as err:
            raise ConfigError(f"tokenFile of {where}: {err}") from None
    elif user.token:
        header = f"Bearer {user.token}"
        authorization = lambda: header  # noqa: E731
    return KubeConfig(
        server=cluster.server,
        ca_file=_path(cluster.certificate_authority, cluster_dir) if cluster.certificate_authority else None,
        ca_data=_decoded(
            cluster.certificate_authority_data, "certificate-authority-data", f"cluster {ctx.cluster!r} in {files}"
        )
        if cluster.certificate_authority_data
        else None,
        cert_file=_path(user.client_certificate, user_dir) if user.client_certificate else None,
        cert_data=_decoded(user.client_certificate_data, "client-certificate-data", where)
        if user.client_certificate_data
        else None,
        key_file=_path(user.client_key, user_dir) if user.client_key else None,
        key_data=_decoded(user.client_key_data, "client-key-data", where) if user.client_key_data else None,
        insecure=cluster.insecure_skip_tls_verify,
        tls_server_name=cluster.tls_server_name,
        authorization=authorization,
    )


def load(env: Mapping[str, str] | None = None) -> KubeConfig:
    """In a pod the service account, else `$KUBECONFIG` (or `~/.kube/config`); raises ConfigError."""
    env = os.environ if env is None else env
    if env.get("KUBERNETES_SERVICE_HOST"):
        return in_cluster(env)
    listed = [Path(p).expanduser() for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    paths = listed or [DEFAULT_KUBECONFIG.expanduser()]
    if not any(p.exists() for p in paths):
        raise ConfigError(
            f"no cluster credentials: not in a pod (KUBERNETES_SERVICE_HOST unset) and no kubeconfig at "
            f"{', '.join(str(p) for p in paths)}; set KUBECONFIG to a kubeconfig file"
        )
    return from_kubeconfig([p for p in paths if p.exists()])


def from_client_configuration(cfg: Any) -> KubeConfig:
    """The same server and credentials as a `kubernetes.client.Configuration` (the controller and tests build
    those); read by attribute, so this module never imports the kubernetes package."""
    return KubeConfig(
        server=cfg.host,
        ca_file=cfg.ssl_ca_cert,
        cert_file=cfg.cert_file,
        key_file=cfg.key_file,
        insecure=not cfg.verify_ssl,
        tls_server_name=getattr(cfg, "tls_server_name", None),
        authorization=lambda: cfg.get_api_key_with_prefix("BearerToken", alias="authorization"),
        pool_size=max(cfg.connection_pool_maxsize or 0, POOL_SIZE),
    )
