"""STOMP over WebSocket, as RabbitMQ's ``rabbitmq_web_stomp`` plugin serves it.

Owns one accepted socket of a ``web_stomp`` listener: the optional PROXY header (through
adapter/server/proxy_prelude.py), the HTTP request and the opening handshake (through
adapter/server/websocket_handshake.py), the WebSocket's messages (wsproto), and the small
transport object through which the unchanged ``ClientConnection`` (the same session, limits and
errors as over TCP) reads and writes STOMP.  Behaviour decided here, each as the plugin does
unless docs/compatibility.md says otherwise:

- sub-protocols: the highest of ``v12.stomp``, ``v11.stomp``, ``v10.stomp`` offered is chosen;
  anything else (``stomp`` included) is accepted without a ``Sec-WebSocket-Protocol`` answer;
- every STOMP frame the adapter sends is one WebSocket message (text or binary per
  ``web_stomp.ws_frame``), heart-beats are ``"\\n"`` messages; what the client sends is a byte
  stream: several frames in one message and one frame over several messages both work;
- after the session ends (DISCONNECT, ERROR, timeouts) the adapter closes with 1000
  ``STOMP died``; a message over ``ws_opts.max_frame_size`` gets 1009, and so does a compressed
  message that would inflate past its bound (adapter/server/wsdeflate.py); invalid UTF-8 in a
  text message 1007 (wsproto's check), no input for ``ws_opts.idle_timeout`` 1000;
- permessage-deflate is accepted while the process's compression budget has room, otherwise
  the WebSocket is served uncompressed;
- plain HTTP: a GET on the WebSocket path without an upgrade gets 426, the web console is
  served under ``/console``, anything else 404; an ``Origin`` outside
  ``web_stomp.allow_origins`` gets 403; a request not complete in time 408 (nothing at all: a
  plain close);
- ``use_http_auth``: the Basic credentials (or bearer JWT) of the request replace CONNECT's,
  no header means the default user, and any other header closes the new WebSocket with 1011
  before a session opens.

Why wsproto (docs/architecture.md, "WebSocket"): it is sans-IO like the STOMP and AMQP cores, so
it runs inside this protocol's own ``data_received`` with no second event loop or task per
socket, and the adapter keeps its flow control.  Outgoing messages are framed here (a 2-10 byte
header, RFC 6455 section 5.2; RFC 7692 for permessage-deflate): the session's frames are bytes,
and wsproto's ``send`` wants a ``str`` for a text message, which would cost a decode and an
encode per MESSAGE and refuse bodies that are not UTF-8 (the plugin sends them as they are).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import struct
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from wsproto import WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    BytesMessage,
    CloseConnection,
    Ping,
    TextMessage,
)
from wsproto.extensions import PerMessageDeflate
from wsproto.utilities import LocalProtocolError

from ..caps import ConnectionCap
from ..stomp.output import MESSAGE_FRAMES
from .connection import ClientConnection
from .handshake_token import is_bearer
from .proxy_prelude import ProxyPrelude
from .websocket_handshake import WebSocketHandshake, choose_subprotocol

__all__ = [
    "CLOSE_INTERNAL_ERROR",
    "CLOSE_NORMAL",
    "BadAuthorization",
    "WebSocketConnection",
    "WebSocketTransport",
    "WebStompSettings",
    "basic_credentials",
    "choose_subprotocol",
    "frame_header",
    "warn_open_origins",
]

if TYPE_CHECKING:
    from .connection import ServerState

log = logging.getLogger("adapter.websocket")

# The plugin's close code and reason once the STOMP session behind the socket has ended.
CLOSE_NORMAL = 1000
STOMP_DIED = "STOMP died"
CLOSE_TOO_BIG = 1009
# The plugin's close code when its handler fails while opening the session (a bad Authorization
# header with use_http_auth): cowboy answers a crash with 1011.
CLOSE_INTERNAL_ERROR = 1011
# How long the adapter waits for the client's answer to its Close before dropping the socket.
_CLOSE_WAIT_SECONDS = 2.0
# Stop reading a client whose unread output (pongs included) passes this many bytes.
_MAX_UNSENT_CONTROL = 1024 * 1024
# How far past the STOMP frame limit one compressed message may inflate when
# web_stomp.ws_opts.max_frame_size is not set: room for heart-beat EOLs around a frame of the
# largest size (adapter/server/wsdeflate.py)
_INFLATE_ROOM = 4096
# What one read callback handles before the rest waits for the next loop turn: wsproto makes an
# event of every frame, a frame can be 6 bytes, and each event costs Python work here (a pong
# written, a message fed to the session); a 256 KiB read of empty pings held the loop 1-2 s.
# Bounded per turn in events and in message bytes (inflated ones: ~80 bytes can be 64 KiB).
_TURN_EVENTS = 256
_TURN_BYTES = 1024 * 1024
_OPCODE_TEXT = 0x1
_OPCODE_BINARY = 0x2


@dataclass(frozen=True, slots=True)
class WebStompSettings:
    """The ``web_stomp.*`` settings one listener serves with (docs/configuration.md)."""

    path: str = "/ws"
    frame_type: Literal["text", "binary"] = "text"
    # bytes one WebSocket message may carry; None: no limit (cowboy's default in 3.10.8),
    # the STOMP frame limits apply in any case
    max_message_size: int | None = None
    use_http_auth: bool = False
    compress: bool = True
    # seconds without any input on an open WebSocket before it is closed (cowboy's 60 s)
    idle_timeout: float = 60.0
    # seconds the client has to send its HTTP request (cowboy's request_timeout, 5 s in the plugin)
    request_timeout: float = 5.0
    # Origin header values allowed to open a WebSocket; empty: every origin
    allow_origins: tuple[str, ...] = ()
    proxy_protocol: bool = False
    # Strict-Transport-Security value for wss:// listeners (web_stomp.hsts.policy), or None
    hsts_policy: str | None = None
    console: bool = True
    # adapter.web_stomp_token_cookie: the cookie that may carry an OAuth 2.0 token (handshake_token.py)
    token_cookie: str | None = None


def warn_open_origins(
    listeners: list[WebStompSettings], addresses: list[tuple[str, int]], default_user: str | None
) -> None:
    """At start-up: a listener without ``web_stomp.allow_origins`` serves WebSockets a browser
    opens for any page, and with a default user a CONNECT without a login is that user; so any
    web page open in a browser that reaches the listener (one on this host included, which
    loopback_users lets through) can send and receive as that user.  Served all the same, as
    by the plugin: the operator is told."""
    if default_user is None or not addresses or all(web.allow_origins for web in listeners):
        return
    log.warning(
        "WebSocket listener %s accepts WebSockets from every web origin and logs a CONNECT without "
        "a login in as %r: any web page open in a browser that reaches it (on this host too) can "
        "use the broker as that user; set web_stomp.allow_origins to the pages' origins, or leave "
        "stomp.default_user empty",
        ", ".join(f"[{host}]:{port}" if ":" in host else f"{host}:{port}" for host, port in addresses),
        default_user,
    )


class BadAuthorization(ValueError):
    """An ``Authorization`` header that is not readable Basic credentials."""


def basic_credentials(value: str | None) -> tuple[str, str] | None:
    """login and passcode of an ``Authorization: Basic`` header; None when there is no header
    (the default user then, as with the plugin).  Raises BadAuthorization for another scheme or
    credentials that cannot be read: the plugin's handler fails the connection then, and falling
    back to the default user would log a client in as someone it did not ask to be."""
    if value is None:
        return None
    scheme, _, encoded = value.strip().partition(" ")
    if scheme.lower() != "basic":
        raise BadAuthorization("not Basic credentials")
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise BadAuthorization("Basic credentials that cannot be decoded") from None
    login, colon, passcode = decoded.partition(":")
    if not colon:
        raise BadAuthorization("Basic credentials without a colon")
    return login, passcode


def frame_header(opcode: int, length: int, rsv1: bool = False) -> bytes:
    """The header of one unmasked, final server frame (RFC 6455 section 5.2)."""
    first = 0x80 | (0x40 if rsv1 else 0) | opcode
    if length < 126:
        return bytes((first, length))
    if length < 65536:
        return struct.pack("!BBH", first, 126, length)
    return struct.pack("!BBQ", first, 127, length)


class _Deflater:
    """permessage-deflate for outgoing messages with the parameters the handshake agreed."""

    __slots__ = ("_bits", "_compressor", "_takeover")

    def __init__(self, extension: PerMessageDeflate) -> None:
        self._bits = extension.server_max_window_bits
        self._takeover = not extension.server_no_context_takeover
        self._compressor = self._new()

    def _new(self) -> Any:
        return zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, -self._bits)

    def compress(self, data: bytes) -> bytes:
        compressor = self._compressor
        out: bytes = compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)
        if not self._takeover:
            self._compressor = self._new()
        return out[:-4]  # without the 00 00 ff ff every sync flush ends with (RFC 7692 7.2.1)


class WebSocketTransport:
    """What ``ClientConnection`` writes to and pauses: each write is one WebSocket message."""

    def __init__(self, owner: WebSocketConnection) -> None:
        self._owner = owner

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._owner.send_messages((bytes(data),))

    def writelines(self, items: Any) -> None:
        self._owner.send_messages(items)

    def can_write_eof(self) -> bool:
        return False

    def write_eof(self) -> None:  # pragma: no cover - can_write_eof() is False
        raise NotImplementedError

    def close(self) -> None:
        self._owner.close_websocket(CLOSE_NORMAL, STOMP_DIED)

    def abort(self) -> None:
        self._owner.abort()

    def is_closing(self) -> bool:
        return self._owner.closing

    def pause_reading(self) -> None:
        self._owner.set_paused("session", True)

    def resume_reading(self) -> None:
        self._owner.set_paused("session", False)

    def get_write_buffer_size(self) -> int:
        raw = self._owner.raw
        return raw.get_write_buffer_size() if raw is not None else 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._owner.extra_info(name, default)


class WebSocketConnection(asyncio.Protocol):
    """One socket of a web_stomp listener: PROXY header, HTTP, then WebSocket."""

    def __init__(
        self,
        server: ServerState,
        settings: WebStompSettings,
        *,
        tls: bool,
        proxy_read: bool = False,
        client_address: tuple[str, int] | None = None,
        cap: ConnectionCap | None = None,
    ) -> None:
        """``proxy_read``: the PROXY header was already read before the TLS handshake (wss://,
        adapter/server/listener.py), and ``client_address`` is what it said.  ``cap``: the
        listener's web_stomp.max_connections count (None: no cap)."""
        self._server = server
        self._cap = cap
        self._proxy_read = proxy_read
        self._client_address = client_address
        self._settings = settings
        self._loop = asyncio.get_running_loop()
        self.raw: asyncio.Transport | None = None
        self.peer = "?"
        self._peername: tuple[str, int] | None = None
        self._phase: Literal["proxy", "http", "websocket", "closing", "closed"] = "http"
        self._proxy = ProxyPrelude(server.stats, "WebSocket connection", log)  # with web_stomp.proxy_protocol
        self._handshake = WebSocketHandshake(self, settings, server.ws_compression, cap, tls=tls)
        self._ws: WSConnection | None = None
        self._session: ClientConnection | None = None
        self._opcode = _OPCODE_BINARY if settings.frame_type == "binary" else _OPCODE_TEXT
        self._deflater: _Deflater | None = None
        self._message_size = 0  # bytes of the client's current message so far
        self._backlog = False  # wsproto holds events for the next loop turn (_handle_events)
        self._paused: set[str] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._last_input = 0.0
        self.closing = False

    # ------------------------------------------------------------------ socket events
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = transport  # type: ignore[assignment]  # uvloop's are not asyncio.Transport
        self._server.open_sockets.add(self)
        peername = transport.get_extra_info("peername")
        if peername:
            self._peername = (peername[0], peername[1])
        if self._client_address is not None:
            self._peername = self._client_address
        self.peer = _format_peer(self._peername)
        # socket options and the descriptor watch are applied by ClientConnection, after the upgrade
        if self._cap is not None and not self._cap.acquire(self):
            # over web_stomp.max_connections: the request is read as any other (so that the
            # answer is not lost to a reset) and answered 503 in _handle_request
            self._server.stats.connections_refused["web_stomp_max_connections"] += 1
        if self._settings.proxy_protocol and not self._proxy_read:
            self._phase = "proxy"
        # the request (and a PROXY header before it) must arrive in time
        self._timer = self._loop.call_later(self._settings.request_timeout, self._request_timed_out)
        if self._phase == "proxy" and not self._proxy.trusted(
            self._server.proxy_trust, peername[0] if peername else "?", self.peer
        ):
            self.abort()

    def data_received(self, data: bytes) -> None:
        if self._phase in ("websocket", "closing"):
            self._websocket_input(data)
        elif self._phase == "http":
            self._handshake.receive(data)
        elif self._phase == "proxy":
            self._proxy_input(data)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.open_sockets.discard(self)
        if self._cap is not None:
            self._cap.release(self)  # held from connection_made to here, as ranch counts
        self._handshake.release_compression()
        self.raw = None
        self._phase = "closed"
        self.closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._session is not None:
            self._session.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._session is not None:
            self._session.pause_writing()

    def resume_writing(self) -> None:
        if self._session is not None:
            self._session.resume_writing()
        self.set_paused("output", False)

    def answered(self) -> None:
        self._phase = "closed"

    # ------------------------------------------------------------------ PROXY header and HTTP
    def _proxy_input(self, data: bytes) -> None:
        opened = self._proxy.opened(data, self.peer)
        if opened is None:
            if self._proxy.refusal:
                self.abort()
            return
        if opened.source is not None:
            self._peername = opened.source
            self.peer = _format_peer(opened.source)
        self._phase = "http"
        if opened.rest:
            self._handshake.receive(opened.rest)

    def _request_timed_out(self) -> None:
        self._timer = None
        if self._phase in ("proxy", "http"):
            if self._phase == "proxy":
                self._proxy.timed_out(self.peer, logged=False)
            log.info(
                "closing WebSocket connection from %s: no complete HTTP request in %g s",
                self.peer,
                self._settings.request_timeout,
            )
            if self._phase == "http" and self._handshake.started:
                # cowboy answers a request whose headers do not arrive in time with 408
                self._handshake.respond(408, "Request Timeout: the HTTP request did not arrive in time\n")
            elif self._phase == "http" and self.raw is not None:
                self._phase = "closed"  # nothing arrived: a plain close, as cowboy's
                self.raw.close()
            else:
                self.abort()

    # ------------------------------------------------------------------ the WebSocket
    def upgraded(
        self,
        ws: WSConnection,
        deflate: PerMessageDeflate | None,
        headers: dict[str, str],
        trailing: bytes,
        token: str | None = None,
    ) -> None:
        """The handshake accepted the WebSocket: open the STOMP session behind it (``token``:
        an OAuth 2.0 token the request carried, adapter/server/handshake_token.py)."""
        self._ws = ws
        if deflate is not None and deflate.enabled():
            self._deflater = _Deflater(deflate)
        else:  # offered, but with parameters not accepted (or not offered)
            self._handshake.release_compression()
        self._phase = "websocket"
        if self._timer is not None:
            self._timer.cancel()
        self._last_input = self._loop.time()
        if self._settings.idle_timeout:
            self._timer = self._loop.call_later(self._settings.idle_timeout, self._check_idle)
        credentials: tuple[str, str] | None = None
        # an OAuth 2.0 token in the handshake: a Bearer Authorization is a token, never
        # use_http_auth's Basic credentials
        if self._settings.use_http_auth and is_bearer(headers) and token is not None:
            # use_http_auth: the request's credentials replace CONNECT's, a bearer token's too
            # (Bearer is read first: ``token`` is the header's)
            credentials = ("", token)
            token = None
        elif self._settings.use_http_auth:
            try:
                credentials = basic_credentials(headers.get("authorization"))
            except BadAuthorization as error:
                # no session is opened: the plugin's handler fails here (close 1011) too
                log.warning("WebSocket from %s refused: its Authorization header holds %s", self.peer, error)
                self.close_websocket(CLOSE_INTERNAL_ERROR, "Bad Authorization header")
                return
            if credentials is None:
                defaults = self._server.session_settings
                credentials = (defaults.default_user or "", defaults.default_pass or "")
        session = ClientConnection(
            self._server,
            proxy_protocol=False,
            label="WebSocket ",
            listener="websocket",
            frames=MESSAGE_FRAMES,
        )
        self._session = session
        session.connection_made(WebSocketTransport(self))  # type: ignore[arg-type]
        if credentials is not None and session.session is not None:
            session.session.forced_credentials = credentials
        if token is not None and session.session is not None:
            session.session.tokens.handshake_token = token  # CONNECT's passcode if it has none
        if trailing:
            self._websocket_input(trailing)

    def inflate_limit(self) -> int:
        """Bytes the compressed message now starting may inflate to: the configured message
        limit, or else the STOMP frame limit in force (the smaller one before login) and room
        for heart-beats: one larger message could only be several frames in one message."""
        limit = self._settings.max_message_size
        if limit is not None:
            return limit
        session = self._session
        if session is not None:
            return session.stomp.parser.limits.max_frame_size + _INFLATE_ROOM
        return self._server.session_settings.unauthenticated_limits.max_frame_size + _INFLATE_ROOM

    def _websocket_input(self, data: bytes) -> None:
        ws = self._ws
        assert ws is not None
        self._last_input = self._loop.time()
        try:
            ws.receive_data(data)
        except LocalProtocolError:
            return  # both Close frames exchanged: what still arrives is dropped with the socket
        if not self._backlog:  # else the turn already scheduled goes on with it, in order
            self._handle_events()

    def _next_turn(self) -> None:
        self._backlog = False
        if self._ws is not None and self._phase in ("websocket", "closing"):
            self._handle_events()

    def _handle_events(self) -> None:
        """The events of what wsproto holds, at most ``_TURN_EVENTS`` of them or ``_TURN_BYTES``
        of message payload per loop turn; the rest at the next turn, the socket not read
        meanwhile.  The payloads of one turn reach the session as one read (the client's
        messages are one byte stream to it)."""
        ws = self._ws
        assert ws is not None
        session = self._session
        limit = self._settings.max_message_size
        events = payload_bytes = 0
        pending: list[bytes] = []
        for event in ws.events():
            events += 1
            if isinstance(event, TextMessage | BytesMessage):
                payload = event.data.encode("utf-8") if isinstance(event, TextMessage) else bytes(event.data)
                if limit is not None:
                    self._message_size += len(payload)
                    if self._message_size > limit:
                        self._feed(session, pending)
                        log.info("peer=%s: WebSocket message over %d bytes, closing", self.peer, limit)
                        self.close_websocket(CLOSE_TOO_BIG, "Message too big")
                        return
                    if event.message_finished:
                        self._message_size = 0
                if session is not None and payload:
                    pending.append(payload)
                    payload_bytes += len(payload)
            elif isinstance(event, Ping):
                if self._phase != "websocket":
                    continue
                self._send_raw(ws.send(event.response()))
                raw = self.raw
                if raw is not None and raw.get_write_buffer_size() > _MAX_UNSENT_CONTROL:
                    self.set_paused("output", True)  # a ping flood from a client that reads nothing
            elif isinstance(event, CloseConnection):
                self._feed(session, pending)
                self._close_received(ws, event)
                return
            else:  # Pong: only keeps the idle clock going
                if session is not None:
                    session.mark_read()
            if self._phase != "websocket":
                session = None  # closing: only the client's Close matters now
            if events >= _TURN_EVENTS or payload_bytes >= _TURN_BYTES:
                # the rest of this read at the next turn: the other clients' callbacks first
                self._feed(session, pending)
                self._backlog = True
                self.set_paused("backlog", True)
                self._loop.call_soon(self._next_turn)
                return
        self._feed(session, pending)
        self.set_paused("backlog", False)

    def _feed(self, session: ClientConnection | None, pending: list[bytes]) -> None:
        if pending:
            data = pending[0] if len(pending) == 1 else b"".join(pending)
            pending.clear()
            if session is not None and self._session is session:
                session.data_received(data)

    def _close_received(self, ws: WSConnection, event: CloseConnection) -> None:
        if ws.state is ConnectionState.OPEN:
            # wsproto could not parse the input (invalid UTF-8: 1007, protocol error: 1002)
            log.info("peer=%s: closing WebSocket: %s (%d)", self.peer, event.reason, event.code)
            if event.code == CLOSE_TOO_BIG:  # a compressed message inflating past its bound
                reason = "Message too big"
            elif event.code == 1007:
                reason = "Invalid UTF-8 in a text message"
            else:
                reason = event.reason or ""
            self.close_websocket(event.code, reason.encode()[:120].decode("utf-8", "ignore"))
            return
        if ws.state is ConnectionState.REMOTE_CLOSING:
            self._send_raw(ws.send(event.response()))
        raw = self.raw
        self._phase = "closed"
        self.closing = True
        if raw is not None:
            raw.close()

    def send_messages(self, items: Any) -> None:
        """The session's output: each item (one STOMP frame or a heart-beat) is one message."""
        raw = self.raw
        if raw is None or self._phase != "websocket":
            return
        opcode = self._opcode
        deflater = self._deflater
        out: list[bytes] = []
        for item in items:
            if deflater is not None:
                payload = deflater.compress(item)
                out.append(frame_header(opcode, len(payload), True))
            else:
                payload = item
                out.append(frame_header(opcode, len(payload)))
            out.append(payload)
        raw.writelines(out)

    def _send_raw(self, data: bytes) -> None:
        if data and self.raw is not None:
            self.raw.write(data)

    def close_websocket(self, code: int, reason: str) -> None:
        """Send Close and give the client a moment to answer it before the socket goes."""
        ws = self._ws
        if self._phase != "websocket" or ws is None:
            return
        self._phase = "closing"  # reading on, for the client's answering Close
        self.closing = True
        with contextlib.suppress(LocalProtocolError):
            self._send_raw(ws.send(CloseConnection(code=code, reason=reason)))
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(_CLOSE_WAIT_SECONDS, self.abort)
        # keep reading so that the client's Close (and anything before it) is consumed
        self._paused.clear()
        if self.raw is not None:
            self.raw.resume_reading()
        session, self._session = self._session, None
        if session is not None:
            # the session may still be open (1009, 1007, idle): it ends with the socket
            session.connection_lost(ConnectionAbortedError(f"WebSocket closed with {code} {reason}".strip()))

    def abort(self) -> None:
        self._phase = "closed"
        self.closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.raw is not None:
            self.raw.abort()

    def set_paused(self, reason: str, paused: bool) -> None:
        raw = self.raw
        before = bool(self._paused)
        if paused:
            self._paused.add(reason)
        else:
            self._paused.discard(reason)
        if raw is None or before == bool(self._paused):
            return
        if self._paused:
            raw.pause_reading()
        else:
            raw.resume_reading()

    def _check_idle(self) -> None:
        self._timer = None
        if self._phase != "websocket":
            return
        timeout = self._settings.idle_timeout
        idle = self._loop.time() - self._last_input
        if idle < timeout:
            self._timer = self._loop.call_later(timeout - idle, self._check_idle)
            return
        log.info("peer=%s: no WebSocket input for %g s, closing", self.peer, timeout)
        self.close_websocket(CLOSE_NORMAL, "")

    def extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return self._peername if self._peername is not None else default
        raw = self.raw
        return raw.get_extra_info(name, default) if raw is not None else default


def _format_peer(address: tuple[str, int] | None) -> str:
    if address is None:
        return "?"
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
