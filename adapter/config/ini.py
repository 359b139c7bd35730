"""The rabbitmq.conf-style ini file, read as a pydantic-settings source.

This module owns the ini file: `read_ini` reads it line by line and looks every key up in a table
of handlers, one per key family (the keys the declarations name, the listener and node families
such as stomp.listeners.tcp.<name>, web_stomp's listener parts, the keys that are ignored and the
ones refused with their reasons); the families that gather several lines into one setting are
combined once the whole file is read (`_IniReader.finish`).  Every value is converted as it is
read, so an error names the file, the line, the key as written and what is allowed.
`IniFileSource` hands the result to `Settings` as one of a load's sources
(adapter/config/loading.py).
"""

from __future__ import annotations

import difflib
import logging
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from .settings import DECLARED
from .values import (
    ConfigError,
    _amqp_url,
    _int_converter,
    _normalise_listener,
    _one_of,
    _tls_versions,
    _to_bool,
    redact_url,
)

# the loader's logger: the ini file's warnings read as the configuration's
log = logging.getLogger("adapter.config")


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


class IniFileSource(PydanticBaseSettingsSource):
    """The ini file as one source of a load.  The file is read when the source is built, so that a
    bad line stops the load before any other source runs (and names its line); its values are
    already converted."""

    def __init__(self, settings_cls: type[BaseSettings], path: str | os.PathLike[str]) -> None:
        super().__init__(settings_cls)
        self.ini = read_ini(path)
        self.values = self.ini.values

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self.values)

    def describe(self, field_name: str) -> str:
        """'FILE line N: key = value' as the operator wrote it, for an error message."""
        origin = self.ini.origins[field_name]
        return f"{origin.where}: {origin.key} = {_shown(field_name, origin.raw)}"
