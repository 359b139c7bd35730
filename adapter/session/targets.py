"""The destinations a connection has named: parsed once, declared once, published to before.

Pure.  Shared by SEND (publishing.py), SUBSCRIBE (subscriptions.py) and the profile extension:

* ``parse``: a destination header parsed by the profile's rules, cached per connection;
* ``declare_queue_once``: a ``/queue/`` is declared (nowait) the first time this connection
  names it, whatever later frames say (docs/destinations.md#common-steps);
* ``temp_queues``: ``/temp-queue/NAME`` -> the server-named queue behind it;
* ``send_targets``: destinations already published to once -> (exchange, routing key), which is
  what lets ``quick_send`` skip parsing and declaring;
* ``declare_exchange_once``: with adapter.declare_exchanges on, the exchange of an
  ``/exchange/`` destination whose frame says ``declare-exchange:true`` is declared the first
  time this connection asks (adapter/mapping/exchanges.py has the header rules).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..mapping.destinations import Destination, DestinationKind, QueueParams, publish_target
from ..mapping.exchanges import DECLARE_HEADER, not_an_exchange, requested_exchange
from ..mapping.operations import ExchangeDeclare, QueueDeclare
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
    __slots__ = (
        "_rules",
        "_parsed",
        "declared",
        "temp_queues",
        "send_targets",
        "exchanges",
        "_declare_exchanges",
        "_default_topic_exchange",
    )

    def __init__(
        self, rules: RabbitMQRules, declare_exchanges: bool = False, default_topic_exchange: str = "amq.topic"
    ) -> None:
        self._rules = rules
        self._declare_exchanges = declare_exchanges
        self._default_topic_exchange = default_topic_exchange
        # the exchanges this connection has declared (a bounded cache: forgetting one only
        # means declaring it again, which the broker answers the same way)
        self.exchanges: dict[str, None] = {}
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

    def declare_exchange_once(self, raw: str, dest: Destination, headers: Mapping[str, str]) -> Steps:
        """The exchange.declare a frame's ``declare-exchange:true`` asks for, before its publish
        or its subscription queue; nothing for a frame without the header.  Synchronous, so a
        refusal (406 other properties, 403 an ``amq.`` name, 503 an unknown type) is the frame's
        ERROR before anything else happens."""
        if DECLARE_HEADER not in headers:
            return
        params = requested_exchange(headers, self._declare_exchanges)
        if params is None:
            return
        if dest.kind is not DestinationKind.EXCHANGE:
            raise not_an_exchange(raw)
        # the exchange the frame then uses: /exchange/amq.topic is the default topic exchange
        exchange = publish_target(dest, self._default_topic_exchange)[0]
        if exchange in self.exchanges:
            return
        yield ExchangeDeclare(exchange, params.type, params.durable, params.auto_delete)
        remember(self.exchanges, exchange, None)
