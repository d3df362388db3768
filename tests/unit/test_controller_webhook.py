"""Unit tests of the webhook server's self-signed certificate and client config (controller/webhook.py)."""

import asyncio
import base64
import json
import ssl
import urllib.request
from typing import Any

from cryptography import x509

from controller.webhook import WebhookServer, self_signed_certificate


def test_certificate_covers_names_and_ips_but_not_unspecified_addresses() -> None:
    cert_pem, key_pem = self_signed_certificate(["svc.ns.svc", "127.0.0.1", "0.0.0.0", "svc.ns.svc"])
    cert = x509.load_pem_x509_certificate(cert_pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["svc.ns.svc"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert cert.subject.rfc4514_string() == "CN=svc.ns.svc"
    assert b"PRIVATE KEY" in key_pem and b"ENCRYPTED" not in key_pem
    _, encrypted = self_signed_certificate(["127.0.0.1"], password="secret")
    assert b"ENCRYPTED" in encrypted


def _serve_once(server: WebhookServer, request: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Start the server, POST one admission review over TLS trusting only its CA bundle; (config, answer)."""

    async def fn(data: Any, **_: Any) -> Any:
        return {"echo": data["uid"]}

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        configs = server(fn)  # type: ignore[arg-type]
        config: dict[str, Any] = dict(await anext(configs))
        try:
            context = ssl.create_default_context(cadata=base64.b64decode(config["caBundle"]).decode())
            url = f"https://127.0.0.1:{server.port}/handler"
            req = urllib.request.Request(url, data=json.dumps(request).encode(), method="POST")

            def post() -> dict[str, Any]:
                with urllib.request.urlopen(req, context=context, timeout=5) as resp:
                    answer: dict[str, Any] = json.loads(resp.read())
                    return answer

            return config, await asyncio.to_thread(post)
        finally:
            await configs.aclose()  # type: ignore[attr-defined]  # an async generator underneath

    return asyncio.run(main())


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_server_serves_tls_with_the_ca_it_registers_by_url() -> None:
    port = _free_port()
    config, answer = _serve_once(WebhookServer(addr="127.0.0.1", port=port), {"uid": "u1"})
    assert config["url"] == f"https://127.0.0.1:{port}"
    assert answer == {"echo": "u1"}


def test_server_registers_a_service_reference_when_asked() -> None:
    port = _free_port()
    server = WebhookServer(
        addr="127.0.0.1",
        port=port,
        extra_sans=["127.0.0.1"],
        host="hook.sys.svc",
        service=("sys", "hook"),
        service_port=443,
    )
    config, answer = _serve_once(server, {"uid": "u2"})
    assert "url" not in config
    assert config["service"] == {"namespace": "sys", "name": "hook", "port": 443}
    cert = x509.load_pem_x509_certificate(base64.b64decode(config["caBundle"]))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert names == ["hook.sys.svc"]
    assert answer == {"echo": "u2"}
