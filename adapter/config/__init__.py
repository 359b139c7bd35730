"""The adapter's configuration: the `Settings` model, and loading it from the command line, the
environment and the rabbitmq.conf-style ini file.

Precedence, highest first: command line (``overrides``) > ``STOMP_ADAPTER_*`` environment > ini file >
defaults.  The package is the only part of the adapter that imports pydantic; nothing here touches
sockets or the event loop.  Its modules:

* ``values``: what an operator may write for a setting (the converters), `ConfigError`;
* ``declare``: how a setting is declared (`Setting`, `Flag`, `IniKey`, `Group`, `Declared`);
* ``settings``: `Settings`, a pydantic-settings ``BaseSettings``, every setting declared once;
* ``ini``: the ini file, read line by line into a source of the load;
* ``loading``: `load_settings`, the sources of one load and the error messages.

Adding a setting: one declaration in `Settings`, in its group (docs/configuration.md, "Adding a
setting"), then its use where the server or the session is built (cli.py).
"""

from __future__ import annotations

from .declare import ENV_PREFIX, Declared, Flag, Group, IniKey, Setting
from .declare import _declarations as _declarations
from .ini import _KEYS as _KEYS
from .ini import IniFile, IniFileSource, read_ini
from .ini import _handler as _handler
from .ini import _IniReader as _IniReader
from .loading import CommandLineSource, EnvironmentSource, load_settings
from .settings import DECLARED, Settings
from .values import ConfigError, parse_listener, redact_url, split_urls

__all__ = [
    "DECLARED",
    "ENV_PREFIX",
    "CommandLineSource",
    "ConfigError",
    "Declared",
    "EnvironmentSource",
    "Flag",
    "Group",
    "IniFile",
    "IniFileSource",
    "IniKey",
    "Setting",
    "Settings",
    "load_settings",
    "parse_listener",
    "read_ini",
    "redact_url",
    "split_urls",
]
