"""How a setting is declared, and what the rest of the adapter reads of a declaration.

One declaration per setting, in `Settings` (adapter/config/settings.py): its type and default (the
annotation and the value), then one `Setting(...)` naming its group, its converter
(adapter/config/values.py), the ini keys that set it directly and, where it has one, its
command-line flag.  Its environment variable is always STOMP_ADAPTER_<NAME>.  Everything else (the
ini key table, the flags of cli.py, the error messages' "where", the checks) is derived from these
declarations, read through `Declared`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, GetCoreSchemaHandler
from pydantic_core import CoreSchema, core_schema

ENV_PREFIX = "STOMP_ADAPTER_"


class Group(StrEnum):
    """The groups settings are declared (and documented) in."""

    LISTENERS = "listeners and TLS"
    WEBSOCKET = "WebSocket"
    AMQP = "AMQP link"
    SESSION = "STOMP sessions"
    LIMITS = "limits"
    OPERATIONS = "operations"


@dataclass(frozen=True, slots=True)
class IniKey:
    """An ini key with its own converter (a key written in other units than the setting's)."""

    name: str
    convert: Callable[[object], Any]


@dataclass(frozen=True, slots=True)
class Flag:
    """A setting's command-line flag (cli.py adds one argparse option per flag, dest = the setting's
    name).  ``repeat``: the flag may be given several times (a list); ``switch``: takes no value and
    means true; ``choices``: the values argparse itself accepts."""

    option: str
    help: str
    metavar: str | None = None
    repeat: bool = False
    switch: bool = False
    choices: tuple[str, ...] | None = None


class Setting:
    """A setting's declaration, as metadata of its field: ``name: Annotated[T, Setting(...)] = default``.

    ``convert`` turns what an operator wrote (or an already typed value) into the setting's value,
    raising ValueError("must be ...") otherwise; it runs for every source (ini file, environment,
    command line, ``Settings(...)`` itself).  ``keys``: the ini keys that set it directly, the first
    spelling first (key families such as stomp.listeners.tcp.<name> are read by `read_ini`'s handlers
    and named in ``family`` for the documentation).  ``redact``: how a value is shown in an error
    message (amqp_url hides its password); a field declared with ``Field(repr=False)`` is shown as
    ``'***'``."""

    __slots__ = ("convert", "family", "flag", "group", "keys", "redact")

    def __init__(
        self,
        group: Group,
        convert: Callable[[object], Any],
        *keys: str | IniKey,
        flag: Flag | None = None,
        redact: Callable[[str], str] | None = None,
        family: tuple[str, ...] = (),
    ) -> None:
        self.group = group
        self.convert = convert
        self.keys = tuple(key if isinstance(key, IniKey) else IniKey(key, convert) for key in keys)
        self.flag = flag
        self.redact = redact
        self.family = family

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        # the converter runs before pydantic's own check of the type, whatever the value's source
        return core_schema.no_info_before_validator_function(self.convert, handler(source))


@dataclass(frozen=True, slots=True)
class Declared:
    """One declared setting, as the loader, the ini reader and cli.py read it."""

    name: str
    setting: Setting
    default: Any
    secret: bool  # declared with Field(repr=False): never shown, not even in an error message

    @property
    def env(self) -> str:
        """Its environment variable (matched without regard to case)."""
        return (ENV_PREFIX + self.name).upper()

    def shown(self, raw: object) -> str:
        """*raw* as an error message may show it."""
        if self.secret:
            return "'***'"
        if self.setting.redact is not None and isinstance(raw, str):
            return repr(self.setting.redact(raw))
        return repr(raw)


def _declarations(model: type[BaseModel]) -> dict[str, Declared]:
    """The declaration of each field of *model*, in field order; a field without one is an error."""
    declared = {}
    for name, info in model.model_fields.items():
        found = [item for item in info.metadata if isinstance(item, Setting)]
        if len(found) != 1:
            raise TypeError(f"setting {name}: declare it as Annotated[<type>, Setting(...)] = <default>")
        declared[name] = Declared(name, found[0], info.default, secret=not info.repr)
    return declared
