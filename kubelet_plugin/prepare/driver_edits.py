"""Driver edits: the NVIDIA driver's libraries, binaries and hooks for every claim spec, by NVIDIA's generator.

With ``--driver-edits=toolkit`` the plugin runs, off the prepare path (at start, then every
``driver_edits_retry_seconds`` while the last run failed or the driver version changed)::

    nvidia-ctk cdi generate --mode=management --format=json --driver-root=<mounted root> --dev-root=<mounted root>
        --nvidia-cdi-hook-path=<host hook path> --vendor=k8s.<driver> --class=driver
        --enable-hook=disable-device-node-modification --output=<tmp>/driver.json
    nvidia-ctk cdi transform root --from=<mounted root> --to=<host driver root> --relative-to=host
        --input=<tmp>/driver.json --output=<tmp>/host.json

and keeps the spec-level ``containerEdits`` (mounts, hooks, env) with ``NVIDIA_VISIBLE_DEVICES=void``; the
generator's devices and device nodes are dropped (claim specs carry the stat-checked nodes of their own GPU).

Why ``--mode=management``: it needs no NVML in the generator (the driver version comes from the suffix of
``libcuda.so.<ver>`` / ``libnvidia-ml.so.<ver>``), and its spec-level edits hold the same libraries, binaries,
firmware and hooks as ``--mode=nvml``; what nvml mode adds is control device nodes (ours come from
discovery) and graphics pieces. It also runs unchanged against the test suite's fake driver root. The
``disable-device-node-modification`` hook, off by default in management mode, is enabled: a container that
shares a GPU must not create device nodes of the others.

The hook binary runs on the host (the runtime calls it at the path the spec names), so the plugin copies its
own ``nvidia-cdi-hook`` to a path under the kubelet plugin directory, which is the same path on the host.
"""

from __future__ import annotations

import logging
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from kubelet_plugin.core.errors import ErrorKind, PrepareError
from kubelet_plugin.core.filelock import atomic_write
from kubelet_plugin.core.settings import Settings
from kubelet_plugin.state import cdi
from kubelet_plugin.state.container_info import VOID, library_problem

log = logging.getLogger(__name__)

#: Seconds one nvidia-ctk call may take (generation reads the driver root; it takes well under a second).
GENERATOR_TIMEOUT_S = 120.0
_STDERR_TAIL = 2000


class DriverEditsError(Exception):
    """Driver edits could not be generated; the message says what failed and what to fix."""


@dataclass(frozen=True)
class GeneratorConfig:
    """What the generator needs; paths as the plugin sees them, except ``host_root`` and ``hook_path``."""

    nvidia_ctk: Path
    mounted_root: Path  # the driver root as mounted into the plugin
    host_root: Path  # the same directory as the host (and so the runtime) sees it
    hook_path: Path  # nvidia-cdi-hook on the host, as written into the hooks
    vendor: str  # CDI vendor of the generated spec (``k8s.<driver>``); its devices are dropped anyway

    @classmethod
    def from_settings(cls, settings: Settings) -> GeneratorConfig:
        """The generator's configuration from the plugin's settings."""
        return cls(
            nvidia_ctk=settings.nvidia_ctk,
            mounted_root=settings.toolkit_driver_root or settings.driver_root,
            host_root=settings.host_driver_root or settings.driver_root,
            hook_path=settings.cdi_hook_path,
            vendor=cdi.cdi_vendor(settings.driver_name),
        )


def generate_argv(config: GeneratorConfig, output: Path) -> list[str]:
    """``nvidia-ctk cdi generate`` (management mode) writing JSON to ``output``."""
    root = str(config.mounted_root)
    return [
        str(config.nvidia_ctk),
        "cdi",
        "generate",
        "--mode=management",
        "--format=json",
        f"--driver-root={root}",
        f"--dev-root={root}",
        f"--nvidia-cdi-hook-path={config.hook_path}",
        f"--vendor={config.vendor}",
        "--class=driver",
        "--enable-hook=disable-device-node-modification",
        f"--output={output}",
    ]


def transform_argv(config: GeneratorConfig, source: Path, output: Path) -> list[str]:
    """``nvidia-ctk cdi transform root`` rewriting host paths from the mounted root to the host root."""
    return [
        str(config.nvidia_ctk),
        "cdi",
        "transform",
        "root",
        f"--from={config.mounted_root}",
        f"--to={config.host_root}",
        "--relative-to=host",
        f"--input={source}",
        f"--output={output}",  # the format follows the extension: JSON
    ]


def parse_driver_edits(spec_json: str) -> cdi.ContainerEdits:
    """The spec-level edits of a generated spec, without device nodes, with ``NVIDIA_VISIBLE_DEVICES=void``.

    Raises DriverEditsError when the text is not a CDI spec our model accepts.
    """
    try:
        spec = cdi.Spec.model_validate_json(spec_json)
    except ValidationError as err:
        raise DriverEditsError(f"nvidia-ctk wrote a CDI spec this plugin cannot read: {err}") from None
    edits = spec.container_edits or cdi.ContainerEdits()
    env = [e for e in edits.env if not e.startswith("NVIDIA_VISIBLE_DEVICES=")] + [VOID]
    return edits.model_copy(update={"device_nodes": [], "env": env})


def install_hook(source: Path, dest: Path) -> bool:
    """Copy ``source`` to ``dest`` atomically with mode 0755; False (nothing written) when already identical.

    Raises DriverEditsError naming the path and the cause.
    """
    try:
        content = source.read_bytes()
    except OSError as err:
        raise DriverEditsError(
            f"cannot read nvidia-cdi-hook at {source}: {err.strerror or err}; it is part of the plugin image "
            "(set --nvidia-cdi-hook-source to where it is)"
        ) from None
    try:
        if dest.read_bytes() == content and dest.stat().st_mode & 0o777 == 0o755:
            return False
    except OSError:
        pass  # missing or unreadable: write it
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(dest, content, 0o755)
    except OSError as err:
        raise DriverEditsError(
            f"cannot install nvidia-cdi-hook at {dest}: {err.strerror or err}; the path must be writable by the "
            "plugin and be the same path on the host (set --nvidia-cdi-hook-path under the kubelet plugin directory)"
        ) from None
    return True


def _run(argv: list[str], what: str, fix: str) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=GENERATOR_TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise DriverEditsError(
            f"{argv[0]} not found; it is part of the plugin image (set --nvidia-ctk to where it is)"
        ) from None
    except (OSError, subprocess.TimeoutExpired) as err:
        raise DriverEditsError(f"{what} failed: {err}; {fix}") from None
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "level=error" in line]  # not its warnings
        stderr = ("\n".join(errors) or done.stderr.strip())[-_STDERR_TAIL:] or "(no output)"
        raise DriverEditsError(f"{what} exited with {done.returncode}: {stderr}; {fix}")


def generate_driver_edits(config: GeneratorConfig) -> cdi.ContainerEdits:
    """Run the generator and the transform; the edits, checked to carry the driver's libraries.

    Raises DriverEditsError with the generator's message and what to check.
    """
    with tempfile.TemporaryDirectory(prefix="fracgpu-driver-edits-") as tmp:
        generated, moved = Path(tmp) / "driver.json", Path(tmp) / "host.json"
        _run(
            generate_argv(config, generated),
            f"nvidia-ctk cdi generate on driver root {config.mounted_root}",
            "check that the NVIDIA driver is installed under that root (the chart's driverRoot: / for a driver on "
            "the host, /run/nvidia/driver for the GPU Operator's driver container)",
        )
        _run(
            transform_argv(config, generated, moved),
            "nvidia-ctk cdi transform root",
            f"check that --host-driver-root ({config.host_root}) is an absolute path",
        )
        edits = parse_driver_edits(moved.read_text())
    problem = library_problem(edits)
    if problem is not None:
        raise DriverEditsError(
            f"{problem} (driver root {config.mounted_root}, {len(edits.mounts)} mounts): is the NVIDIA driver "
            "installed there, and is the chart's driverRoot the directory that holds its usr/lib*?"
        )
    return edits


class DriverEdits:
    """The current driver edits, cached by driver version; ``current()`` never generates.

    ``refresh()`` installs the hook and generates when the version changed or the last attempt failed;
    ``run()`` calls it every ``interval`` seconds. ``on_failure(message)`` is called once per failure (the
    first failed attempt, or a changed message), ``on_attempt_failed()`` on every failed attempt.
    """

    def __init__(
        self,
        config: GeneratorConfig,
        hook_source: Path,
        driver_version: Callable[[], str],
        *,
        interval: float = 60.0,
        generate: Callable[[GeneratorConfig], cdi.ContainerEdits] = generate_driver_edits,
        on_failure: Callable[[str], None] = lambda _message: None,
        on_attempt_failed: Callable[[], None] = lambda: None,
    ) -> None:
        self._config = config
        self._hook_source = hook_source
        self._driver_version = driver_version
        self._interval = interval
        self._generate = generate
        self._on_failure = on_failure
        self._on_attempt_failed = on_attempt_failed
        self._lock = threading.Lock()
        self._edits: cdi.ContainerEdits | None = None
        self._version: str | None = None
        self._error: str | None = "driver edits were not generated yet"

    def current(self) -> cdi.ContainerEdits:
        """The edits of the last successful generation for the current version; DriverEditsError otherwise."""
        with self._lock:
            if self._edits is None or self._error is not None:
                raise DriverEditsError(self._error or "driver edits were not generated yet")
            return self._edits

    def refresh(self) -> None:
        """Regenerate if the driver version changed or the last attempt failed; failures are recorded."""
        try:
            version = self._driver_version()
        except Exception as err:  # e.g. NVML unavailable right now: keep what we have, retry later
            with self._lock:
                have = self._edits is not None and self._error is None
            if have:
                log.warning("cannot read the driver version; driver edits kept", extra={"error": str(err)})
            else:
                self._failed(f"cannot read the driver version through NVML: {err}")
            return
        with self._lock:
            if self._error is None and version == self._version:
                return
        try:
            if install_hook(self._hook_source, self._config.hook_path):
                log.info("installed nvidia-cdi-hook", extra={"path": str(self._config.hook_path)})
            edits = self._generate(self._config)
        except DriverEditsError as err:
            self._failed(str(err))
            return
        with self._lock:
            self._edits, self._version, self._error = edits, version, None
        log.info(
            "driver edits generated",
            extra={"driver_version": version, "mounts": len(edits.mounts), "hooks": len(edits.hooks)},
        )

    def _failed(self, message: str) -> None:
        with self._lock:
            new = message != self._error
            self._error = message
        self._on_attempt_failed()
        if new:
            log.error("driver edits could not be generated", extra={"error": message})
            self._on_failure(message)

    def run(self, stop: threading.Event) -> None:
        """``refresh()`` every ``interval`` seconds until ``stop`` is set."""
        while not stop.wait(self._interval):
            self.refresh()


def current_driver_edits(settings: Settings, driver_edits: DriverEdits | None) -> cdi.ContainerEdits | None:
    """The driver edits for claim specs (None with ``--driver-edits=none``), as last generated; raises
    PrepareError (a claim's error: the generator failed, or none was started)."""
    if settings.driver_edits != "toolkit":
        return None
    if driver_edits is None:
        raise PrepareError(
            ErrorKind.DRIVER_EDITS, "driver edits are on but this plugin was started without a generator"
        )
    try:
        return driver_edits.current()
    except DriverEditsError as err:
        raise PrepareError(
            ErrorKind.DRIVER_EDITS,
            f"the NVIDIA driver's libraries for the container could not be generated: {err}; the plugin "
            f"retries every {settings.driver_edits_retry_seconds:g} s and the kubelet retries this claim",
        ) from None
