"""Loading and validating the adapter's settings.

This module owns the adapter's configuration: the `Settings` model (frozen, the plain values the rest of
the adapter takes), reading the rabbitmq.conf-style ini file, reading ``STOMP_ADAPTER_*`` environment
variables, merging command-line overrides, and turning every mistake into a `ConfigError` that names the
key as the operator wrote it, the bad value and what is allowed.

It is the only module of the adapter that imports pydantic; nothing here touches sockets or the event loop.

Precedence, highest first: command line (``overrides``) > environment > ini file > defaults.
"""

from __future__ import annotations

import contextvars
import difflib
import ipaddress
import json
import logging
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

__all__ = [
    "ENV_PREFIX",
    "ConfigError",
    "IniFile",
    "IniSettingsSource",
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


def redact_url(url: str) -> str:
    """Return *url* with any password replaced by ``***`` (for logs and error messages); a
    comma-separated list of URLs (several broker nodes) URL by URL."""
    if "," in url:
        return ",".join(redact_url(part) for part in url.split(","))
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
    for item in value.split(","):
        url = item.strip()
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


_CONVERTERS: dict[str, Callable[[object], Any]] = {
    "listeners": _listeners,
    "amqp_url": _amqp_url,
    "ssl_listeners": _listeners,
    "ssl_cacertfile": _optional_path,
    "ssl_certfile": _optional_path,
    "ssl_keyfile": _optional_path,
    "ssl_password": _optional_path,
    "ssl_verify": _one_of("verify_none", "verify_peer"),
    "ssl_fail_if_no_peer_cert": _to_bool,
    "ssl_versions": _tls_versions,
    "amqp_node_order": _one_of("round_robin", "shuffle"),
    "amqp_tls_cafile": _optional_path,
    "amqp_tls_certfile": _optional_path,
    "amqp_tls_keyfile": _optional_path,
    "amqp_tls_verify": _to_bool,
    "amqp_tls_server_name": _optional_path,
    "amqp_tls_min_version": _one_of("tlsv1.2", "tlsv1.3"),
    "default_user": _credential,
    "default_pass": _credential,
    "default_vhost": _non_empty_str,
    "implicit_connect": _to_bool,
    "hide_server_info": _to_bool,
    "default_nack_requeue": _to_bool,
    "proxy_protocol": _to_bool,
    "proxy_protocol_trusted": _trusted_peers,
    "default_topic_exchange": _non_empty_str,
    "max_frame_size": _int_converter(1),
    "max_frame_size_unauthenticated": _int_converter(1),
    "max_headers": _int_converter(1),
    "max_header_length": _int_converter(1),
    "login_timeout": _float_converter(0, inclusive=False),
    "frame_timeout": _float_converter(0, inclusive=True),
    "incomplete_frames_budget": _int_converter(1),
    "max_transaction_bytes": _int_converter(1),
    "transaction_bytes_budget": _int_converter(1),
    "max_unacked_bytes": _int_converter(1),
    "unacked_bytes_budget": _int_converter(1),
    "heartbeat_tolerance": _float_converter(1, inclusive=True, unit=""),
    "shutdown_timeout": _float_converter(0, inclusive=True),
    "amqp_connect_timeout": _float_converter(0, inclusive=False),
    "amqp_heartbeat": _int_converter(0, 65535, what="an integer from 0 to 65535 (seconds, 0 disables)"),
    "amqp_connection_reuse": _to_bool,
    "amqp_connection_idle_seconds": _float_converter(0, inclusive=False),
    "amqp_connection_max_age_seconds": _float_converter(0, inclusive=False),
    "amqp_connection_pool_size": _int_converter(1),
    # connection caps (adapter/caps.py): None is infinity
    "max_connections": _connection_cap,
    "web_stomp_max_connections": _connection_cap,
    "loopback_users": _user_list,
    "tcp_backlog": _int_converter(1),
    "tcp_nodelay": _to_bool,
    "tcp_keepalive": _to_bool,
    "tcp_sndbuf": _optional(_int_converter(1), "(or none for the OS default)"),
    "tcp_recbuf": _optional(_int_converter(1), "(or none for the OS default)"),
    "log_level": _log_level,
    "log_format": _one_of("text", "json"),
    "http_listen": _http_listen,
    "workers": _int_converter(1, 256),
    "metrics_destinations": _int_converter(0, 10_000),
    "trailing_lf": _to_bool,
    "web_stomp_listeners": _listeners,
    "web_stomp_ssl_listeners": _listeners,
    "web_stomp_ssl_certfile": _optional_path,
    "web_stomp_ssl_keyfile": _optional_path,
    "web_stomp_ssl_cacertfile": _optional_path,
    "web_stomp_ssl_password": _optional_path,
    "web_stomp_ssl_versions": _tls_versions,
    "web_stomp_backlog": _int_converter(1),
    "web_stomp_ws_path": _ws_path,
    "web_stomp_ws_frame": _one_of("text", "binary"),
    # 0 is valid in the plugin's schema: cowboy then refuses every non-empty message with 1009
    "web_stomp_max_frame_size": _optional(_int_converter(0), "(or none for no limit)"),
    "web_stomp_use_http_auth": _to_bool,
    "web_stomp_compress": _to_bool,
    "web_stomp_idle_timeout": _float_converter(0, inclusive=True),
    "web_stomp_request_timeout": _float_converter(0, inclusive=False),
    "web_stomp_allow_origins": _origins,
    "web_stomp_proxy_protocol": _to_bool,
    "web_stomp_hsts_policy": _optional_path,
    "web_stomp_console": _to_bool,
    "web_stomp_compress_budget": _int_converter(0),
    "profile": _one_of("rabbitmq", "activemq"),
    "activemq_listeners": _listeners,
}


# --------------------------------------------------------------------------------------------------------
# The settings model
# --------------------------------------------------------------------------------------------------------


class Settings(BaseSettings):
    """Every setting of the adapter, validated and frozen.  Build it with `load_settings`."""

    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",
        env_prefix=ENV_PREFIX,
        case_sensitive=False,
        validate_default=True,
    )

    # Listening sockets, normalised "host:port" ("[v6]:port" for IPv6).  Empty: listen nowhere.
    listeners: Annotated[tuple[str, ...], NoDecode] = ("0.0.0.0:61613",)
    # TLS listeners (stomp.listeners.ssl.<name>) and the rabbitmq.conf ssl_options.* they use.
    ssl_listeners: Annotated[tuple[str, ...], NoDecode] = ()
    ssl_cacertfile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: str | None = Field(default=None, repr=False)
    ssl_verify: Literal["verify_none", "verify_peer"] = "verify_none"
    ssl_fail_if_no_peer_cert: bool = False
    ssl_versions: Annotated[tuple[str, ...], NoDecode] = ()
    # Where the broker is.  STOMP sessions log in with the CONNECT frame's credentials (or the defaults).
    amqp_url: str = "amqp://guest:guest@localhost:5672/"
    # With several nodes: the order a login tries them in (docs/behaviour.md, "Broker nodes").
    amqp_node_order: Literal["round_robin", "shuffle"] = "round_robin"
    # TLS to amqps:// nodes: CA file (None: Python's default trust store), client certificate
    # and key (brokers that require mutual TLS), peer verification, the name the certificate
    # must carry (None: the node's host name), the lowest protocol version accepted.
    amqp_tls_cafile: str | None = None
    amqp_tls_certfile: str | None = None
    amqp_tls_keyfile: str | None = None
    amqp_tls_verify: bool = True
    amqp_tls_server_name: str | None = None
    amqp_tls_min_version: str = "tlsv1.2"
    # Used when CONNECT has no login/passcode (and for implicit connect); None disables.
    default_user: str | None = "guest"
    default_pass: str | None = Field(default="guest", repr=False)
    default_vhost: str = "/"
    implicit_connect: bool = False
    hide_server_info: bool = False
    default_nack_requeue: bool = True
    proxy_protocol: bool = False
    # peers whose PROXY header (stomp. and web_stomp.proxy_protocol) is believed; empty: every
    # peer, as in the plugins (adapter/server/proxy_protocol.py, ProxyTrust)
    proxy_protocol_trusted: Annotated[tuple[str, ...], NoDecode] = ()
    default_topic_exchange: str = "amq.topic"
    max_frame_size: int = 4 * 1024 * 1024
    max_frame_size_unauthenticated: int = 65536
    max_headers: int = 100
    max_header_length: int = 102400
    # Seconds (the ini key stomp.login_timeout is in milliseconds, as in the plugin).
    login_timeout: float = 10.0
    # Seconds a client has to complete a frame once it has started sending it; 0: no limit.
    frame_timeout: float = 60.0
    # Bytes all connections together may hold in frames they have not completed.
    incomplete_frames_budget: int = 256 * 1024 * 1024
    # Bytes of SEND bodies in open transactions: per connection, and all connections together.
    # activemq profile: bytes of unacknowledged client-ack deliveries kept for NACK, likewise.
    # (docs/configuration.md, "Byte budgets", argues the defaults)
    max_transaction_bytes: int = 64 * 1024 * 1024
    transaction_bytes_budget: int = 1024 * 1024 * 1024
    max_unacked_bytes: int = 64 * 1024 * 1024
    unacked_bytes_budget: int = 1024 * 1024 * 1024
    # Factor applied to the client's heart-beat interval before the connection is declared dead.
    heartbeat_tolerance: float = 1.5
    shutdown_timeout: float = 10.0
    amqp_connect_timeout: float = 10.0
    amqp_heartbeat: int = 60
    # Reuse a STOMP session's AMQP connection for the next CONNECT of the same user, vhost and
    # passcode (adapter/server/amqp_pool.py, docs/configuration.md): off by default.  Idle
    # pooled connections close after idle_seconds, every one max_age_seconds after the broker
    # authenticated it; at most pool_size idle ones per process.
    amqp_connection_reuse: bool = False
    amqp_connection_idle_seconds: float = 5.0
    amqp_connection_max_age_seconds: float = 60.0
    amqp_connection_pool_size: int = 100
    # Connection caps (adapter/caps.py, docs/configuration.md "Connection caps"); None: no cap.
    # max_connections: STOMP sessions of every listener (TCP, TLS, WebSocket), counted from
    # CONNECT to close, the CONNECT over it refused; web_stomp_max_connections: the sockets of
    # each web_stomp listener, the request over it answered 503.  With --workers N each
    # process applies the ceiling of the value / N.
    max_connections: int | None = None
    web_stomp_max_connections: int | None = None
    # Users that may only log in when the STOMP client connects from a loopback address.
    loopback_users: Annotated[tuple[str, ...], NoDecode] = ("guest",)
    tcp_backlog: int = 128
    tcp_nodelay: bool = True
    tcp_keepalive: bool = False
    tcp_sndbuf: int | None = None
    tcp_recbuf: int | None = None
    log_level: str = "INFO"
    # "text": one human-readable line per event; "json": one JSON object per line (log shippers)
    log_format: Literal["text", "json"] = "text"
    # HOST:PORT of the HTTP listener for /metrics, /healthz and /readyz; None: no HTTP port
    http_listen: str | None = None
    # adapter processes sharing the listeners; 1: this process serves everything itself
    # (adapter/server/workers.py and docs/architecture.md, "Workers")
    workers: int = 1
    # per-destination metric series: at most this many destinations per process get their own,
    # later ones count as "other"; 0: no per-destination series (adapter/server/stats.py)
    metrics_destinations: int = 0
    # Append LF after the NUL of every outgoing frame, as the plugin does.
    trailing_lf: bool = True
    # STOMP over WebSocket (the web_stomp.* keys of rabbitmq_web_stomp).  No listener unless a
    # web_stomp.* key is in the ini file (then web_stomp.tcp.port, default 15674) or the
    # STOMP_ADAPTER_WEB_STOMP_LISTENERS variable names some.
    web_stomp_listeners: Annotated[tuple[str, ...], NoDecode] = ()
    web_stomp_ssl_listeners: Annotated[tuple[str, ...], NoDecode] = ()
    web_stomp_ssl_certfile: str | None = None
    web_stomp_ssl_keyfile: str | None = None
    web_stomp_ssl_cacertfile: str | None = None
    web_stomp_ssl_password: str | None = Field(default=None, repr=False)
    web_stomp_ssl_versions: Annotated[tuple[str, ...], NoDecode] = ()
    web_stomp_backlog: int = 1024
    web_stomp_ws_path: str = "/ws"
    web_stomp_ws_frame: Literal["text", "binary"] = "text"
    # bytes per WebSocket message; None: no limit (the STOMP frame limits still apply)
    web_stomp_max_frame_size: int | None = None
    web_stomp_use_http_auth: bool = False
    web_stomp_compress: bool = True
    # seconds (the ini keys are in milliseconds, as in the plugin)
    web_stomp_idle_timeout: float = 60.0
    # seconds a new connection has for its HTTP request: cowboy's request_timeout, which the
    # plugin leaves at 5 s (its cowboy_opts.idle_timeout only times request bodies)
    web_stomp_request_timeout: float = 5.0
    web_stomp_allow_origins: Annotated[tuple[str, ...], NoDecode] = ()
    web_stomp_proxy_protocol: bool = False
    web_stomp_hsts_policy: str | None = None
    web_stomp_console: bool = True
    # bytes of permessage-deflate state all WebSockets together may hold (adapter-only)
    web_stomp_compress_budget: int = 256 * 1024 * 1024
    # The STOMP dialect of every listener: the plugin's (rabbitmq) or ActiveMQ's
    # (docs/migration-activemq.md).
    profile: Literal["rabbitmq", "activemq"] = "rabbitmq"
    # plain TCP listeners that always speak the activemq profile, beside the others (a migration
    # serves RabbitMQ-style and legacy ActiveMQ clients from one adapter)
    activemq_listeners: Annotated[tuple[str, ...], NoDecode] = ()

    @field_validator("*", mode="before")
    @classmethod
    def _convert(cls, value: object, info: Any) -> object:
        return _CONVERTERS[info.field_name](value)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # First wins: command line, then environment, then the ini file given to load_settings.
        # No .env or secrets-directory sources: the adapter reads nothing the operator did not name.
        return init_settings, env_settings, IniSettingsSource(settings_cls, _ACTIVE_INI.get())


# Every field must have a converter (the wildcard validator looks them up by name).
assert set(_CONVERTERS) == set(Settings.model_fields), set(_CONVERTERS) ^ set(Settings.model_fields)


# --------------------------------------------------------------------------------------------------------
# The ini file (rabbitmq.conf style)
# --------------------------------------------------------------------------------------------------------

# rabbitmq.conf keys of the STOMP plugin, accepted unchanged.
_STOMP_KEYS: dict[str, str] = {
    "stomp.default_user": "default_user",
    "stomp.default_pass": "default_pass",
    "stomp.default_vhost": "default_vhost",
    "stomp.implicit_connect": "implicit_connect",
    "stomp.max_frame_size": "max_frame_size",
    "stomp.max_frame_size_unauthenticated": "max_frame_size_unauthenticated",
    "stomp.default_topic_exchange": "default_topic_exchange",
    "stomp.hide_server_info": "hide_server_info",
    "stomp.default_nack_requeue": "default_nack_requeue",
    "stomp.proxy_protocol": "proxy_protocol",
    "stomp.login_timeout": "login_timeout",  # milliseconds, see _read_value
    "stomp.max_connections": "max_connections",
    "stomp.tcp_listen_options.backlog": "tcp_backlog",
    "stomp.tcp_listen_options.nodelay": "tcp_nodelay",
    "stomp.tcp_listen_options.keepalive": "tcp_keepalive",
    "stomp.tcp_listen_options.sndbuf": "tcp_sndbuf",
    "stomp.tcp_listen_options.recbuf": "tcp_recbuf",
}

# rabbitmq.conf's TLS options (used by stomp.listeners.ssl.<name>), accepted unchanged.
_SSL_OPTION_KEYS: dict[str, str] = {
    "ssl_options.cacertfile": "ssl_cacertfile",
    "ssl_options.certfile": "ssl_certfile",
    "ssl_options.keyfile": "ssl_keyfile",
    "ssl_options.password": "ssl_password",
    "ssl_options.verify": "ssl_verify",
    "ssl_options.fail_if_no_peer_cert": "ssl_fail_if_no_peer_cert",
}
_SSL_VERSIONS_PREFIX = "ssl_options.versions."

# The adapter's own keys.
_ADAPTER_KEYS: dict[str, str] = {
    f"adapter.{name}": name
    for name in (
        "listeners",
        "amqp_url",
        "amqp_node_order",
        "amqp_tls_cafile",
        "amqp_tls_certfile",
        "amqp_tls_keyfile",
        "amqp_tls_verify",
        "amqp_tls_server_name",
        "amqp_tls_min_version",
        "max_frame_size_unauthenticated",
        "max_headers",
        "max_header_length",
        "login_timeout",
        "frame_timeout",
        "incomplete_frames_budget",
        "max_transaction_bytes",
        "transaction_bytes_budget",
        "max_unacked_bytes",
        "unacked_bytes_budget",
        "heartbeat_tolerance",
        "shutdown_timeout",
        "amqp_connect_timeout",
        "amqp_heartbeat",
        "amqp_connection_reuse",
        "amqp_connection_idle_seconds",
        "amqp_connection_max_age_seconds",
        "amqp_connection_pool_size",
        "loopback_users",
        "proxy_protocol_trusted",
        "log_level",
        "log_format",
        "http_listen",
        "workers",
        "metrics_destinations",
        "trailing_lf",
        "profile",
        "activemq_listeners",
    )
}

# rabbitmq.conf keys of the web_stomp plugin, accepted unchanged (the listener keys are below).
_WEB_STOMP_KEYS: dict[str, str] = {
    "web_stomp.ws_path": "web_stomp_ws_path",
    "web_stomp.ws_frame": "web_stomp_ws_frame",
    "web_stomp.use_http_auth": "web_stomp_use_http_auth",
    "web_stomp.proxy_protocol": "web_stomp_proxy_protocol",
    "web_stomp.allow_origins": "web_stomp_allow_origins",
    "web_stomp.hsts.policy": "web_stomp_hsts_policy",
    "web_stomp.tcp.backlog": "web_stomp_backlog",
    "web_stomp.max_connections": "web_stomp_max_connections",
    "web_stomp.ws_opts.compress": "web_stomp_compress",
    "web_stomp.ws_opts.max_frame_size": "web_stomp_max_frame_size",
    "web_stomp.max_frame_size": "web_stomp_max_frame_size",  # the name issue #11 uses
    "web_stomp.ws_opts.idle_timeout": "web_stomp_idle_timeout",  # milliseconds
    "web_stomp.ssl.certfile": "web_stomp_ssl_certfile",
    "web_stomp.ssl.keyfile": "web_stomp_ssl_keyfile",
    "web_stomp.ssl.cacertfile": "web_stomp_ssl_cacertfile",
    "web_stomp.ssl.password": "web_stomp_ssl_password",
    "adapter.web_stomp_console": "web_stomp_console",
    "adapter.web_stomp_compress_budget": "web_stomp_compress_budget",
}
_MILLISECOND_KEYS = {
    "stomp.login_timeout",
    "web_stomp.ws_opts.idle_timeout",
}
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

_KEYS = {**_STOMP_KEYS, **_SSL_OPTION_KEYS, **_ADAPTER_KEYS, **_WEB_STOMP_KEYS}

_TCP_LISTENER_PREFIX = "stomp.listeners.tcp."
_AMQP_NODE_PREFIX = "adapter.amqp_url."  # one broker node per key, like stomp.listeners.tcp.<name>
_SSL_LISTENER_PREFIX = "stomp.listeners.ssl."
_ACCEPTORS_PREFIX = "stomp.num_acceptors."

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

# Valid plugin keys for features the adapter does not have: refused so nobody believes they are on.
_UNSUPPORTED_KEYS = {
    "stomp.ssl_cert_login",
    "web_stomp.ssl.crl_check",
    "ssl_options.crl_check",
}
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
_UNSUPPORTED_REASONS = {
    "web_stomp.ssl.crl_check": _CRL_CHECK_REASON,
    "ssl_options.crl_check": _CRL_CHECK_REASON,
    "stomp.ssl_cert_login": (
        "the plugin logs a client in by its certificate's name without a password because it runs "
        "inside the broker; a separate process has no such login (docs/compatibility.md, 'Login by "
        "certificate'): give these clients passwords (over a TLS listener), or keep the clients that "
        "need certificate login on the plugin"
    ),
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
        read = ", ".join(k.removeprefix("ssl_options.") for k in _SSL_OPTION_KEYS)
        return f" (the ssl_options.* keys read are {read} and versions.<n>)"
    if not key.startswith(("stomp.", "adapter.", "web_stomp.")):
        return " (only stomp.*, web_stomp.*, ssl_options.* and adapter.* keys are read)"
    return ""


def _shown(field_name: str, raw: object) -> str:
    if field_name == "amqp_url" and isinstance(raw, str):
        return repr(redact_url(raw))
    if field_name == "default_pass":
        return "'***'"
    return repr(raw)


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

    ini = IniFile(path=shown_path)
    tcp_listeners: dict[str, tuple[str, _Origin]] = {}
    ssl_listeners: dict[str, tuple[str, _Origin]] = {}
    ssl_versions: dict[str, str] = {}
    amqp_nodes: dict[str, tuple[str, _Origin]] = {}
    tcp_none: _Origin | None = None
    ssl_none: _Origin | None = None
    adapter_listeners: _Origin | None = None
    web_parts: dict[tuple[str, str], tuple[str, _Origin]] = {}
    web_ssl_versions: dict[str, str] = {}
    web_origins: dict[str, str] = {}
    web_seen: _Origin | None = None

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

        def fail(message: str, origin: _Origin = origin) -> ConfigError:
            shown = _shown(_KEYS.get(origin.key, ""), origin.raw)
            return ConfigError(f"{origin.where}: {origin.key} = {shown}: {message}")

        if key.startswith("web_stomp.") and web_seen is None:
            web_seen = origin  # any web_stomp.* key starts the WebSocket listener (the plugin enabled)
        if key in _WEB_LISTENER_KEYS:
            web_parts[_WEB_LISTENER_KEYS[key]] = (raw, origin)
            continue
        if key.startswith(_WEB_SSL_VERSIONS_PREFIX) and len(key) > len(_WEB_SSL_VERSIONS_PREFIX):
            web_ssl_versions[key] = raw
            continue
        if key.startswith(_WEB_ALLOW_ORIGINS_PREFIX) and len(key) > len(_WEB_ALLOW_ORIGINS_PREFIX):
            web_origins[key] = raw
            continue
        if key in _WEB_COWBOY_TIMEOUT_KEYS:
            try:
                _int_converter(0, what="an integer >= 0 (milliseconds)")(raw)
            except ValueError as exc:
                raise fail(str(exc)) from None
            log.warning(
                "%s: key %r has no effect on WebSocket connections (as in the plugin, whose cowboy "
                "applies it to request bodies only) and is ignored",
                where,
                key,
            )
            continue
        if key == "web_stomp.ssl.password" and raw.strip().lower().startswith("encrypted:"):
            raise ConfigError(
                f"{where}: {key} = 'encrypted:…': values encrypted with "
                "rabbitmqctl encode need the broker's config_entry_decoder passphrase, which the "
                "adapter does not read; write the password itself (and protect the file)"
            )
        if key.startswith("web_stomp.ssl.ciphers."):
            raise ConfigError(
                f"{where}: key {key!r} is not supported: cipher suites use Erlang's names in the plugin; "
                "the adapter uses OpenSSL's default suites for the TLS versions allowed "
                "(web_stomp.ssl.versions.<n>)"
            )
        if key == "stomp.listeners.tcp":
            if raw.lower() != "none":
                raise fail("only 'none' is allowed here; add listeners as stomp.listeners.tcp.<name> = PORT")
            tcp_none = origin
            continue
        if key == "stomp.listeners.ssl":
            if raw.lower() != "none":
                raise fail("only 'none' is allowed here; add listeners as stomp.listeners.ssl.<name> = PORT")
            ssl_none = origin
            continue
        if key.startswith(_TCP_LISTENER_PREFIX) and len(key) > len(_TCP_LISTENER_PREFIX):
            try:
                listener = _normalise_listener(raw)
            except ValueError as exc:
                raise fail(str(exc)) from None
            tcp_listeners[key] = (listener, origin)  # a repeated name replaces, as in rabbitmq.conf
            continue
        if key.startswith(_AMQP_NODE_PREFIX) and len(key) > len(_AMQP_NODE_PREFIX):
            try:
                url = _amqp_url(raw)
            except ValueError as exc:
                raise ConfigError(f"{where}: {key} = {redact_url(raw)!r}: {exc}") from None
            if "," in url:
                raise ConfigError(f"{where}: {key}: one node per key (a comma separates nodes elsewhere)")
            amqp_nodes[key] = (url, origin)  # a repeated name replaces, as for listeners
            continue
        if key.startswith(_SSL_LISTENER_PREFIX) and len(key) > len(_SSL_LISTENER_PREFIX):
            try:
                listener = _normalise_listener(raw)
            except ValueError as exc:
                raise fail(str(exc)) from None
            ssl_listeners[key] = (listener, origin)
            continue
        if key.startswith(_SSL_VERSIONS_PREFIX) and len(key) > len(_SSL_VERSIONS_PREFIX):
            ssl_versions[key] = raw  # ssl_options.versions.1 = tlsv1.3 and so on, in key order
            continue
        if key in _UNSUPPORTED_KEYS:
            if key == "stomp.ssl_cert_login":
                try:
                    if not _to_bool(raw):
                        continue  # false is the plugin's default and what the adapter does anyway
                except ValueError as exc:
                    raise fail(str(exc)) from None
            if key in ("web_stomp.ssl.crl_check", "ssl_options.crl_check"):
                try:
                    if _one_of(*_CRL_CHECK_VALUES)(raw) == "false":
                        continue  # the plugin's default: no CRL check, as the adapter does
                except ValueError as exc:
                    raise fail(str(exc)) from None
            if key in _UNSUPPORTED_REASONS:
                raise ConfigError(f"{where}: key {key!r} is not supported: {_UNSUPPORTED_REASONS[key]}")
            raise ConfigError(f"{where}: key {key!r} is not supported by the adapter (yet)")
        if key.startswith(_ACCEPTORS_PREFIX) or key in _IGNORED_KEYS:
            log.warning("%s: key %r has no meaning for the adapter and is ignored", where, key)
            continue
        if key not in _KEYS:
            raise ConfigError(f"{where}: unknown key {key!r}{_suggest(key)}")

        name = _KEYS[key]
        try:
            if key in _MILLISECOND_KEYS:
                minimum = 0 if key == "web_stomp.ws_opts.idle_timeout" else 1
                what = "a positive integer (milliseconds)" if minimum else "an integer >= 0 (milliseconds)"
                value: Any = _int_converter(minimum, what=what)(raw) / 1000
            else:
                value = _CONVERTERS[name](raw)
        except ValueError as exc:
            raise fail(str(exc)) from None
        previous = ini.origins.get(name)
        if previous is not None and previous.key != key:
            raise ConfigError(
                f"{where}: {key} sets the same setting as {previous.key} ({previous.where}); keep one of them"
            )
        if name == "listeners":
            adapter_listeners = origin
        ini.values[name] = value
        ini.origins[name] = origin

    if ssl_none is not None:
        # As in the plugin's schema (and as for TCP below), "stomp.listeners.ssl = none" wins over
        # named TLS listeners.
        _warn_ignored_listeners(ssl_listeners, ssl_none)
        ini.values["ssl_listeners"] = ()
        ini.origins["ssl_listeners"] = ssl_none
    elif ssl_listeners:
        ini.values["ssl_listeners"] = tuple(listener for listener, _origin in ssl_listeners.values())
        ini.origins["ssl_listeners"] = next(iter(ssl_listeners.values()))[1]
    if ssl_versions:
        ordered = [ssl_versions[k] for k in sorted(ssl_versions)]
        first_key = sorted(ssl_versions)[0]
        try:
            ini.values["ssl_versions"] = _tls_versions(ordered)
        except ValueError as exc:
            raise ConfigError(f"{shown_path}: {first_key}: {exc}") from None
        ini.origins["ssl_versions"] = _Origin(shown_path, first_key, ssl_versions[first_key])
    if amqp_nodes:
        previous = ini.origins.get("amqp_url")
        first = next(iter(amqp_nodes.values()))[1]
        if previous is not None:
            raise ConfigError(
                f"{first.where}: {first.key} and {previous.key} ({previous.where}) both name the broker; "
                "keep one form"
            )
        ini.values["amqp_url"] = ",".join(url for url, _origin in amqp_nodes.values())
        ini.origins["amqp_url"] = first
    if web_seen is not None:
        _web_listeners(ini, shown_path, web_parts, web_ssl_versions, web_origins, web_seen)
    if tcp_listeners and adapter_listeners is not None:
        first = next(iter(tcp_listeners.values()))[1]
        raise ConfigError(
            f"{adapter_listeners.where}: adapter.listeners and {first.key} ({first.where}) both set the "
            "listeners; keep one of them"
        )
    if tcp_none is not None:
        # As in the plugin's schema, "stomp.listeners.tcp = none" wins over named listeners.
        _warn_ignored_listeners(tcp_listeners, tcp_none)
        if adapter_listeners is not None:
            raise ConfigError(
                f"{tcp_none.where}: stomp.listeners.tcp = none and adapter.listeners "
                f"({adapter_listeners.where}) both set the listeners; keep one of them"
            )
        ini.values["listeners"] = ()
        ini.origins["listeners"] = tcp_none
    elif tcp_listeners:
        ini.values["listeners"] = tuple(listener for listener, _origin in tcp_listeners.values())
        ini.origins["listeners"] = next(iter(tcp_listeners.values()))[1]
    return ini


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


class IniSettingsSource(PydanticBaseSettingsSource):
    """pydantic-settings source for an already parsed `IniFile` (or nothing)."""

    def __init__(self, settings_cls: type[BaseSettings], ini: IniFile | None) -> None:
        super().__init__(settings_cls)
        self._ini = ini

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        if self._ini is None or field_name not in self._ini.values:
            return None, field_name, False
        return self._ini.values[field_name], field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._ini.values) if self._ini is not None else {}


# The ini file of the load_settings call in progress (settings_customise_sources is a classmethod, so
# this is how the file reaches it without a subclass per call).
_ACTIVE_INI: contextvars.ContextVar[IniFile | None] = contextvars.ContextVar("_ACTIVE_INI", default=None)


# --------------------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------------------

# Command-line flags that exist (cli.py), for error messages about overrides.
_CLI_FLAGS = {
    "listeners": "--listen",
    "amqp_url": "--amqp-url",
    "log_level": "--log-level",
    "log_format": "--log-format",
    "http_listen": "--http-listen",
    "workers": "--workers",
    "metrics_destinations": "--metrics-destinations",
    "profile": "--profile",
}


def _env_var(field_name: str, environ: Mapping[str, str]) -> str | None:
    wanted = (ENV_PREFIX + field_name).upper()
    for name in environ:
        if name.upper() == wanted:
            return name
    return None


def _warn_unknown_env(environ: Mapping[str, str]) -> None:
    # A warning, not an error: other tools may share the prefix, and the environment is not ours alone.
    env_names = {(ENV_PREFIX + name).upper(): name for name in Settings.model_fields}
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
    if field_name in overrides:
        flag = _CLI_FLAGS.get(field_name)
        where = f"command line: {flag}" if flag else f"override: {field_name}"
        return f"{where} = {_shown(field_name, overrides[field_name])}"
    env_name = _env_var(field_name, environ)
    if env_name is not None:
        return f"environment: {env_name} = {_shown(field_name, environ[env_name])}"
    if ini is not None and field_name in ini.origins:
        origin = ini.origins[field_name]
        return f"{origin.where}: {origin.key} = {_shown(field_name, origin.raw)}"
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

    *overrides* are command-line values keyed by field name; None values are ignored.  Every problem
    raises `ConfigError` naming the key, the value and what is allowed.
    """
    given = {name: value for name, value in (overrides or {}).items() if value is not None}
    for name in given:
        if name not in Settings.model_fields:
            close = difflib.get_close_matches(name, list(Settings.model_fields), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"override: unknown setting {name!r}{hint}")

    ini = read_ini(config_file) if config_file is not None else None
    environ = dict(os.environ)
    _warn_unknown_env(environ)

    token = _ACTIVE_INI.set(ini)
    try:
        # the values are raw (strings, lists) on purpose: every field's validator converts them
        return Settings(**given)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = error.get("loc") or ()
            field_name = str(loc[0]) if loc else ""
            if field_name in Settings.model_fields:
                problems.append(f"{_describe(field_name, given, environ, ini)}: {_error_text(error)}")
            else:
                problems.append(f"{field_name or 'settings'}: {_error_text(error)}")
        raise ConfigError("\n".join(problems)) from None
    finally:
        _ACTIVE_INI.reset(token)
