"""The option helpers the reader and the writer share: the broker ``url``, the ``timeout`` and
the checks of a required, a positive-integer and a seconds option, each refused with the
option's name (docs/spark.md lists the options).

Its own module so that ``source.py`` (which picks the reader or the writer) and ``sink.py``
both build on it instead of on each other.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Final

from .broker import BrokerUrl, parse_broker_url
from .streams import StreamOptionError
from .tokens import token_source

DEFAULT_TIMEOUT: Final = 30.0


def required_option(options: Mapping[str, str], name: str, example: str) -> str:
    value = options.get(name)
    if not value:
        raise StreamOptionError(f"option {name!r} is required, e.g. .option({name!r}, {example!r})")
    return value


def positive_option(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise StreamOptionError(f"option {name!r} must be a positive integer, got {raw!r}")
    return value


def seconds_option(options: Mapping[str, str], name: str, default: float) -> float:
    """A positive number of seconds (``timeout``), refused with the option's name otherwise."""
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise StreamOptionError(f"option {name!r} must be a positive number of seconds, got {raw!r}")
    return value


def broker_url(options: Mapping[str, str]) -> BrokerUrl:
    raw = required_option(options, "url", "amqp://user:password@host:5672/vhost")
    try:
        url = parse_broker_url(raw)
        # an OAuth 2.0 token (option token or tokenFile) instead of the URL's password
        source = token_source(options.get("token"), options.get("tokenFile"))
    except ValueError as error:
        raise StreamOptionError(str(error)) from None
    if source is None:
        return url
    return dataclasses.replace(url, user="", password="", token=source)


_DURATION_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def duration_option(options: Mapping[str, str], name: str, default: float) -> float:
    """A duration as Spark's Kafka source takes it (``maxTriggerDelay``): a number with a unit
    ``ms``, ``s``, ``m``/``min``, ``h`` or ``d`` (``15m``, ``500ms``), or a bare number of
    milliseconds; in seconds, refused with the option's name unless it is at least zero."""
    raw = options.get(name)
    if raw is None:
        return default
    text = raw.strip().lower()
    number, unit = text, "ms"
    for suffix in sorted(_DURATION_UNITS, key=len, reverse=True):
        if text.endswith(suffix):
            number, unit = text[: -len(suffix)].strip(), suffix
            break
    try:
        value = float(number) * _DURATION_UNITS[unit]
    except ValueError:
        value = math.nan
    if not (value >= 0 and math.isfinite(value)):
        raise StreamOptionError(
            f"option {name!r} must be a duration such as '15m', '30s' or '500ms', got {raw!r}"
        )
    return value
