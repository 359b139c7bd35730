"""The RabbitMQ topology the ``activemq`` profile will create for a recorded fleet, and the
frames it would refuse.

Owns nothing of the rules themselves: every queue, flag, argument, binding and refusal here is
what ``adapter.mapping.profile.ActiveMQRules`` (and the destination functions it builds on)
returns for the recorded SEND and SUBSCRIBE frames, called exactly as the session calls them, so
the report cannot drift from the adapter.  What the rules do not decide is stated as such: the
private queue of a temporary destination (created by the session, named by the broker).  A
virtual topic's consumer queue and its binding come from the rules like any other.

Runs on the driver, on the distinct plans the Spark job collected; pure (no Spark, no I/O).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from ..errors import StompError
from ..mapping.destinations import (
    AMQ_TOPIC,
    Destination,
    DestinationError,
    DestinationKind,
    QueueParams,
    publish_target,
)
from ..mapping.profile import ActiveMQRules, check_transformation
from ..mapping.scheduled import HEADERS_EXCHANGE, ROUTE_HEADER, bucket, delay_queue

__all__ = ["plan_topology"]

_EPHEMERAL: Final = "(one auto-delete queue per subscription)"
_PRIVATE: Final = "(one private queue per connection, named by the broker)"
# the destinations a scheduled SEND names a target exchange for (the others are the session's)
_SCHEDULABLE: Final = frozenset(
    {
        DestinationKind.QUEUE,
        DestinationKind.AMQ_QUEUE,
        DestinationKind.REPLY_QUEUE,
        DestinationKind.TOPIC,
        DestinationKind.EXCHANGE,
    }
)


class _Topology:
    def __init__(self) -> None:
        self.queues: dict[str, dict[str, Any]] = {}
        self.exchanges: dict[str, dict[str, Any]] = {}
        self.bindings: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.refused: dict[tuple[str, str, str, str], dict[str, Any]] = {}

    def queue(self, name: str, params: QueueParams | None, app: str, by: str, note: str = "") -> None:
        entry = self.queues.setdefault(
            name,
            {
                "name": name,
                "durable": None,
                "auto_delete": None,
                "exclusive": None,
                "arguments": {},
                "declared_by": set(),
                "applications": set(),
                "note": note,
            },
        )
        if params is not None:
            # the first declare wins in RabbitMQ; later ones with other flags would fail
            if entry["durable"] is None:
                entry.update(
                    durable=params.durable, auto_delete=params.auto_delete, exclusive=params.exclusive
                )
            entry["arguments"].update(params.arguments)
        entry["declared_by"].add(by)
        entry["applications"].add(app)
        if note and not entry["note"]:
            entry["note"] = note

    def exchange(self, name: str, note: str) -> None:
        self.exchanges.setdefault(
            name, {"name": name, "type": "topic" if name == AMQ_TOPIC else "", "note": note}
        )

    def bind(self, exchange: str, key: str, queue: str, app: str, note: str = "") -> None:
        entry = self.bindings.setdefault(
            (exchange, key, queue),
            {"exchange": exchange, "routing_key": key, "queue": queue, "applications": set(), "note": note},
        )
        entry["applications"].add(app)

    def refuse(self, app: str, command: str, destination: str, error: StompError) -> None:
        self.refused.setdefault(
            (app, command, destination, error.message),
            {
                "application": app,
                "command": command,
                "destination": destination,
                "message": error.message,
                "detail": error.detail.strip(),
            },
        )

    def result(self) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
        def plain(entry: dict[str, Any]) -> dict[str, Any]:
            return {k: sorted(v) if isinstance(v, set) else v for k, v in entry.items()}

        topology = {
            "queues": [plain(q) for _, q in sorted(self.queues.items())],
            "exchanges": [plain(e) for _, e in sorted(self.exchanges.items())],
            "bindings": [plain(b) for _, b in sorted(self.bindings.items())],
        }
        return topology, [self.refused[key] for key in sorted(self.refused)]


def plan_topology(
    plans: Iterable[Mapping[str, Any]],
) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """The queues, exchanges and bindings the profile declares for ``plans``, and the frames it
    refuses.

    Each plan is one distinct recorded frame: ``application`` (its name in the report),
    ``client_id`` (of its connection), ``command`` (SEND, SUBSCRIBE or NACK), ``destination``,
    ``headers`` (the (name, value) pairs a plan depends on) and ``idioms`` (its idiom names).
    """
    topology = _Topology()
    rules = ActiveMQRules()
    for plan in sorted(plans, key=lambda p: (p["application"], p["command"], p["destination"] or "")):
        app, command, raw = plan["application"], plan["command"], plan["destination"]
        headers: dict[str, str] = {}
        for name, value in plan["headers"]:
            headers.setdefault(name, value)
        if command == "NACK":
            if rules.dead_letter_queue is not None:
                topology.queue(
                    rules.dead_letter_queue,
                    QueueParams(durable=True, auto_delete=False, exclusive=False),
                    app,
                    "NACK",
                    "NACKed persistent messages (ActiveMQ's dead-letter queue)",
                )
            continue
        if raw is None:
            continue
        try:
            if command == "SEND":
                _send(topology, rules, app, raw, headers)
            elif command == "SUBSCRIBE":
                _subscribe(topology, rules, app, raw, headers, plan["client_id"], plan["idioms"])
        except StompError as error:
            topology.refuse(app, command, raw, error)
    return topology.result()


def _send(topology: _Topology, rules: ActiveMQRules, app: str, raw: str, headers: Mapping[str, str]) -> None:
    check_transformation(headers, "SEND")
    delay = rules.scheduled_delay(headers)  # the other scheduling headers are refused here
    elements = raw.split(",") if "," in raw and rules.composite_destinations else [raw]
    for element in elements:
        if element.startswith(("/remote-temp-queue/", "/remote-temp-topic/")):
            # an ActiveMQ responder's reply: through the adapter it gets /reply-queue/... in
            # reply-to and sends there; nothing to declare
            continue
        dest = rules.parse_destination(element)
        params = rules.send_queue_params(dest, headers, ())
        if delay is not None and dest.kind in _SCHEDULABLE:
            _delay_queue(topology, dest, delay, element, app)
        if dest.kind is DestinationKind.QUEUE:
            topology.queue(dest.name, params, app, "SEND")
        elif dest.kind in (DestinationKind.TOPIC, DestinationKind.EXCHANGE):
            exchange, _key = publish_target(dest, AMQ_TOPIC)
            topology.exchange(
                exchange,
                "predeclared by RabbitMQ"
                if exchange == AMQ_TOPIC
                else "must exist: the adapter does not declare it",
            )
        elif dest.kind is DestinationKind.AMQ_QUEUE:
            topology.queue(dest.name, None, app, "SEND", "must exist: the adapter does not declare it")


def _subscribe(
    topology: _Topology,
    rules: ActiveMQRules,
    app: str,
    raw: str,
    headers: Mapping[str, str],
    client_id: str | None,
    idioms: Iterable[str],
) -> None:
    dest = rules.parse_destination(raw)
    rules.check_subscribe_destination(dest)
    rules.selector(dest, headers)  # a selector the adapter cannot compile is refused here
    if dest.kind in (DestinationKind.TEMP_QUEUE, DestinationKind.TEMP_TOPIC):
        # created by the session, as the rules leave it: exclusive, auto-delete, server-named
        topology.queue(
            _PRIVATE, QueueParams(durable=False, auto_delete=True, exclusive=True), app, "SUBSCRIBE", raw
        )
        return
    target = rules.subscribe_target(dest, headers, headers.get("id"), AMQ_TOPIC, client_id)
    queue = target.queue
    if target.bind_exchange is not None and target.declare is not None and not target.declare.durable:
        queue = _EPHEMERAL  # a random name per subscription (stomp-subscription-...)
    note = ""
    if dest.kind is DestinationKind.AMQ_QUEUE:
        note = "must exist: the adapter does not declare it"
    topology.queue(queue, target.declare, app, "SUBSCRIBE", note)
    if target.bind_exchange is not None:
        topology.exchange(
            target.bind_exchange,
            "predeclared by RabbitMQ" if target.bind_exchange == AMQ_TOPIC else "must exist",
        )
        topology.bind(target.bind_exchange, target.bind_key, queue, app)


def _delay_queue(topology: _Topology, dest: Destination, delay: int, raw: str, app: str) -> None:
    """A scheduled SEND's delay queue (adapter/mapping/scheduled.py), as the session declares it:
    per delay bucket and target exchange, bound to ``amq.headers``; refused (and so listed as
    refused) for targets other than queues and the topic exchange."""
    exchange, _key = publish_target(dest, AMQ_TOPIC)
    if exchange not in ("", AMQ_TOPIC):
        raise DestinationError(
            "Scheduled delivery not supported",
            f"'AMQ_SCHEDULED_DELAY' on a SEND to '{raw}': scheduled delivery is supported to "
            "/queue/, /amq/queue/, /reply-queue/ and /topic/ destinations only",
        )
    name, params = delay_queue(bucket(delay), exchange)
    topology.queue(
        name,
        params,
        app,
        "SEND",
        f"scheduled delivery: holds messages {bucket(delay)} ms, then dead-letters them",
    )
    topology.exchange(HEADERS_EXCHANGE, "predeclared by RabbitMQ")
    topology.bind(HEADERS_EXCHANGE, "", name, app, f"x-match all, {ROUTE_HEADER} = {name}")
