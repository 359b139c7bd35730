"""What an operator may write for a setting, and what it becomes.

This module owns the converters of the settings (adapter/config/settings.py names one per setting):
each takes a string as an operator wrote it (ini file, environment variable, flag) or an already
typed value, and returns the setting's value or raises ``ValueError("must be ...")``, the text an
error message shows after the key.  It also owns the listener syntax (`parse_listener`), the broker
URL's redaction (`redact_url`, `split_urls`) and `ConfigError`.  Pure functions: no file, no
environment, no pydantic.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

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


def _secret_without_at(url: str) -> str | None:
    """The user of a ``scheme://user:secret`` with no @ of its own (not ``host:port``), else
    None: in a list, a password whose @ (and more) went to the next URL when it was split
    (``amqps://u:p,amqp://x@h``)."""
    _, _, rest = url.partition("://")
    authority = rest.split("/", 1)[0]
    if "@" in url or ":" not in authority or authority.startswith("["):
        return None
    user, _, after = authority.partition(":")
    return None if after.isdigit() else user


def redact_url(url: str) -> str:
    """Return *url* with any password replaced by ``***`` (for logs and error messages); a
    comma-separated list of URLs (several broker nodes) URL by URL, split before redacting
    only where the next URL begins (``split_urls``), so a comma in a password is hidden too."""
    urls = split_urls(url)
    if len(urls) > 1:
        for one in urls:
            user = _secret_without_at(one) if "@" in url else None
            if user is not None:
                # a password that holds ",scheme://": hide all from its colon to the last @
                return f"{one.partition('://')[0]}://{user}:***@{url.rpartition('@')[2]}"
        return ",".join(redact_url(one) for one in urls)
    try:
        parts = urlsplit(url)
        scheme, _, rest = url.partition("://")
        if "@" in rest and url.count("@") != parts.netloc.count("@"):
            # an unencoded / ? # @ in the password ends the user part early, or makes part of it
            # a host: hide all up to the last @
            user = re.split(r"[:@/?#]", rest, maxsplit=1)[0]
            return f"{scheme}://{user}:***@{rest.rpartition('@')[2]}"
        if parts.password is None:
            return url  # no user, or a user without a password
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
        if url.count("@") != parts.netloc.count("@"):
            # "amqp://user:12345/secret@host/" reads as host "user", port 12345; "s3@cr/et@host"
            # as a password "s3" and a host "cr": an @ beyond the authority is in the password
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


def _milliseconds(minimum: int) -> Callable[[object], float]:
    """An ini key in milliseconds (as the plugin's) for a setting in seconds."""
    what = "a positive integer (milliseconds)" if minimum else "an integer >= 0 (milliseconds)"
    integer = _int_converter(minimum, what=what)

    def convert(value: object) -> float:
        return integer(value) / 1000

    return convert


def _retry_defaults(value: object) -> tuple[tuple[str, str], ...]:
    """``adapter.default_retry_delays``: ``PREFIX=DELAYS`` entries separated by ``;`` (DELAYS as
    SUBSCRIBE's ``x-retry-delays`` takes them: 1 to 32 integers from 1 to 86400000, comma-
    separated), or none."""
    allowed = (
        "must be PREFIX=DELAYS entries separated by ';', each DELAYS 1 to 32 milliseconds from 1 to "
        "86400000 separated by commas (e.g. /queue/orders.=1000,5000,30000), or none"
    )
    if isinstance(value, list | tuple):
        value = ";".join(str(item) for item in value)
    if not isinstance(value, str):
        raise ValueError(allowed)
    if value.strip().lower() in ("", "none"):
        return ()
    entries: list[tuple[str, str]] = []
    for entry in value.split(";"):
        if not entry.strip():
            continue
        prefix, equals, delays = entry.strip().partition("=")
        parts = [part.strip() for part in delays.split(",")]
        if (
            not equals
            or not prefix.startswith("/")
            or not 1 <= len(parts) <= 32
            or not all(part.isascii() and part.isdigit() and 1 <= int(part) <= 86_400_000 for part in parts)
        ):
            raise ValueError(allowed)
        entries.append((prefix.strip(), ",".join(parts)))
    return tuple(entries)
