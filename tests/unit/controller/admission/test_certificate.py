"""Unit tests of the webhook certificate the controller replicas share through a Secret
(controller/admission/certificate.py), on an in-memory API with the API server's write semantics."""

import asyncio
import base64
import datetime
import json
import ssl
import threading
import urllib.request
from pathlib import Path
from typing import Any

from cryptography import x509

from controller.admission.certificate import VALIDITY, SharedCertificate, renewal_due
from controller.admission.webhook import WebhookServer
from tests.unit.fake_objects import FakeObjects

SECRETS = "/api/v1/namespaces/ns/secrets"
PATH = f"{SECRETS}/cert"
HOSTS = ("127.0.0.1", "svc.ns.svc")


def _shared(api: FakeObjects, tmp: Path, name: str, **kwargs: Any) -> SharedCertificate:
    (tmp / name).mkdir()
    return SharedCertificate(api, "ns", "cert", HOSTS, tmp / name, **kwargs)


def _race(api: FakeObjects, a: SharedCertificate, b: SharedCertificate) -> None:
    """Both read (the same state) before either writes, then both write."""
    both_read = threading.Barrier(2, timeout=5)
    calls = iter(range(1_000))

    def first_reads_meet() -> None:
        if next(calls) < 2:  # the retries after a lost race read alone
            both_read.wait()

    api.before_get = first_reads_meet
    threads = [threading.Thread(target=s.sync) for s in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    api.before_get = None


def test_replicas_starting_together_create_one_secret_and_both_serve_its_certificate(tmp_path: Path) -> None:
    api = FakeObjects()
    a, b = _shared(api, tmp_path, "a"), _shared(api, tmp_path, "b")
    _race(api, a, b)
    assert api.writes == [("POST", PATH)], "the loser of the create must read the winner's, not write"
    assert a.current is not None and a.current == b.current
    assert a.certfile.read_bytes() == b.certfile.read_bytes() == a.current.cert
    assert a.keyfile.read_bytes() == b.keyfile.read_bytes()
    stored = api.objects[PATH]
    assert stored["type"] == "kubernetes.io/tls"
    assert base64.b64decode(stored["data"]["tls.crt"]) == a.current.cert
    assert not b.sync(), "an unchanged Secret changed the files"
    assert api.writes == [("POST", PATH)]


def test_a_certificate_due_for_renewal_is_replaced_once_and_the_previous_stays_trusted(tmp_path: Path) -> None:
    api = FakeObjects()
    first = _shared(api, tmp_path, "first")
    first.sync()
    old = first.current
    assert old is not None
    later = datetime.datetime.now(datetime.UTC) + VALIDITY - VALIDITY / 3 + datetime.timedelta(days=1)
    a, b = _shared(api, tmp_path, "a", now=lambda: later), _shared(api, tmp_path, "b", now=lambda: later)
    _race(api, a, b)
    assert [m for m, _ in api.writes] == ["POST", "PUT"], "two renewals of one certificate"
    assert a.current == b.current and a.current is not None and a.current.cert != old.cert
    assert a.current.bundle == a.current.cert + old.cert, "the previous certificate left the CA bundle"
    assert renewal_due(a.current.cert, HOSTS, later, VALIDITY) is None


def test_a_certificate_missing_a_host_name_or_unreadable_is_replaced(tmp_path: Path) -> None:
    api = FakeObjects()
    narrow = SharedCertificate(api, "ns", "cert", ("127.0.0.1",), tmp_path)
    narrow.sync()
    assert narrow.current is not None
    now = datetime.datetime.now(datetime.UTC)
    assert renewal_due(narrow.current.cert, HOSTS, now, VALIDITY) == "it does not cover svc.ns.svc"
    wide = _shared(api, tmp_path, "wide")
    wide.sync()
    assert wide.current is not None and wide.current.cert != narrow.current.cert
    api.edit(PATH, lambda secret: secret.update(data={"tls.crt": "bm90IGEgY2VydA=="}))
    fixed = _shared(api, tmp_path, "fixed")
    fixed.sync()
    assert fixed.current is not None
    x509.load_pem_x509_certificate(fixed.current.cert)


def test_two_servers_on_the_shared_certificate_register_one_ca_bundle_that_trusts_both(tmp_path: Path) -> None:
    api = FakeObjects()
    shared = [_shared(api, tmp_path, n) for n in ("a", "b")]
    for s in shared:
        s.sync()

    async def fn(data: Any, **_: Any) -> Any:
        return {"echo": data["uid"]}

    async def main() -> list[tuple[str, str]]:
        out = []
        for s in shared:
            server = WebhookServer(addr="127.0.0.1", port=0, host="127.0.0.1", shared=s)
            server.port = server._allocate_free_port()
            configs = server(fn)  # type: ignore[arg-type]
            config: dict[str, Any] = dict(await anext(configs))
            try:
                context = ssl.create_default_context(cadata=base64.b64decode(config["caBundle"]).decode())
                req = urllib.request.Request(
                    f"https://127.0.0.1:{server.port}/h", data=json.dumps({"uid": "u"}).encode(), method="POST"
                )

                def post(req: urllib.request.Request = req, context: ssl.SSLContext = context) -> str:
                    with urllib.request.urlopen(req, context=context, timeout=5) as resp:
                        return str(json.loads(resp.read())["echo"])

                out.append((config["caBundle"], await asyncio.to_thread(post)))
            finally:
                await configs.aclose()  # type: ignore[attr-defined]
        return out

    (bundle_a, echo_a), (bundle_b, echo_b) = asyncio.run(main())
    assert bundle_a == bundle_b and echo_a == echo_b == "u"
