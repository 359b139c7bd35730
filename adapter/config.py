"""Loading and validating the adapter's settings.

This module owns the adapter's configuration: the `Settings` model (frozen, the plain values the rest of
the adapter takes), in which every setting is declared once (type, default, group, converter, ini keys,
command-line flag; the environment variable is STOMP_ADAPTER_<NAME>); reading the rabbitmq.conf-style ini
file through a table of handlers per key family; reading ``STOMP_ADAPTER_*`` environment variables;
merging command-line overrides; and turning every mistake into a `ConfigError` that names the key as the
operator wrote it, the bad value and what is allowed.

It is the only module of the adapter that imports pydantic; nothing here touches sockets or the event loop.

Precedence, highest first: command line (``overrides``) > environment > ini file > defaults.

Adding a setting: one declaration in `Settings`, in its group (docs/configuration.md, "Adding a
setting"), then its use where the server or the session is built (cli.py).
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import logging
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, ValidationError
from pydantic_core import CoreSchema, core_schema

__all__ = [
    "ENV_PREFIX",
    "DECLARED",
    "ConfigError",
    "Declared",
    "Flag",
    "Group",
    "IniFile",
    "IniKey",
    "Setting",
    "Settings",
    "load_settings",
    "parse_listener",
    "read_ini",
    "redact_url",
]

log = logging.getLogger(__name__)

ENV_PREFIX = "STOMP_ADAPTER_"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class ConfigError(Exception):
    """A configuration problem; ``str()`` is a message fit to print to the operator as is."""


# --------------------------------------------------------------------------------------------------------
# Value converters.  Shared by the ini source (eagerly, so errors carry the line) and by the model's
# before-validators (environment and command line).  Each accepts either a string as written by an
# operator or an already-typed Python value, and raises ValueError("must be ...") otherwise.
# --------------------------------------------------------------------------------------------------------

_INT_RE = re.compile(r"[+-]?[0-9]+")
_HOSTNAME_RE = re.compile(r"(?=.{1,253}$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,62})(?:\.[A-Za-z0-9_-]{1,63})*\.?")


def _to_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered == "true":
            return True
        if lowered == "false":
            return False
    raise ValueError("must be true or false")


def _int_converter(
    minimum: int, maximum: int | None = None, *, what: str | None = None
) -> Callable[[object], int]:
    if what is None:
        if maximum is not None:
            what = f"an integer from {minimum} to {maximum}"
        elif minimum == 1:
            what = "a positive integer"
        elif minimum == 0:
            what = "a non-negative integer"
        else:
            what = f"an integer >= {minimum}"
    message = f"must be {what}"

    def convert(value: object) -> int:
        if isinstance(value, bool):
            raise ValueError(message)
        if isinstance(value, str):
            text = value.strip()
            if not _INT_RE.fullmatch(text):
                raise ValueError(message)
            value = int(text)
        if not isinstance(value, int) or value < minimum or (maximum is not None and value > maximum):
            raise ValueError(message)
        return value

    return convert


def _optional(convert: Callable[[object], Any], hint: str) -> Callable[[object], Any]:
    """Allow None, and 'none' or an empty string written by an operator, to mean "not set"."""

    def convert_optional(value: object) -> Any:
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
            return None
        try:
            return convert(value)
        except ValueError as exc:
            raise ValueError(f"{exc} {hint}") from None

    return convert_optional


def _float_converter(minimum: float, *, inclusive: bool, unit: str = "seconds") -> Callable[[object], float]:
    relation = ">=" if inclusive else ">"
    message = f"must be a number {relation} {minimum:g}" + (f" ({unit})" if unit else "")

    def convert(value: object) -> float:
        if isinstance(value, bool):
            raise ValueError(message)
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise ValueError(message) from None
        if not isinstance(value, int | float):
            raise ValueError(message)
        number = float(value)
        if not math.isfinite(number) or number < minimum or (not inclusive and number == minimum):
            raise ValueError(message)
        return number

    return convert


def _connection_cap(value: object) -> int | None:
    """stomp.max_connections and web_stomp.max_connections: infinity (None: no cap, the
    plugin's default) or an integer >= 0, as the plugin's schema allows."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "infinity"):
        return None
    try:
        return _int_converter(0)(value)
    except ValueError:
        raise ValueError("must be a non-negative integer or infinity") from None


def _non_empty_str(value: object) -> str:
    if isinstance(value, str) and value.strip():
        return value.strip()
    raise ValueError("must be a non-empty string")


def _credential(value: object) -> str | None:
    # An empty value disables the default login (RabbitMQ: default_user set to []).
    if value is None:
        return None
    if isinstance(value, str):
        return value.strip() or None
    raise ValueError("must be a string (empty to disable)")


def _log_level(value: object) -> str:
    if isinstance(value, str) and value.strip().upper() in LOG_LEVELS:
        return value.strip().upper()
    raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")


# a comma separates broker nodes only where the next URL begins: a comma inside a password
# (unencoded) must not cut the URL in two, or each half would be shown unredacted
_NEXT_URL = re.compile(r",(?=\s*[A-Za-z][A-Za-z0-9+.-]*://)")


def split_urls(text: str) -> list[str]:
    """The URLs of a comma-separated list (several broker nodes), split only where a comma is
    followed by the next URL's scheme: a comma in a password stays in its URL."""
    return _NEXT_URL.split(text)


def redact_url(url: str) -> str:
    """Return *url* with any password replaced by ``***`` (for logs and error messages); a
    comma-separated list of URLs (several broker nodes) URL by URL, split before redacting
    only where the next URL begins (``split_urls``), so a comma in a password is hidden too."""
    urls = split_urls(url)
    if len(urls) > 1:
        return ",".join(redact_url(one) for one in urls)
    try:
        parts = urlsplit(url)
        if parts.password is None:
            if "@" not in url or "@" in parts.netloc or "://" not in url:
                return url  # no user, or a user without a password
            # an unencoded / ? # in the password ends the user part early: hide all up to the last @
            scheme, _, rest = url.partition("://")
            user = re.split(r"[:@/?#]", rest, maxsplit=1)[0]
            return f"{scheme}://{user}:***@{rest.rpartition('@')[2]}"
        userinfo, _, hostport = parts.netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        return urlunsplit(parts._replace(netloc=f"{user}:***@{hostport}"))
    except ValueError:
        return "<unparseable URL>"


def _http_listen(value: object) -> str | None:
    """The metrics and health HTTP listener: HOST:PORT, or none (no HTTP port at all)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return None
    try:
        return _normalise_listener(value)
    except ValueError as exc:
        raise ValueError(f"{exc} (or none for no HTTP port)") from None


def _amqp_url(value: object) -> str:
    """One amqp:// or amqps:// URL, or several separated by commas (the nodes of a cluster)."""
    allowed = (
        "must be amqp:// or amqps:// URLs with a host, comma-separated for several nodes, "
        "e.g. amqp://guest:guest@localhost:5672/"
    )
    if not isinstance(value, str) or not value.strip():
        raise ValueError(allowed)
    urls = []
    for item in split_urls(value):
        url = item.strip()
        if "," in url.rstrip(","):
            # a comma not followed by another URL: in the user or password, unencoded
            raise ValueError(f"{allowed}; percent-encode , / ? # @ in the user and password")
        if url.endswith(","):
            raise ValueError(allowed)
        try:
            parts = urlsplit(url)
            port = parts.port  # raises ValueError on a non-numeric or out-of-range port
        except ValueError:
            raise ValueError(allowed) from None
        if parts.scheme.lower() not in ("amqp", "amqps") or not parts.hostname or port == 0:
            raise ValueError(allowed)
        if "@" in url and "@" not in parts.netloc:
            # "amqp://user:12345/secret@host/" reads as host "user", port 12345
            raise ValueError(f"{allowed}; percent-encode / ? # @ in the user and password")
        urls.append(url)
    return ",".join(urls)


def _one_of(*choices: str) -> Callable[[object], str]:
    def convert(value: object) -> str:
        text = str(value).strip().lower() if isinstance(value, str) else ""
        if text not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return text

    return convert


def _tls_versions(value: object) -> tuple[str, ...]:
    allowed = ("tlsv1.2", "tlsv1.3")
    items = _split_list(value) if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        raise ValueError("must be a list of tlsv1.2, tlsv1.3")
    versions = tuple(str(item).strip().lower().strip("'") for item in items if str(item).strip())
    for version in versions:
        if version not in allowed:
            raise ValueError(f"TLS versions must be among {', '.join(allowed)}, got {version!r}")
    return versions


def _optional_path(value: object) -> str | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return None
    if not isinstance(value, str):
        raise ValueError("must be a file path")
    return value.strip()


def _ws_path(value: object) -> str:
    text = value.strip() if isinstance(value, str) else ""
    if not text.startswith("/") or any(c.isspace() for c in text):
        raise ValueError("must be a path starting with /, without spaces")
    return text


def _origins(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        if value.strip().lower() == "none":
            return ()  # the plugin's "no list": every origin is allowed
        value = _split_list(value)
    if not isinstance(value, list | tuple):
        raise ValueError("must be a comma-separated list of origins such as https://example.com")
    return tuple(str(item).strip() for item in value if str(item).strip())


def parse_listener(value: str) -> tuple[str, int]:
    """Parse a listener as RabbitMQ writes it: ``PORT``, ``HOST:PORT``, ``[V6ADDR]:PORT`` or ``V6ADDR:PORT``.

    A bare port means all IPv4 interfaces (``0.0.0.0``).  Port 0 asks the OS for a free port.  Returns
    ``(host, port)`` with IPv6 addresses unbracketed and compressed.  Raises ValueError otherwise.
    """
    allowed = "must be PORT, HOST:PORT or [IPV6]:PORT with a port from 0 to 65535"
    if not isinstance(value, str):
        raise ValueError(allowed)
    text = value.strip()
    if text.startswith("["):
        close = text.find("]")
        if close < 0 or text[close + 1 : close + 2] != ":":
            raise ValueError(allowed)
        host, port_text = text[1:close], text[close + 2 :]
        try:
            host = ipaddress.IPv6Address(host).compressed
        except ValueError:
            raise ValueError(f"{allowed} ({host!r} is not an IPv6 address)") from None
    elif ":" not in text:
        host, port_text = "0.0.0.0", text
    else:
        host, _, port_text = text.rpartition(":")
        if ":" in host:
            # Unbracketed IPv6 as in the plugin guide ("::1:61613"): the last colon separates the port.
            try:
                host = ipaddress.IPv6Address(host).compressed
            except ValueError:
                raise ValueError(f"{allowed} ({host!r} is not an IPv6 address)") from None
        elif re.fullmatch(r"[0-9.]+", host):
            try:
                host = str(ipaddress.IPv4Address(host))
            except ValueError:
                raise ValueError(f"{allowed} ({host!r} is not an IPv4 address)") from None
        elif not _HOSTNAME_RE.fullmatch(host):
            raise ValueError(f"{allowed} ({host!r} is not a host name or address)")
    if not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(allowed)
    return host, int(port_text)


def _format_listener(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _normalise_listener(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise ValueError("must be PORT, HOST:PORT or [IPV6]:PORT")
    return _format_listener(*parse_listener(value))


def _split_list(value: str) -> list[object]:
    text = value.strip()
    if text.startswith("["):  # a JSON list, as pydantic-settings users may expect from the environment
        try:
            decoded = json.loads(text)
        except json.JSONDecodeError:
            decoded = None
        if isinstance(decoded, list):
            return decoded
    return [item.strip() for item in text.split(",")]


def _listeners(value: object) -> tuple[str, ...]:
    allowed = "must be a comma-separated list of PORT, HOST:PORT or [IPV6]:PORT (or none)"
    if isinstance(value, str):
        if value.strip().lower() == "none":
            return ()
        if not value.strip():
            raise ValueError(allowed)
        value = _split_list(value)
    if not isinstance(value, list | tuple):
        raise ValueError(allowed)
    result = []
    for item in value:
        try:
            result.append(_normalise_listener(item))
        except ValueError as exc:
            raise ValueError(f"{item!r}: {exc}") from None
    return tuple(result)


def _trusted_peers(value: object) -> tuple[str, ...]:
    """adapter.proxy_protocol_trusted: addresses and CIDR networks, normalised; none: every peer."""
    allowed = "must be a comma-separated list of IP addresses and CIDR networks such as 10.0.0.0/8 (or none)"
    if isinstance(value, str):
        if value.strip().lower() in ("", "none"):
            return ()
        value = _split_list(value)
    if not isinstance(value, list | tuple):
        raise ValueError(allowed)
    result = []
    for item in value:
        text = str(item).strip()
        if not text:
            continue
        try:
            result.append(str(ipaddress.ip_network(text, strict=True)))
        except ValueError as exc:
            hint = " (host bits set: write the network's own address)" if "host bits" in str(exc) else ""
            raise ValueError(f"{text!r} is not an address or network{hint}: {allowed}") from None
    return tuple(result)


def _user_list(value: object) -> tuple[str, ...]:
    allowed = "must be a comma-separated list of user names (or none)"
    if isinstance(value, str):
        if value.strip().lower() == "none":
            return ()
        value = _split_list(value)
    if not isinstance(value, list | tuple) or not all(isinstance(item, str) for item in value):
        raise ValueError(allowed)
    return tuple(item.strip() for item in value if item.strip())


# --------------------------------------------------------------------------------------------------------
# How a setting is declared.  One declaration per setting, in the `Settings` class below: its type and
# default (the annotation and the value), then one `Setting(...)` naming its group, its converter, the
# ini keys that set it directly and, where it has one, its command-line flag.  Its environment variable
# is always STOMP_ADAPTER_<NAME>.  Everything else (the ini key table, the flags of cli.py, the error
# messages' "where", the checks) is derived from these declarations.
# --------------------------------------------------------------------------------------------------------


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


def _milliseconds(minimum: int) -> Callable[[object], float]:
    """An ini key in milliseconds (as the plugin's) for a setting in seconds."""
    what = "a positive integer (milliseconds)" if minimum else "an integer >= 0 (milliseconds)"
    integer = _int_converter(minimum, what=what)

    def convert(value: object) -> float:
        return integer(value) / 1000

    return convert


_OS_DEFAULT = "(or none for the OS default)"
_LISTEN, _WEB, _AMQP, _SESSION, _LIMITS, _OPS = (
    Group.LISTENERS,
    Group.WEBSOCKET,
    Group.AMQP,
    Group.SESSION,
    Group.LIMITS,
    Group.OPERATIONS,
)


# --------------------------------------------------------------------------------------------------------
# The settings
# --------------------------------------------------------------------------------------------------------


class Settings(BaseModel):
    """Every setting of the adapter, validated and frozen.  Build it with `load_settings`; ``Settings()``
    is the defaults (no file, no environment)."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    def __repr_args__(self) -> Any:
        """The repr (and str) shows a value as an error message would (``Declared.shown``):
        amqp_url with its passwords as ``***``; the fields declared ``repr=False`` not at all."""
        for name, value in super().__repr_args__():
            redact = DECLARED[name].setting.redact if name is not None and name in DECLARED else None
            yield name, redact(value) if redact is not None and isinstance(value, str) else value

    # ---- listeners and TLS ------------------------------------------------------------------------------
    # Listening sockets, normalised "host:port" ("[v6]:port" for IPv6).  Empty: listen nowhere.
    listeners: Annotated[
        tuple[str, ...],
        Setting(
            _LISTEN,
            _listeners,
            "adapter.listeners",
            family=("stomp.listeners.tcp.<name>", "stomp.listeners.tcp = none"),
            flag=Flag(
                "--listen",
                "address to accept STOMP clients on; repeat for several "
                "(default 0.0.0.0:61613; port 0 = any free port)",
                metavar="HOST:PORT",
                repeat=True,
            ),
        ),
    ] = ("0.0.0.0:61613",)
    # plain TCP listeners that always speak the activemq profile, beside the others (a migration
    # serves RabbitMQ-style and legacy ActiveMQ clients from one adapter)
    activemq_listeners: Annotated[
        tuple[str, ...], Setting(_LISTEN, _listeners, "adapter.activemq_listeners")
    ] = ()
    # TLS listeners (stomp.listeners.ssl.<name>) and the rabbitmq.conf ssl_options.* they use.
    ssl_listeners: Annotated[
        tuple[str, ...],
        Setting(_LISTEN, _listeners, family=("stomp.listeners.ssl.<name>", "stomp.listeners.ssl = none")),
    ] = ()
    ssl_cacertfile: Annotated[str | None, Setting(_LISTEN, _optional_path, "ssl_options.cacertfile")] = None
    ssl_certfile: Annotated[str | None, Setting(_LISTEN, _optional_path, "ssl_options.certfile")] = None
    ssl_keyfile: Annotated[str | None, Setting(_LISTEN, _optional_path, "ssl_options.keyfile")] = None
    ssl_password: Annotated[str | None, Setting(_LISTEN, _optional_path, "ssl_options.password")] = Field(
        default=None, repr=False
    )
    ssl_verify: Annotated[
        Literal["verify_none", "verify_peer"],
        Setting(_LISTEN, _one_of("verify_none", "verify_peer"), "ssl_options.verify"),
    ] = "verify_none"
    ssl_fail_if_no_peer_cert: Annotated[
        bool, Setting(_LISTEN, _to_bool, "ssl_options.fail_if_no_peer_cert")
    ] = False
    ssl_versions: Annotated[
        tuple[str, ...], Setting(_LISTEN, _tls_versions, family=("ssl_options.versions.<n>",))
    ] = ()
    # every connection starts with a PROXY protocol header
    proxy_protocol: Annotated[bool, Setting(_LISTEN, _to_bool, "stomp.proxy_protocol")] = False
    # peers whose PROXY header (stomp. and web_stomp.proxy_protocol) is believed; empty: every
    # peer, as in the plugins (adapter/server/proxy_protocol.py, ProxyTrust)
    proxy_protocol_trusted: Annotated[
        tuple[str, ...], Setting(_LISTEN, _trusted_peers, "adapter.proxy_protocol_trusted")
    ] = ()
    tcp_backlog: Annotated[int, Setting(_LISTEN, _int_converter(1), "stomp.tcp_listen_options.backlog")] = 128
    tcp_nodelay: Annotated[bool, Setting(_LISTEN, _to_bool, "stomp.tcp_listen_options.nodelay")] = True
    tcp_keepalive: Annotated[bool, Setting(_LISTEN, _to_bool, "stomp.tcp_listen_options.keepalive")] = False
    tcp_sndbuf: Annotated[
        int | None,
        Setting(_LISTEN, _optional(_int_converter(1), _OS_DEFAULT), "stomp.tcp_listen_options.sndbuf"),
    ] = None
    tcp_recbuf: Annotated[
        int | None,
        Setting(_LISTEN, _optional(_int_converter(1), _OS_DEFAULT), "stomp.tcp_listen_options.recbuf"),
    ] = None

    # ---- WebSocket (the web_stomp.* keys of rabbitmq_web_stomp) -----------------------------------------
    # No listener unless a web_stomp.* key is in the ini file (then web_stomp.tcp.port, default
    # 15674) or the STOMP_ADAPTER_WEB_STOMP_LISTENERS variable names some.
    web_stomp_listeners: Annotated[
        tuple[str, ...],
        Setting(
            _WEB, _listeners, family=("web_stomp.tcp.port", "web_stomp.tcp.ip", "web_stomp.tcp.listener")
        ),
    ] = ()
    web_stomp_ssl_listeners: Annotated[
        tuple[str, ...],
        Setting(
            _WEB, _listeners, family=("web_stomp.ssl.port", "web_stomp.ssl.ip", "web_stomp.ssl.listener")
        ),
    ] = ()
    web_stomp_ssl_certfile: Annotated[str | None, Setting(_WEB, _optional_path, "web_stomp.ssl.certfile")] = (
        None
    )
    web_stomp_ssl_keyfile: Annotated[str | None, Setting(_WEB, _optional_path, "web_stomp.ssl.keyfile")] = (
        None
    )
    web_stomp_ssl_cacertfile: Annotated[
        str | None, Setting(_WEB, _optional_path, "web_stomp.ssl.cacertfile")
    ] = None
    web_stomp_ssl_password: Annotated[str | None, Setting(_WEB, _optional_path, "web_stomp.ssl.password")] = (
        Field(default=None, repr=False)
    )
    web_stomp_ssl_versions: Annotated[
        tuple[str, ...], Setting(_WEB, _tls_versions, family=("web_stomp.ssl.versions.<n>",))
    ] = ()
    web_stomp_backlog: Annotated[int, Setting(_WEB, _int_converter(1), "web_stomp.tcp.backlog")] = 1024
    web_stomp_ws_path: Annotated[str, Setting(_WEB, _ws_path, "web_stomp.ws_path")] = "/ws"
    web_stomp_ws_frame: Annotated[
        Literal["text", "binary"], Setting(_WEB, _one_of("text", "binary"), "web_stomp.ws_frame")
    ] = "text"
    # bytes per WebSocket message; None: no limit (the STOMP frame limits still apply).  0 is valid
    # in the plugin's schema: cowboy then refuses every non-empty message with 1009.
    web_stomp_max_frame_size: Annotated[
        int | None,
        Setting(
            _WEB,
            _optional(_int_converter(0), "(or none for no limit)"),
            "web_stomp.ws_opts.max_frame_size",
            "web_stomp.max_frame_size",  # the name issue #11 uses
        ),
    ] = None
    web_stomp_use_http_auth: Annotated[bool, Setting(_WEB, _to_bool, "web_stomp.use_http_auth")] = False
    web_stomp_compress: Annotated[bool, Setting(_WEB, _to_bool, "web_stomp.ws_opts.compress")] = True
    # seconds (the ini key is in milliseconds, as in the plugin)
    web_stomp_idle_timeout: Annotated[
        float,
        Setting(
            _WEB,
            _float_converter(0, inclusive=True),
            IniKey("web_stomp.ws_opts.idle_timeout", _milliseconds(0)),
        ),
    ] = 60.0
    # seconds a new connection has for its HTTP request: cowboy's request_timeout, which the
    # plugin leaves at 5 s (its cowboy_opts.idle_timeout only times request bodies); no ini key
    web_stomp_request_timeout: Annotated[float, Setting(_WEB, _float_converter(0, inclusive=False))] = 5.0
    web_stomp_allow_origins: Annotated[
        tuple[str, ...],
        Setting(_WEB, _origins, "web_stomp.allow_origins", family=("web_stomp.allow_origins.<n>",)),
    ] = ()
    web_stomp_proxy_protocol: Annotated[bool, Setting(_WEB, _to_bool, "web_stomp.proxy_protocol")] = False
    web_stomp_hsts_policy: Annotated[str | None, Setting(_WEB, _optional_path, "web_stomp.hsts.policy")] = (
        None
    )
    web_stomp_console: Annotated[bool, Setting(_WEB, _to_bool, "adapter.web_stomp_console")] = True

    # ---- AMQP link ----------------------------------------------------------------------------------------
    # Where the broker is.  STOMP sessions log in with the CONNECT frame's credentials (or the defaults).
    amqp_url: Annotated[
        str,
        Setting(
            _AMQP,
            _amqp_url,
            "adapter.amqp_url",
            family=("adapter.amqp_url.<name>",),
            redact=redact_url,
            flag=Flag(
                "--amqp-url",
                "the RabbitMQ to front (default amqp://guest:guest@localhost:5672/); clients log in "
                "with their own CONNECT credentials and vhost",
                metavar="URL",
            ),
        ),
    ] = "amqp://guest:guest@localhost:5672/"
    # With several nodes: the order a login tries them in (docs/behaviour.md, "Broker nodes").
    amqp_node_order: Annotated[
        Literal["round_robin", "shuffle"],
        Setting(_AMQP, _one_of("round_robin", "shuffle"), "adapter.amqp_node_order"),
    ] = "round_robin"
    # TLS to amqps:// nodes: CA file (None: Python's default trust store), client certificate
    # and key (brokers that require mutual TLS), peer verification, the name the certificate
    # must carry (None: the node's host name), the lowest protocol version accepted.
    amqp_tls_cafile: Annotated[str | None, Setting(_AMQP, _optional_path, "adapter.amqp_tls_cafile")] = None
    amqp_tls_certfile: Annotated[str | None, Setting(_AMQP, _optional_path, "adapter.amqp_tls_certfile")] = (
        None
    )
    amqp_tls_keyfile: Annotated[str | None, Setting(_AMQP, _optional_path, "adapter.amqp_tls_keyfile")] = None
    amqp_tls_verify: Annotated[bool, Setting(_AMQP, _to_bool, "adapter.amqp_tls_verify")] = True
    amqp_tls_server_name: Annotated[
        str | None, Setting(_AMQP, _optional_path, "adapter.amqp_tls_server_name")
    ] = None
    amqp_tls_min_version: Annotated[
        str, Setting(_AMQP, _one_of("tlsv1.2", "tlsv1.3"), "adapter.amqp_tls_min_version")
    ] = "tlsv1.2"
    amqp_connect_timeout: Annotated[
        float, Setting(_AMQP, _float_converter(0, inclusive=False), "adapter.amqp_connect_timeout")
    ] = 10.0
    amqp_heartbeat: Annotated[
        int,
        Setting(
            _AMQP,
            _int_converter(0, 65535, what="an integer from 0 to 65535 (seconds, 0 disables)"),
            "adapter.amqp_heartbeat",
        ),
    ] = 60
    # Reuse a STOMP session's AMQP connection for the next CONNECT of the same user, vhost and
    # passcode (adapter/amqp/pool_runtime.py, docs/configuration.md): off by default.  Idle
    # pooled connections close after idle_seconds, every one max_age_seconds after the broker
    # authenticated it; at most pool_size idle ones per process.
    amqp_connection_reuse: Annotated[
        bool,
        Setting(
            _AMQP,
            _to_bool,
            "adapter.amqp_connection_reuse",
            flag=Flag(
                "--amqp-connection-reuse",
                "reuse a finished STOMP session's AMQP connection for the next CONNECT of the same "
                "user, vhost and passcode (default off; docs/configuration.md says what it changes)",
                switch=True,
            ),
        ),
    ] = False
    amqp_connection_idle_seconds: Annotated[
        float, Setting(_AMQP, _float_converter(0, inclusive=False), "adapter.amqp_connection_idle_seconds")
    ] = 5.0
    amqp_connection_max_age_seconds: Annotated[
        float, Setting(_AMQP, _float_converter(0, inclusive=False), "adapter.amqp_connection_max_age_seconds")
    ] = 60.0
    amqp_connection_pool_size: Annotated[
        int, Setting(_AMQP, _int_converter(1), "adapter.amqp_connection_pool_size")
    ] = 100
    # Concurrent STOMP sessions of the same node, vhost, user and passcode share AMQP connections,
    # each on a channel of its own, at most this many per connection (adapter/amqp/multiplex_runtime.py,
    # docs/configuration.md): 1 (the default) gives every session a connection of its own.
    amqp_sessions_per_connection: Annotated[
        int,
        Setting(
            _AMQP,
            _int_converter(1, 65535, what="an integer from 1 to 65535"),
            "adapter.amqp_sessions_per_connection",
        ),
    ] = 1
    # With multiplexing, a session's client that does not read cannot hold the shared socket
    # back: what it is delivered meanwhile is bounded per session and for the process (an ERROR
    # ends the session past either).
    amqp_shared_max_paused_bytes: Annotated[
        int, Setting(_AMQP, _int_converter(1), "adapter.amqp_shared_max_paused_bytes")
    ] = 8 * 1024 * 1024
    amqp_shared_paused_bytes_budget: Annotated[
        int, Setting(_AMQP, _int_converter(1), "adapter.amqp_shared_paused_bytes_budget")
    ] = 256 * 1024 * 1024

    # ---- STOMP sessions -----------------------------------------------------------------------------------
    # Used when CONNECT has no login/passcode (and for implicit connect); None disables.
    default_user: Annotated[str | None, Setting(_SESSION, _credential, "stomp.default_user")] = "guest"
    default_pass: Annotated[str | None, Setting(_SESSION, _credential, "stomp.default_pass")] = Field(
        default="guest", repr=False
    )
    default_vhost: Annotated[str, Setting(_SESSION, _non_empty_str, "stomp.default_vhost")] = "/"
    implicit_connect: Annotated[bool, Setting(_SESSION, _to_bool, "stomp.implicit_connect")] = False
    hide_server_info: Annotated[bool, Setting(_SESSION, _to_bool, "stomp.hide_server_info")] = False
    default_nack_requeue: Annotated[bool, Setting(_SESSION, _to_bool, "stomp.default_nack_requeue")] = True
    default_topic_exchange: Annotated[
        str, Setting(_SESSION, _non_empty_str, "stomp.default_topic_exchange")
    ] = "amq.topic"
    # Users that may only log in when the STOMP client connects from a loopback address.
    loopback_users: Annotated[tuple[str, ...], Setting(_SESSION, _user_list, "adapter.loopback_users")] = (
        "guest",
    )
    # Append LF after the NUL of every outgoing frame, as the plugin does.
    trailing_lf: Annotated[bool, Setting(_SESSION, _to_bool, "adapter.trailing_lf")] = True
    # Whose visible behaviour (ERROR texts, what a consumer timeout does) the adapter copies: the
    # 3.10.8 plugin's (the reference) or the current plugin's (adapter/session/edition.py).
    plugin_behaviour: Annotated[
        Literal["3.10", "current"], Setting(_SESSION, _one_of("3.10", "current"), "adapter.plugin_behaviour")
    ] = "3.10"
    # Declare the exchange of a SEND / SUBSCRIBE to /exchange/NAME that carries declare-exchange:true
    # (adapter/mapping/exchanges.py); an adapter-only feature, off: the header is refused.
    declare_exchanges: Annotated[bool, Setting(_SESSION, _to_bool, "adapter.declare_exchanges")] = False
    # Non-durable auto-ack /topic/ and /exchange/ subscriptions of the same vhost, user, passcode
    # and destination share one AMQP queue and consumer per process, the adapter copying each
    # message to them (adapter/session/fanout.py, docs/configuration.md "Shared subscriptions").
    # Off: each subscription has its own queue and consumer, as with the plugin.
    shared_subscriptions: Annotated[
        bool,
        Setting(
            _SESSION,
            _to_bool,
            "adapter.shared_subscriptions",
            flag=Flag(
                "--shared-subscriptions",
                "share one AMQP queue and consumer among the plain topic subscriptions of the same "
                "user and destination (default off; docs/configuration.md says what it changes)",
                switch=True,
            ),
        ),
    ] = False
    # The STOMP dialect of every listener: the plugin's (rabbitmq) or ActiveMQ's
    # (docs/migration-activemq.md).
    profile: Annotated[
        Literal["rabbitmq", "activemq"],
        Setting(
            _SESSION,
            _one_of("rabbitmq", "activemq"),
            "adapter.profile",
            flag=Flag(
                "--profile",
                "STOMP dialect of every listener: rabbitmq (the STOMP plugin's, default) or activemq "
                "(legacy ActiveMQ clients, docs/migration-activemq.md)",
                choices=("rabbitmq", "activemq"),
            ),
        ),
    ] = "rabbitmq"

    # ---- limits -------------------------------------------------------------------------------------------
    max_frame_size: Annotated[int, Setting(_LIMITS, _int_converter(1), "stomp.max_frame_size")] = (
        4 * 1024 * 1024
    )
    max_frame_size_unauthenticated: Annotated[
        int,
        Setting(
            _LIMITS,
            _int_converter(1),
            "stomp.max_frame_size_unauthenticated",
            "adapter.max_frame_size_unauthenticated",
        ),
    ] = 65536
    max_headers: Annotated[int, Setting(_LIMITS, _int_converter(1), "adapter.max_headers")] = 100
    max_header_length: Annotated[int, Setting(_LIMITS, _int_converter(1), "adapter.max_header_length")] = (
        102400
    )
    # Seconds (the ini key stomp.login_timeout is in milliseconds, as in the plugin).
    login_timeout: Annotated[
        float,
        Setting(
            _LIMITS,
            _float_converter(0, inclusive=False),
            IniKey("stomp.login_timeout", _milliseconds(1)),
            "adapter.login_timeout",
        ),
    ] = 10.0
    # Seconds a client has to complete a frame once it has started sending it; 0: no limit.
    frame_timeout: Annotated[
        float, Setting(_LIMITS, _float_converter(0, inclusive=True), "adapter.frame_timeout")
    ] = 60.0
    # Bytes all connections together may hold in frames they have not completed.
    incomplete_frames_budget: Annotated[
        int, Setting(_LIMITS, _int_converter(1), "adapter.incomplete_frames_budget")
    ] = 256 * 1024 * 1024
    # Bytes of SEND bodies in open transactions: per connection, and all connections together.
    # activemq profile: bytes of unacknowledged client-ack deliveries kept for NACK, likewise.
    # (docs/configuration.md, "Byte budgets", argues the defaults)
    max_transaction_bytes: Annotated[
        int, Setting(_LIMITS, _int_converter(1), "adapter.max_transaction_bytes")
    ] = 64 * 1024 * 1024
    transaction_bytes_budget: Annotated[
        int, Setting(_LIMITS, _int_converter(1), "adapter.transaction_bytes_budget")
    ] = 1024 * 1024 * 1024
    max_unacked_bytes: Annotated[int, Setting(_LIMITS, _int_converter(1), "adapter.max_unacked_bytes")] = (
        64 * 1024 * 1024
    )
    unacked_bytes_budget: Annotated[
        int, Setting(_LIMITS, _int_converter(1), "adapter.unacked_bytes_budget")
    ] = 1024 * 1024 * 1024
    # AMQP logins of one process talking to the broker at once; the others wait their turn
    # (adapter/amqp/admission.py, docs/configuration.md "Connection caps").
    max_logins_in_flight: Annotated[
        int, Setting(_LIMITS, _int_converter(1), "adapter.max_logins_in_flight")
    ] = 64
    # With shared subscriptions: bytes of MESSAGE frames that may wait for one subscriber to read
    # them, and for all of a process's subscribers together; over either, the subscriber (the
    # one furthest behind) gets an ERROR naming the setting and is closed.
    shared_subscription_max_lag: Annotated[
        int, Setting(_LIMITS, _int_converter(1), "adapter.shared_subscription_max_lag")
    ] = 4 * 1024 * 1024
    shared_subscription_lag_budget: Annotated[
        int, Setting(_LIMITS, _int_converter(1), "adapter.shared_subscription_lag_budget")
    ] = 256 * 1024 * 1024
    # Factor applied to the client's heart-beat interval before the connection is declared dead.
    heartbeat_tolerance: Annotated[
        float, Setting(_LIMITS, _float_converter(1, inclusive=True, unit=""), "adapter.heartbeat_tolerance")
    ] = 1.5
    # Connection caps (adapter/caps.py, docs/configuration.md "Connection caps"); None: no cap.
    # max_connections: STOMP sessions of every listener (TCP, TLS, WebSocket), counted from
    # CONNECT to close, the CONNECT over it refused; web_stomp_max_connections: the sockets of
    # each web_stomp listener, the request over it answered 503.  With --workers N they hold
    # for the workers together (adapter/server/sharedcaps.py).
    max_connections: Annotated[int | None, Setting(_LIMITS, _connection_cap, "stomp.max_connections")] = None
    web_stomp_max_connections: Annotated[
        int | None, Setting(_LIMITS, _connection_cap, "web_stomp.max_connections")
    ] = None
    # bytes of permessage-deflate state all WebSockets together may hold (adapter-only)
    web_stomp_compress_budget: Annotated[
        int, Setting(_LIMITS, _int_converter(0), "adapter.web_stomp_compress_budget")
    ] = 256 * 1024 * 1024

    # ---- operations ---------------------------------------------------------------------------------------
    log_level: Annotated[
        str,
        Setting(
            _OPS,
            _log_level,
            "adapter.log_level",
            flag=Flag("--log-level", "DEBUG, INFO, WARNING or ERROR (default INFO)", metavar="LEVEL"),
        ),
    ] = "INFO"
    # "text": one human-readable line per event; "json": one JSON object per line (log shippers)
    log_format: Annotated[
        Literal["text", "json"],
        Setting(
            _OPS,
            _one_of("text", "json"),
            "adapter.log_format",
            flag=Flag(
                "--log-format",
                "text (default) or json: one JSON object per line, with the connection lines' fields as keys",
                metavar="FORMAT",
            ),
        ),
    ] = "text"
    # HOST:PORT of the HTTP listener for /metrics, /healthz and /readyz; None: no HTTP port
    http_listen: Annotated[
        str | None,
        Setting(
            _OPS,
            _http_listen,
            "adapter.http_listen",
            flag=Flag(
                "--http-listen",
                "serve GET /metrics (Prometheus), /healthz and /readyz on this address "
                "(default: no HTTP port; it has no authentication, keep it private)",
                metavar="HOST:PORT",
            ),
        ),
    ] = None
    # adapter processes sharing the listeners; 1: this process serves everything itself
    # (adapter/server/workers.py and docs/architecture.md, "Workers")
    workers: Annotated[
        int,
        Setting(
            _OPS,
            _int_converter(1, 256),
            "adapter.workers",
            flag=Flag(
                "--workers",
                "adapter processes sharing the listeners (default 1: this process alone); with more, "
                "this process supervises them, restarts one that dies and serves --http-listen for all",
                metavar="N",
            ),
        ),
    ] = 1
    # per-destination metric series: at most this many destinations per process get their own,
    # later ones count as "other"; 0: no per-destination series (adapter/server/stats.py)
    metrics_destinations: Annotated[
        int,
        Setting(
            _OPS,
            _int_converter(0, 10_000),
            "adapter.metrics_destinations",
            flag=Flag(
                "--metrics-destinations",
                "per-destination message series on /metrics for at most N destinations per process, "
                "later ones counted as other (default 0: none)",
                metavar="N",
            ),
        ),
    ] = 0
    # seconds a graceful shutdown waits for the connections before it gives up on them
    shutdown_timeout: Annotated[
        float, Setting(_OPS, _float_converter(0, inclusive=True), "adapter.shutdown_timeout")
    ] = 10.0


@dataclass(frozen=True, slots=True)
class Declared:
    """One declared setting, as the rest of this module (and cli.py) reads it."""

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
    declared = {}
    for name, info in model.model_fields.items():
        found = [item for item in info.metadata if isinstance(item, Setting)]
        if len(found) != 1:
            raise TypeError(f"setting {name}: declare it as Annotated[<type>, Setting(...)] = <default>")
        declared[name] = Declared(name, found[0], info.default, secret=not info.repr)
    return declared


# Every setting, in declaration order (the order of the groups above).
DECLARED: dict[str, Declared] = _declarations(Settings)


def _ini_key_table() -> dict[str, tuple[str, Callable[[object], Any]]]:
    table: dict[str, tuple[str, Callable[[object], Any]]] = {}
    for declared in DECLARED.values():
        for key in declared.setting.keys:
            if key.name in table:
                raise TypeError(
                    f"ini key {key.name} declared by both {table[key.name][0]} and {declared.name}"
                )
            table[key.name] = (declared.name, key.convert)
    return table


# ini key -> (setting, converter), for the keys that set one setting directly.
_KEYS = _ini_key_table()


# --------------------------------------------------------------------------------------------------------
# The ini file (rabbitmq.conf style).  `read_ini` looks every key up in a table of handlers, one per key
# family: the keys declared above, the listener and node families (stomp.listeners.tcp.<name>, ...),
# web_stomp's listener parts, the keys that are ignored and the ones refused.  The families that gather
# several lines into one setting are combined once the whole file is read (`_IniReader.finish`).
# --------------------------------------------------------------------------------------------------------

# cowboy's HTTP idle timeout: in cowboy 2.8 it runs only while a request body is read, and a
# WebSocket upgrade has none, so it changes nothing the plugin's clients see.  Checked as the
# plugin's schema checks it (milliseconds, >= 0), then ignored with a warning.
_WEB_COWBOY_TIMEOUT_KEYS = {"web_stomp.cowboy_opts.idle_timeout", "web_stomp.cowboy_opts.timeout"}
# web_stomp.tcp.* / web_stomp.ssl.* listener parts, combined after the whole file is read
_WEB_LISTENER_KEYS = {
    "web_stomp.port": ("tcp", "port"),
    "web_stomp.tcp.port": ("tcp", "port"),
    "web_stomp.tcp.ip": ("tcp", "ip"),
    "web_stomp.tcp.listener": ("tcp", "listener"),
    "web_stomp.ssl.port": ("ssl", "port"),
    "web_stomp.ssl.ip": ("ssl", "ip"),
    "web_stomp.ssl.listener": ("ssl", "listener"),
}
_WEB_STOMP_DEFAULT_PORT = 15674
_WEB_SSL_VERSIONS_PREFIX = "web_stomp.ssl.versions."
_WEB_ALLOW_ORIGINS_PREFIX = "web_stomp.allow_origins."
_TCP_LISTENER_PREFIX = "stomp.listeners.tcp."
_AMQP_NODE_PREFIX = "adapter.amqp_url."  # one broker node per key, like stomp.listeners.tcp.<name>
_SSL_LISTENER_PREFIX = "stomp.listeners.ssl."
_SSL_VERSIONS_PREFIX = "ssl_options.versions."
_ACCEPTORS_PREFIX = "stomp.num_acceptors."
_CIPHERS_PREFIX = "web_stomp.ssl.ciphers."

# Valid plugin keys that make no sense for the adapter: accepted, ignored, logged.
_IGNORED_KEYS = {
    "stomp.tcp_listen_options.exit_on_close",
    "stomp.tcp_listen_options.send_timeout",
    "stomp.tcp_listen_options.send_timeout_close",
    "stomp.tcp_listen_options.linger.on",
    "stomp.tcp_listen_options.linger.timeout",
    "web_stomp.num_acceptors.tcp",
    "web_stomp.num_acceptors.ssl",
    "web_stomp.ssl.backlog",
    "web_stomp.ssl.honor_cipher_order",
    "web_stomp.ssl.honor_ecc_order",
    "web_stomp.ssl.reuse_sessions",
    "web_stomp.ssl.secure_renegotiate",
    "web_stomp.ssl.client_renegotiation",
    "web_stomp.ssl.depth",
    "web_stomp.cowboy_opts.max_empty_lines",
    "web_stomp.cowboy_opts.max_header_name_length",
    "web_stomp.cowboy_opts.max_header_value_length",
    "web_stomp.cowboy_opts.max_headers",
    "web_stomp.cowboy_opts.max_keepalive",
    "web_stomp.cowboy_opts.max_request_line_length",
    "web_stomp.use_file_handle_cache",
}

# Valid plugin keys for features the adapter does not have: refused (with the reason) so nobody
# believes they are on; the plugin's default value, which is what the adapter does, is accepted.
# CRL checks: the plugin's crl_check (true, peer, best_effort) looks certificates up in Erlang's
# CRL cache, which rabbitmq.conf cannot fill (the plugin's schema has no CRL file or URL key), so
# there is no CRL source the adapter could read the same way; false is the default and accepted.
_CRL_CHECK_VALUES = ("true", "false", "peer", "best_effort")
_CRL_CHECK_REASON = (
    "the plugin checks certificates against Erlang's CRL cache, which the adapter has no "
    "equivalent of; to refuse revoked client certificates, terminate TLS at a proxy that checks "
    "a CRL (HAProxy crl-file, nginx ssl_crl) in front of a plain listener, with "
    "stomp.proxy_protocol / web_stomp.proxy_protocol to pass the client's address on"
)
_CERT_LOGIN_REASON = (
    "the plugin logs a client in by its certificate's name without a password because it runs "
    "inside the broker; a separate process has no such login (docs/compatibility.md, 'Login by "
    "certificate'): give these clients passwords (over a TLS listener), or keep the clients that "
    "need certificate login on the plugin"
)
# key -> (the converter checking its value, the accepted default, why any other value is refused)
_UNSUPPORTED: dict[str, tuple[Callable[[object], object], object, str]] = {
    "stomp.ssl_cert_login": (_to_bool, False, _CERT_LOGIN_REASON),
    "web_stomp.ssl.crl_check": (_one_of(*_CRL_CHECK_VALUES), "false", _CRL_CHECK_REASON),
    "ssl_options.crl_check": (_one_of(*_CRL_CHECK_VALUES), "false", _CRL_CHECK_REASON),
}

# Candidates offered by "did you mean".
_SUGGESTIONS = sorted(
    [
        *_KEYS,
        "stomp.listeners.tcp",
        "stomp.listeners.tcp.<name>",
        "stomp.num_acceptors.tcp",
        *_IGNORED_KEYS,
        *_WEB_COWBOY_TIMEOUT_KEYS,
    ]
)


@dataclass(frozen=True, slots=True)
class _Origin:
    """Where a value was written, for error messages: "FILE line N" and the key as written."""

    where: str
    key: str
    raw: str


@dataclass(slots=True)
class IniFile:
    """A parsed ini file: typed values by field name, and where each came from."""

    path: str
    values: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, _Origin] = field(default_factory=dict)


def _warn_ignored_listeners(listeners: dict[str, tuple[str, _Origin]], none: _Origin) -> None:
    """Log each named listener that a "stomp.listeners.<kind> = none" line overrides."""
    for _listener, origin in listeners.values():
        log.warning(
            "%s: %s is ignored because of %s = none (%s)", origin.where, origin.key, none.key, none.where
        )


def _suggest(key: str) -> str:
    if key == "loopback_users" or key.startswith("loopback_users."):
        return " (the adapter's equivalent is adapter.loopback_users, a comma-separated list or none)"
    # A misspelt listener key keeps its own name: offer "stomp.listeners.tcp.<that name>".
    candidates = [*_SUGGESTIONS, _TCP_LISTENER_PREFIX + key.rpartition(".")[2]]
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.75)
    if close:
        return f" (did you mean {close[0]!r}?)"
    if key.startswith("ssl_options."):
        # rabbitmq.conf has many more TLS options (depth, ciphers, ...): say which are
        # honoured, so that a pasted file fails with the list instead of a guess.
        read = ", ".join(k.removeprefix("ssl_options.") for k in _KEYS if k.startswith("ssl_options."))
        return f" (the ssl_options.* keys read are {read} and versions.<n>)"
    if not key.startswith(("stomp.", "adapter.", "web_stomp.")):
        return " (only stomp.*, web_stomp.*, ssl_options.* and adapter.* keys are read)"
    return ""


def _shown(field_name: str, raw: object) -> str:
    declared = DECLARED.get(field_name)
    return declared.shown(raw) if declared is not None else repr(raw)


class _IniReader:
    """The state of reading one file: what each key family has gathered so far.  One method per
    family reads one line of it (`_EXACT_KEYS`, `_KEY_PREFIXES`); `finish` combines them."""

    def __init__(self, shown_path: str) -> None:
        self.path = shown_path
        self.ini = IniFile(path=shown_path)
        self.tcp_listeners: dict[str, tuple[str, _Origin]] = {}
        self.ssl_listeners: dict[str, tuple[str, _Origin]] = {}
        self.ssl_versions: dict[str, str] = {}
        self.amqp_nodes: dict[str, tuple[str, _Origin]] = {}
        self.tcp_none: _Origin | None = None
        self.ssl_none: _Origin | None = None
        self.adapter_listeners: _Origin | None = None
        self.web_parts: dict[tuple[str, str], tuple[str, _Origin]] = {}
        self.web_ssl_versions: dict[str, str] = {}
        self.web_origins: dict[str, str] = {}
        self.web_seen: _Origin | None = None

    @staticmethod
    def fail(origin: _Origin, message: str) -> ConfigError:
        shown = _shown(_KEYS[origin.key][0] if origin.key in _KEYS else "", origin.raw)
        return ConfigError(f"{origin.where}: {origin.key} = {shown}: {message}")

    def checked(self, origin: _Origin, convert: Callable[[object], Any]) -> Any:
        try:
            return convert(origin.raw)
        except ValueError as exc:
            raise self.fail(origin, str(exc)) from None

    # ---- one handler per key family ----

    def declared(self, origin: _Origin) -> None:
        """A key that sets one declared setting."""
        name, convert = _KEYS[origin.key]
        value = self.checked(origin, convert)
        previous = self.ini.origins.get(name)
        if previous is not None and previous.key != origin.key:
            raise ConfigError(
                f"{origin.where}: {origin.key} sets the same setting as {previous.key} ({previous.where}); "
                "keep one of them"
            )
        if name == "listeners":
            self.adapter_listeners = origin
        self.ini.values[name] = value
        self.ini.origins[name] = origin

    def web_password(self, origin: _Origin) -> None:
        if origin.raw.strip().lower().startswith("encrypted:"):
            raise ConfigError(
                f"{origin.where}: {origin.key} = 'encrypted:…': values encrypted with "
                "rabbitmqctl encode need the broker's config_entry_decoder passphrase, which the "
                "adapter does not read; write the password itself (and protect the file)"
            )
        self.declared(origin)

    def web_listener_part(self, origin: _Origin) -> None:
        self.web_parts[_WEB_LISTENER_KEYS[origin.key]] = (origin.raw, origin)

    def web_ssl_version(self, origin: _Origin) -> None:
        self.web_ssl_versions[origin.key] = origin.raw

    def web_origin(self, origin: _Origin) -> None:
        self.web_origins[origin.key] = origin.raw

    def cowboy_timeout(self, origin: _Origin) -> None:
        self.checked(origin, _int_converter(0, what="an integer >= 0 (milliseconds)"))
        log.warning(
            "%s: key %r has no effect on WebSocket connections (as in the plugin, whose cowboy "
            "applies it to request bodies only) and is ignored",
            origin.where,
            origin.key,
        )

    def web_ciphers(self, origin: _Origin) -> None:
        raise ConfigError(
            f"{origin.where}: key {origin.key!r} is not supported: cipher suites use Erlang's names in the "
            "plugin; the adapter uses OpenSSL's default suites for the TLS versions allowed "
            "(web_stomp.ssl.versions.<n>)"
        )

    def tcp_listeners_none(self, origin: _Origin) -> None:
        if origin.raw.lower() != "none":
            raise self.fail(
                origin, "only 'none' is allowed here; add listeners as stomp.listeners.tcp.<name> = PORT"
            )
        self.tcp_none = origin

    def ssl_listeners_none(self, origin: _Origin) -> None:
        if origin.raw.lower() != "none":
            raise self.fail(
                origin, "only 'none' is allowed here; add listeners as stomp.listeners.ssl.<name> = PORT"
            )
        self.ssl_none = origin

    def tcp_listener(self, origin: _Origin) -> None:
        # a repeated name replaces, as in rabbitmq.conf
        self.tcp_listeners[origin.key] = (self.checked(origin, _normalise_listener), origin)

    def ssl_listener(self, origin: _Origin) -> None:
        self.ssl_listeners[origin.key] = (self.checked(origin, _normalise_listener), origin)

    def ssl_version(self, origin: _Origin) -> None:
        self.ssl_versions[origin.key] = origin.raw  # ssl_options.versions.1 = tlsv1.3 ..., in key order

    def amqp_node(self, origin: _Origin) -> None:
        try:
            url = _amqp_url(origin.raw)
        except ValueError as exc:
            raise ConfigError(f"{origin.where}: {origin.key} = {redact_url(origin.raw)!r}: {exc}") from None
        if "," in url:
            raise ConfigError(
                f"{origin.where}: {origin.key}: one node per key (a comma separates nodes elsewhere)"
            )
        self.amqp_nodes[origin.key] = (url, origin)  # a repeated name replaces, as for listeners

    def unsupported(self, origin: _Origin) -> None:
        convert, default, reason = _UNSUPPORTED[origin.key]
        if self.checked(origin, convert) == default:
            return  # the plugin's default, and what the adapter does anyway
        raise ConfigError(f"{origin.where}: key {origin.key!r} is not supported: {reason}")

    def ignored(self, origin: _Origin) -> None:
        log.warning("%s: key %r has no meaning for the adapter and is ignored", origin.where, origin.key)

    def unknown(self, origin: _Origin) -> None:
        raise ConfigError(f"{origin.where}: unknown key {origin.key!r}{_suggest(origin.key)}")

    # ---- the families that gather several lines ----

    def finish(self) -> IniFile:
        ini, path = self.ini, self.path
        if self.ssl_none is not None:
            # As in the plugin's schema (and as for TCP below), "stomp.listeners.ssl = none" wins over
            # named TLS listeners.
            _warn_ignored_listeners(self.ssl_listeners, self.ssl_none)
            ini.values["ssl_listeners"] = ()
            ini.origins["ssl_listeners"] = self.ssl_none
        elif self.ssl_listeners:
            ini.values["ssl_listeners"] = tuple(listener for listener, _origin in self.ssl_listeners.values())
            ini.origins["ssl_listeners"] = next(iter(self.ssl_listeners.values()))[1]
        if self.ssl_versions:
            keys = sorted(self.ssl_versions)
            try:
                ini.values["ssl_versions"] = _tls_versions([self.ssl_versions[k] for k in keys])
            except ValueError as exc:
                raise ConfigError(f"{path}: {keys[0]}: {exc}") from None
            ini.origins["ssl_versions"] = _Origin(path, keys[0], self.ssl_versions[keys[0]])
        if self.amqp_nodes:
            previous = ini.origins.get("amqp_url")
            first = next(iter(self.amqp_nodes.values()))[1]
            if previous is not None:
                raise ConfigError(
                    f"{first.where}: {first.key} and {previous.key} ({previous.where}) both name the broker; "
                    "keep one form"
                )
            ini.values["amqp_url"] = ",".join(url for url, _origin in self.amqp_nodes.values())
            ini.origins["amqp_url"] = first
        if self.web_seen is not None:
            _web_listeners(ini, path, self.web_parts, self.web_ssl_versions, self.web_origins, self.web_seen)
        adapter_listeners = self.adapter_listeners
        if self.tcp_listeners and adapter_listeners is not None:
            first = next(iter(self.tcp_listeners.values()))[1]
            raise ConfigError(
                f"{adapter_listeners.where}: adapter.listeners and {first.key} ({first.where}) both set the "
                "listeners; keep one of them"
            )
        if self.tcp_none is not None:
            # As in the plugin's schema, "stomp.listeners.tcp = none" wins over named listeners.
            _warn_ignored_listeners(self.tcp_listeners, self.tcp_none)
            if adapter_listeners is not None:
                raise ConfigError(
                    f"{self.tcp_none.where}: stomp.listeners.tcp = none and adapter.listeners "
                    f"({adapter_listeners.where}) both set the listeners; keep one of them"
                )
            ini.values["listeners"] = ()
            ini.origins["listeners"] = self.tcp_none
        elif self.tcp_listeners:
            ini.values["listeners"] = tuple(listener for listener, _origin in self.tcp_listeners.values())
            ini.origins["listeners"] = next(iter(self.tcp_listeners.values()))[1]
        return ini


_Handler = Callable[[_IniReader, _Origin], None]


def _exact_keys() -> dict[str, _Handler]:
    table: dict[str, _Handler] = {key: _IniReader.declared for key in _KEYS}
    families: list[tuple[Iterable[str], _Handler]] = [
        (["web_stomp.ssl.password"], _IniReader.web_password),  # also a declared key: checked first
        (_WEB_LISTENER_KEYS, _IniReader.web_listener_part),
        (_WEB_COWBOY_TIMEOUT_KEYS, _IniReader.cowboy_timeout),
        (["stomp.listeners.tcp"], _IniReader.tcp_listeners_none),
        (["stomp.listeners.ssl"], _IniReader.ssl_listeners_none),
        (_UNSUPPORTED, _IniReader.unsupported),
        (_IGNORED_KEYS, _IniReader.ignored),
    ]
    for keys, handler in families:
        for key in keys:
            if key in table and key != "web_stomp.ssl.password":
                raise TypeError(f"ini key {key} belongs to two families")
            table[key] = handler
    return table


# Keys read by one handler each, then families named by a prefix (a key longer than the prefix).
_EXACT_KEYS = _exact_keys()
_KEY_PREFIXES: tuple[tuple[str, _Handler], ...] = (
    (_WEB_SSL_VERSIONS_PREFIX, _IniReader.web_ssl_version),
    (_WEB_ALLOW_ORIGINS_PREFIX, _IniReader.web_origin),
    (_CIPHERS_PREFIX, _IniReader.web_ciphers),
    (_TCP_LISTENER_PREFIX, _IniReader.tcp_listener),
    (_AMQP_NODE_PREFIX, _IniReader.amqp_node),
    (_SSL_LISTENER_PREFIX, _IniReader.ssl_listener),
    (_SSL_VERSIONS_PREFIX, _IniReader.ssl_version),
    (_ACCEPTORS_PREFIX, _IniReader.ignored),
)


def _handler(key: str) -> _Handler:
    handler = _EXACT_KEYS.get(key)
    if handler is not None:
        return handler
    for prefix, family in _KEY_PREFIXES:
        if key.startswith(prefix) and len(key) > len(prefix):
            return family
    return _IniReader.unknown


def read_ini(path: str | os.PathLike[str]) -> IniFile:
    """Read and validate a rabbitmq.conf-style file; raise ConfigError on the first problem."""
    shown_path = os.fspath(path)
    try:
        with open(path, encoding="utf-8-sig") as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        raise ConfigError(f"configuration file {shown_path!r} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"cannot read configuration file {shown_path!r}: {reason}") from None

    reader = _IniReader(shown_path)
    for number, line in enumerate(lines, start=1):
        where = f"{shown_path} line {number}"
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        text = re.split(r"\s#", text, maxsplit=1)[0].strip()  # a trailing " # comment"
        if text.startswith("["):
            raise ConfigError(
                f"{where}: section headers such as {text!r} are not supported; write 'key = value'"
            )
        key, equals, raw = text.partition("=")
        key, raw = key.strip(), raw.strip()
        if not equals or not key or re.search(r"\s", key):
            raise ConfigError(f"{where}: expected 'key = value', got {text!r}")
        origin = _Origin(where, key, raw)
        if key.startswith("web_stomp.") and reader.web_seen is None:
            reader.web_seen = origin  # any web_stomp.* key starts the WebSocket listener (the plugin enabled)
        _handler(key)(reader, origin)
    return reader.finish()


def _web_listener(
    kind: str, parts: dict[tuple[str, str], tuple[str, _Origin]], default_port: int | None
) -> str | None:
    """One web_stomp listener from its .listener, .ip and .port keys (as the plugin's schema
    combines them: .listener wins, and ``.listener = none`` means no such listener)."""
    listener = parts.get((kind, "listener"))
    if listener is not None:
        raw, origin = listener
        if raw.strip().lower() == "none":
            for part in ("ip", "port"):
                ignored = parts.get((kind, part))
                if ignored is not None:
                    log.warning(
                        "%s: %s is ignored because of %s = none (%s)",
                        ignored[1].where,
                        ignored[1].key,
                        origin.key,
                        origin.where,
                    )
            return None
        try:
            return _normalise_listener(raw)
        except ValueError as exc:
            raise ConfigError(f"{origin.where}: {origin.key} = {raw!r}: {exc}") from None
    port = parts.get((kind, "port"))
    ip = parts.get((kind, "ip"))
    if port is None and default_port is None:
        return None
    port_text = port[0] if port is not None else str(default_port)
    if port is not None and not port_text.isdigit():
        raise ConfigError(f"{port[1].where}: {port[1].key} = {port_text!r}: must be a port from 0 to 65535")
    host = ip[0] if ip is not None else "0.0.0.0"
    text = f"[{host}]:{port_text}" if ":" in host else f"{host}:{port_text}"
    try:
        return _normalise_listener(text)
    except ValueError as exc:
        culprit = ip[1] if ip is not None else port[1] if port is not None else None
        where = f"{culprit.where}: {culprit.key}" if culprit else "web_stomp listener"
        raise ConfigError(f"{where}: {exc}") from None


def _web_listeners(
    ini: IniFile,
    shown_path: str,
    parts: dict[tuple[str, str], tuple[str, _Origin]],
    ssl_versions: dict[str, str],
    origins: dict[str, str],
    first: _Origin,
) -> None:
    """The WebSocket listeners the web_stomp.* keys of one file ask for."""
    tcp = _web_listener("tcp", parts, _WEB_STOMP_DEFAULT_PORT)
    ini.values["web_stomp_listeners"] = (tcp,) if tcp is not None else ()  # None: wss:// only
    ini.origins["web_stomp_listeners"] = parts.get(
        ("tcp", "listener"), parts.get(("tcp", "port"), (None, first))
    )[1]
    ssl_listener = _web_listener("ssl", parts, None)
    if ssl_listener is not None:
        ini.values["web_stomp_ssl_listeners"] = (ssl_listener,)
        ini.origins["web_stomp_ssl_listeners"] = next(
            origin for (kind, _part), (_raw, origin) in parts.items() if kind == "ssl"
        )
    if ssl_versions:
        keys = sorted(ssl_versions)
        try:
            ini.values["web_stomp_ssl_versions"] = _tls_versions([ssl_versions[k] for k in keys])
        except ValueError as exc:
            raise ConfigError(f"{shown_path}: {keys[0]}: {exc}") from None
        ini.origins["web_stomp_ssl_versions"] = _Origin(shown_path, keys[0], ssl_versions[keys[0]])
    if origins:
        whole = ini.origins.get("web_stomp_allow_origins")
        if whole is not None and whole.raw.strip().lower() == "none":
            # as in the plugin's schema: "web_stomp.allow_origins = none" wins over the list
            log.warning(
                "%s: web_stomp.allow_origins.<n> keys are ignored because of %s = none (%s)",
                shown_path,
                whole.key,
                whole.where,
            )
            return
        if whole is not None:
            raise ConfigError(
                f"{shown_path}: web_stomp.allow_origins and web_stomp.allow_origins.<name> both set the "
                "allowed origins; keep one form"
            )
        keys = sorted(origins)
        ini.values["web_stomp_allow_origins"] = tuple(origins[k].strip() for k in keys if origins[k].strip())
        ini.origins["web_stomp_allow_origins"] = _Origin(shown_path, keys[0], origins[keys[0]])


# --------------------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------------------


def _env_var(field_name: str, environ: Mapping[str, str]) -> str | None:
    wanted = DECLARED[field_name].env
    for name in environ:
        if name.upper() == wanted:
            return name
    return None


def _warn_unknown_env(environ: Mapping[str, str]) -> None:
    # A warning, not an error: other tools may share the prefix, and the environment is not ours alone.
    env_names = {declared.env for declared in DECLARED.values()}
    for name in environ:
        upper = name.upper()
        if upper.startswith(ENV_PREFIX) and upper not in env_names:
            close = difflib.get_close_matches(upper, list(env_names), n=1, cutoff=0.75)
            hint = f" (did you mean {close[0]}?)" if close else ""
            log.warning("environment variable %s is not an adapter setting and is ignored%s", name, hint)


def _describe(
    field_name: str, overrides: Mapping[str, object], environ: Mapping[str, str], ini: IniFile | None
) -> str:
    """'<where>: <key> = <value>' for the source whose value won, as the operator wrote it."""
    declared = DECLARED[field_name]
    if field_name in overrides:
        flag = declared.setting.flag
        where = f"command line: {flag.option}" if flag else f"override: {field_name}"
        return f"{where} = {declared.shown(overrides[field_name])}"
    env_name = _env_var(field_name, environ)
    if env_name is not None:
        return f"environment: {env_name} = {declared.shown(environ[env_name])}"
    if ini is not None and field_name in ini.origins:
        origin = ini.origins[field_name]
        return f"{origin.where}: {origin.key} = {declared.shown(origin.raw)}"
    return f"setting {field_name}"


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
    raises `ConfigError` naming the key, the value and what is allowed (every bad value at once, in
    declaration order, one per line).
    """
    given = {name: value for name, value in (overrides or {}).items() if value is not None}
    for name in given:
        if name not in DECLARED:
            close = difflib.get_close_matches(name, list(DECLARED), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"override: unknown setting {name!r}{hint}")

    ini = read_ini(config_file) if config_file is not None else None
    environ = dict(os.environ)
    _warn_unknown_env(environ)

    # First wins: command line, then environment, then the ini file (its values already converted,
    # each error reported with its line), then the declared default.
    values: dict[str, Any] = {}
    problems = []
    for name, declared in DECLARED.items():
        env_name = _env_var(name, environ)
        if name in given:
            raw = given[name]
        elif env_name is not None:
            raw = environ[env_name]
        elif ini is not None and name in ini.values:
            values[name] = ini.values[name]
            continue
        else:
            continue
        try:
            values[name] = declared.setting.convert(raw)
        except ValueError as exc:
            problems.append(f"{_describe(name, given, environ, ini)}: {exc}")
    if problems:
        raise ConfigError("\n".join(problems))
    try:
        return Settings(**values)
    except ValidationError as exc:  # a converter let through a value of the wrong type
        lines = []
        for error in exc.errors():
            loc = error.get("loc") or ()
            name = str(loc[0]) if loc else ""
            where = _describe(name, given, environ, ini) if name in DECLARED else name or "settings"
            lines.append(f"{where}: {_error_text(error)}")
        raise ConfigError("\n".join(lines)) from None
