"""kopf's own webhook server, with its self-signed certificate built by `cryptography` (no cert-manager).

kopf generates and serves the certificate; this subclass adds a certificate builder that is installed
here (kopf's uses `certbuilder`), a Service reference instead of a URL, the registration of its client
config (CA bundle included) in the chart-made webhook configuration (`controller.admission.webhook_config`), and its
own thread: the server and kopf's admission handling run on an event loop of their own, so that a busy main
loop (watch events, indexes, the ledger) does not queue admission reviews behind it. The webhook that rewrites a
claim's opaque parameters in canonical bytes (`CANONICAL_CLAIMS`) is answered here, not by kopf: kopf builds a
mutation's JSON-patch by comparing decoded objects, where bytes and key order do not show.

A refusal (`refuse`) is logged by the controller itself; kopf logs every handler's permanent error, and
`kopf.AdmissionError` is one, at ERROR on `kopf.objects`, formatted into the message, and has neither a setting
for that level nor a hook between a handler's outcome and that line. So a refusal marks the review being served
(a context variable of the task that serves it, reset for each request) and `is_refusal_echo` tells the log
filter which record is kopf's echo of it.
"""

import asyncio
import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import AsyncIterator, Collection
from typing import Any, NoReturn

import aiohttp.web
import kopf

from api import bounded_json
from controller.admission.canonical import canonical_review
from controller.admission.certificate import SharedCertificate, self_signed_certificate
from controller.admission.webhook_config import CANONICAL_CLAIMS, Registration
from controller.core import kopf_json, metrics

_REFUSED: contextvars.ContextVar[bool] = contextvars.ContextVar("fracgpu_admission_refused", default=False)
"""Set by `refuse` in the task serving one admission review; reset by `WebhookServer._serve` for the next."""


def refuse(message: str) -> NoReturn:
    """Refuse the admission review being served (HTTP 422 to the user, with `message`)."""
    _REFUSED.set(True)
    raise kopf.AdmissionError(message, code=422)


def is_refusal_echo(record: logging.LogRecord) -> bool:
    """Whether `record` is kopf's ERROR line about a refusal made by `refuse` in the review being served."""
    return _REFUSED.get() and record.name == "kopf.objects" and record.levelno == logging.ERROR


class _Utf8Request:
    """An aiohttp request whose `text()` is given: the rest is the request's own."""

    def __init__(self, request: aiohttp.web.Request, text: str) -> None:
        self._request = request
        self._text = text

    def __getattr__(self, name: str) -> Any:
        return getattr(self._request, name)

    async def text(self) -> str:
        return self._text


class WebhookServer(kopf.WebhookServer):
    """`kopf.WebhookServer` that builds its self-signed certificate with `cryptography`.

    With `service=(namespace, name)` the registered client config is a Service reference (port
    `service_port`) instead of a URL, as a webhook inside the cluster is reached. With `registration`, each
    client config it yields is also patched into the webhook configuration (and kept there while it serves:
    `Registration.keep`), and removed when it stops, unless its certificate is one every replica serves: `shared`
    (controller/admission/certificate.py, kept current by `shared.keep` while it serves) or the files `certfile` and
    `pkeyfile` (`--webhook-cert-dir`: the Secret the chart's value `certSecretName` names, mounted in every replica).
    Then the configuration stays registered when one replica stops: the others serve the same CA bundle behind the
    same Service, and a webhook that fails closed (`webhook_config`) stays closed while none does. With `driver`, it
    answers the reviews of `CANONICAL_CLAIMS` for that driver's opaque configs (`controller.admission.canonical`).
    """

    def __init__(
        self,
        *,
        service: tuple[str, str] | None = None,
        service_port: int | None = None,
        registration: Registration | None = None,
        shared: "SharedCertificate | None" = None,
        shared_check_seconds: float = 3600.0,
        driver: str | None = None,
        **kwargs: Any,
    ) -> None:
        if shared is not None:
            kwargs |= {"certfile": shared.certfile, "pkeyfile": shared.keyfile, "cafile": shared.cafile}
        super().__init__(**kwargs)
        self.shared = shared
        self.shared_check_seconds = shared_check_seconds
        self.service = service
        self.service_port = service_port
        self.registration = registration
        self.driver = driver

    @staticmethod
    def build_certificate(hostnames: Collection[str], password: str | None = None) -> tuple[bytes, bytes]:
        return self_signed_certificate(hostnames, password)

    def _client_config(self, config: kopf.WebhookClientConfig) -> kopf.WebhookClientConfig:
        if self.service is None:
            return config
        namespace, name = self.service
        service: dict[str, Any] = {"namespace": namespace, "name": name}
        if self.service_port:
            service["port"] = self.service_port
        out = kopf.WebhookClientConfig(service=service)  # type: ignore[typeddict-item]
        if "caBundle" in config:
            out["caBundle"] = config["caBundle"]
        return out

    @staticmethod
    async def _serve(fn: kopf.WebhookFn, request: aiohttp.web.Request) -> aiohttp.web.Response:
        """kopf's `_serve`, with bytes that are not UTF-8 read as U+FFFD (and reported): kopf reads the body
        with `request.text()`, which raises on them, and the API server sends a claim's bytes as stored, so
        a claim of any driver would get an error answer instead of a review. Timed into
        `metrics.ADMISSION_SECONDS` (the webhook's own latency, apart from the API server's round trip)."""
        started = time.monotonic()
        refused = _REFUSED.set(False)  # aiohttp serves a connection's requests in one task: each starts clean
        body = await request.read()
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            text = body.decode("utf-8", errors="replace")
            kopf_json.report_not_utf8(bounded_json.loads(text))
        try:
            served: aiohttp.web.Response = await kopf.WebhookServer._serve(fn, _Utf8Request(request, text))  # type: ignore[arg-type]
        finally:
            metrics.ADMISSION_SECONDS.observe(time.monotonic() - started)
            _REFUSED.reset(refused)
        return served

    def _answering(self, fn: kopf.WebhookFn) -> kopf.WebhookFn:
        """`fn` (kopf's handling), with the reviews of `CANONICAL_CLAIMS` answered by `canonical_review` instead."""
        driver = self.driver
        if driver is None:
            return fn

        async def answer(request: Any, *, webhook: str | None = None, **kwargs: Any) -> Any:
            if webhook != CANONICAL_CLAIMS.id:
                return await fn(request, webhook=webhook, **kwargs)
            try:
                answer = canonical_review(request, driver)
            except ValueError as err:  # not an admission review: as kopf answers those
                raise aiohttp.web.HTTPBadRequest(reason=str(err)) from err
            if "patch" in answer["response"]:
                metrics.ADMISSION.labels("ResourceClaim", "canonical").inc()
            return answer

        return answer

    async def _serve_in_thread(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        """kopf's serving (`kopf.WebhookServer.__call__`) on an event loop in a thread of its own; yields its
        client configs here. Admission handlers then run on that loop: they may only read what the main loop
        publishes by plain attribute assignment (the device catalogue's admission facts, controller/devices/)."""
        main = asyncio.get_running_loop()
        configs: asyncio.Queue[kopf.WebhookClientConfig | BaseException] = asyncio.Queue()
        context = contextvars.copy_context()  # kopf's context variables (its Event posting queue among them)
        loop = asyncio.new_event_loop()
        serving = loop.create_task(self._forward(fn, main, configs), context=context)

        def run() -> None:
            with contextlib.suppress(asyncio.CancelledError):
                loop.run_until_complete(serving)
            loop.run_until_complete(loop.shutdown_asyncgens())

        thread = threading.Thread(target=run, name="fracgpu-webhook", daemon=True)
        thread.start()
        try:
            while True:
                item = await configs.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            loop.call_soon_threadsafe(serving.cancel)
            await asyncio.to_thread(thread.join, 30)
            if not thread.is_alive():
                loop.close()

    async def _forward(
        self,
        fn: kopf.WebhookFn,
        main: asyncio.AbstractEventLoop,
        configs: "asyncio.Queue[kopf.WebhookClientConfig | BaseException]",
    ) -> None:
        try:
            async for config in super().__call__(self._answering(fn)):
                main.call_soon_threadsafe(configs.put_nowait, config)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # e.g. the port is taken: raised in the main loop
            main.call_soon_threadsafe(configs.put_nowait, err)

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        registering: asyncio.Task[None] | None = None
        keeping = asyncio.create_task(self.shared.keep(self.shared_check_seconds)) if self.shared else None
        try:
            async for config in self._serve_in_thread(fn):
                out = self._client_config(config)
                if self.registration is not None:
                    if registering is not None:
                        registering.cancel()
                    registering = asyncio.create_task(self.registration.keep(out))
                yield out
        finally:
            for task in (registering, keeping):
                if task is not None:
                    task.cancel()
                    await asyncio.wait([task])
            if self.registration is not None and self.registration.registered and not self._common_certificate:
                await self.registration.unregister()

    @property
    def _common_certificate(self) -> bool:
        """Whether every replica serves this certificate (shared through the Secret, or given as files)."""
        return self.shared is not None or bool(self.certfile)
