"""The probe connections of session multiplexing without a broker: which calls take one
(adapter/amqp/probe.py's ``needs_probe``), a session's ``Probe`` (opened for a call, kept while
it holds what a basic.get took, closed after, never reopened once the session ended), a
``ChannelLink`` that sends those calls to its probe and, when the probe's call fails, ends its
own session alone with the probe's reply code and text while its neighbour on the shared
connection goes on, and the process's bound on probes open at once (adapter/amqp/probe_runtime.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from pamqp import commands

from adapter.amqp.admission import Gate
from adapter.amqp.brokers import BrokerNodes, parse_nodes
from adapter.amqp.connection import AmqpConnection, AmqpError
from adapter.amqp.login import BrokerSettings, probe_login
from adapter.amqp.probe import Probe, needs_probe
from adapter.amqp.probe_runtime import Probes
from adapter.mapping import operations as ops
from adapter.mapping.properties import MessageProperties
from adapter.server.fdlimit import DescriptorWatch
from adapter.server.stats import ServerStats
from tests.unit.fake_amqp import Opener
from tests.unit.test_amqp_connection import broker
from tests.unit.test_amqp_shared import two_sessions

X_DECLARE = ops.ExchangeDeclare("e", "x-no-such-type", True, False)
GET = ops.BasicGet("q", "T_b")


def got(tag: int) -> ops.Delivery:
    return ops.Delivery("T_b", tag, False, "", "q", MessageProperties(), b"m%d" % tag)


@pytest.mark.parametrize(
    ("op", "probed"),
    [
        (GET, True),
        (X_DECLARE, True),
        (ops.ExchangeDeclare("e", "x-consistent-hash", True, False), True),
        *[
            (ops.ExchangeDeclare("e", kind, True, False), False)
            for kind in ("direct", "fanout", "topic", "headers")
        ],
        (ops.QueueDeclare("q"), False),
        (ops.BasicConsume("q", "T_1", no_ack=True), False),
        (ops.QueueBind("q", "amq.topic", "k"), False),
    ],
)
def test_only_calls_that_may_draw_a_connection_error_take_a_probe(op: Any, probed: bool) -> None:
    assert needs_probe(op) is probed


class ProbeLink:
    """A probe connection: answers each call with the next of ``answers`` (an exception is
    raised), records calls, nacks and whether it was closed."""

    def __init__(self, answers: list[object]) -> None:
        self.answers = answers
        self.calls: list[Any] = []
        self.requeued: list[tuple[int, ...]] = []

    async def execute(self, op: Any) -> object:
        self.calls.append(op)
        answer = self.answers.pop(0) if self.answers else None
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def requeue_got(self, delivery_tags: tuple[int, ...]) -> None:
        self.requeued.append(delivery_tags)


@dataclass
class FakeOpener:
    """ProbeOpener: hands out ``ProbeLink``s (one per open, each with the next list of answers)."""

    answers: list[list[object]] = field(default_factory=list)
    opened: list[ProbeLink] = field(default_factory=list)
    done_with: list[ProbeLink] = field(default_factory=list)
    logins: list[tuple[str, str, str]] = field(default_factory=list)
    gate: asyncio.Future[None] | None = None  # set: an open waits for it

    async def open(self, user: str, password: str, vhost: str, ended: Callable[[], bool]) -> Any:
        self.logins.append((user, password, vhost))
        if self.gate is not None:
            await self.gate
        link = ProbeLink(self.answers.pop(0) if self.answers else [])
        self.opened.append(link)
        return link

    def done(self, connection: Any) -> Any:
        self.done_with.append(connection)
        return ("closing", connection)  # stands for the close's task


async def test_a_declare_runs_on_a_probe_of_its_own_that_closes_after_it() -> None:
    opener = FakeOpener([[None], [None]])
    probe = Probe(opener, "guest", "secret", "/")  # type: ignore[arg-type]
    assert await probe.execute(X_DECLARE) is None
    (first,) = opener.opened
    assert first.calls == [X_DECLARE] and opener.done_with == [first] and not probe.is_open
    await probe.execute(X_DECLARE)  # the next one: a probe again
    assert len(opener.opened) == 2 and opener.logins == [("guest", "secret", "/")] * 2


async def test_a_browse_keeps_its_probe_while_it_holds_messages_and_hands_them_back_there() -> None:
    opener = FakeOpener([[got(1), got(2), None]])
    probe = Probe(opener, "guest", "secret", "/")  # type: ignore[arg-type]
    assert await probe.execute(GET) == got(1)
    assert await probe.execute(GET) == got(2)
    assert await probe.execute(GET) is None  # the queue is empty: the two are still held
    (link,) = opener.opened
    assert link.calls == [GET] * 3 and opener.done_with == [] and probe.is_open
    # the session waits for the probe's close before its next call: the nacks reach the queue
    # before, say, a basic.consume of it on the shared connection (#27)
    closing: object = probe.requeue_got((1, 2))
    assert closing == ("closing", link)
    assert link.requeued == [(1, 2)] and opener.done_with == [link] and not probe.is_open


async def test_an_empty_browse_closes_its_probe_at_once() -> None:
    opener = FakeOpener([[None]])
    probe = Probe(opener, "guest", "secret", "/")  # type: ignore[arg-type]
    assert await probe.execute(GET) is None
    assert opener.done_with == opener.opened
    assert probe.requeue_got(()) is None  # nothing was taken: nothing to do, nothing to wait for
    assert opener.opened[0].requeued == []


async def test_a_failed_call_closes_the_probe_and_raises_the_brokers_error() -> None:
    refusal = AmqpError(540, "NOT_IMPLEMENTED - basic.get not supported by stream queues", from_broker=True)
    opener = FakeOpener([[refusal]])
    probe = Probe(opener, "guest", "secret", "/")  # type: ignore[arg-type]
    with pytest.raises(AmqpError) as info:
        await probe.execute(GET)
    assert info.value is refusal
    assert opener.done_with == opener.opened and not probe.is_open


async def test_a_session_that_ends_while_its_probe_opens_gets_none() -> None:
    opener = FakeOpener([[None]], gate=asyncio.get_running_loop().create_future())
    probe = Probe(opener, "guest", "secret", "/")  # type: ignore[arg-type]
    call = asyncio.ensure_future(probe.execute(X_DECLARE))
    await asyncio.sleep(0)
    probe.end()
    assert opener.gate is not None
    opener.gate.set_result(None)
    with pytest.raises(AmqpError):
        await call
    (link,) = opener.opened
    assert link.calls == [] and opener.done_with == [link]
    with pytest.raises(AmqpError):  # and no probe is opened for it any more
        await probe.execute(X_DECLARE)
    assert len(opener.opened) == 1 and probe._password == ""


async def test_an_ended_session_closes_the_probe_that_holds_its_browse() -> None:
    opener = FakeOpener([[got(1)]])
    probe = Probe(opener, "guest", "secret", "/")  # type: ignore[arg-type]
    await probe.execute(GET)
    probe.end()  # the broker requeues what the probe held as it closes
    assert opener.done_with == opener.opened and opener.opened[0].requeued == []


# ------------------------------------------------------------------ a ChannelLink with a probe
async def test_a_probed_call_never_reaches_the_shared_connection() -> None:
    _connection, transport, (link, _neighbour), _events = await two_sessions()
    opener = FakeOpener([[got(1), None]])
    link.probe = Probe(opener, "guest", "secret", "/")  # type: ignore[arg-type]
    assert await link.execute(GET) == got(1)
    assert await link.execute(GET) is None
    link.requeue_got((1,))
    link.flush()
    assert transport.take_frames() == []  # no basic.get, and no basic.nack on its channel
    assert opener.opened[0].requeued == [(1,)]


async def test_a_built_in_exchange_type_is_declared_on_the_sessions_own_channel() -> None:
    connection, transport, (link, _neighbour), _events = await two_sessions()
    opener = FakeOpener()
    link.probe = Probe(opener, "guest", "secret", "/")  # type: ignore[arg-type]
    call = asyncio.ensure_future(link.execute(ops.ExchangeDeclare("e", "direct", True, False)))
    await asyncio.sleep(0)
    link.flush()
    ((channel, declare),) = transport.take_frames()
    assert channel == link.channel and isinstance(declare, commands.Exchange.Declare)
    connection.socket.data_received(broker((commands.Exchange.DeclareOk(), link.channel)))
    assert await call is None and opener.opened == []


async def test_a_probes_connection_error_ends_only_its_session_with_the_same_error() -> None:
    connection, transport, (link, neighbour), (events, neighbour_events) = await two_sessions()
    text = "COMMAND_INVALID - unknown exchange type 'x-no-such-type'"
    opener = FakeOpener([[AmqpError(503, text, from_broker=True)]])
    link.probe = Probe(opener, "guest", "secret", "/")  # type: ignore[arg-type]
    with pytest.raises(AmqpError) as info:
        await link.execute(X_DECLARE)
    # the session learns it as from a connection of its own: code and text, then ERROR and close
    ((error,),) = (events.closed,)
    assert (error.code, error.text, error.name) == (503, text, "command_invalid")
    assert info.value.code == 503 and error.channel_only  # but only its channel closes
    ((channel, close),) = transport.take_frames()
    assert channel == link.channel and isinstance(close, commands.Channel.Close)
    assert neighbour_events.closed == [] and connection.is_open
    neighbour.publish("", "q", MessageProperties(), b"on")
    neighbour.flush()
    assert [channel for channel, _ in transport.take_frames()] == [neighbour.channel] * 3
    assert opener.done_with == opener.opened


async def test_a_session_that_leaves_ends_its_probe() -> None:
    _connection, _transport, (link, _neighbour), _events = await two_sessions()
    opener = FakeOpener([[got(1)]])
    link.probe = probe = Probe(opener, "guest", "secret", "/")  # type: ignore[arg-type]
    await link.execute(GET)
    link.close_nowait()
    assert probe.ended and opener.done_with == opener.opened


async def test_the_shared_connection_failing_ends_the_probes_of_its_sessions() -> None:
    connection, _transport, (link, _neighbour), _events = await two_sessions()
    opener = FakeOpener([[got(1)]])
    link.probe = probe = Probe(opener, "guest", "secret", "/")  # type: ignore[arg-type]
    await link.execute(GET)
    connection.socket.connection_lost(ConnectionResetError("reset"))
    assert probe.ended and opener.done_with == opener.opened


# ------------------------------------------------------------------ the process's bound
@dataclass
class Services:
    nodes: BrokerNodes = field(default_factory=lambda: BrokerNodes(parse_nodes("amqp://node-a:5672/")))
    broker: BrokerSettings = field(default_factory=lambda: BrokerSettings(60, 5.0))
    login_timeout: float = 10.0
    descriptors: DescriptorWatch = field(default_factory=DescriptorWatch)
    stats: ServerStats = field(default_factory=ServerStats)
    logins: Gate = field(default_factory=lambda: Gate(64))
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def spawn(self, coro: Any) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.append(task)
        return task


async def test_no_more_probes_open_at_once_than_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    opener = Opener()
    monkeypatch.setattr(AmqpConnection, "open", opener)
    services = Services()
    probes = Probes(services, probe_login(services), limit=2)  # type: ignore[arg-type]
    first = await probes.open("guest", "guest", "/", lambda: False)
    await probes.open("guest", "guest", "/", lambda: False)
    third = asyncio.ensure_future(probes.open("guest", "guest", "/", lambda: False))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not third.done() and len(opener.opened) == 2 and probes.gate.waiting == 1
    probes.done(first)  # closed in the background, then its place passes on
    await asyncio.gather(*services.tasks)
    await third
    assert len(opener.opened) == 3 and first.closed and probes.opened == 3
    assert opener.attempts[0]["connection_name"] == "STOMP probe" and not opener.attempts[0]["reusable"]


async def test_a_refused_probe_login_is_the_sessions_error_and_gives_its_place_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opener = Opener(AmqpError(403, "ACCESS_REFUSED - Login was refused", phase="auth"))
    monkeypatch.setattr(AmqpConnection, "open", opener)
    services = Services()
    probes = Probes(services, probe_login(services), limit=1)  # type: ignore[arg-type]
    with pytest.raises(AmqpError) as info:
        await probes.open("guest", "changed", "/", lambda: False)
    assert info.value.code == 403 and info.value.name == "access_refused"
    assert probes.gate.in_flight == 0 and probes.opened == 0
