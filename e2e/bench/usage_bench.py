"""Benchmark of the usage sampler: CPU time per GPU per sample, steady state.

    python -m e2e.bench.usage_bench [--samples 200] [--gpus-profile h100x8] [--claims-per-gpu 8] \
        [--out build/bench/usage.json]

Real parts: pynvml against the mock libnvidia-ml.so.1 (built here; the benchmark re-runs itself with it on the
library path), the claims' info files as the preparer writes them, /proc/<pid>/cgroup files read from a
directory laid out like the host's /proc (one process per claim), the real attribution, metrics, crossing and
ledger-planning code. The API server is a stub that answers claim reads (once per claim, before the measured
samples) and ledger writes (none in steady state: usage does not change). Reports CPU and wall time of this
one run; asserts nothing.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from harness import mocknvml
from kubelet_plugin.publishing.discovery import discover_gpus
from kubelet_plugin.state import claim_files as store
from kubelet_plugin.state import container_info
from kubelet_plugin.state.container_info import ClaimName, DeviceInfo, RequestInfo
from kubelet_plugin.usage.metrics import UsageMetrics
from kubelet_plugin.usage.sampler import UsageSampler

GiB = 1 << 30


class StubRest:
    """Answers the sampler's claim GETs (reserved for one pod each) and ledger applies."""

    def __init__(self, pods: dict[str, tuple[str, str]]) -> None:
        self.pods = pods  # claim name -> (claim uid, pod uid)
        self.calls = 0

    def get(self, path: str, **_: Any) -> dict[str, Any]:
        self.calls += 1
        uid, pod = self.pods[path.rsplit("/", 1)[1]]
        return {"metadata": {"uid": uid}, "status": {"reservedFor": [{"resource": "pods", "name": pod, "uid": pod}]}}

    def apply(self, path: str, body: dict[str, Any], field_manager: str, force: bool = True) -> dict[str, Any]:
        self.calls += 1
        return body

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        return body


def run(samples: int, claims_per_gpu: int, workdir: Path) -> dict[str, Any]:
    gpus = discover_gpus()
    data_dir, proc = workdir / "plugin", workdir / "proc"
    control: list[str] = []
    pods: dict[str, tuple[str, str]] = {}
    pid = 1000
    for gpu in gpus:
        for i in range(claims_per_gpu):
            claim_uid, pod_uid = str(uuid.uuid4()), str(uuid.uuid4())
            name = f"claim-{gpu.index}-{i}"
            info = RequestInfo(
                claim=ClaimName(namespace="bench", name=name, uid=claim_uid),
                request="gpu",
                enforcement="none",
                devices=[
                    DeviceInfo(
                        uuid=gpu.uuid,
                        memory_mib=8192,
                        share_id=str(uuid.uuid4()),
                        device=gpu.device_name,
                        pci_bus_id=gpu.pci_bus_id,
                        minor=gpu.minor,
                        cdi_device=f"k8s.gpu.fracgpu.dev/claim={claim_uid}-{gpu.device_name}",
                        env_prefix="FRACGPU_DEV_X_",
                    )
                ],
            )
            f = container_info.info_file(data_dir, info)
            store.write_claim_files(f.host_path.parent, [f])
            (proc / str(pid)).mkdir(parents=True)
            (proc / str(pid) / "cgroup").write_text(
                f"13:memory:/kubepods/besteffort/pod{pod_uid}/{uuid.uuid4().hex}{uuid.uuid4().hex}\n0::/\n"
            )
            control.append(f"{gpu.uuid} {pid} {4 * GiB}")
            pods[name] = (claim_uid, pod_uid)
            pid += 1
    Path(os.environ["FRACGPU_MOCK_NVML_PROCESSES"]).write_text("\n".join(control) + "\n")
    rest = StubRest(pods)
    sampler = UsageSampler(
        node="bench",
        gpus=gpus,
        plugin_data_dir=data_dir,
        proc_root=proc,
        rest=rest,  # type: ignore[arg-type]
        metrics=UsageMetrics(CollectorRegistry()),
        interval_s=10,
        ledger_min_interval_s=30,
        ledger_threshold_bytes=256 << 20,
    )
    first = sampler.sample_once()  # reads each claim once and writes the ledger: not measured
    assert first is not None and len(first.claims) == len(gpus) * claims_per_gpu
    calls_before = rest.calls
    cpu, wall = [], []
    for _ in range(samples):
        c0, w0 = time.process_time(), time.perf_counter()
        sampler.sample_once()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    per_gpu = [c / len(gpus) for c in cpu]
    return {
        "gpus": len(gpus),
        "claims_per_gpu": claims_per_gpu,
        "processes": len(control),
        "samples": samples,
        "cpu_ms_per_gpu_per_sample": {
            "p50": round(statistics.median(per_gpu) * 1000, 3),
            "max": round(max(per_gpu) * 1000, 3),
        },
        "cpu_ms_per_sample_p50": round(statistics.median(cpu) * 1000, 3),
        "wall_ms_per_sample_p50": round(statistics.median(wall) * 1000, 3),
        "api_calls_in_steady_state": rest.calls - calls_before,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--claims-per-gpu", type=int, default=8)
    parser.add_argument("--gpus-profile", default="h100x8")
    parser.add_argument("--out", type=Path, default=Path("build/bench/usage.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fgub-") as tmp:
        workdir = Path(tmp)
        if "FRACGPU_MOCK_NVML_PROCESSES" not in os.environ:  # re-run with the mock NVML on the library path
            env = {
                **os.environ,
                "LD_LIBRARY_PATH": str(mocknvml.build(workdir / "nvml")),
                "FRACGPU_MOCK_NVML_PROFILE": str(mocknvml.PROFILES / f"{args.gpus_profile}.profile"),
                "FRACGPU_MOCK_NVML_PROCESSES": str(workdir / "processes"),
            }
            argv = [sys.executable, "-m", "e2e.bench.usage_bench", *sys.argv[1:]]
            sys.exit(subprocess.run(argv, env=env, check=False).returncode)
        report = run(args.samples, args.claims_per_gpu, workdir)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"usage sampler, {report['gpus']} GPUs x {report['claims_per_gpu']} claims ({report['processes']} processes), "
        f"{report['samples']} samples: CPU per GPU per sample p50 {report['cpu_ms_per_gpu_per_sample']['p50']} ms "
        f"(max {report['cpu_ms_per_gpu_per_sample']['max']} ms); per sample CPU {report['cpu_ms_per_sample_p50']} ms, "
        f"wall {report['wall_ms_per_sample_p50']} ms; API calls in steady state: {report['api_calls_in_steady_state']}"
    )
    print(f"report: {args.out}")


if __name__ == "__main__":
    main()
