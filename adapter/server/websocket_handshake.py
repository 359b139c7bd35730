"""The HTTP request in front of a WebSocket (h11) and the WebSocket opening handshake (wsproto).

``WebSocketHandshake`` reads one socket's HTTP request for its ``WebSocketConnection``
(adapter/server/websocket.py), answers a plain request itself and closes (the console, 404,
426 without an upgrade, 403 for an ``Origin`` outside ``web_stomp.allow_origins``, 503 over
``web_stomp.max_connections``, 400 for a bad request or handshake, 408 from the connection's
request timer), and accepts an upgrade: sub-protocol, permessage-deflate within the process's
compression budget (the reservation is its own: ``reserved``, ``release_compression``), the
HSTS header on TLS.  Then it hands the WebSocket over (``upgraded``), as wsproto's handshake
hands over to its connection, with the OAuth 2.0 token the request carries, read after the
origin check (adapter/server/handshake_token.py; adapter.web_stomp_token_cookie).
"""

from __future__ import annotations

import asyncio
import logging
from importlib import resources
from typing import TYPE_CHECKING, Any, Protocol

import h11
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Request
from wsproto.extensions import PerMessageDeflate
from wsproto.utilities import RemoteProtocolError

from .handshake_token import handshake_token
from .wsdeflate import CONTEXT_BYTES, BoundedDeflate

if TYPE_CHECKING:
    from ..caps import ConnectionCap
    from .wsdeflate import CompressionBudget

__all__ = ["HandshakeHost", "WebSocketHandshake", "choose_subprotocol"]

log = logging.getLogger("adapter.websocket")

# Bound on the HTTP request head (request line and headers), as cowboy bounds them.
_MAX_REQUEST_HEAD = 64 * 1024
_CONSOLE_PATH = "/console"


def choose_subprotocol(offered: list[str]) -> str | None:
    """The highest STOMP version the client offers (v10.stomp, v11.stomp, v12.stomp), as the
    plugin picks it; None when it offers none of them (the handshake still succeeds)."""
    known = [p for p in offered if p in ("v10.stomp", "v11.stomp", "v12.stomp")]
    return max(known) if known else None


class HandshakeSettings(Protocol):
    """The ``web_stomp.*`` settings the handshake reads (``WebStompSettings``)."""

    @property
    def path(self) -> str: ...

    @property
    def allow_origins(self) -> tuple[str, ...]: ...

    @property
    def console(self) -> bool: ...

    @property
    def compress(self) -> bool: ...

    @property
    def hsts_policy(self) -> str | None: ...

    @property
    def token_cookie(self) -> str | None: ...  # adapter.web_stomp_token_cookie


class HandshakeHost(Protocol):
    """The connection the handshake reads for (``WebSocketConnection``)."""

    peer: str
    raw: asyncio.Transport | None

    def answered(self) -> None:
        """A plain HTTP answer goes out now, and the socket closes after it."""
        ...

    def upgraded(
        self,
        ws: WSConnection,
        deflate: PerMessageDeflate | None,
        headers: dict[str, str],
        trailing: bytes,
        token: str | None = None,
    ) -> None:
        """The WebSocket is open (the accept is written); ``trailing``: its first bytes;
        ``token``: an OAuth 2.0 token the request carried."""
        ...

    def inflate_limit(self) -> int: ...


class WebSocketHandshake:
    """One socket's HTTP request and WebSocket handshake (see the module docstring)."""

    __slots__ = ("_cap", "_compression", "_host", "_http", "_settings", "_tls", "reserved", "started")

    def __init__(
        self,
        host: HandshakeHost,
        settings: HandshakeSettings,
        compression: CompressionBudget,
        cap: ConnectionCap | None,
        *,
        tls: bool,
    ) -> None:
        self._host = host
        self._settings = settings
        self._compression = compression
        self._cap = cap
        self._tls = tls
        self._http = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_REQUEST_HEAD)
        self.started = False  # some of the HTTP request has arrived
        self.reserved = False  # CONTEXT_BYTES taken from the compression budget

    def release_compression(self) -> None:
        if self.reserved:
            self.reserved = False
            self._compression.release(CONTEXT_BYTES)

    def receive(self, data: bytes) -> None:
        """Bytes of the request (and of what follows it, kept for the WebSocket)."""
        self.started = True
        http = self._http
        http.receive_data(data)
        try:
            event = http.next_event()
        except h11.RemoteProtocolError as error:
            self.respond(error.error_status_hint, f"Bad request: {error}\n")
            return
        if event is h11.NEED_DATA:
            return
        if not isinstance(event, h11.Request):
            self.respond(400, "Bad request\n")
            return
        self._route(event)

    def _route(self, request: h11.Request) -> None:
        # a header sent twice is one comma-separated value, as HTTP reads it and cowboy joins it:
        # two Authorization headers are then unreadable credentials, not the last one's
        headers: dict[str, str] = {}
        for raw_name, raw_value in request.headers:
            name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        target = request.target.decode("latin-1")
        path = target.split("?", 1)[0]
        method = request.method.decode("latin-1")
        settings = self._settings
        if self._cap is not None and not self._cap.holds(self._host):
            log.info(
                "WebSocket connection from %s refused: web_stomp.max_connections (%s) reached",
                self._host.peer,
                self._cap.limit,
            )
            self.respond(503, f"Service Unavailable: web_stomp.max_connections ({self._cap.limit}) reached\n")
            return
        if path == settings.path:
            upgrade = headers.get("upgrade", "").lower()
            if method != "GET" or "websocket" not in upgrade:
                self.respond(
                    426,
                    "This is a WebSocket endpoint: connect with a WebSocket client\n",
                    extra=[("Upgrade", "websocket")],
                )
                return
            origin = headers.get("origin")
            if settings.allow_origins and origin is not None and origin not in settings.allow_origins:
                log.warning(
                    "WebSocket from %s refused: origin %r is not in web_stomp.allow_origins",
                    self._host.peer,
                    origin,
                )
                self.respond(403, "Origin not allowed\n")
                return
            self._accept(request, target, headers)
            return
        if settings.console and method in ("GET", "HEAD") and path in (_CONSOLE_PATH, _CONSOLE_PATH + "/"):
            self.respond(200, _console_page(), content_type="text/html; charset=utf-8", head=method == "HEAD")
            return
        self.respond(404, "Not found\n")

    def respond(
        self,
        status: int,
        body: str | bytes,
        *,
        content_type: str = "text/plain; charset=utf-8",
        extra: list[tuple[str, str]] | None = None,
        head: bool = False,
    ) -> None:
        """Answer one plain HTTP request and close (no keep-alive: the only pages are the
        console and errors, and a browser opens its WebSocket on a new connection anyway)."""
        payload = body.encode("utf-8") if isinstance(body, str) else body
        headers = [
            ("Content-Type", content_type),
            ("Content-Length", str(len(payload))),
            ("Connection", "close"),
            ("Server", "stomp-amqp-adapter"),
            *(extra or []),
        ]
        response = h11.Response(status_code=status, headers=headers)
        if self._http.their_state is h11.ERROR:
            data = _raw_response(status, headers)  # h11 will not write after a broken request
        else:
            try:
                data = self._http.send(response) or b""
            except h11.LocalProtocolError:
                data = _raw_response(status, headers)
        if not head:
            data += payload
        raw = self._host.raw
        self._host.answered()
        if raw is not None:
            raw.write(data)
            raw.close()

    def _accept(self, request: h11.Request, target: str, headers: dict[str, str]) -> None:
        trailing, _closed = self._http.trailing_data
        ws = WSConnection(ConnectionType.SERVER)
        try:
            ws.initiate_upgrade_connection(list(request.headers), target)
            opened = next(ws.events())
        except (RemoteProtocolError, StopIteration) as error:
            self.respond(400, f"Bad WebSocket handshake: {error}\n")
            return
        assert isinstance(opened, Request)
        raw = self._host.raw
        if raw is None:
            return
        extensions: list[Any] = []
        deflate: PerMessageDeflate | None = None
        if self._settings.compress and "permessage-deflate" in headers.get("sec-websocket-extensions", ""):
            # the process-wide budget of compression state: without room, this client is served
            # uncompressed (a server may decline the extension, RFC 7692 5)
            if self._compression.reserve(CONTEXT_BYTES):
                self.reserved = True
                deflate = BoundedDeflate(self._host.inflate_limit)
                extensions.append(deflate)
            else:
                log.info(
                    "WebSocket from %s served without permessage-deflate: the compression budget"
                    " (adapter.web_stomp_compress_budget, %d bytes) is in use",
                    self._host.peer,
                    self._compression.limit,
                )
        extra_headers: list[tuple[bytes, bytes]] = [(b"server", b"stomp-amqp-adapter")]
        if self._tls and self._settings.hsts_policy:
            extra_headers.append((b"strict-transport-security", self._settings.hsts_policy.encode()))
        accept = AcceptConnection(
            subprotocol=choose_subprotocol(opened.subprotocols),
            extensions=extensions,
            extra_headers=extra_headers,
        )
        raw.write(ws.send(accept))
        # an OAuth 2.0 token in the request (never in its URL): read here, after the origin check
        token = handshake_token(headers, opened.subprotocols, self._settings.token_cookie)
        self._host.upgraded(ws, deflate, headers, trailing, token)


def _raw_response(status: int, headers: list[tuple[str, str]]) -> bytes:
    reasons = {
        400: "Bad Request",
        404: "Not Found",
        408: "Request Timeout",
        503: "Service Unavailable",
        431: "Request Header Fields Too Large",
    }
    reason = reasons.get(status, "Error")
    lines = [f"HTTP/1.1 {status} {reason}"] + [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


_console_cache: bytes | None = None


def _console_page() -> bytes:
    """The web console (adapter/server/console.html), read once."""
    global _console_cache
    if _console_cache is None:
        _console_cache = resources.files(__package__).joinpath("console.html").read_bytes()
    return _console_cache
