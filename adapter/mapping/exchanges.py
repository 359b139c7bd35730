"""The exchange a SEND or SUBSCRIBE asks the adapter to declare (``declare-exchange:true``).

An adapter-only feature, off unless ``adapter.declare_exchanges`` is on (docs/destinations.md,
"Declaring the exchange"): the STOMP plugin has never declared exchanges.  This module owns the
header rules: which headers, their defaults, what values are accepted, and the refusals (an
ERROR ``Invalid header`` naming the header, or the setting when it is off).  Declaring once
per connection is the session's business (adapter/session/targets.py).

Pure: standard library and the mapping layer only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from .destinations import DestinationError

DECLARE_HEADER: Final = "declare-exchange"
SETTING: Final = "adapter.declare_exchanges"
# The broker's built-in types; an ``x-`` type is a plugin's (x-consistent-hash, x-delayed-message
# ...), which the broker accepts or refuses (503 command_invalid) itself.
BUILT_IN_TYPES: Final = ("direct", "fanout", "topic", "headers")
# exchange.declare carries the type as a shortstr: longer is refused here, not by the encoder
_MAX_TYPE_BYTES: Final = 255


@dataclass(frozen=True, slots=True)
class ExchangeParams:
    """What ``exchange.declare`` says besides the name (never passive, internal or nowait)."""

    type: str = "topic"
    durable: bool = True
    auto_delete: bool = False


def _invalid(detail: str) -> DestinationError:
    return DestinationError("Invalid header", detail + "\n")


def _flag(headers: Mapping[str, str], name: str, default: bool) -> bool:
    # as the plugin reads its queue flag headers (durable, auto-delete): true/True, false/False
    value = headers.get(name)
    if value is None:
        return default
    if value in ("true", "True"):
        return True
    if value in ("false", "False"):
        return False
    raise _invalid(f"'{name}' must be true or false, got {value!r}")


def requested_exchange(headers: Mapping[str, str], enabled: bool = True) -> ExchangeParams | None:
    """The declaration a frame asks for, or None (no ``declare-exchange``, or ``false``: the
    other exchange headers are then ignored, as every header the plugin does not know is).

    Raises ``DestinationError("Invalid header")`` naming the header for a value outside the
    rules: booleans as the plugin's queue flags, a type among ``BUILT_IN_TYPES`` or ``x-NAME``;
    and naming the setting when ``declare-exchange:true`` comes while it is off (``enabled``),
    before the other headers are looked at.
    """
    if not _flag(headers, DECLARE_HEADER, False):
        return None
    if not enabled:
        raise declaration_disabled()
    kind = headers.get("exchange-type", "topic")
    if kind not in BUILT_IN_TYPES and not (
        kind.startswith("x-") and 2 < len(kind.encode("utf-8", "surrogateescape")) <= _MAX_TYPE_BYTES
    ):
        raise _invalid(
            f"'exchange-type' must be one of {', '.join(BUILT_IN_TYPES)} or an x- type of the broker's "
            f"(at most {_MAX_TYPE_BYTES} bytes), got {kind[:64]!r}"
        )
    return ExchangeParams(
        kind,
        durable=_flag(headers, "exchange-durable", True),
        auto_delete=_flag(headers, "exchange-auto-delete", False),
    )


def declaration_disabled() -> DestinationError:
    """The refusal of ``declare-exchange:true`` while the setting is off (the default)."""
    return _invalid(
        f"'{DECLARE_HEADER}:true' needs {SETTING} = true (environment: STOMP_ADAPTER_DECLARE_EXCHANGES); "
        "exchange declaration is off by default"
    )


def not_an_exchange(destination: str) -> DestinationError:
    """``declare-exchange:true`` on a destination other than ``/exchange/NAME[/KEY]``."""
    return _invalid(
        f"'{DECLARE_HEADER}:true' applies to /exchange/ destinations only, not {destination[:200]!r}"
    )
