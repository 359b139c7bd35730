"""The tap's operator port (``--http-listen``): ``GET /metrics`` and ``GET /healthz``.

Owns the tap's Prometheus series and the small HTTP/1.1 answerer that serves them.  The series
are read from the tap's own plain counters when scraped (a ``Collector``), so the proxy counts
with integer additions and no client library call per frame.  One request per connection
(``Connection: close``), parsed with h11 as the adapter's port does, bounded in size and time.
It is its own small server because the adapter's (adapter/server/http.py) serves a Server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

import h11
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from .proxy import Tap
    from .writer import RecordWriter

log = logging.getLogger("adapter.tap")

PREFIX = "stomp_adapter_tap_"
_MAX_REQUEST_BYTES = 16 * 1024
_REQUEST_SECONDS = 10.0


class TapCollector(Collector):
    def __init__(self, tap: Tap, writer: RecordWriter | None) -> None:
        self._tap = tap
        self._writer = writer

    def collect(self) -> Iterator[Metric]:
        tap = self._tap
        yield CounterMetricFamily(
            PREFIX + "connections", "Client connections accepted by the tap", value=tap.connections
        )
        yield GaugeMetricFamily(
            PREFIX + "open_connections", "Client connections open now", value=len(tap.links)
        )
        yield CounterMetricFamily(
            PREFIX + "upstream_failures",
            "Client connections reset because the upstream could not be reached",
            value=tap.upstream_failures,
        )
        for name, what, documentation in (
            ("bytes", "bytes", "Bytes passed on, by direction (in: client to upstream)"),
            ("frames", "frames", "STOMP frames recorded, by direction (in: client to upstream)"),
        ):
            family = CounterMetricFamily(PREFIX + name, documentation, labels=["dir"])
            for direction, value in tap.figures(what).items():
                family.add_metric([direction], value)
            yield family
        yield GaugeMetricFamily(
            PREFIX + "parse_buffer_bytes",
            "Bytes the recorders hold for frames not yet complete (all connections)",
            value=tap.budget.held,
        )
        writer = self._writer
        if writer is not None:
            yield CounterMetricFamily(
                PREFIX + "records_written", "Records written to the recording", value=writer.written
            )
            yield CounterMetricFamily(
                PREFIX + "records_dropped",
                "Records dropped: the writer queue was full, or the disk failed",
                value=writer.dropped,
            )
            yield GaugeMetricFamily(
                PREFIX + "records_queued", "Records waiting for the writer", value=writer.pending
            )
            yield CounterMetricFamily(PREFIX + "files", "Recording files finished", value=writer.files)


def build_registry(tap: Tap, writer: RecordWriter | None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TapCollector(tap, writer))
    return registry


class OperatorPort:
    """``GET /metrics`` (the Prometheus text format) and ``GET /healthz`` (200 while the tap runs)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> str:
        self._server = await asyncio.start_server(self._serve, host or None, port, reuse_address=True)
        name = self._server.sockets[0].getsockname()
        return f"{name[0]}:{name[1]}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(_REQUEST_SECONDS):
                await self._answer(reader, writer)
        except (OSError, TimeoutError, h11.ProtocolError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_REQUEST_BYTES)
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(4096)
                connection.receive_data(data)
                continue
            break
        if not isinstance(event, h11.Request):
            return
        path = event.target.decode("ascii", "replace").split("?", 1)[0]
        if event.method not in (b"GET", b"HEAD"):
            status, body, content_type = 405, b"method not allowed\n", "text/plain; charset=utf-8"
        elif path == "/metrics":
            status, body, content_type = 200, generate_latest(self._registry), CONTENT_TYPE_LATEST
        elif path == "/healthz":
            status, body, content_type = 200, b"ok: the tap is running\n", "text/plain; charset=utf-8"
        else:
            status, body, content_type = 404, b"not found\n", "text/plain; charset=utf-8"
        headers = [
            ("content-type", content_type),
            ("content-length", str(len(body))),
            ("connection", "close"),
        ]
        writer.write(connection.send(h11.Response(status_code=status, headers=headers)) or b"")
        if event.method == b"GET":
            writer.write(connection.send(h11.Data(data=body)) or b"")
        writer.write(connection.send(h11.EndOfMessage()) or b"")
        await writer.drain()
