"""The operator's HTTP port (``--http-listen``): ``GET /metrics``, ``GET /healthz``, ``GET /readyz``.

Owns one HTTP/1.1 connection: h11 parses requests and frames responses, inside the adapter's
own event loop (no thread, no second server framework: a scrape is one callback between two
others, and the counters it reads cannot change under it).  Keep-alive is supported; a
connection idle for ``IDLE_SECONDS`` is closed.  Answers: 200 or 503 for the health endpoints
(with a one-line reason), the Prometheus text format for /metrics, 404 and 405 otherwise.

What the endpoints answer comes from an ``Endpoints`` object: ``ServerEndpoints`` for a single
adapter process, the supervisor's for ``--workers N`` (adapter/server/workers.py), which adds up
its workers' series.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Protocol

import h11
from prometheus_client import CONTENT_TYPE_LATEST

from .health import Serving, Verdict, liveness, readiness
from .metrics import render

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from .health import BrokerCheck

log = logging.getLogger("adapter.http")

IDLE_SECONDS = 30.0
_MAX_REQUEST_BYTES = 16 * 1024  # request line and headers: health checks and scrapers send little


class Endpoints(Protocol):
    """What the HTTP port reports on, and the set of its open HTTP connections (closed at
    shutdown)."""

    @property
    def http_connections(self) -> set[OperatorHttp]: ...

    async def metrics(self) -> bytes: ...

    def live(self) -> Verdict: ...

    async def ready(self) -> Verdict: ...


class EndpointSource(Serving, Protocol):
    """What ``ServerEndpoints`` reads of a Server (adapter/server/listener.py, which builds on
    this module, so it is named here by what it offers, not imported)."""

    @property
    def http_connections(self) -> set[OperatorHttp]: ...

    @property
    def registry(self) -> CollectorRegistry: ...

    @property
    def broker_check(self) -> BrokerCheck: ...


class ServerEndpoints:
    """The endpoints of one adapter process: its own registry and health."""

    def __init__(self, server: EndpointSource) -> None:
        self._server = server

    @property
    def http_connections(self) -> set[OperatorHttp]:
        return self._server.http_connections

    async def metrics(self) -> bytes:
        return render(self._server.registry)

    def live(self) -> Verdict:
        return liveness(self._server)

    async def ready(self) -> Verdict:
        return await readiness(self._server, self._server.broker_check)


class OperatorHttp(asyncio.Protocol):
    def __init__(self, server: Endpoints) -> None:
        self._server = server
        self._http = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_REQUEST_BYTES)
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._idle: asyncio.TimerHandle | None = None
        self._answering: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's are not asyncio.Transport
        self._server.http_connections.add(self)
        self._arm_idle_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._server.http_connections.discard(self)
        if self._idle is not None:
            self._idle.cancel()

    def data_received(self, data: bytes) -> None:
        self._http.receive_data(data)
        self._next_request()

    def eof_received(self) -> bool:
        self._http.receive_data(b"")
        self._next_request()
        return False

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _arm_idle_timer(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        self._idle = self._loop.call_later(IDLE_SECONDS, self.abort)

    def _next_request(self) -> None:
        if self._answering is not None or self._transport is None:
            return  # one request at a time; the rest waits in h11's buffer
        try:
            event = self._http.next_event()
        except h11.RemoteProtocolError:
            self._send_simple(400, b"bad request\n")
            self._transport.close()
            return
        if event is h11.NEED_DATA:
            return
        if isinstance(event, h11.Request):
            self._transport.pause_reading()
            self._answering = self._loop.create_task(self._answer(event))
            return
        if isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
            self._transport.close()

    async def _answer(self, request: h11.Request) -> None:
        try:
            status, content_type, body = await self._route(request)
            self._send_simple(status, body, content_type, head=request.method == b"HEAD")
        except Exception:  # a bug must not take the server down: report it, drop this connection
            log.exception("internal error answering %r", request.target)
            self.abort()
            return
        finally:
            self._answering = None
        transport = self._transport
        if transport is None:
            return
        if self._http.our_state is h11.DONE and self._http.their_state is h11.DONE:
            self._http.start_next_cycle()
            self._arm_idle_timer()
            transport.resume_reading()
            self._next_request()
        elif self._http.their_state is h11.SEND_BODY:
            transport.close()  # a request with a body: nothing here takes one
        else:
            transport.close()

    async def _route(self, request: h11.Request) -> tuple[int, bytes, bytes]:
        path = request.target.split(b"?", 1)[0]
        if path not in (b"/metrics", b"/healthz", b"/readyz"):
            return 404, b"text/plain; charset=utf-8", b"not found: try /metrics, /healthz or /readyz\n"
        if request.method not in (b"GET", b"HEAD"):
            return 405, b"text/plain; charset=utf-8", b"method not allowed\n"
        if path == b"/metrics":
            return 200, CONTENT_TYPE_LATEST.encode(), await self._server.metrics()
        verdict = self._server.live() if path == b"/healthz" else await self._server.ready()
        return (200 if verdict.ok else 503), b"text/plain; charset=utf-8", f"{verdict.detail}\n".encode()

    def _send_simple(
        self, status: int, body: bytes, content_type: bytes = b"text/plain; charset=utf-8", head: bool = False
    ) -> None:
        transport = self._transport
        if transport is None or self._http.our_state is not h11.SEND_RESPONSE:
            return
        headers = [
            (b"content-type", content_type),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
        ]
        if status == 405:
            headers.append((b"allow", b"GET, HEAD"))
        out = self._http.send(h11.Response(status_code=status, headers=headers)) or b""
        if not head:
            out += self._http.send(h11.Data(data=body)) or b""
        out += self._http.send(h11.EndOfMessage()) or b""
        transport.write(out)
