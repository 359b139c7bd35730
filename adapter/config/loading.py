"""Loading the settings: the sources of one load, and the errors an operator reads.

This module owns `load_settings`.  A load is one ``Settings(...)`` of pydantic-settings whose sources,
highest first, are built for that load: the command line (`CommandLineSource`), the
``STOMP_ADAPTER_*`` variables (`EnvironmentSource`, pydantic-settings' own environment source), the
ini file (`IniFileSource`, adapter/config/ini.py); the declared defaults come last.  Each source
converts nothing itself except the ini file (whose errors need their line): every value is checked
by its setting's converter as pydantic validates the model, and each error is then put back in the
words of the source that won, "command line: --listen = ...", "environment: STOMP_ADAPTER_... =
...", "FILE line N: key = ...", every bad value at once, in declaration order.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Mapping
from typing import Any, Protocol

from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource

from .declare import ENV_PREFIX
from .ini import IniFileSource
from .settings import DECLARED, SOURCES, Settings
from .values import ConfigError

log = logging.getLogger("adapter.config")


class _Described(Protocol):
    """A source of a load that can say where each value it gave was written."""

    @property
    def values(self) -> Mapping[str, Any]: ...

    def describe(self, field_name: str) -> str: ...


class CommandLineSource(PydanticBaseSettingsSource):
    """The flags given (cli.py passes every flag's value, None for one not given), keyed by setting."""

    def __init__(self, settings_cls: type[BaseSettings], overrides: Mapping[str, object]) -> None:
        super().__init__(settings_cls)
        self.values = {name: value for name, value in overrides.items() if value is not None}
        for name in self.values:
            if name not in DECLARED:
                close = difflib.get_close_matches(name, list(DECLARED), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"override: unknown setting {name!r}{hint}")

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self.values)

    def describe(self, field_name: str) -> str:
        declared = DECLARED[field_name]
        flag = declared.setting.flag
        where = f"command line: {flag.option}" if flag else f"override: {field_name}"
        return f"{where} = {declared.shown(self.values[field_name])}"


class EnvironmentSource(EnvSettingsSource):
    """pydantic-settings' environment source, configured by `Settings.model_config` (the prefix,
    names matched without regard to case, values left as written), that also knows each
    variable's name as written and warns of a ``STOMP_ADAPTER_*`` variable that is no setting's."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls)
        # lower-cased name -> the name as written (of two that differ in case only, the one whose
        # value the source read: the last, as in its own table ``env_vars``)
        self.names = {name.lower(): name for name in os.environ}
        self.values: dict[str, Any] = {}  # what it gave the load (its __call__)

    def __call__(self) -> dict[str, Any]:
        # A warning, not an error: other tools may share the prefix, and the environment is not ours alone.
        known = {declared.env for declared in DECLARED.values()}
        for name in self.names.values():
            upper = name.upper()
            if upper.startswith(ENV_PREFIX) and upper not in known:
                close = difflib.get_close_matches(upper, list(known), n=1, cutoff=0.75)
                hint = f" (did you mean {close[0]}?)" if close else ""
                log.warning("environment variable %s is not an adapter setting and is ignored%s", name, hint)
        self.values = super().__call__()
        return self.values

    def describe(self, field_name: str) -> str:
        declared = DECLARED[field_name]
        key = declared.env.lower()
        return f"environment: {self.names[key]} = {declared.shown(self.env_vars[key])}"


def _error_text(error: Mapping[str, Any]) -> str:
    ctx = error.get("ctx") or {}
    if isinstance(ctx.get("error"), ValueError):
        return str(ctx["error"])
    return str(error.get("msg", "invalid value"))


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> Settings:
    """Build the settings from defaults, the ini file, ``STOMP_ADAPTER_*`` variables and *overrides*.

    *overrides* are command-line values keyed by setting name; None values are ignored.  Every problem
    raises `ConfigError` naming the key, the value and what is allowed: a line of the ini file
    alone (the first bad one), else every bad value of the other sources at once, in declaration
    order, one per line.
    """
    # Built in this order, so that an unknown override is reported first, then the ini file's
    # first bad line; pydantic-settings calls them highest first.
    command_line = CommandLineSource(Settings, overrides or {})
    ini = [IniFileSource(Settings, config_file)] if config_file is not None else []
    environment = EnvironmentSource(Settings)
    sources: tuple[PydanticBaseSettingsSource, ...] = (command_line, environment, *ini)
    request: dict[str, Any] = {SOURCES: sources}  # Settings.settings_customise_sources unpacks it
    try:
        return Settings(**request)
    except ValidationError as exc:
        described: list[_Described] = [command_line, environment, *ini]
        lines = []
        for error in exc.errors():
            loc = error.get("loc") or ()
            name = str(loc[0]) if loc else ""
            lines.append(f"{_where(name, described)}: {_error_text(error)}")
        raise ConfigError("\n".join(lines)) from None


def _where(field_name: str, sources: list[_Described]) -> str:
    """'<where>: <key> = <value>' for the source whose value won, as the operator wrote it."""
    if field_name not in DECLARED:
        return field_name or "settings"
    for source in sources:
        if field_name in source.values:
            return source.describe(field_name)
    return f"setting {field_name}"
