"""Connections to the real broker leave no cyclic garbage: a closed client connection, its
session and its AMQP link (a connection of its own, or a channel on a shared one with
``--amqp-sessions-per-connection``) are freed by reference counting when they end, not by the
cyclic garbage collector (tests/unit/test_finished_connection.py says which parts let go of
what).  The collector is off while the clients come and go; what it then finds unreachable must
hold none of the connection's objects."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from adapter.amqp.channel import ChannelCore
from adapter.amqp.client import ConnectionCore
from adapter.amqp.connection import AmqpConnection, AmqpSocket
from adapter.amqp.shared import ChannelLink
from adapter.server.connection import ClientConnection
from adapter.session import Session
from adapter.session.connection import StompConnection
from tests.support import AdapterProcess, BrokerProbe, RawSession, unique, wait_until

_PER_CONNECTION = (
    ClientConnection,
    StompConnection,
    Session,
    AmqpConnection,
    AmqpSocket,
    ChannelLink,
    ChannelCore,
    ConnectionCore,
)


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def _left_to_the_collector() -> list[str]:
    """The connection objects the collector would have to free now."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return sorted(type(o).__qualname__ for o in gc.garbage if isinstance(o, _PER_CONNECTION))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def test_connect_cycles_leave_no_cyclic_garbage(adapter: AdapterProcess, collector_off: None) -> None:
    for _ in range(5):
        session = RawSession(adapter.port)
        assert session.command == "CONNECTED", session.body
        session.disconnect()
    assert wait_until(lambda: adapter.connection_count == 0, 10)
    assert _left_to_the_collector() == []


def test_sessions_that_used_the_broker_and_went_away_leave_no_cyclic_garbage(
    adapter: AdapterProcess, broker: BrokerProbe, collector_off: None
) -> None:
    """A subscription and a message both ways, then the socket closed without DISCONNECT."""
    queue = unique("garbage")
    broker.track_queue(queue)
    for _ in range(3):
        session = RawSession(adapter.port)
        session.round_trip(queue)
        session.sock.close()
    assert wait_until(lambda: adapter.connection_count == 0, 10)
    assert _left_to_the_collector() == []
