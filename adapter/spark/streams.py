"""RabbitMQ stream queues as Spark sees them: which streams a destination names, where they
begin and end, and the messages between two offsets.

Owns the stream side of the source, with no Spark in it: resolving the ``destination`` option
to stream queues (checking that they exist, or declaring the "capture" stream bound the way a
durable STOMP subscription to a ``/topic/`` or ``/exchange/`` destination is bound), probing a
stream's first and next offset over AMQP 0-9-1, and reading one offset range exactly.

Offsets are the broker's stream offsets (the ``x-stream-offset`` header of each delivery); a
range is ``[start, end)``.  AMQP 0-9-1 has no "how long is this stream" call (queue.declare
reports 0 messages for a stream), so the end is found by attaching at ``last``, which delivers
the stream's last chunk, and taking the highest offset seen: every end offset the source
reports is one the broker has delivered, never a guess.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import count
from typing import Final

from ..mapping.destinations import (
    AMQ_TOPIC,
    DestinationError,
    DestinationKind,
    parse_destination,
    subscribe_target,
)
from ..mapping.operations import Delivery
from .broker import BlockingBroker, BrokerError, BrokerUrl
from .messages import STREAM_OFFSET_HEADER, stream_offset

# How long a probe waits for the first delivery: only an empty stream makes it wait this long
# ("first" and "last" deliver at once on a stream holding anything).
PROBE_FIRST_WAIT: Final = 2.0
# After the last chunk, how long the end probe keeps listening for newer messages.
PROBE_QUIET: Final = 0.2
# The end probe's whole budget from its first delivery: a stream that keeps growing never goes
# quiet for PROBE_QUIET, and the probe then ends here with the newest offset it has seen.
PROBE_LIMIT: Final = 1.0
# Deliveries acknowledged together (a stream consumer needs acks to get more credit); half the
# prefetch when that is less.
ACK_EVERY: Final = 256

_tags = count(1)


class StreamOptionError(ValueError):
    """A source option that names no readable stream; the text says which option and why."""


@dataclass(frozen=True, slots=True)
class StreamRef:
    """One stream to read: the queue name, and the destination option that named it."""

    queue: str
    destination: str


def stream_refs(
    destinations: str, capture_stream: str | None, capture_arguments: Mapping[str, str]
) -> list[StreamRef]:
    """The streams the ``destination`` option (comma-separated) names, without the broker.

    ``/amq/queue/<name>`` (or ``/queue/<name>``) is the stream queue itself; a ``/topic/`` or
    ``/exchange/`` destination is captured into the stream named by the ``stream`` option."""
    refs = []
    raw_list = [part.strip() for part in destinations.split(",") if part.strip()]
    if not raw_list:
        raise StreamOptionError(
            "option 'destination' is empty: give a STOMP destination, e.g. /amq/queue/events"
        )
    for raw in raw_list:
        try:
            dest = parse_destination(raw)
        except DestinationError as error:
            raise StreamOptionError(
                f"option 'destination' {raw!r}: {error.message}: {error.detail.strip()}"
            ) from None
        if dest.kind in (DestinationKind.AMQ_QUEUE, DestinationKind.QUEUE):
            refs.append(StreamRef(dest.name, raw))
        elif dest.kind in (DestinationKind.TOPIC, DestinationKind.EXCHANGE):
            if not capture_stream:
                raise StreamOptionError(
                    f"option 'destination' {raw!r} is not a queue: to capture it, name the stream to "
                    "keep its messages in with option 'stream'"
                )
            if len(raw_list) > 1:
                raise StreamOptionError("option 'stream' captures one destination; give only one")
            refs.append(StreamRef(capture_stream, raw))
        else:
            raise StreamOptionError(
                f"option 'destination' {raw!r}: a {dest.kind} destination cannot be read as a stream"
            )
    return refs


def prepare_streams(
    broker: BlockingBroker, refs: list[StreamRef], capture_arguments: Mapping[str, str]
) -> None:
    """Check that each stream exists; declare and bind a capture stream as a durable STOMP
    subscription with ``x-queue-name:<stream>`` and ``x-queue-type:stream`` would."""
    for ref in refs:
        dest = parse_destination(ref.destination)
        if dest.kind in (DestinationKind.TOPIC, DestinationKind.EXCHANGE):
            # a stream may not be auto-delete, which a /topic/ subscription queue is by default
            headers = {
                **capture_arguments,
                "durable": "true",
                "auto-delete": "false",
                "x-queue-type": "stream",
                "x-queue-name": ref.queue,
            }
            target = subscribe_target(dest, headers, ref.queue, AMQ_TOPIC)
            params = target.declare
            assert params is not None and target.bind_exchange is not None
            try:
                broker.queue_declare(
                    target.queue,
                    durable=params.durable,
                    exclusive=params.exclusive,
                    auto_delete=params.auto_delete,
                    arguments=dict(params.arguments),
                )
                broker.queue_bind(target.queue, target.bind_exchange, target.bind_key)
            except BrokerError as error:
                raise BrokerError(
                    f"cannot declare the capture stream {ref.queue!r} for {ref.destination!r}: {error}"
                ) from None
            continue
        try:
            broker.queue_declare(ref.queue, passive=True)
        except BrokerError as error:
            raise BrokerError(
                f"stream {ref.queue!r} (option 'destination' {ref.destination!r}) cannot be read: {error}"
            ) from None


class _Consumer:
    """One consumer on a stream, cancelled (and its leftover deliveries dropped) on exit."""

    def __init__(
        self, broker: BlockingBroker, queue: str, offset: tuple[str, str | int], prefetch: int
    ) -> None:
        self.broker = broker
        self.tag = f"spark-{next(_tags)}"
        self._unacked = 0
        # acknowledged before the prefetch runs out: the broker sends a stream consumer no more
        # than ``prefetch`` unacknowledged messages
        self._ack_every = min(ACK_EVERY, max(1, prefetch // 2))
        self._last_tag = 0
        broker.basic_qos(prefetch)
        try:
            broker.basic_consume(queue, self.tag, {"x-stream-offset": offset})
        except BrokerError as error:
            raise BrokerError(f"cannot consume from stream {queue!r}: {error}") from None

    def next(self, deadline: float) -> Delivery | None:
        taken = self.broker.take_deliveries(deadline, at_most=1)
        delivery = taken[0] if taken else None
        if delivery is not None:
            self._last_tag = delivery.delivery_tag
            self._unacked += 1
            if self._unacked >= self._ack_every:
                self.ack()
        return delivery

    def take(self, deadline: float) -> list[Delivery]:
        """Every delivery queued (at least one, unless ``deadline`` passed first: [])."""
        taken = self.broker.take_deliveries(deadline)
        if taken:
            self._last_tag = taken[-1].delivery_tag
            self._unacked += len(taken)
            if self._unacked >= self._ack_every:
                self.ack()
        return taken

    def ack(self) -> None:
        if self._unacked:
            self.broker.ack(self._last_tag, True)
            self._unacked = 0

    def close(self) -> None:
        self.ack()
        self.broker.basic_cancel(self.tag)
        self.broker.deliveries.clear()


def first_offset(broker: BlockingBroker, queue: str) -> int | None:
    """The oldest offset the stream still holds, None when it is empty."""
    consumer = _Consumer(broker, queue, ("longstr", "first"), 1)
    try:
        delivery = consumer.next(time.monotonic() + PROBE_FIRST_WAIT)
        return None if delivery is None else stream_offset(delivery)
    finally:
        consumer.close()


def offset_at(broker: BlockingBroker, queue: str, seconds: int) -> int | None:
    """The first offset of the first chunk the broker wrote at or after ``seconds`` (since the
    epoch; AMQP 0-9-1 timestamps are whole seconds), None when the stream has none yet: an
    ``x-stream-offset`` of the timestamp type."""
    consumer = _Consumer(broker, queue, ("timestamp", seconds), 1)
    try:
        delivery = consumer.next(time.monotonic() + PROBE_FIRST_WAIT)
        return None if delivery is None else stream_offset(delivery)
    finally:
        consumer.close()


def next_offset(broker: BlockingBroker, queue: str) -> int | None:
    """One past the newest offset the broker delivers, None when the stream is empty.

    The probe ends at the first pause of PROBE_QUIET between deliveries, or PROBE_LIMIT after
    the first one, whichever comes first: on a stream that keeps growing, "the end" is the
    newest message delivered by then (every offset below it is in the stream), and whatever
    arrives later belongs to the next probe."""
    consumer = _Consumer(broker, queue, ("longstr", "last"), 1000)
    highest = None
    try:
        deadline = time.monotonic() + PROBE_FIRST_WAIT
        limit: float | None = None
        while (delivery := consumer.next(deadline)) is not None:
            offset = stream_offset(delivery)
            highest = offset if highest is None else max(highest, offset)
            now = time.monotonic()
            if limit is None:
                limit = now + PROBE_LIMIT
            elif now >= limit:
                break
            deadline = min(now + PROBE_QUIET, limit)
    finally:
        consumer.close()
    return None if highest is None else highest + 1


def offset_within_bytes(
    broker: BlockingBroker, queue: str, start: int, end: int, budget: int, timeout: float
) -> int:
    """The end of the longest range ``[start, e)``, ``e <= end``, whose bodies hold at most
    ``budget`` bytes, but at least one message (``maxBytesPerTrigger``): the driver reads the
    bodies from ``start`` to count them, as AMQP 0-9-1 tells no message's size otherwise.
    An offset retention has removed counts as empty."""
    if start >= end:
        return start
    consumer = _Consumer(broker, queue, ("long", start), 1000)
    used = 0
    reached = start
    try:
        while reached < end:
            delivery = consumer.next(time.monotonic() + timeout)
            if delivery is None:
                raise BrokerError(
                    f"stream {queue!r} delivered nothing after offset {reached - 1} within {timeout:g} s "
                    f"while sizing a micro-batch (maxBytesPerTrigger) up to offset {end - 1}"
                )
            offset = stream_offset(delivery)
            if offset < reached:
                continue  # the chunk holding ``start`` begins before it
            used += len(delivery.body)
            if offset >= end or (used > budget and offset > start):
                return min(offset, end)
            reached = offset + 1
    finally:
        consumer.close()
    return reached


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one stream: what one Spark partition reads."""

    queue: str
    destination: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class ReadSettings:
    url: BrokerUrl
    prefetch: int = 1000
    timeout: float = 30.0
    fail_on_data_loss: bool = True
    # includeHeaders=false: rows carry an empty headers map, the MESSAGE headers are not rendered
    include_headers: bool = True


def split_range(queue: str, destination: str, start: int, end: int, size: int) -> list[OffsetRange]:
    """``[start, end)`` cut into ranges of at most ``size`` offsets, so several tasks can read
    one stream at once (a stream serves any number of readers at any offset)."""
    return [OffsetRange(queue, destination, low, min(low + size, end)) for low in range(start, end, size)]


def read_deliveries(
    settings: ReadSettings, offsets: OffsetRange
) -> Iterator[tuple[list[Delivery], list[int]]]:
    """Every message of the range, in offset order, as pieces ``(deliveries, their offsets)``:
    the range's part of what one read of the socket brought, so that the caller works on
    lists (adapter/spark/source.py builds Arrow columns of them).

    Fails (BrokerError) rather than return fewer messages: when the stream no longer holds the
    start (retention removed it; unless fail_on_data_loss is off) or stops delivering before the
    end for ``settings.timeout`` seconds."""
    if offsets.start >= offsets.end:
        return
    end = offsets.end
    with BlockingBroker(
        settings.url, connection_name=f"spark reader {offsets.queue}", timeout=settings.timeout
    ) as broker:
        consumer = _Consumer(broker, offsets.queue, ("long", offsets.start), settings.prefetch)
        expected = offsets.start
        while expected < end:
            broker.refresh_token()  # options token / tokenFile: a long read outlives its token
            taken = consumer.take(time.monotonic() + settings.timeout)
            if not taken:
                raise BrokerError(
                    f"stream {offsets.queue!r} delivered nothing after offset {expected - 1} within "
                    f"{settings.timeout:g} s, but this batch reads up to offset {end - 1}"
                )
            kept: list[Delivery] = []
            numbers: list[int] = []
            for delivery in taken:
                headers = delivery.properties.headers
                offset = headers.get(STREAM_OFFSET_HEADER) if headers else None
                if type(offset) is not int:
                    offset = stream_offset(delivery)  # raises, naming what is wrong
                if offset < expected:
                    continue  # the broker starts at the chunk holding the start offset
                if offset > expected and settings.fail_on_data_loss:
                    raise BrokerError(
                        f"stream {offsets.queue!r} no longer holds offsets {expected} to {offset - 1} "
                        "(removed by retention?); set failOnDataLoss=false to skip them"
                    )
                if offset >= end:
                    expected = end
                    break
                kept.append(delivery)
                numbers.append(offset)
                expected = offset + 1
            if kept:
                yield kept, numbers
        consumer.close()
