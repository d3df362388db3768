"""Every YAML example the README (and any page under docs/) shows is one a user can apply as it stands.

Each ```yaml block is parsed (several documents per block) and must hold whole objects (`apiVersion`, `kind`,
`metadata.name`): a snippet cannot be checked as the user would apply it, so a page shows the whole object. Each
object is sent to the real kube-apiserver of the integration tier in server-side dry run (`dryRun=All`), which
validates it (and runs admission) without storing it, and the answer must keep every field the example set: an
API server that drops a field (a feature gate off, a misspelt field pruned) fails the test as well. The
`GpuConfig` parameters of a claim's or template's opaque configs for our driver must decode with the decoder the
admission webhook uses, and the claim spec must pass the webhook's review.

A block fenced as ```yaml theirs shows what a user wrote for another project (docs/migrating.md, "coming from X,
write Y"): it must parse as YAML and is not sent. A block fenced as ```yaml not-dry-run holds objects of another
project's API that the test cluster does not serve (Kueue's, docs/migrating.md#quota-with-kueue): each must be of
one of UNSERVED_GROUPS, which the API server is checked not to serve, so no fracgpu or Kubernetes object escapes
the dry run by it. Any other word after `yaml` fails the test, so that no block escapes the check by its info
string.
"""

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from api.gpu_config import GpuConfigError, decode_gpu_config
from api.names import DEVICE_CLASS_NAME, DRIVER_NAME
from controller.admission.verdict import review_claim_spec
from harness import kube

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
GiB = 1 << 30
_YAML_BLOCK = re.compile(r"^ {0,3}```[ \t]*ya?ml(?P<info>[^\n]*)\n(?P<body>.*?)^ {0,3}```[ \t]*$", re.M | re.S)
THEIRS = "theirs"
"""The info-string word of a block that shows another project's objects, never sent to the API server."""
NOT_DRY_RUN = "not-dry-run"
"""The info-string word of a block of objects whose API the test cluster lacks (CRDs not installed): parsed only."""
UNSERVED_GROUPS = ("kueue.x-k8s.io", "config.kueue.x-k8s.io")
"""The API groups a ```yaml not-dry-run block may hold: Kueue's, whose CRDs the test cluster does not install
(`config.kueue.x-k8s.io` is Kueue's configuration file, never an API object)."""
MIGRATING = REPO / "docs" / "migrating.md"
CLAIM_SPEC_AT = {"ResourceClaim": ("spec",), "ResourceClaimTemplate": ("spec", "spec")}


def yaml_blocks(text: str, *, theirs: bool = False, marker: str = "") -> list[str]:
    """The bodies of the ```yaml (or ```yml) fenced blocks of a Markdown text: fracgpu's, with `theirs` those
    marked ```yaml theirs, with `marker` those marked ```yaml <marker>. A block with any other info string after
    `yaml` is an error."""
    want = [THEIRS] if theirs else [marker] if marker else []
    found: list[str] = []
    for m in _YAML_BLOCK.finditer(text):
        words = m.group("info").split()
        assert words in ([], [THEIRS], [NOT_DRY_RUN]), (
            f"```yaml {m.group('info').strip()}: only ```yaml, ```yaml {THEIRS} and ```yaml {NOT_DRY_RUN} exist"
        )
        if words == want:
            found.append(m.group("body"))
    return found


def examples() -> list[tuple[str, dict[str, Any]]]:
    """(where, object) of every document of every YAML block of the pages; `where` is `page#block.document`."""
    found: list[tuple[str, dict[str, Any]]] = []
    for page in PAGES:
        for b, block in enumerate(yaml_blocks(page.read_text()), start=1):
            for d, doc in enumerate(yaml.safe_load_all(block), start=1):
                if doc is not None:
                    found.append((f"{page.relative_to(REPO)}#{b}.{d}", doc))
    return found


def not_whole(doc: object) -> str | None:
    """Why `doc` is not a whole Kubernetes object, or None."""
    if not isinstance(doc, dict):
        return f"a {type(doc).__name__}, not an object"
    missing = [f for f in ("apiVersion", "kind") if not isinstance(doc.get(f), str)]
    if not isinstance((doc.get("metadata") or {}).get("name"), str):
        missing.append("metadata.name")
    return f"no {', '.join(missing)}: a fragment; show the whole object" if missing else None


def claim_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The ResourceClaimSpec of a claim or template, else None."""
    at = CLAIM_SPEC_AT.get(str(doc.get("kind")))
    if at is None:
        return None
    spec: Any = doc
    for key in at:
        spec = spec.get(key) or {}
    return dict(spec)


def dropped(sent: object, got: object, path: str = "") -> list[str]:
    """Paths of what `sent` set and `got` lacks or holds otherwise (`got` may add fields: defaults)."""
    if isinstance(sent, dict):
        if not isinstance(got, dict):
            return [path or "."]
        return [
            p for k, v in sent.items() for p in (dropped(v, got[k], f"{path}.{k}") if k in got else [f"{path}.{k}"])
        ]
    if isinstance(sent, list):
        if not isinstance(got, list) or len(got) != len(sent):
            return [path]
        return [p for i, (s, g) in enumerate(zip(sent, got, strict=True)) for p in dropped(s, g, f"{path}[{i}]")]
    # the API server answers an int quantity (`gpu.fracgpu.dev/gpu: 1`) as a string
    return [] if sent == got or (isinstance(sent, int) and str(sent) == got) else [f"{path}: {sent!r} -> {got!r}"]


def test_the_helpers_see_what_they_check() -> None:
    text = "a\n```yaml\nkind: A\n---\nkind: B\n```\n```bash\nkind: C\n```\n```yml\n- x\n```\n```yaml theirs\nkind: D\n```\n"
    assert yaml_blocks(text) == ["kind: A\n---\nkind: B\n", "- x\n"]
    assert yaml_blocks(text, theirs=True) == ["kind: D\n"]
    with pytest.raises(AssertionError, match="only ```yaml, "):
        yaml_blocks("```yaml mine\nkind: E\n```\n")
    unsent = "```yaml not-dry-run\nkind: F\n```\n```yaml\nkind: G\n```\n"
    assert (yaml_blocks(unsent, marker=NOT_DRY_RUN), yaml_blocks(unsent)) == (["kind: F\n"], ["kind: G\n"])
    assert not_whole({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}) is None
    assert not_whole({"resources": {"limits": {"gpu.fracgpu.dev/gpu": 1}}}) is not None
    assert not_whole(["x"]) is not None
    assert dropped({"a": {"b": 1, "c": [1, 2]}}, {"a": {"b": "1", "c": [1, 2], "d": 3}}) == []
    assert dropped({"a": {"b": 1, "c": [1, 2]}}, {"a": {"c": [1]}}) == [".a.b", ".a.c"]
    assert dropped({"a": "10Gi"}, {"a": "10737418240"}) == [".a: '10Gi' -> '10737418240'"]


def test_every_example_is_a_whole_object() -> None:
    found = examples()
    assert len([w for w, _ in found if w.startswith("README.md#")]) >= 5, "the README shows its examples as YAML"
    fragments = {where: why for where, doc in found if (why := not_whole(doc)) is not None}
    assert fragments == {}


def test_the_migration_page_shows_what_they_wrote_beside_what_fracgpu_takes() -> None:
    """docs/migrating.md: each peer's objects (parsed, not sent) beside fracgpu's (sent, above and below)."""
    text = MIGRATING.read_text()
    theirs = [doc for block in yaml_blocks(text, theirs=True) for doc in yaml.safe_load_all(block) if doc is not None]
    ours = [w for w, _ in examples() if w.startswith("docs/migrating.md#")]
    assert len(theirs) >= 8 and len(ours) >= 8, (len(theirs), len(ours))
    for peer in ("NVIDIA's DRA driver", "HAMi", "NVIDIA's device plugin", "No equivalent yet"):
        assert f"\n## {peer}\n" in text, f"docs/migrating.md has no section ## {peer}"


def test_gpu_configs_decode_and_claims_pass_the_webhooks_review() -> None:
    configs = 0
    for where, doc in examples():
        spec = claim_spec(doc)
        if spec is None:
            continue
        for config in (spec.get("devices") or {}).get("config") or []:
            opaque = config.get("opaque") or {}
            if opaque.get("driver") != DRIVER_NAME:
                continue
            parameters = opaque.get("parameters")
            assert isinstance(parameters, dict), f"{where}: GpuConfig parameters are not an object: {parameters!r}"
            try:
                decode_gpu_config(parameters)
            except GpuConfigError as err:
                pytest.fail(f"{where}: the GpuConfig does not decode: {err}")
            configs += 1
        prefix = ".".join(CLAIM_SPEC_AT[doc["kind"]])
        review = review_claim_spec(spec, prefix, driver=DRIVER_NAME, device_class=DEVICE_CLASS_NAME, largest=80 * GiB)
        assert review.allowed and not review.warnings, (where, review)
    assert configs >= 1, "the README shows a GpuConfig (enforcement)"


def test_the_api_server_accepts_every_example_as_it_stands(dyn: DynamicClient, namespace: str) -> None:
    problems: dict[str, str] = {}
    kinds: set[str] = set()
    for where, doc in examples():
        if (why := not_whole(doc)) is not None:
            problems[where] = why
            continue
        res = kube.resource(dyn, doc["apiVersion"], doc["kind"])
        try:
            answer = res.create(body=doc, namespace=namespace if res.namespaced else None, dry_run="All")
        except ApiException as err:
            problems[where] = f"refused: {err.status} {err.body}"
            continue
        got = answer.to_dict()
        if lost := dropped(doc, got):
            problems[where] = f"the API server dropped or changed {lost}"
        kinds.add(doc["kind"])
    assert problems == {}
    assert {"ResourceClaimTemplate", "Pod"} <= kinds


def test_objects_not_dry_run_are_only_of_apis_the_cluster_does_not_serve(dyn: DynamicClient) -> None:
    """A ```yaml not-dry-run block holds only whole objects (apiVersion and kind; Kueue's Configuration has no
    name) of UNSERVED_GROUPS, and the API server indeed serves none of them: once it does, send them instead."""
    unsent = [
        (page.relative_to(REPO), doc)
        for page in PAGES
        for block in yaml_blocks(page.read_text(), marker=NOT_DRY_RUN)
        for doc in yaml.safe_load_all(block)
        if doc is not None
    ]
    assert len(unsent) >= 4, "docs/migrating.md shows Kueue's Configuration, ResourceFlavor, ClusterQueue, LocalQueue"
    for where, doc in unsent:
        assert isinstance(doc, dict) and isinstance(doc.get("kind"), str), (where, doc)
        group = str(doc.get("apiVersion", "")).rpartition("/")[0]
        assert group in UNSERVED_GROUPS, (
            f"{where}: {doc.get('apiVersion')} {doc['kind']} must be dry-run: fence it ```yaml"
        )
    served = {g.name for g in client.ApisApi(dyn.client).get_api_versions().groups}
    assert not served & set(UNSERVED_GROUPS), f"the API server serves {served & set(UNSERVED_GROUPS)}: dry-run them"
