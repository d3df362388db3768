"""What an MPS GPU publishes beyond a whole GPU's (pure): capacity ``mpsClients`` (the clients its MPS server
takes) and, with trust domains kept apart, the binding conditions the scheduler waits on.

May import: ``core``, ``api``.
"""

from typing import Any

from api.mps_trust import ADMITTED_CONDITION, CONFLICT_CONDITION
from api.names import MPS_CLIENTS_CAPACITY
from kubelet_plugin.core.model import GpuInfo

MPS_CLIENTS_VOLTA = 48
MPS_CLIENTS_BEFORE_VOLTA = 16


def mps_clients(gpu: GpuInfo) -> int:
    """How many clients one MPS server takes on `gpu`: 48 from Volta (compute capability 7.0) on, 16 before."""
    major = gpu.cuda_compute_capability.split(".", 1)[0]
    return MPS_CLIENTS_VOLTA if major.isdigit() and int(major) >= 7 else MPS_CLIENTS_BEFORE_VOLTA


def with_mps_server(entry: dict[str, Any], gpu: GpuInfo, *, binding: bool) -> dict[str, Any]:
    """`entry` (an MPS GPU's device) with capacity `mpsClients`: the clients its MPS server takes, of which each
    allocation consumes one unless it asks for more (one per CUDA process), so the scheduler never places a share
    the server would refuse with CUDA_ERROR_MPS_MAX_CLIENTS_REACHED; with `binding` (MPS trust domains kept apart,
    any scope but cluster) also the binding condition the scheduler waits on before it binds a pod there, which the
    controller sets once it has found the claim's trust domain alone on the GPU (or the failure condition, when
    another domain holds it: the scheduler then places the claim again)."""
    clients = str(mps_clients(gpu))
    entry["capacity"][MPS_CLIENTS_CAPACITY] = {
        "value": clients,
        "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": clients, "step": "1"}},
    }
    if binding:
        entry["bindingConditions"] = [ADMITTED_CONDITION]
        entry["bindingFailureConditions"] = [CONFLICT_CONDITION]
    return entry
