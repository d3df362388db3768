"""`kubectl get gpus` on the demo: the default columns fit 120 characters, `-o wide` shows every column.

The table is rendered as kubectl renders a CRD's printer columns (api/gpu.py `PRINTER_COLUMNS`, evaluated on the
objects the ledger plans for the demo's node: two H100s, two 40Gi shares on one, a whole GPU on the other), with
kubectl's layout: NAME first, each column as wide as its widest cell plus 3 spaces, the last one unpadded.
"""

import re
from typing import Any

from api.gpu import PRINTER_COLUMNS
from api.names import DRIVER_NAME
from api.quantity import MiB
from controller.core.slices import SliceView, current_devices, slice_view
from controller.ledger.plan import desired_ledger, identity_body
from controller.nodes.plan import Heartbeat, plan_plugin_reporting
from kubelet_plugin.publishing.slices import build_slices
from tests.unit.controller.ledger.test_plan import MANAGER, claims
from tests.unit.controller.nodes.test_plan import NS, T0
from tests.unit.controller_factories import claim, gpu, result

DEMO_NODE = "fracgpu-node"  # harness/cluster/node.py NODE_NAME, the node of `make demo`
AGE = "5m30s"  # kubectl's age of an object a few minutes old: the widest cell of AGE on the demo
WIDTH = 120
PADDING = 3  # kubectl's tab writer


PATH_PART = re.compile(r'\.([\w-]+)(?:\[\?\(@\.(\w+)=="([^"]*)"\)\])?')


def _cell(obj: dict[str, Any], path: str) -> str:
    """One printer column's cell: the simple JSONPaths the CRD uses (`.a.b`, `.a[?(@.k=="v")].b`); blank when
    absent, as kubectl prints a missing field."""
    parts = PATH_PART.findall(path)
    assert "".join(f".{n}" + (f'[?(@.{k}=="{v}")]' if k else "") for n, k, v in parts) == path, path
    value: Any = obj
    for name, key, wanted in parts:
        value = value.get(name) if isinstance(value, dict) else None
        if key:
            value = next((v for v in value or [] if v.get(key) == wanted), None)
    return "" if value is None else str(value)


def _demo_objects() -> list[dict[str, Any]]:
    """The GPU objects of the demo as the controller writes them, the node plugin's enforcement tier at its
    longest (`hami-core`) and the node reporting."""
    bodies = build_slices(
        DEMO_NODE, "uid-node", DRIVER_NAME, [gpu(0), gpu(1)], step=256 * MiB, reserve=0, generation=1,
        enforcement={"gpu-0": "hami-core", "gpu-1": "hami-core"},
    )  # fmt: skip
    devices = current_devices([v for b in bodies if isinstance(v := slice_view(b, DRIVER_NAME), SliceView)])
    demo = claims(
        claim("share-a-gpu-x7k2p", results=[result("gpu", "gpu-0", "40Gi", "s-1", pool=DEMO_NODE)], node=DEMO_NODE),
        claim("share-b-gpu-q9w4z", results=[result("gpu", "gpu-0", "40Gi", "s-2", pool=DEMO_NODE)], node=DEMO_NODE),
        claim("whole-gpu-m3n8r", results=[result("gpu", "gpu-1", "80Gi", None, pool=DEMO_NODE)], node=DEMO_NODE),
    )
    beat = {DEMO_NODE: Heartbeat(renew_time="r", seen_at=T0)}
    reporting = plan_plugin_reporting([DEMO_NODE], beat, {}, now=T0, timeout_s=60, namespace=NS)
    ledger = desired_ledger(devices, demo, DRIVER_NAME, MANAGER, reporting)
    return [{**identity_body(o), "status": {**o.status, "usage": {"usedMemory": "61440Mi"}}} for o in ledger.values()]


def _table(objects: list[dict[str, Any]], *, wide: bool) -> list[str]:
    columns = [c for c in PRINTER_COLUMNS if wide or not c.get("priority")]
    header = ["NAME", *(str(c["name"]).upper() for c in columns)]
    rows = [
        [o["metadata"]["name"], *(AGE if c["type"] == "date" else _cell(o, str(c["jsonPath"])) for c in columns)]
        for o in objects
    ]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    return [
        "".join(cell.ljust(w + PADDING) for cell, w in zip(r[:-1], widths, strict=False)) + r[-1]
        for r in (header, *rows)
    ]


def test_the_default_columns_fit_120_characters_on_the_demo() -> None:
    objects = _demo_objects()
    table = _table(objects, wide=False)
    assert table[0].split() == [
        "NAME", "MODEL", "TOTAL", "ALLOCATED", "FREE", "SHARES", "ENFORCEMENT", "REPORTING", "AGE",
    ]  # fmt: skip
    rows = {r.split()[0]: r for r in table[1:]}
    assert rows[f"{DEMO_NODE}-gpu-0"].split()[1:] == [
        "NVIDIA", "H100", "80GB", "HBM3", "80Gi", "80Gi", "0", "2", "hami-core", "True", AGE,
    ]  # fmt: skip
    longest = max(len(line) for line in table)
    assert longest <= WIDTH, "\n".join(table)


def test_wide_adds_every_other_column_in_order() -> None:
    table = _table(_demo_objects(), wide=True)
    assert table[0].split() == ["NAME", *(str(c["name"]).upper() for c in PRINTER_COLUMNS)]
    row = dict(zip(table[0].split(), table[1].split(), strict=False))
    assert (row["NODE"], row["MODEL"]) == (DEMO_NODE, "NVIDIA")
