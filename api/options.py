"""Settings declared once: every field of an `OptionSettings` model is a command-line flag and an environment variable.

A field `api_timeout_seconds` of a model whose `env_prefix` is `FRACGPU_` is the flag `--api-timeout` and the
variable `FRACGPU_API_TIMEOUT`: a unit suffix (`_seconds`, `_bytes`) is left out of both, the description says the
unit. `Field(json_schema_extra={"env": "NODE_NAME"})` names a variable outside the prefix (one Kubernetes or kubectl
sets). A bool field is `--x` / `--no-x`; a Literal field's values are the flag's choices. Flags win over the
environment, the environment over the defaults; an empty value (flag or variable) counts as unset.

`Model(...)` alone reads the environment (pydantic-settings); `parse(Model, argv, ...)` adds the flags, and turns a
validation error into a usage error naming the flag or variable that carried the bad value.
"""

import argparse
from typing import Any, Literal, NamedTuple, NoReturn, TypeVar, get_args, get_origin

from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails, PydanticUndefined
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from api.quantity import format_bytes

UNIT_SUFFIXES = ("_seconds", "_bytes")

S = TypeVar("S", bound="OptionSettings")


class Option(NamedTuple):
    """One field as the operator sets it."""

    field: str
    flag: str
    env: str
    info: FieldInfo


def option_stem(field: str) -> str:
    """The field name without its unit suffix: the stem of the flag and the variable."""
    return next((field.removesuffix(s) for s in UNIT_SUFFIXES if field.endswith(s)), field)


def _env_name(model: type["OptionSettings"], name: str, info: FieldInfo) -> str:
    extra = info.json_schema_extra
    named = extra.get("env") if isinstance(extra, dict) else None
    return named if isinstance(named, str) else f"{model.model_config.get('env_prefix', '')}{option_stem(name)}".upper()


def options(model: type["OptionSettings"]) -> list[Option]:
    """Every field of `model` with its flag and environment variable, in declaration order."""
    return [
        Option(name, f"--{option_stem(name).replace('_', '-')}", _env_name(model, name, info), info)
        for name, info in model.model_fields.items()
    ]


class OptionsEnvSource(EnvSettingsSource):
    """pydantic-settings' environment source, reading each field from its `options` variable."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls)
        assert issubclass(settings_cls, OptionSettings)
        self._env_names = {o.field: o.env for o in options(settings_cls)}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.env_vars.get(self._env_names[field_name]), field_name, False


class OptionSettings(BaseSettings):
    """Base of a component's settings: frozen; constructor arguments, then the environment, then defaults."""

    model_config = SettingsConfigDict(frozen=True, case_sensitive=True, env_ignore_empty=True)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, OptionsEnvSource(settings_cls)


def _default_text(option: Option) -> str:
    default = option.info.default
    if default is PydanticUndefined or default is None or default == "":
        return ""
    if isinstance(default, bool):
        return f"; default: {'--' if default else '--no-'}{option.flag.removeprefix('--')}"
    if option.field.endswith("_bytes") and isinstance(default, int):
        return f"; default: {format_bytes(default)}"
    return f"; default: {default}"


def help_text(option: Option) -> str:
    """The flag's help: the field's description, its variable and its default."""
    text = f"{option.info.description or ''} (env {option.env}{_default_text(option)})"
    return text.replace("%", "%%")  # argparse formats help with %


def build_parser(model: type[OptionSettings], prog: str, description: str) -> argparse.ArgumentParser:
    """A flag per field of `model`; values stay strings (pydantic converts and validates them)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=f"{description} Every flag can also be set by the environment variable named in its help; "
        "a flag wins over its variable.",
    )
    for option in options(model):
        kwargs: dict[str, Any] = {"dest": option.field, "default": argparse.SUPPRESS, "help": help_text(option)}
        if option.info.annotation is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif get_origin(option.info.annotation) is Literal:
            kwargs["choices"] = [str(v) for v in get_args(option.info.annotation)]
        else:
            kwargs["metavar"] = option_stem(option.field).upper()
        if option.info.is_required():
            kwargs["help"] = f"required: {kwargs['help']}"
        parser.add_argument(option.flag, **kwargs)
    return parser


def _problem(error: ErrorDetails, by_field: dict[str, Option], flags: dict[str, Any]) -> str:
    """One validation error as the operator reads it: where the value came from, and what is wrong with it."""
    message = error["msg"].removeprefix("Value error, ")
    option = by_field.get(str(error["loc"][0])) if error["loc"] else None
    if option is None:
        return message
    if error["type"] == "missing":
        return f"{option.flag} (or env {option.env}) is required: {option.info.description}"
    if option.field in flags:
        return f"{option.flag}={flags[option.field]}: {message}"
    return f"env {option.env}={error['input']}: {message}"


def parse(model: type[S], argv: list[str] | None, parser: argparse.ArgumentParser) -> S:
    """`model` from `parser`'s flags over the environment; exits 2 with every problem named on bad input."""
    flags = {name: value for name, value in vars(parser.parse_args(argv)).items() if value != ""}
    try:
        return model(**flags)
    except ValidationError as err:
        by_field = {o.field: o for o in options(model)}
        _exit(parser, "; ".join(_problem(e, by_field, flags) for e in err.errors()))


def _exit(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    parser.error(f"{message} (see --help)")
