"""Liveness and readiness: what ``GET /healthz`` and ``GET /readyz`` answer.

Owns the two decisions and the broker check behind readiness:

* live: the server has started and is not shutting down (an answer at all also shows the event
  loop turns);
* ready: live, listening, and a broker node answers.  "Answers" means it speaks AMQP: the check
  opens a TCP (or TLS, for amqps://) connection, sends the AMQP 0-9-1 protocol header and waits
  for the broker's ``connection.start``; it logs in nowhere and needs no credentials.  The result
  is kept for ``BROKER_CHECK_TTL`` seconds and concurrent requests share one check in flight,
  so a storm of probes costs the broker at most one connection every few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..amqp.brokers import BrokerNodes
    from .connection import BrokerSettings

log = logging.getLogger("adapter.health")

BROKER_CHECK_TTL = 5.0  # seconds a broker check's result is reused
BROKER_CHECK_TIMEOUT = 3.0  # seconds one node has to answer the check

AMQP_PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
_FRAME_METHOD = 1
_CONNECTION_START = (10, 10)  # class connection, method start


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    detail: str


class BrokerSide(Protocol):
    """Where the broker is: a server's ``ServerContext``, or the supervisor of ``--workers N``."""

    @property
    def nodes(self) -> BrokerNodes: ...

    @property
    def broker(self) -> BrokerSettings: ...


class Serving(Protocol):
    """What liveness and readiness read of a Server: its phase and where it listens (a
    protocol, so that this module needs nothing of adapter/server/listener.py, which builds on
    it)."""

    @property
    def started(self) -> bool: ...

    @property
    def shutting_down(self) -> bool: ...

    @property
    def addresses(self) -> Sequence[tuple[str, int]]: ...

    @property
    def tls_addresses(self) -> Sequence[tuple[str, int]]: ...

    @property
    def web_addresses(self) -> Sequence[tuple[str, int]]: ...


class BrokerCheck:
    """Whether some broker node speaks AMQP now, asked at most once per ``ttl`` seconds."""

    def __init__(self, server: BrokerSide, ttl: float = BROKER_CHECK_TTL) -> None:
        self._server = server
        self._ttl = ttl
        self._verdict: Verdict | None = None
        self._checked_at = 0.0
        self._running: asyncio.Task[Verdict] | None = None

    async def verdict(self) -> Verdict:
        loop = asyncio.get_running_loop()
        if self._verdict is not None and loop.time() - self._checked_at < self._ttl:
            return self._verdict
        if self._running is None:
            self._running = loop.create_task(self._check_nodes())
        running = self._running
        try:
            # shield: a client that hangs up must not cancel the check others wait for
            verdict = await asyncio.shield(running)
        finally:
            if running.done() and self._running is running:
                self._running = None
        return verdict

    async def _check_nodes(self) -> Verdict:
        problems = []
        for node in self._server.nodes.nodes:
            try:
                async with asyncio.timeout(min(BROKER_CHECK_TIMEOUT, self._server.broker.connect_timeout)):
                    await self._check_node(node.resolver.target(), node.port, node.tls, node.host)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as error:
                problems.append(f"{node.label}: {error or type(error).__name__}")
                continue
            verdict = Verdict(True, f"broker {node.label} answers")
            break
        else:
            verdict = Verdict(False, "no broker node answers: " + "; ".join(problems))
            log.warning("readiness: %s", verdict.detail)
        self._verdict = verdict
        self._checked_at = asyncio.get_running_loop().time()
        return verdict

    async def _check_node(self, target: str, port: int, tls: bool, host: str) -> None:
        broker = self._server.broker
        server_hostname = (broker.tls_server_name or host) if tls else None
        reader, writer = await asyncio.open_connection(
            target, port, ssl=broker.tls if tls else None, server_hostname=server_hostname
        )
        try:
            writer.write(AMQP_PROTOCOL_HEADER)
            # frame header (type, channel, size) and the method's class and method ids
            frame_type, _channel, _size, class_id, method_id = struct.unpack(
                ">BHIHH", await reader.readexactly(11)
            )
            if frame_type != _FRAME_METHOD or (class_id, method_id) != _CONNECTION_START:
                raise ValueError("the answer is not an AMQP 0-9-1 connection.start")
        finally:
            writer.transport.abort()  # nothing to say to the broker: no handshake to finish
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def liveness(server: Serving) -> Verdict:
    if server.shutting_down:
        return Verdict(False, "shutting down")
    if not server.started:
        return Verdict(False, "starting")
    return Verdict(True, "ok")


async def readiness(server: Serving, broker: BrokerCheck) -> Verdict:
    live = liveness(server)
    if not live.ok:
        return live
    if not (server.addresses or server.tls_addresses or server.web_addresses):
        return Verdict(False, "no STOMP listener")
    return await broker.verdict()
