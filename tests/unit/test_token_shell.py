"""An OAuth 2.0 token session in the asyncio shell, with in-memory transports and AMQP link.

What the shell's parts do for a token login (adapter/server/client_timers.py: the expiry timer;
client_link.py: the refresh's broker call; websocket_handshake.py: the handshake's token), with
no broker: the timer's callback is called directly and the session's clock is replaced, never
waited for.  tests/oauth2 runs the same paths against a node with the oauth2 backend."""

from __future__ import annotations

import base64
import json
import time

from adapter.server.client_timers import ClientTimers
from adapter.server.connection import ClientConnection
from adapter.server.websocket import WebSocketConnection, WebStompSettings
from adapter.session import State
from tests.support import MemoryTransport
from tests.unit.fake_amqp import Opener
from tests.unit.test_shell import RawSocket, connect_client, make_server, settle


def token(**claims: object) -> str:
    """An unsigned JWT (no local validation is configured: only its claims are read)."""

    def part(value: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.c2ln"


async def token_login(expires_at: float) -> tuple[ClientConnection, MemoryTransport, Opener]:
    server = make_server()
    client, transport = connect_client(server)
    opener = Opener()
    client.link.glue.login.opener = opener
    jwt = token(sub="alice", exp=int(expires_at))
    client.data_received(f"CONNECT\naccept-version:1.2\nhost:/\npasscode:{jwt}\n\n\0".encode())
    await settle()
    (connected,) = transport.frames()
    assert connected.startswith(b"CONNECTED\n"), connected
    transport.written.clear()
    return client, transport, opener


def expiry_timer(timers: ClientTimers) -> object:
    return timers._token_expiry._timer  # noqa: SLF001 - the guard's handle


async def test_a_token_login_arms_the_expiry_timer_and_the_close_cancels_it() -> None:
    client, _transport, _opener = await token_login(time.time() + 3600)
    assert client.session.user == "alice"  # a token's user is its subject
    assert expiry_timer(client.timers) is not None
    client.close("test")
    assert expiry_timer(client.timers) is None


async def test_a_password_login_arms_no_expiry_timer() -> None:
    server = make_server()
    client, transport = connect_client(server)
    client.link.glue.login.opener = Opener()
    client.data_received(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0")
    await settle()
    assert client.session.state is State.CONNECTED
    assert expiry_timer(client.timers) is None


async def test_the_expiry_timer_ends_the_session_with_the_error() -> None:
    expires_at = time.time() + 3600
    client, transport, _opener = await token_login(expires_at)
    client.session.tokens._clock = lambda: expires_at + 0.1  # noqa: SLF001 - exp has passed
    client.timers._token_expired()  # noqa: SLF001 - the timer's callback
    (error,) = transport.frames()
    assert error.startswith(b"ERROR\n") and b"message:Token expired\n" in error
    assert client.closed and transport.eof_written


async def test_an_early_timer_waits_for_the_exp_again() -> None:
    expires_at = time.time() + 3600
    client, transport, _opener = await token_login(expires_at)
    client.timers._token_expired()  # noqa: SLF001 - fired an hour early: armed again
    assert not client.closed and transport.frames() == []
    assert expiry_timer(client.timers) is not None


async def test_a_refresh_is_a_broker_call_whose_refusal_ends_the_session() -> None:
    """UpdateSecret goes through ClientLink's task (the socket is not read meanwhile); the
    in-memory link is not an AMQP connection of its own, so update-secret refuses it, and the
    session answers ERROR with the RECEIPT and closes."""
    client, transport, _opener = await token_login(time.time() + 3600)
    fresh = token(sub="alice", exp=int(time.time() + 7200))
    client.data_received(f"SEND\ndestination:/auth/token\nreceipt:r1\n\n{fresh}\0".encode())
    assert not transport.reading  # a broker call
    await settle()
    (error,) = transport.frames()
    assert error.startswith(b"ERROR\n") and b"message:Token refused\n" in error
    assert b"connection of its own" in error
    assert client.closed
    assert fresh.encode() not in error


async def test_the_handshake_token_reaches_the_session_after_the_origin_check() -> None:
    server = make_server()
    jwt = token(sub="alice", exp=int(time.time() + 3600))
    for origin, opened in (("https://good.example", True), ("https://evil.example", False)):
        socket = WebSocketConnection(
            server, WebStompSettings(compress=False, allow_origins=("https://good.example",)), tls=False
        )
        raw = RawSocket()
        socket.connection_made(raw)  # type: ignore[arg-type]
        key = base64.b64encode(b"0123456789abcdef").decode()
        socket.data_received(
            (
                "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nOrigin: {origin}\r\n"
                f"Authorization: Bearer {jwt}\r\n\r\n"
            ).encode()
        )
        if opened:
            assert bytes(raw.written).startswith(b"HTTP/1.1 101")
            session = socket._session  # noqa: SLF001
            assert session is not None
            assert session.session.tokens.handshake_token == jwt
            session.close("test")
        else:
            assert bytes(raw.written).startswith(b"HTTP/1.1 403") and socket._session is None  # noqa: SLF001
