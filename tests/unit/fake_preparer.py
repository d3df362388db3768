"""A ClaimPreparer double for the gRPC server tests: fixed answers, records its calls."""

from kubelet_plugin.core.model import ClaimRef, PreparedDevice, PrepareResult


class FakePreparer:
    """Prepares every claim to one device on gpu-0; claim name 'bad' fails, 'lost' gets no entry."""

    def __init__(self) -> None:
        self.raise_exc: Exception | None = None
        self.prepared: list[list[ClaimRef]] = []
        self.unprepared: list[list[ClaimRef]] = []

    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        self.prepared.append(claims)
        if self.raise_exc is not None:
            raise self.raise_exc
        out: dict[str, PrepareResult] = {}
        for c in claims:
            if c.name == "bad":
                out[c.uid] = PrepareResult(error=f"claim {c.name} is not allocated")
            elif c.name != "lost":
                out[c.uid] = PrepareResult(
                    devices=(
                        PreparedDevice(
                            request_names=("gpu",),
                            pool_name="node-a",
                            device_name="gpu-0",
                            cdi_device_ids=(f"k8s.gpu.fracgpu.dev/claim={c.uid}-gpu-0-share",),
                            share_id=f"share-{c.uid}",
                        ),
                        PreparedDevice(
                            request_names=(),
                            pool_name="node-a",
                            device_name="gpu-1",
                            cdi_device_ids=(),
                        ),
                    )
                )
        return out

    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]:
        self.unprepared.append(claims)
        if self.raise_exc is not None:
            raise self.raise_exc
        return {c.uid: ("busy" if c.name == "bad" else "") for c in claims if c.name != "lost"}
