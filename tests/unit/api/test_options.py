"""Every settings field of both components is a flag and an environment variable (api/options.py), and the
chart passes only names the components know."""

import re
from collections.abc import Callable
from pathlib import Path
from typing import Literal, get_args, get_origin

import pytest

from api.options import Option, OptionSettings, options
from api.quantity import MiB
from controller.core import settings as controller_settings
from kubelet_plugin.core import settings as plugin_settings

REPO = Path(__file__).resolve().parents[3]
TEMPLATES = REPO / "charts" / "fracgpu" / "templates"

Component = tuple[type[OptionSettings], Callable[[list[str] | None], OptionSettings], dict[str, str]]
# The model, its command line, and what every run needs besides the option under test.
COMPONENTS: dict[str, Component] = {
    "kubelet-plugin": (plugin_settings.Settings, plugin_settings.parse_settings, {"node_name": "node-a"}),
    # the controller: the Lease namespace that --leader-elect needs (the chart sets it)
    "controller": (controller_settings.Settings, controller_settings.parse_settings, {"namespace": "ns"}),
}
CASES = [(component, option) for component, (model, _, _) in COMPONENTS.items() for option in options(model)]


def _case_id(case: tuple[str, Option]) -> str:
    return f"{case[0]}:{case[1].field}"


def sample(option: Option) -> tuple[str, object]:
    """A value other than the default that every validator accepts: (as typed, as the model holds it)."""
    annotation, default = option.info.annotation, option.info.default
    if get_origin(annotation) is Literal:
        # nvml needs toolkit, namespaceLabel a label
        choice = next(str(v) for v in get_args(annotation) if v not in (default, "nvml", "namespaceLabel"))
        return choice, choice
    if annotation is bool:
        return ("false", False) if default else ("true", True)
    if option.field.endswith("_bytes"):
        return "768Mi", 768 * MiB
    if option.field.endswith("_xids"):
        return "13, 31", "13,31"
    if option.field.endswith("_gpus"):
        return "0, GPU-1", "0,GPU-1"
    if annotation is int:
        return str(default + 1), default + 1
    if annotation is float:
        return "1.5", 1.5
    if annotation in (Path, Path | None):
        return f"/x/{option.field}", Path(f"/x/{option.field}")
    assert annotation in (str, str | None), f"{option.field}: no sample for {annotation}"
    return "ns/value", "ns/value"  # a <namespace>/<name> pleases webhook_service too


def _clear_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for model, _, _ in COMPONENTS.values():
        for option in options(model):
            monkeypatch.delenv(option.env, raising=False)


@pytest.mark.parametrize(("component", "option"), CASES, ids=list(map(_case_id, CASES)))
def test_every_field_is_set_by_its_flag_and_by_its_variable(
    component: str, option: Option, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, parse_settings, base = COMPONENTS[component]
    _clear_environment(monkeypatch)
    text, value = sample(option)
    assert value != option.info.default, "the sample must differ from the default"
    base_flags = [f"--{k.replace('_', '-')}={v}" for k, v in base.items() if k != option.field]
    if option.info.annotation is bool:
        flag = option.flag if value else f"--no-{option.flag.removeprefix('--')}"
    else:
        flag = f"{option.flag}={text}"
    by_flag = parse_settings([*base_flags, flag])
    assert getattr(by_flag, option.field) == value, f"{option.flag} sets {option.field}"
    monkeypatch.setenv(option.env, text)
    by_env = parse_settings(base_flags)
    assert getattr(by_env, option.field) == value, f"{option.env} sets {option.field}"
    assert isinstance(by_env, model)


@pytest.mark.parametrize("component", COMPONENTS)
def test_help_lists_every_option_with_its_description(component: str, capsys: pytest.CaptureFixture[str]) -> None:
    model, parse_settings, _ = COMPONENTS[component]
    with pytest.raises(SystemExit) as exited:
        parse_settings(["--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    squeezed = "".join(text.split())  # argparse wraps lines, also after a hyphen
    for option in options(model):
        assert option.info.description, f"{option.field} has no description"
        assert re.search(rf"^  {option.flag}[ ,\n]", text, re.MULTILINE), f"--help lacks {option.flag}"
        assert "".join(option.info.description.split()) in squeezed, f"--help lacks the description of {option.flag}"
        assert f"(env{option.env}" in squeezed, f"--help lacks {option.env}"


def test_names_are_unique_per_component() -> None:
    for model, _, _ in COMPONENTS.values():
        found = options(model)
        assert len({o.flag for o in found}) == len(found) and len({o.env for o in found}) == len(found)


def _chart_names(template: str) -> tuple[set[str], set[str]]:
    """(flags, our environment variables) a chart template passes to its container."""
    text = (TEMPLATES / template).read_text()
    flags = set(re.findall(r"^\s*- (--[a-z0-9-]+)", text, re.MULTILINE))
    env = set(re.findall(r"^\s*- name: (FRACGPU_[A-Z0-9_]+|NODE_NAME|POD_UID|KUBECONFIG)\s*$", text, re.MULTILINE))
    return flags, env


@pytest.mark.parametrize(
    ("component", "template"),
    [("kubelet-plugin", "kubelet-plugin-daemonset.yaml"), ("controller", "controller-deployment.yaml")],
)
def test_the_chart_passes_only_known_flags_and_variables(component: str, template: str) -> None:
    model, _, _ = COMPONENTS[component]
    flags, env = _chart_names(template)
    assert flags or env, f"found no flags or variables in {template}"
    known_flags = {o.flag for o in options(model)} | {f"--no-{o.flag[2:]}" for o in options(model)}
    assert flags <= known_flags, f"{template} passes unknown flags {sorted(flags - known_flags)}"
    assert env <= {o.env for o in options(model)}, f"{template} sets unknown variables"
