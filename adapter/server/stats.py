"""The adapter's counters: what each connection counts and what the server keeps of closed ones.

Owns the server-wide ``ServerStats`` (totals of closed connections, rare events such as refused
logins and failed AMQP connections, the receipt and publisher-confirm latency histograms, the
per-destination counts when asked for), the label bounds and the names of the pause reasons.
The per-message counters themselves are plain integers and dicts on ``ClientConnection`` and
``Session``: incrementing an attribute costs a few tens of nanoseconds, where a
prometheus_client ``Counter.inc()`` takes a lock.  The message path touches this module only
for a frame with a receipt (``observe_receipt``) and, when adapter.metrics_destinations is set,
for the per-destination counts; ``adapter/server/metrics.py`` adds everything up when
Prometheus scrapes.

No I/O, no prometheus_client: the numbers can be checked without either.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field

from ..stomp import frame

# Client frames counted under their own command; anything else (a client sending "HELLO") is
# "other", so that a client cannot create series by inventing commands.
CLIENT_COMMANDS = frame.CLIENT_COMMANDS  # the codec's own list

# ERROR frames are counted by their ``message`` header.  The adapter's messages are fixed texts
# and AMQP reply names, a few dozen in all; the bound only guards against a message built from
# input, which would otherwise add a series per distinct value.
MAX_ERROR_MESSAGES = 100
OTHER = "other"

# Why a connection stopped reading one of its sockets, as the shell names it -> the metric label.
PAUSE_REASONS = {
    "broker": "broker_call",  # waiting for the broker's reply to a declare, consume, login ...
    "broker-flow": "broker_flow",  # RabbitMQ blocked publishers (connection.blocked) or its socket is full
    "input": "input_buffer",  # over a megabyte of the client's frames wait behind a broker call
    "slow-client": "slow_client",  # the client reads slower than the broker delivers: broker reads stop
}

# Publisher-confirm latency buckets, seconds: a local broker confirms in well under a
# millisecond, a loaded or remote one in tens of milliseconds, a broker under a memory alarm
# in seconds.
CONFIRM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Receipt latency, from the client frame to its RECEIPT: a SEND's waits for the confirm, a
# SUBSCRIBE's for a declare, a bind and a consume; the same scale fits both.
RECEIPT_BUCKETS = CONFIRM_BUCKETS

# Per-destination series (adapter.metrics_destinations): the first N distinct destinations a
# process sees get a series each, every later one counts under OTHER.  Temporary and reply
# queues (and the activemq profile's temporary topics) have a new name per requester, so they
# are always one series each, outside the N.
TEMP_QUEUE_LABEL = "/temp-queue/*"
REPLY_QUEUE_LABEL = "/reply-queue/*"
TEMP_TOPIC_LABEL = "/temp-topic/*"
SHARED_DESTINATION_LABELS = (TEMP_QUEUE_LABEL, REPLY_QUEUE_LABEL, TEMP_TOPIC_LABEL, OTHER)
# the per-destination families, whose labels the supervisor of --workers bounds again
# (adapter/server/workermetrics.py)
DESTINATION_FAMILIES = (
    "stomp_adapter_destination_messages_published",
    "stomp_adapter_destination_messages_delivered",
)


def client_command_label(command: str) -> str:
    return command if command in CLIENT_COMMANDS else OTHER


@dataclass(slots=True)
class Histogram:
    """Cumulative-at-scrape bucket counts: ``observe`` adds one value to its bucket."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    observations: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.observations += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound, observations <= it), ending with +Inf, as Prometheus buckets are."""
        running = 0
        buckets = []
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), running))
        return buckets


class DestinationCounts:
    """Messages published and delivered by STOMP destination, for at most ``limit`` of them.

    The label of a destination is the destination as the client wrote it (a SEND's
    ``destination`` header, a SUBSCRIBE's for deliveries), except that every ``/temp-queue/...``
    is TEMP_QUEUE_LABEL, every ``/reply-queue/...`` REPLY_QUEUE_LABEL and every
    ``/temp-topic/...`` TEMP_TOPIC_LABEL.  The first ``limit``
    other destinations are admitted for the life of the process, in the order they are first
    counted; later ones count under OTHER.  Only admitted destinations are remembered, so memory
    stays bounded whatever clients send.
    """

    __slots__ = ("limit", "published", "delivered", "_admitted")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.published: dict[str, int] = {}
        self.delivered: dict[str, int] = {}
        self._admitted: dict[str, str] = {}  # destination -> itself: one lookup per message

    def label(self, destination: str) -> str:
        label = self._admitted.get(destination)
        if label is not None:
            return label
        if destination.startswith("/temp-queue/"):
            return TEMP_QUEUE_LABEL
        if destination.startswith("/reply-queue/"):
            return REPLY_QUEUE_LABEL
        if destination.startswith("/temp-topic/"):
            return TEMP_TOPIC_LABEL
        if len(self._admitted) < self.limit and destination not in SHARED_DESTINATION_LABELS:
            self._admitted[destination] = destination
            return destination
        return OTHER

    def count_published(self, destination: str) -> None:
        label = self.label(destination)
        published = self.published
        published[label] = published.get(label, 0) + 1

    def count_delivered(self, destination: str) -> None:
        label = self.label(destination)
        delivered = self.delivered
        delivered[label] = delivered.get(label, 0) + 1


class LabelBound:
    """The same bound applied again to labels that are already counted: the supervisor of
    ``--workers`` admits at most ``limit`` of the destinations its workers report (each admitted
    its own N), in the order it first sees them, and folds the rest into OTHER.  Sticky, like
    DestinationCounts: a label keeps its series, so the folded sums never go down."""

    __slots__ = ("limit", "_admitted")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._admitted: set[str] = set()

    def fold(self, label: str) -> str:
        if label in self._admitted or label in SHARED_DESTINATION_LABELS:
            return label
        if len(self._admitted) < self.limit:
            self._admitted.add(label)
            return label
        return OTHER


@dataclass(slots=True)
class TrafficCounts:
    """What connections counted: the totals of closed ones, or a sum at scrape time."""

    frames_received: Counter[str] = field(default_factory=Counter)
    frames_sent: Counter[str] = field(default_factory=Counter)
    errors_sent: Counter[str] = field(default_factory=Counter)
    messages_published: int = 0
    messages_delivered: int = 0
    acks: int = 0
    nacks: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0
    paused_seconds: dict[str, float] = field(default_factory=dict)

    def add_paused(self, reason: str, seconds: float) -> None:
        self.paused_seconds[reason] = self.paused_seconds.get(reason, 0.0) + seconds

    def add_frames_received(self, counts: dict[str, int]) -> None:
        for command, count in counts.items():
            self.frames_received[client_command_label(command)] += count

    def add_errors_sent(self, counts: dict[str, int]) -> None:
        errors = self.errors_sent
        for message, count in counts.items():
            if message not in errors and len(errors) >= MAX_ERROR_MESSAGES:
                message = OTHER
            errors[message] += count

    def merged(self, other: TrafficCounts) -> TrafficCounts:
        combined = TrafficCounts(
            frames_received=self.frames_received + other.frames_received,
            frames_sent=self.frames_sent + other.frames_sent,
            errors_sent=Counter(self.errors_sent),
            messages_published=self.messages_published + other.messages_published,
            messages_delivered=self.messages_delivered + other.messages_delivered,
            acks=self.acks + other.acks,
            nacks=self.nacks + other.nacks,
            bytes_received=self.bytes_received + other.bytes_received,
            bytes_sent=self.bytes_sent + other.bytes_sent,
            paused_seconds=dict(self.paused_seconds),
        )
        combined.add_errors_sent(other.errors_sent)
        for reason, seconds in other.paused_seconds.items():
            combined.add_paused(reason, seconds)
        return combined


@dataclass(slots=True)
class ServerStats:
    """Everything the server counts beyond its live connections."""

    closed: TrafficCounts = field(default_factory=TrafficCounts)
    connections_opened: Counter[str] = field(default_factory=Counter)  # by listener kind
    connections_closed: Counter[str] = field(default_factory=Counter)
    login_failures: Counter[str] = field(default_factory=Counter)  # by reason
    amqp_connection_failures: Counter[str] = field(default_factory=Counter)  # by reason
    # connections ended before a STOMP byte could be read (REFUSAL_REASONS)
    connections_refused: Counter[str] = field(default_factory=Counter)
    confirm_latency: Histogram = field(default_factory=lambda: Histogram(CONFIRM_BUCKETS))
    # receipt latency by the command of the frame that asked for it (a client command: bounded)
    receipt_latency: dict[str, Histogram] = field(default_factory=dict)
    # None unless adapter.metrics_destinations is set: the message path checks only that
    destinations: DestinationCounts | None = None

    def observe_receipt(self, command: str, seconds: float) -> None:
        histogram = self.receipt_latency.get(command)
        if histogram is None:
            histogram = self.receipt_histogram(command)
        histogram.observe(seconds)

    def receipt_histogram(self, command: str) -> Histogram:
        """The histogram of a command seen for the first time; one that is not a client
        command (never answered by a RECEIPT, but a bug must not add series) shares other's."""
        label = client_command_label(command)
        histogram = self.receipt_latency.get(label)
        if histogram is None:
            histogram = self.receipt_latency[label] = Histogram(RECEIPT_BUCKETS)
        return histogram
