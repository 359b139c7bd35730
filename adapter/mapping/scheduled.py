"""ActiveMQ's scheduled delivery (``AMQ_SCHEDULED_DELAY``) on a RabbitMQ without a delay plugin.

Pure.  Owns the plan of a scheduled SEND (docs/migration-activemq.md, "Scheduled delivery"):

* the delay a SEND asks for, checked (an integer number of milliseconds up to ``MAX_DELAY_MS``)
  and the scheduling headers ActiveMQ has that the adapter refuses (``AMQ_SCHEDULED_PERIOD``,
  ``_REPEAT`` and ``_CRON``: repeated delivery needs a scheduler, which RabbitMQ has not);
* the delay *bucket*: the delay rounded up to two significant digits (1234 ms -> 1300 ms), so a
  message is never delivered early and at most 10 % late, and the number of distinct delays,
  hence of delay queues, is bounded (``MAX_BUCKETS`` per target exchange) whatever the clients
  send;
* the delay queue of a (bucket, target exchange): durable, ``x-message-ttl`` = the bucket (one
  TTL per queue, so its messages expire in the order they came, none waits behind a longer
  one), dead-lettering into the target exchange with each message's own routing key, and
  ``x-expires`` so an unused delay queue goes away; it is bound to ``amq.headers`` (which every
  virtual host has) on a header naming it, so a publish there with the target's routing key
  reaches it and keeps that routing key for the dead-lettering.

Only the default exchange (queues) and the topic exchange are targets: a delay queue per
``/exchange/NAME`` would let a client create queues without bound.

``delay_plan`` says which delay values plan the same (one bucket): the migration report runs it
in Spark's Python workers, so it imports nothing beyond this module's own imports.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Final

from .destinations import DestinationError, ProcessingError, QueueParams, plugin_integer
from .operations import BasicPublish, Operation, QueueBind, QueueDeclare

__all__ = [
    "DELAY_HEADER",
    "DELAY_NOW",
    "DELAY_REFUSED",
    "MAX_BUCKETS",
    "MAX_DELAY_MS",
    "REFUSED_HEADERS",
    "bucket",
    "delay_plan",
    "delay_queue",
    "scheduled_delay",
    "scheduled_publishes",
]

DELAY_HEADER: Final = "AMQ_SCHEDULED_DELAY"
# ActiveMQ's other scheduling headers; a value "0" (what some clients send by default) asks for
# nothing and is accepted, as is an empty cron
REFUSED_HEADERS: Final = ("AMQ_SCHEDULED_PERIOD", "AMQ_SCHEDULED_REPEAT", "AMQ_SCHEDULED_CRON")
# 46 days: below RabbitMQ's largest TTL (2^32 - 1 ms), with room for the x-expires margin
MAX_DELAY_MS: Final = 4_000_000_000
# an unused delay queue is deleted this long after its TTL (every scheduled SEND redeclares it
# just before it publishes, so its messages have all left it by then)
EXPIRES_MARGIN_MS: Final = 60_000
# the headers exchange the delay queues are bound to, and the header that picks one
HEADERS_EXCHANGE: Final = "amq.headers"
ROUTE_HEADER: Final = "activemq-scheduled-queue"
_PREFIX: Final = "activemq.scheduled."
_SCHEDULING: Final = frozenset({DELAY_HEADER, *REFUSED_HEADERS})


def bucket(delay_ms: int) -> int:
    """``delay_ms`` rounded up to two significant digits (exact below 100 ms)."""
    step = 1
    while delay_ms > 99 * step:
        step *= 10
    return -(-delay_ms // step) * step


def _count_buckets() -> int:
    top = bucket(MAX_DELAY_MS)
    count, step = min(99, top), 10  # 1..99 ms, exact
    while 10 * step <= top:
        count += min(99, top // step) - 10 + 1  # d * step, 10 <= d <= 99
        step *= 10
    return count


# how many delay queues one target exchange can have at most
MAX_BUCKETS: Final = _count_buckets()


def scheduled_delay(headers: Mapping[str, str]) -> int | None:
    """The delay of a SEND in milliseconds, or None for one delivered at once (no header, or a
    delay of 0 or less, as ActiveMQ).  Raises the ERROR of a value the adapter refuses."""
    for name in REFUSED_HEADERS:
        value = headers.get(name)
        if value is not None and value.strip() not in ("", "0"):
            raise DestinationError(
                "Scheduled delivery not supported",
                f"SEND with '{name}:{value}': the adapter delivers a scheduled message once, after "
                f"'{DELAY_HEADER}'; repeated delivery ({', '.join(REFUSED_HEADERS)}) is not "
                "supported. Send each repetition yourself.\n",
            )
    value = headers.get(DELAY_HEADER)
    if value is None:
        return None
    try:
        delay = plugin_integer(value, strip=True)
    except ProcessingError:  # too many digits
        delay = None
    if delay is None:
        raise ProcessingError(f"{DELAY_HEADER} must be an integer (milliseconds), got {value!r}")
    if delay <= 0:
        return None
    if delay > MAX_DELAY_MS:
        raise ProcessingError(f"{DELAY_HEADER} must be at most {MAX_DELAY_MS} ms, got {value!r}")
    return delay


# what delay_plan says of a delay that delays nothing (0 or less) and of one that is refused
DELAY_NOW: Final = "now"
DELAY_REFUSED: Final = "refused"


def delay_plan(value: str | None) -> str | None:
    """What an ``AMQ_SCHEDULED_DELAY`` value plans, so that values planning the same are one:
    its bucket in ms (``"1300"`` for 1234 and for 1250: the same delay queue), ``DELAY_NOW``
    (0 or less: delivered at once), ``DELAY_REFUSED`` (the ERROR of ``scheduled_delay``: not
    an integer, too many digits, above ``MAX_DELAY_MS``), or None without the header.  The
    other scheduling headers are not looked at (they are refused whatever the delay)."""
    if value is None:
        return None
    try:
        delay = scheduled_delay({DELAY_HEADER: value})
    except (DestinationError, ProcessingError):
        return DELAY_REFUSED
    return DELAY_NOW if delay is None else str(bucket(delay))


def delay_queue(delay_ms: int, exchange: str) -> tuple[str, QueueParams]:
    """The name and declare of the delay queue of ``delay_ms`` (already a bucket) for messages
    dead-lettered into ``exchange``."""
    name = f"{_PREFIX}{delay_ms}ms.{exchange or 'amq.default'}"
    arguments: dict[str, str | int | bool] = {
        "x-message-ttl": delay_ms,
        "x-expires": delay_ms + EXPIRES_MARGIN_MS,
        "x-dead-letter-exchange": exchange,
    }
    return name, QueueParams(durable=True, auto_delete=False, exclusive=False, arguments=arguments)


def scheduled_publishes(
    publishes: list[BasicPublish], delay_ms: int, topic_exchange: str
) -> tuple[list[Operation], list[BasicPublish]]:
    """The plan of a scheduled SEND: the operations before its publishes (each publish's delay
    queue declared, nowait, which also resets the queue's x-expires, and bound), and the
    publishes, now to ``amq.headers`` with the header that picks the delay queue and without the
    scheduling headers.  The
    message's own TTL (``expires``) is dropped: in the delay queue it would dead-letter the
    message early, and RabbitMQ removes it at dead-lettering anyway."""
    delay = bucket(delay_ms)
    prepare: list[Operation] = []
    routed: list[BasicPublish] = []
    for publish in publishes:
        if publish.exchange not in ("", topic_exchange):
            raise DestinationError(
                "Scheduled delivery not supported",
                f"'{DELAY_HEADER}' on a SEND to '{publish.destination}': scheduled delivery is "
                "supported to /queue/, /amq/queue/, /reply-queue/ and /topic/ destinations only\n",
            )
        queue, params = delay_queue(delay, publish.exchange)
        # the scheduling headers are consumed, as ActiveMQ does: a consumer that forwards the
        # message with its headers does not delay it again
        headers = {k: v for k, v in (publish.properties.headers or {}).items() if k not in _SCHEDULING}
        headers[ROUTE_HEADER] = queue
        properties = dataclasses.replace(publish.properties, headers=headers, expiration=None)
        if queue not in {op.queue for op in prepare if isinstance(op, QueueDeclare)}:
            prepare.append(QueueDeclare(queue, durable=True, arguments=dict(params.arguments), nowait=True))
            prepare.append(
                QueueBind(queue, HEADERS_EXCHANGE, "", (("x-match", "all"), (ROUTE_HEADER, queue)))
            )
        routed.append(dataclasses.replace(publish, exchange=HEADERS_EXCHANGE, properties=properties))
    return prepare, routed
