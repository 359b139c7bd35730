"""The Prometheus view of the server: every ``stomp_adapter_*`` series, built at scrape time.

Owns the metric names, their help texts and labels, and the registry ``GET /metrics`` renders.
Nothing is counted here: a custom collector adds up the plain counters of the live connections
and the totals the server kept of closed ones (adapter/server/stats.py) each time Prometheus
asks, so the message path never touches prometheus_client.  Scrapes run inside the event loop,
so they see the counters between two callbacks, never half-updated.

The series and what they mean are listed in docs/configuration.md ("Metrics").
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ..session import State
from ..stomp.frame import Command
from .stats import (
    CLIENT_COMMANDS,
    DESTINATION_FAMILIES,
    OTHER,
    PAUSE_REASONS,
    SHARED_DESTINATION_LABELS,
    ServerStats,
    TrafficCounts,
)

if TYPE_CHECKING:
    from ..amqp.brokers import BrokerNodes
    from ..amqp.multiplex_runtime import AmqpMultiplex
    from ..amqp.pool_runtime import AmqpReuse
    from ..sharing.rules import Registry
    from .connection import ClientConnection

PREFIX = "stomp_adapter"
LISTENER_KINDS = ("tcp", "tls", "websocket")
SERVER_COMMANDS = (Command.CONNECTED, Command.MESSAGE, Command.RECEIPT, Command.ERROR)


class Observed(Protocol):
    """What a scrape reads of a server: its ``ServerContext`` (adapter/server/context.py, which
    builds on this module, so it is named here by what it offers, not imported)."""

    @property
    def stats(self) -> ServerStats: ...

    @property
    def connections(self) -> Collection[ClientConnection]: ...

    @property
    def nodes(self) -> BrokerNodes: ...

    @property
    def amqp_reuse(self) -> AmqpReuse | None: ...

    @property
    def amqp_mux(self) -> AmqpMultiplex | None: ...

    @property
    def shared_subscriptions(self) -> Registry | None: ...

    def clock(self) -> float: ...


def connection_state(connection: ClientConnection) -> str:
    """connecting (no successful CONNECT yet), connected, or closing (closed by either side,
    its AMQP connection still closing)."""
    session = connection.session
    if connection.closed or session is None or session.state is State.CLOSED:
        return "closing"
    return "connected" if session.state is State.CONNECTED else "connecting"


def add_connection(counts: TrafficCounts, connection: ClientConnection, now: float) -> None:
    """Add what one connection counted (pauses still running count up to ``now``)."""
    counts.add_frames_received(connection.counters.frames_received)
    counters = connection.counters
    session = connection.session
    if session is not None:
        for command, count in session.frames.frames_sent.items():
            counts.frames_sent[str(command)] += count
        counts.frames_sent[Command.MESSAGE.value] += session.frames.messages_sent
        counts.messages_delivered += session.frames.messages_sent
        counts.add_errors_sent(session.errors_sent)
    shared = counters.shared_messages  # adapter.shared_subscriptions' MESSAGE frames
    if shared:
        counts.frames_sent[Command.MESSAGE.value] += shared
        counts.messages_delivered += shared
    counts.messages_published += counters.messages_published
    counts.acks += counters.acks
    counts.nacks += counters.nacks
    counts.bytes_received += counters.bytes_received
    counts.bytes_sent += counters.bytes_sent
    for reason, seconds in connection.flow.paused_seconds.items():
        counts.add_paused(reason, seconds)
    for reason, since in connection.flow.paused_since.items():
        counts.add_paused(reason, now - since)


class ServerCollector(Collector):
    """Reads one Server's counters into metric families on every scrape."""

    def __init__(self, server: Observed) -> None:
        self._server = server

    def collect(self) -> Iterator[Metric]:
        server = self._server
        stats = server.stats
        now = server.clock()
        live = TrafficCounts()
        states: dict[tuple[str, str], int] = {
            (kind, state): 0 for kind in LISTENER_KINDS for state in ("connecting", "connected", "closing")
        }
        for connection in server.connections:
            key = (connection.listener, connection_state(connection))
            states[key] = states.get(key, 0) + 1
            if not connection.stomp.finished:  # a finished one is already in stats.closed
                add_connection(live, connection, now)
        traffic = stats.closed.merged(live)

        connections = GaugeMetricFamily(
            f"{PREFIX}_connections",
            "STOMP connections now, by listener kind and state (connecting: no successful CONNECT yet; "
            "closing: closed, its AMQP connection still closing)",
            labels=["listener", "state"],
        )
        for (kind, state), count in sorted(states.items()):
            connections.add_metric([kind, state], count)
        yield connections
        yield _by_label(
            "connections_opened",
            "STOMP connections accepted",
            "listener",
            stats.connections_opened,
            LISTENER_KINDS,
        )
        yield _by_label(
            "connections_closed",
            "STOMP connections closed",
            "listener",
            stats.connections_closed,
            LISTENER_KINDS,
        )
        yield _by_label(
            "frames_received",
            "STOMP frames received from clients, by command (unknown commands: other)",
            "command",
            traffic.frames_received,
            (*sorted(CLIENT_COMMANDS), OTHER),
        )
        yield _by_label(
            "frames_sent",
            "STOMP frames sent to clients, by command (heart-beats are not frames)",
            "command",
            traffic.frames_sent,
            SERVER_COMMANDS,
        )
        yield _by_label(
            "error_frames",
            "ERROR frames sent, by their message header (at most 100 distinct messages, then other)",
            "message",
            traffic.errors_sent,
            (),
        )
        yield _counter(
            "receipts_sent", "RECEIPT frames sent", traffic.frames_sent.get(Command.RECEIPT.value, 0)
        )
        yield _counter(
            "messages_published",
            "messages published to the broker (one per SEND; a transaction's at its COMMIT)",
            traffic.messages_published,
        )
        yield _counter("messages_delivered", "MESSAGE frames sent to subscribers", traffic.messages_delivered)
        yield _counter(
            "acks",
            "basic.ack sent to the broker for client ACK frames (a 'client'-mode ACK also covers the "
            "messages before it and counts once)",
            traffic.acks,
        )
        yield _counter("nacks", "basic.nack sent to the broker for client NACK frames", traffic.nacks)
        yield _counter(
            "received_bytes",
            "STOMP bytes received from clients (after TLS/WebSocket)",
            traffic.bytes_received,
        )
        yield _counter("sent_bytes", "STOMP bytes sent to clients (before TLS/WebSocket)", traffic.bytes_sent)
        paused = CounterMetricFamily(
            f"{PREFIX}_reads_paused_seconds",
            "seconds connections spent with a socket not read, by reason (broker_call: waiting for a "
            "broker reply; broker_flow: the broker blocked publishers or its socket was full; "
            "input_buffer: client frames waiting; slow_client: broker reads paused for a slow client)",
            labels=["reason"],
        )
        for internal, label in PAUSE_REASONS.items():
            paused.add_metric([label], traffic.paused_seconds.get(internal, 0.0))
        yield paused
        yield _by_label(
            "amqp_connection_failures",
            "AMQP connections that failed to open or were lost, by reason",
            "reason",
            stats.amqp_connection_failures,
            (
                "unreachable",
                "timeout",
                "reset",
                "tls",
                "access_refused",
                "vhost",
                "refused",
                "file_descriptors",
                "connection_lost",
                "closed_by_broker",
            ),
        )
        yield _by_label(
            "connections_refused",
            "connections ended before any STOMP frame, by reason (tls_handshake: a failed TLS "
            "handshake; tls_timeout: none within the login timeout; proxy_header: a missing or "
            "invalid PROXY header; proxy_timeout: an incomplete one at the login timeout; "
            "web_stomp_max_connections: a web_stomp listener's connection over its cap, answered 503; "
            "proxy_untrusted: a peer outside adapter.proxy_protocol_trusted)",
            "reason",
            stats.connections_refused,
            (
                "tls_handshake",
                "tls_timeout",
                "proxy_header",
                "proxy_timeout",
                "web_stomp_max_connections",
                "proxy_untrusted",
            ),
        )
        yield _by_label(
            "login_failures",
            "CONNECT frames refused, by reason (max_connections: over stomp.max_connections)",
            "reason",
            stats.login_failures,
            (
                "access_refused",
                "vhost",
                "loopback_only",
                "missing_credentials",
                "broker_unavailable",
                "max_connections",
            ),
        )
        latency = stats.confirm_latency
        histogram = HistogramMetricFamily(
            f"{PREFIX}_publisher_confirm_seconds",
            "time from a publish to the broker's confirm (with confirms on, i.e. after a SEND with a "
            "receipt; one publish per connection timed at a time)",
        )
        histogram.add_metric([], latency.cumulative(), latency.total)
        yield histogram
        receipts = HistogramMetricFamily(
            f"{PREFIX}_receipt_seconds",
            "time from reading a client frame with a receipt header to its RECEIPT, by the frame's "
            "command (a SEND's waits for the broker's confirm)",
            labels=["command"],
        )
        for command, latency in sorted(stats.receipt_latency.items()):
            receipts.add_metric([command], latency.cumulative(), latency.total)
        yield receipts
        destinations = stats.destinations
        if destinations is not None:
            published, delivered = DESTINATION_FAMILIES
            yield _by_label(
                published.removeprefix(f"{PREFIX}_"),
                "messages published, by the destination header of their SEND (adapter.metrics_destinations "
                "bounds the series: later destinations count as other)",
                "destination",
                destinations.published,
                SHARED_DESTINATION_LABELS,
            )
            yield _by_label(
                delivered.removeprefix(f"{PREFIX}_"),
                "MESSAGE frames sent, by the destination header of their SUBSCRIBE "
                "(adapter.metrics_destinations bounds the series: later destinations count as other)",
                "destination",
                destinations.delivered,
                SHARED_DESTINATION_LABELS,
            )
        brokers = GaugeMetricFamily(
            f"{PREFIX}_broker_info",
            "1 per broker node a login reached, labelled with the version its connection.start "
            "announced (empty: none) and the queue.declare rules the adapter uses for it "
            "(3.10, 3.11-3.13, 4.x; docs/compatibility.md)",
            labels=["node", "version", "rules"],
        )
        for node in server.nodes.nodes:
            if node.announced is not None:
                version, rules = node.announced
                brokers.add_metric([node.label, version, rules.value], 1)
        yield brokers
        reuse = server.amqp_reuse  # adapter.amqp_connection_reuse (adapter/amqp/pool_runtime.py)
        if reuse is not None:
            yield _gauge(
                "amqp_connections_pooled", "idle AMQP connections in the reuse pool", len(reuse.pool)
            )
            yield _counter(
                "amqp_connections_reused", "logins served by a pooled AMQP connection", reuse.reused
            )
        mux = server.amqp_mux  # adapter.amqp_sessions_per_connection (adapter/amqp/multiplex_runtime.py)
        if mux is not None:
            yield _gauge(
                "amqp_connections_shared",
                "AMQP connections that STOMP sessions share (idle ones included)",
                len(mux.shared),
            )
            yield _gauge(
                "amqp_shared_sessions", "STOMP sessions on shared AMQP connections", mux.shared.sessions
            )
            yield _counter(
                "amqp_shared_joins", "logins that joined a shared AMQP connection (no new login)", mux.joined
            )
        shared = server.shared_subscriptions  # adapter.shared_subscriptions (adapter/sharing/rules.py)
        if shared is not None:
            yield _gauge(
                "shared_subscriptions",
                "shared topic subscriptions now (each one AMQP connection, queue and consumer)",
                len(shared.groups),
            )
            yield _gauge(
                "shared_subscribers",
                "STOMP subscriptions served by a shared topic subscription now",
                shared.members,
            )
            yield _gauge(
                "shared_lag_bytes",
                "bytes of shared subscriptions' MESSAGE frames waiting for their clients to read them, "
                "as last measured (bounded by adapter.shared_subscription_lag_budget)",
                shared.total_lag,
            )
            yield _counter(
                "shared_subscriptions_opened",
                "shared topic subscriptions opened (each by its first subscriber's credentials)",
                shared.opened,
            )
            yield _counter(
                "shared_subscribers_evicted",
                "subscribers of shared subscriptions closed with an ERROR for falling behind "
                "(adapter.shared_subscription_max_lag, adapter.shared_subscription_lag_budget)",
                shared.evicted,
            )


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(f"{PREFIX}_{name}", documentation, value=value)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", documentation, value=value)


def _by_label(
    name: str, documentation: str, label: str, counts: dict[str, int], always: tuple[str, ...]
) -> CounterMetricFamily:
    """A counter per label value; the values in ``always`` appear even at 0, so that a dashboard's
    rate() has a series from the start."""
    family = CounterMetricFamily(f"{PREFIX}_{name}", documentation, labels=[label])
    for value in sorted({*always, *counts}):
        family.add_metric([value], counts.get(value, 0))
    return family


def build_registry(server: Observed) -> CollectorRegistry:
    """The adapter's series plus the process ones (CPU, memory, open file descriptors)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServerCollector(server))
    ProcessCollector(registry=registry)
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
