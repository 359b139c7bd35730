"""A server shutdown while logins are under way closes every AMQP socket it opened before it
returns.

The hostile case: the broker (a proxy in front of it, tests/amqp_proxy.py) holds back
connection.open-ok, so the logins of several clients are under way when the shutdown begins;
it is let through once the shutdown has closed those clients, so each login gets its AMQP link
after its client has gone.  The link is then given back (closed, or with
``adapter.amqp_sessions_per_connection`` its channel closed on a shared connection, which the
shutdown also closes); the shutdown must wait for that close.  If it does not, the event loop
closed after the shutdown (tests/support.py ``AdapterProcess.stop``, as the command's own loop
ends) frees the socket unclosed: a ResourceWarning "unclosed transport" from asyncio, and a
connection the broker sees dropped instead of closed; or, kept by the shared connections'
registry, it is freed whenever the server is, and warns in whichever test runs then.  A bystander,
logged in before, gets the shutdown's ERROR as always.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import time
import warnings
from typing import Any

import pytest
from pamqp import commands

from adapter.amqp.connection import AmqpSocket
from tests.amqp_proxy import CONNECTION_CLOSE_OK, Frame, Hook, Link, ProxyThread
from tests.support import BrokerProbe, RawSession, read_frames, wait_until

_CONNECTION_OPEN_OK = commands.Connection.OpenOk.index
_IN_FLIGHT = 4


class HoldOpenOk(Hook):
    """Once ``holding``: every connection.open-ok waits until ``release``, and every
    connection.close-ok comes 0.3 s late (a broker slow to close: the close takes longer than
    the rest of the shutdown)."""

    def __init__(self) -> None:
        self.holding = False
        self.held = 0
        self._released = asyncio.Event()

    async def server_frame(self, link: Link, frame: Frame) -> list[Frame]:
        if self.holding and frame.method_index == _CONNECTION_OPEN_OK:
            self.held += 1
            await self._released.wait()
        if self.holding and frame.method_index == CONNECTION_CLOSE_OK:
            await asyncio.sleep(0.3)
        return [frame]

    def release(self, proxy: ProxyThread) -> None:
        proxy.loop.call_soon_threadsafe(self._released.set)


def _open_amqp_sockets(loop: asyncio.AbstractEventLoop) -> list[AmqpSocket[Any]]:
    """The AMQP sockets of ``loop`` whose end (``connection_lost``) never came."""
    return [
        o
        for o in gc.get_objects()
        if isinstance(o, AmqpSocket) and o.loop is loop and o.transport is not None
    ]


def _wait_for_the_close(sock: socket.socket) -> None:
    read_frames(sock, timeout=10)  # until the adapter closes it (the shutdown's ERROR first)


@pytest.mark.parametrize("sessions_per_connection", [1, 8], ids=["own-connection", "multiplexed"])
def test_a_shutdown_while_logins_are_under_way_closes_their_amqp_sockets(
    amqp_url: str, start_adapter: Any, broker: BrokerProbe, sessions_per_connection: int
) -> None:
    hold = HoldOpenOk()
    with ProxyThread(amqp_url, [hold]) as proxy:
        adapter = start_adapter(amqp_url=proxy.url, amqp_sessions_per_connection=sessions_per_connection)
        # another user: the clients below cannot join its shared connection, they log in
        bystander = RawSession(adapter.port, broker.create_user("pw", "shutdown"), "pw")
        assert bystander.command == "CONNECTED"
        hold.holding = True
        clients = []
        for _ in range(_IN_FLIGHT):
            sock = socket.create_connection(("127.0.0.1", adapter.port), timeout=10)
            RawSession.opened.append(sock)
            sock.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0")
            clients.append(sock)
        assert wait_until(lambda: hold.held >= 1, timeout=10)  # logins under way

        def release_once_the_clients_are_closed() -> None:
            for sock in clients:
                _wait_for_the_close(sock)
            time.sleep(0.05)
            hold.release(proxy)

        releaser = threading.Thread(target=release_once_the_clients_are_closed)
        releaser.start()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            adapter.stop()  # its loop is closed at the end, as the command's is
            gc.collect()  # a socket left in a reference cycle is freed (and warns) here
        releaser.join(15)
        unclosed = [str(w.message) for w in caught if "unclosed" in str(w.message)]
        assert unclosed == []
        # and none still referenced (an idle shared connection in the registry): freed later, it
        # would warn in whichever test runs then
        assert _open_amqp_sockets(adapter.loop) == []
        frames, closed = read_frames(bystander.sock, timeout=5)
        assert frames[0].startswith(b"ERROR") and closed  # the bystander: the shutdown's ERROR
