"""The destinations a connection has named: parsed once, declared once, published to before.

Pure.  Shared by SEND (publishing.py), SUBSCRIBE (subscriptions.py) and the profile extension:

* ``parse``: a destination header parsed by the profile's rules, cached per connection;
* ``declare_queue_once``: a ``/queue/`` is declared (nowait) the first time this connection
  names it, whatever later frames say (docs/destinations.md#common-steps);
* ``temp_queues``: ``/temp-queue/NAME`` -> the server-named queue behind it;
* ``send_targets``: destinations already published to once -> (exchange, routing key), which is
  what lets ``quick_send`` skip parsing and declaring.
"""

from __future__ import annotations

from typing import Any

from ..mapping.destinations import Destination, QueueParams
from ..mapping.operations import QueueDeclare
from ..mapping.profile import RabbitMQRules
from .settings import Steps

# Parsed destinations are cached per session: clients reuse a handful of destinations.
_CACHE_SIZE = 256


def remember(cache: dict[Any, Any], key: object, value: object) -> None:
    """Store in a per-session cache, emptied when full so a client cycling through endless
    destination names cannot grow it without bound."""
    if len(cache) >= _CACHE_SIZE:
        cache.clear()
    cache[key] = value


class Targets:
    __slots__ = ("_rules", "_parsed", "declared", "temp_queues", "send_targets")

    def __init__(self, rules: RabbitMQRules) -> None:
        self._rules = rules
        self._parsed: dict[str, Destination] = {}
        self.declared: set[str] = set()
        self.temp_queues: dict[str, str] = {}
        self.send_targets: dict[str, tuple[str, str]] = {}

    def parse(self, raw: str) -> Destination:
        dest = self._parsed.get(raw)
        if dest is None:
            dest = self._rules.parse_destination(raw)
            remember(self._parsed, raw, dest)
        return dest

    def declare_queue_once(self, dest: Destination, params: QueueParams) -> Steps:
        # /queue declares are nowait and happen once per connection, whatever later frames
        # say (docs/destinations.md#common-steps)
        yield QueueDeclare(
            dest.name,
            durable=params.durable,
            exclusive=params.exclusive,
            auto_delete=params.auto_delete,
            arguments=dict(params.arguments),
            nowait=True,
        )
        self.declared.add(dest.name)
