"""An in-memory stand-in for a session's AMQP link (``SessionLink``, adapter/amqp/link.py) for
the shell's unit tests: it records what the shell asks of the broker (publishes, acks, calls,
pauses) and answers calls at once, or when a test opens its ``gate``.  It offers the whole
interface (tests/unit/test_amqp_link.py checks), plus what BrokerLogin reads of a fresh login."""

from __future__ import annotations

import asyncio
from typing import Any

from adapter.amqp.connection import AmqpError
from adapter.mapping import operations as ops
from adapter.mapping.destinations import broker_generation


class FakeAmqp:
    def __init__(self, events: Any, *, version: str = "3.10.8", **options: Any) -> None:
        self.events = events
        self.options = options
        self.published: list[tuple[str, str, Any, bytes]] = []
        self.mandatory: list[int] = []  # which of them went out mandatory (by index)
        self.acks: list[tuple[int, bool]] = []
        self.nacks: list[tuple[int, bool, bool]] = []
        self.calls: list[Any] = []
        self.declared_nowait: list[ops.QueueDeclare] = []
        self.deleted: list[str] = []
        self.flushes = 0
        self.reading = True
        self.is_open = True
        self.closed = False
        self.dropped = False
        self.gate: asyncio.Future[None] | None = None  # set: calls wait for it
        self.fail_with: Exception | None = None  # set: the next call raises it
        self.publish_error: Exception | None = None
        self.server_properties: dict[str, object] = {"product": b"RabbitMQ", "version": version.encode()}
        self.broker_version = version
        self.broker_generation = broker_generation(version)
        self.peer_address = "127.0.0.1:5672"

    def publish(self, exchange: str, routing_key: str, properties: Any, body: bytes) -> None:
        if self.publish_error is not None:
            raise self.publish_error
        self.published.append((exchange, routing_key, properties, body))

    def publish_mandatory(self, exchange: str, routing_key: str, properties: Any, body: bytes) -> None:
        self.publish(exchange, routing_key, properties, body)
        self.mandatory.append(len(self.published) - 1)

    def ack(self, delivery_tag: int, multiple: bool) -> None:
        self.acks.append((delivery_tag, multiple))

    def nack(self, delivery_tag: int, multiple: bool, requeue: bool) -> None:
        self.nacks.append((delivery_tag, multiple, requeue))

    def requeue_got(self, delivery_tags: tuple[int, ...]) -> None:
        for delivery_tag in delivery_tags:
            self.nack(delivery_tag, False, True)  # nothing to wait for, as on a channel of its own

    def declare_nowait(self, op: ops.QueueDeclare) -> None:
        self.declared_nowait.append(op)

    def flush(self) -> None:
        self.flushes += 1

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    async def execute(self, op: Any) -> str | None:
        self.calls.append(op)
        if self.gate is not None:
            await self.gate
        if self.fail_with is not None:
            error, self.fail_with = self.fail_with, None
            raise error
        if isinstance(op, ops.QueueDeclare):
            return op.queue or "amq.gen-fake"
        return None

    async def delete_queue_on_fresh_channel(self, queue: str) -> None:
        self.deleted.append(queue)

    async def close(self, timeout: float = 5.0) -> None:
        self.closed = True
        self.is_open = False

    def close_nowait(self) -> None:
        self.closed = True
        self.is_open = False

    def drop(self) -> None:
        self.dropped = True
        self.is_open = False

    def broker_closes(self, code: int, text: str, *, channel_only: bool = False) -> None:
        """The broker ends the channel or connection (as AmqpConnection reports it)."""
        self.is_open = channel_only
        self.events.on_amqp_closed(AmqpError(code, text, channel_only=channel_only))


class Opener:
    """BrokerLogin.opener: opens FakeAmqp links, or raises what ``errors`` holds, per attempt."""

    def __init__(self, *errors: Exception | None, version: str = "3.10.8") -> None:
        self.errors = list(errors)
        self.version = version
        self.attempts: list[dict[str, Any]] = []
        self.opened: list[FakeAmqp] = []

    async def __call__(self, events: Any, **options: Any) -> FakeAmqp:
        self.attempts.append(options)
        if self.errors:
            error = self.errors.pop(0)
            if error is not None:
                raise error
        link = FakeAmqp(events, version=self.version, **options)
        self.opened.append(link)
        return link
