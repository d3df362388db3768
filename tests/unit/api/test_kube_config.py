"""Cluster credentials (api/kube_config.py) as the node plugin loads them, used for real: every variant sends
a request over TLS to a fake API server (tests/unit/fake_apiserver.py) that checks the client certificate
against the cluster CA and records what authenticated each request."""

import base64
import dataclasses
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml

from api.kube_config import ConfigError, KubeConfig, TokenFile, from_kubeconfig, in_cluster, load
from api.kube_errors import ApiError, ApiTransient
from api.kube_rest import KubeConnection, KubeRest
from harness.cluster.pki import Pki
from tests.unit.fake_apiserver import FakeApiServer, ServerTls, serve


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def tls_server(pki: Pki) -> Iterator[tuple[FakeApiServer, str]]:
    serving = pki.issue("serving", "apiserver", ips=("127.0.0.1",), server=True)
    with serve(ServerTls(serving.cert, serving.key, pki.ca.cert)) as running:
        running[0].objects["/api"] = b'{"kind": "APIVersions"}'
        yield running


def write_kubeconfig(path: Path, cluster: dict[str, Any], user: dict[str, Any], **extra: Any) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": "admin", "user": user}],
        "contexts": [{"name": "admin@local", "context": {"cluster": "local", "user": "admin"}}],
        "current-context": "admin@local",
        **extra,
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def get_api(config: KubeConfig) -> dict[str, Any]:
    return KubeRest.bounded(KubeConnection(config), budget=10).get("/api")


def test_client_certificate_files_as_the_harness_writes_them(
    tls_server: tuple[FakeApiServer, str], pki: Pki, tmp_path: Path
) -> None:
    api, url = tls_server
    pair = pki.issue("admin", "admin", client=True)
    path = write_kubeconfig(
        tmp_path / "kubeconfig",
        {"server": url, "certificate-authority": str(pki.ca.cert)},
        {"client-certificate": str(pair.cert), "client-key": str(pair.key)},
    )
    assert get_api(from_kubeconfig([path])) == {"kind": "APIVersions"}
    assert api.credentials == [(None, "admin")]


def test_inline_certificate_data_leaves_no_key_file_behind(
    tls_server: tuple[FakeApiServer, str], pki: Pki, tmp_path: Path
) -> None:
    api, url = tls_server
    pair = pki.issue("inline", "inline-user", client=True)
    path = write_kubeconfig(
        tmp_path / "kubeconfig",
        {"server": url, "certificate-authority-data": b64(pki.ca.cert)},
        {"client-certificate-data": b64(pair.cert), "client-key-data": b64(pair.key)},
    )
    before = set(Path(tempfile.gettempdir()).glob("fracgpu-kube-*"))
    assert get_api(from_kubeconfig([path])) == {"kind": "APIVersions"}
    assert api.credentials == [(None, "inline-user")]
    assert set(Path(tempfile.gettempdir()).glob("fracgpu-kube-*")) == before


def test_relative_paths_are_relative_to_the_kubeconfig_file(
    tls_server: tuple[FakeApiServer, str], pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api, url = tls_server
    pair = pki.issue("relative", "relative-user", client=True)
    (tmp_path / "certs").mkdir()
    for src, name in ((pki.ca.cert, "ca.crt"), (pair.cert, "c.crt"), (pair.key, "c.key")):
        (tmp_path / "certs" / name).write_bytes(src.read_bytes())
    path = write_kubeconfig(
        tmp_path / "kubeconfig",
        {"server": url, "certificate-authority": "certs/ca.crt"},
        {"client-certificate": "certs/c.crt", "client-key": "certs/c.key"},
    )
    monkeypatch.chdir("/")  # restored after the test: later tests run from the repository
    assert get_api(from_kubeconfig([path])) == {"kind": "APIVersions"}
    assert api.credentials == [(None, "relative-user")]


def test_a_token_authenticates_and_a_token_file_is_read_again_when_it_changes(
    tls_server: tuple[FakeApiServer, str], pki: Pki, tmp_path: Path
) -> None:
    api, url = tls_server
    cluster = {"server": url, "certificate-authority": str(pki.ca.cert)}
    get_api(from_kubeconfig([write_kubeconfig(tmp_path / "a", cluster, {"token": "secret-a"})]))
    (tmp_path / "token").write_text("secret-b\n")
    config = from_kubeconfig([write_kubeconfig(tmp_path / "b", cluster, {"tokenFile": "token", "token": "not-this"})])
    get_api(config)
    (tmp_path / "token").write_text("secret-c-longer\n")
    get_api(config)
    assert api.credentials == [("Bearer secret-a", None), ("Bearer secret-b", None), ("Bearer secret-c-longer", None)]


def test_the_server_is_verified_against_the_cluster_ca_unless_the_file_says_insecure(
    tls_server: tuple[FakeApiServer, str], tmp_path: Path
) -> None:
    _, url = tls_server
    other = Pki(tmp_path / "other")
    strict = write_kubeconfig(tmp_path / "strict", {"server": url, "certificate-authority": str(other.ca.cert)}, {})
    with pytest.raises(ApiError, match="certificate is not trusted") as untrusted:
        get_api(from_kubeconfig([strict]))
    assert not isinstance(untrusted.value, ApiTransient), "not retried: trying again cannot help"
    assert untrusted.value.tries == 1
    insecure = write_kubeconfig(tmp_path / "insecure", {"server": url, "insecure-skip-tls-verify": True}, {})
    with pytest.warns(urllib3.exceptions.InsecureRequestWarning):
        assert get_api(from_kubeconfig([insecure])) == {"kind": "APIVersions"}


def test_a_server_name_other_than_the_address_is_checked_against_tls_server_name(pki: Pki, tmp_path: Path) -> None:
    serving = pki.issue("named", "apiserver", dns=("apiserver.example",), server=True)  # no IP in the cert
    with serve(ServerTls(serving.cert, serving.key, pki.ca.cert)) as (api, url):
        api.objects["/api"] = b"{}"
        cluster = {"server": url, "certificate-authority": str(pki.ca.cert)}
        with pytest.raises(ApiError, match=r"certificate is not trusted \(.*mismatch"):
            get_api(from_kubeconfig([write_kubeconfig(tmp_path / "a", cluster, {})]))
        named = {**cluster, "tls-server-name": "apiserver.example"}
        assert get_api(from_kubeconfig([write_kubeconfig(tmp_path / "b", named, {})])) == {}


def test_current_context_picks_the_cluster_and_user_and_kubeconfig_files_merge_first_wins(tmp_path: Path) -> None:
    first = tmp_path / "first"
    first.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "a", "cluster": {"server": "https://a.example"}}],
                "users": [{"name": "u", "user": {"token": "from-first"}}],
                "contexts": [{"name": "ctx-b", "context": {"cluster": "b", "user": "u"}}],
                "current-context": "ctx-b",
            }
        )
    )
    second = tmp_path / "second"
    second.write_text(
        yaml.safe_dump(
            {
                "clusters": [
                    {"name": "a", "cluster": {"server": "https://ignored.example"}},
                    {"name": "b", "cluster": {"server": "https://b.example:6443"}},
                ],
                "users": [{"name": "u", "user": {"token": "from-second"}}],
                "contexts": [{"name": "ctx-a", "context": {"cluster": "a", "user": "u"}}],
                "current-context": "ctx-a",
            }
        )
    )
    merged = load({"KUBECONFIG": f"{first}:{tmp_path / 'missing'}:{second}"})
    assert (merged.server, merged.authorization()) == ("https://b.example:6443", "Bearer from-first")
    chosen = from_kubeconfig([first, second], context="ctx-a")
    assert chosen.server == "https://a.example"


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("clusters: [", "is not valid YAML"),
        ("clusters: 5", "not a valid kubeconfig: clusters"),
        ("clusters: []\ncontexts: []\n", "sets no current-context"),
        ("current-context: nope\ncontexts: []\n", "has no context 'nope'"),
        (
            "current-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
            "clusters: [{name: c, cluster: {server: 'https://c'}}]\n",
            "names a user 'u' it lacks",
        ),
        (
            "current-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
            "clusters: [{name: c, cluster: {server: 'https://c'}}]\n"
            "users: [{name: u, user: {exec: {command: aws}}}]\n",
            "does not support: use a client certificate, token or tokenFile",
        ),
        (
            "current-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
            "clusters: [{name: c, cluster: {server: 'https://c'}}]\n"
            "users: [{name: u, user: {client-certificate: c.crt}}]\n",
            "a client certificate without its key",
        ),
        (
            "current-context: x\ncontexts: [{name: x, context: {cluster: c, user: ''}}]\n"
            "clusters: [{name: c, cluster: {server: 'https://c', certificate-authority-data: '%%%'}}]\n",
            "certificate-authority-data of cluster 'c' in .* is not base64-encoded PEM",
        ),
        (
            "current-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
            "clusters: [{name: c, cluster: {server: 'https://c'}}]\n"
            "users: [{name: u, user: {tokenFile: absent-token}}]\n",
            "cannot read the bearer token file",
        ),
    ],
)
def test_a_bad_kubeconfig_is_a_config_error_saying_what_is_wrong(tmp_path: Path, doc: str, message: str) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(doc)
    with pytest.raises(ConfigError, match=message) as raised:
        from_kubeconfig([path])
    assert str(path) in str(raised.value)


def test_no_credentials_at_all_says_what_to_set(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="set KUBECONFIG to a kubeconfig file"):
        load({"KUBECONFIG": str(tmp_path / "absent")})


# ----- in a pod: the service account -----------------------------------------------------------------


def service_account(directory: Path, pki: Pki, token: str) -> Path:
    """A service account directory as the kubelet projects it: files behind a `..data` symlink."""
    data = directory / "..2026_12_01_00_00_00.000000001"
    data.mkdir(parents=True)
    (data / "token").write_text(token)
    (data / "ca.crt").write_bytes(pki.ca.cert.read_bytes())
    (directory / "..data").symlink_to(data.name)
    for name in ("token", "ca.crt"):
        (directory / name).symlink_to(f"..data/{name}")
    return directory


def rotate(directory: Path, token: str) -> None:
    """Rotate the token the way the kubelet does: a new timestamped directory, then swap `..data` atomically."""
    data = directory / "..2026_12_01_01_00_00.000000002"
    data.mkdir()
    (data / "token").write_text(token)
    (data / "ca.crt").write_bytes((directory / "ca.crt").read_bytes())
    (directory / "..data_tmp").symlink_to(data.name)
    os.replace(directory / "..data_tmp", directory / "..data")


def test_in_cluster_uses_the_service_account_and_follows_token_rotation(
    tls_server: tuple[FakeApiServer, str], pki: Pki, tmp_path: Path
) -> None:
    api, url = tls_server
    port = url.rsplit(":", 1)[1]
    account = service_account(tmp_path / "sa", pki, "first-token")
    config = in_cluster({"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port}, account)
    assert config.server == url
    rest = KubeRest.bounded(KubeConnection(config), budget=10)
    rest.get("/api")
    rotate(account, "second-token")
    rest.get("/api")
    assert api.credentials == [("Bearer first-token", None), ("Bearer second-token", None)]


def test_in_cluster_addresses_and_errors(pki: Pki, tmp_path: Path) -> None:
    account = service_account(tmp_path / "sa", pki, "t")
    ipv6 = in_cluster({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}, account)
    assert ipv6.server == "https://[fd00::1]:443"
    with pytest.raises(ConfigError, match="KUBERNETES_SERVICE_PORT must both be set"):
        in_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, account)
    with pytest.raises(ConfigError, match=r"service account CA .* is missing"):
        in_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}, tmp_path)


def test_a_token_file_being_replaced_keeps_the_last_token(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("kept")
    token = TokenFile(path)
    path.unlink()
    assert token() == "Bearer kept"
    path.write_text("")
    assert token() == "Bearer kept"
    path.write_text("new")
    assert token() == "Bearer new"


def test_unusable_tls_material_or_address_is_a_clear_error_at_start(pki: Pki, tmp_path: Path) -> None:
    garbage = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nnot a certificate\n").decode()
    path = write_kubeconfig(tmp_path / "kubeconfig", {"server": "https://127.0.0.1:6443"}, {})
    config = from_kubeconfig([path])
    with pytest.raises(ApiError, match=r"cannot load the TLS certificates of https://127.0.0.1:6443"):
        KubeConnection(dataclasses.replace(config, ca_data=base64.b64decode(garbage).decode()))
    with pytest.raises(ApiError, match=r"cannot load the TLS certificates"):
        KubeConnection(dataclasses.replace(config, cert_file=str(pki.ca.cert), key_file=str(tmp_path / "absent")))
    with pytest.raises(ApiError, match=r"'127.0.0.1:6443' is not an http\(s\) URL"):
        KubeConnection(dataclasses.replace(config, server="127.0.0.1:6443"))
