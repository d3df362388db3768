"""The README and the pages under docs/: the README stays a user's page (short, the two set-up commands, a
diagram of one claim), and no page points at something that is not there.

Links are checked the way GitHub renders them: a relative link names a file or directory of the repository (never
one outside it), and a `#anchor` into a Markdown file names one of its headings by GitHub's slug (lower-case,
punctuation other than `-` and `_` dropped, spaces as `-`, `-1`, `-2`, ... for repeated headings). Paths and
modules named in backticks, `python -m` modules and `make` targets are checked as well: a page must not show a
command that cannot work.
"""

import ast
import re
import urllib.parse
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
CHART_README = REPO / "charts" / "fracgpu" / "README.md"
MAX_README_LINES = 250
# The maintainer pages the README hands its details to; each must exist and be linked from the README.
SPLIT_PAGES = ("operations.md", "performance.md", "testing.md", "gpu-check.md", "migrating.md")

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s<>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_REPO_PATH = re.compile(r"^(?:api|controller|kubelet_plugin|harness|e2e|tests|charts|docs)/[^\s<>*{}]*$")
_DOTTED = re.compile(r"^(?:api|controller|kubelet_plugin|harness|e2e)(?:\.[A-Za-z_][A-Za-z0-9_]*)+$")
_PYTHON_M = re.compile(r"python3? -m ([A-Za-z_][A-Za-z0-9_.]*)")
_MAKE = re.compile(r"(?:^|[\s;&(])make((?:[ \t]+[a-z][a-z0-9-]*)+)", re.M)


def markdown_pages() -> list[Path]:
    """Every page whose links are checked."""
    return [README, *sorted(DOCS.glob("*.md")), CHART_README]


# ----- reading Markdown -------------------------------------------------------------------------------------


def split_fences(text: str) -> tuple[str, list[tuple[str, str]]]:
    """(the text with fenced code blocks blanked out, [(info string, body) of each fenced block])."""
    prose: list[str] = []
    blocks: list[tuple[str, str]] = []
    fence: str | None = None
    info = ""
    body: list[str] = []
    for line in text.splitlines():
        m = _FENCE.match(line)
        if fence is None:
            if m:
                fence, info, body = m.group(1), m.group(2).strip(), []
                prose.append("")
            else:
                prose.append(line)
        elif m and m.group(1).startswith(fence) and not m.group(2).strip():
            blocks.append((info, "\n".join(body) + "\n"))
            fence = None
            prose.append("")
        else:
            body.append(line)
            prose.append("")
    assert fence is None, f"a code fence {fence!r} is never closed"
    return "\n".join(prose), blocks


def code_spans(text: str) -> list[str]:
    """The contents of the inline code spans of `text` (fenced blocks left out)."""
    prose, _ = split_fences(text)
    return [m.group(2).strip() for m in _CODE_SPAN.finditer(prose)]


def link_targets(text: str) -> list[str]:
    """Targets of the inline links, images and reference definitions outside code."""
    prose, _ = split_fences(text)
    prose = _CODE_SPAN.sub(lambda m: "x" * len(m.group(0)), prose)
    return [m.group(1) for m in _INLINE_LINK.finditer(prose)] + _REFERENCE_DEFINITION.findall(prose)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (without the `-N` of a repeated one)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link counts by its text
    text = re.sub(r"<[^>]+>", "", text)  # HTML tags
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading anchor of a Markdown page, repeated headings numbered as GitHub numbers them."""
    prose, _ = split_fences(text)
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in prose.splitlines():
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def section(text: str, heading: str) -> str:
    """The body of the `## heading` section of a page (up to the next heading of level 1 or 2)."""
    m = re.search(rf"^## {re.escape(heading)}[ \t]*\n(.*?)(?=^#{{1,2}} |\Z)", text, re.M | re.S)
    assert m, f"no section '## {heading}'"
    return m.group(1)


def broken_links(page: Path, root: Path) -> list[str]:
    """Every relative link of `page` whose file, directory or heading does not exist, or that leaves `root`."""
    problems: list[str] = []
    text = page.read_text()
    for target in link_targets(text):
        if _SCHEME.match(target) or target.startswith("//"):
            continue  # external: see test_no_page_links_outside_the_repository
        path_part, _, fragment = target.partition("#")
        path_part = urllib.parse.unquote(path_part)
        if path_part.startswith("/"):
            problems.append(f"{target}: an absolute path; link relative to the page")
            continue
        resolved = (page.parent / path_part).resolve() if path_part else page.resolve()
        if not resolved.is_relative_to(root.resolve()):
            problems.append(f"{target}: outside the repository")
            continue
        if not resolved.exists():
            problems.append(f"{target}: {resolved.relative_to(root.resolve())} does not exist")
            continue
        if fragment:
            if resolved.suffix != ".md" or not resolved.is_file():
                problems.append(f"{target}: an anchor into something that is not a Markdown file")
            elif urllib.parse.unquote(fragment) not in anchors(resolved.read_text()):
                problems.append(f"{target}: no heading #{fragment} in {resolved.relative_to(root.resolve())}")
    return problems


def defined_names(module: Path) -> set[str]:
    """Names bound at the top level of a module (definitions, assignments, imports)."""
    names: set[str] = set()
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def unresolved_dotted(name: str, root: Path = REPO) -> str | None:
    """None when `pkg.module[.attribute]` names a module of the tree (and, past it, a name it defines)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:cut])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if not module.is_file() and not (cut == 1 and base.is_dir()):
            continue
        rest = parts[cut:]
        if not rest:
            return None
        if len(rest) == 1 and module.is_file() and rest[0] in defined_names(module):
            return None
        return f"{name}: {'.'.join(parts[:cut])} defines no {'.'.join(rest)}"
    return f"{name}: no such module"


def chart_values() -> set[str]:
    """Every dotted path of the chart's values.yaml (`controller.replicas`, `kubeletPlugin.usage.interval`)."""

    def paths(values: object, prefix: str) -> set[str]:
        if not isinstance(values, dict):
            return set()
        return {p for key, value in values.items() for p in (f"{prefix}{key}", *paths(value, f"{prefix}{key}."))}

    return paths(yaml.safe_load((REPO / "charts" / "fracgpu" / "values.yaml").read_text()), "")


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z0-9-]*):", (REPO / "Makefile").read_text(), re.M))


# ----- the checkers themselves: each must see what it is for ------------------------------------------------


def test_slugs_follow_githubs_rules() -> None:
    assert slug("Node plugin internals (`kubelet_plugin/`)") == "node-plugin-internals-kubelet_plugin"
    assert slug("Flow of one claim, and the module for each step") == "flow-of-one-claim-and-the-module-for-each-step"
    assert slug("GPU health: device taints from NVML") == "gpu-health-device-taints-from-nvml"
    assert slug("Node plugin against Go's reference plugin") == "node-plugin-against-gos-reference-plugin"
    assert anchors("# A\n## Tests\n```\n# not a heading\n```\n## Tests\n") == {"a", "tests", "tests-1"}


def test_the_link_checker_finds_every_kind_of_broken_link(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## Some heading\n")
    (tmp_path / "dir").mkdir()
    page = tmp_path / "README.md"
    page.write_text(
        "# Top\n\n## Here\n\n"
        "[ok](docs/other.md#some-heading) [ok](#here) [ok](dir/) [ok](https://kubernetes.io/x) `[not](a-link.md)`\n"
        "[gone](docs/missing.md) [bad anchor](docs/other.md#nope) [bad local](#there) [out](../outside.md)\n"
        "[abs](/etc/passwd) [anchor into a dir](dir/#x)\n\n[ref]: docs/also-missing.md\n"
        "```\n[in code](nowhere.md)\n```\n"
    )
    problems = broken_links(page, tmp_path)
    assert [p.split(":")[0] for p in problems] == [
        "docs/missing.md",
        "docs/other.md#nope",
        "#there",
        "../outside.md",
        "/etc/passwd",
        "dir/#x",
        "docs/also-missing.md",
    ], problems


def test_the_other_checkers_see_what_they_check() -> None:
    assert code_spans("a `make demo` b\n```\n`not a span`\n```\n") == ["make demo"]
    assert unresolved_dotted("kubelet_plugin.prepare.plan.plan_claim") is None
    assert unresolved_dotted("kubelet_plugin.claim_spec.plan_claim") is not None
    assert unresolved_dotted("kubelet_plugin.prepare.plan.no_such_function") is not None
    assert {"controller.replicas", "kubeletPlugin.usage.interval"} <= chart_values()
    assert "demo" in makefile_targets()
    assert "no-such-target" not in makefile_targets()
    assert section("# T\n## A\nbody a\n### sub\nmore\n## B\nbody b\n", "A") == "body a\n### sub\nmore\n"


# ----- the pages ---------------------------------------------------------------------------------------------


def test_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, (
        f"README.md has {lines} lines, at most {MAX_README_LINES}: move maintainer detail to a page under docs/"
    )


def test_readme_sets_up_a_fresh_machine_with_exactly_make_demo_and_make_test() -> None:
    _, blocks = split_fences(section(README.read_text(), "Set up a fresh machine"))
    assert blocks, "the set-up section has no command block"
    commands = [line.split("#", 1)[0].strip() for line in blocks[0][1].splitlines()]
    assert [c for c in commands if c] == ["make demo", "make test"]


def test_readme_draws_one_claims_flow_in_mermaid() -> None:
    diagrams = [body for info, body in split_fences(README.read_text())[1] if info.split()[:1] == ["mermaid"]]
    assert len(diagrams) == 1, "the README needs one ```mermaid block"
    (diagram,) = diagrams
    assert diagram.split(None, 1)[0] in ("flowchart", "sequenceDiagram"), diagram
    for step in ("admission webhook", "kube-scheduler", "NodePrepareResources", "CDI", "containerd"):
        assert step in diagram, f"the diagram leaves out {step!r}"


def test_readme_links_the_maintainer_pages_and_the_chart() -> None:
    targets = {t.partition("#")[0] for t in link_targets(README.read_text())}
    wanted = {f"docs/{p}" for p in ("architecture.md", *SPLIT_PAGES)}
    wanted |= {"charts/fracgpu/README.md", "charts/fracgpu/examples/"}
    assert wanted - targets == set(), f"README.md does not link {sorted(wanted - targets)}"
    for page in SPLIT_PAGES:
        assert (DOCS / page).is_file(), f"docs/{page} is missing"


@pytest.mark.parametrize("page", markdown_pages(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_points_at_something_that_exists(page: Path) -> None:
    problems = broken_links(page, REPO)
    assert problems == [], f"{page.relative_to(REPO)}: broken links: {problems}"


def test_no_page_links_outside_the_repository() -> None:
    """Users may follow the README's links to the Kubernetes docs; the maintainer pages stand on the repo alone."""
    external = {
        page.relative_to(REPO).as_posix(): [t for t in link_targets(page.read_text()) if _SCHEME.match(t)]
        for page in [README, *sorted(DOCS.glob("*.md"))]
    }
    readme = external.pop("README.md")
    assert readme and all(t.startswith("https://kubernetes.io/") for t in readme), readme
    assert {p: ts for p, ts in external.items() if ts} == {}
    for page in [README, *sorted(DOCS.glob("*.md"))]:
        assert "../shared" not in page.read_text(), f"{page.relative_to(REPO)} names a path outside the repository"


@pytest.mark.parametrize("name", ["README.md", "docs/architecture.md", *(f"docs/{p}" for p in SPLIT_PAGES)])
def test_paths_modules_and_commands_a_page_names_exist(name: str) -> None:
    text = (REPO / name).read_text()
    _, blocks = split_fences(text)
    spans = code_spans(text)
    code = "\n".join([*spans, *(body for _, body in blocks)])
    problems: list[str] = []
    values = chart_values()
    for span in spans:
        for raw in span.split():
            word = raw.rstrip(",;:)").split("#")[0]
            if _REPO_PATH.match(word) and "<" not in word and not (REPO / word.rstrip("/")).exists():
                problems.append(f"{word}: no such path")
            elif _DOTTED.match(word) and word not in values and (problem := unresolved_dotted(word)) is not None:
                problems.append(problem)
    for module in _PYTHON_M.findall(code):
        if not module.startswith(("harness", "e2e", "api", "controller", "kubelet_plugin")):
            continue
        base = REPO.joinpath(*module.split("."))
        if not (base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()):
            problems.append(f"python -m {module}: no such module")
    targets = makefile_targets()
    for m in _MAKE.finditer(code):
        problems += [f"make {t}: no such target" for t in m.group(1).split() if t not in targets]
    assert problems == [], f"{name}: {problems}"
