"""A frame-aware AMQP 0-9-1 fault-injection proxy for the tests, between the adapter and a real
broker.

The machines the tests run on have one RabbitMQ (3.10.8); what a newer broker does differently
on the wire, or what a broker does only when it fails, is played by this proxy: every client
connection gets its own upstream connection to the real broker, and every frame in either
direction goes through a chain of *hooks*, which may pass it on, change it, drop it, answer it
themselves, wait, or end the link.  Everything the hooks do not touch is the real broker's.

Hooks (subclass :class:`Hook`, override what you need; each call may await, which holds that
direction of that link and nothing else):

* :class:`ServerVersion`: connection.start's server-properties say another ``version``
  (or none at all);
* :class:`RefuseTransientQueues`: a queue.declare of a new non-durable non-exclusive queue is
  answered the way RabbitMQ 4.3 answers it (the deprecated feature ``transient_nonexcl_queues``,
  denied by default): connection.close 541 with the broker's deprecation text;
* :class:`MethodLog`: records the methods the clients sent, for assertions on their fields
  (the flags of each queue.declare, the ``global`` bit of basic.qos ...).

Use :class:`ProxyThread` from synchronous tests (the proxy gets an event loop in a thread of its
own, as tests/support.py runs the adapter)::

    with ProxyThread(broker_url, [ServerVersion("4.3.0"), RefuseTransientQueues(broker_url)]) as proxy:
        adapter = start_adapter(amqp_url=proxy.url)

Frames are split here (type, channel, size, payload, frame end: AMQP 0-9-1 §2.3.5); methods
are decoded and encoded with pamqp, an implementation independent of the adapter's.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import aiormq
from pamqp import commands
from pamqp import frame as pamqp_frame

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD = 1
FRAME_END = 0xCE

CONNECTION_START = commands.Connection.Start.index
CONNECTION_OPEN = commands.Connection.Open.index
CONNECTION_CLOSE_OK = commands.Connection.CloseOk.index
QUEUE_DECLARE = commands.Queue.Declare.index

# rabbit_deprecated_features.erl (v4.3.x), the generated ``when_denied`` text of a deprecated
# feature in the denied_by_default phase, for transient_nonexcl_queues (rabbit_amqqueue.erl)
TRANSIENT_NONEXCL_DENIED = (
    "Feature `transient_nonexcl_queues` is deprecated.\n"
    "By default, this feature is not permitted anymore.\n"
    "The feature will be removed from a future major RabbitMQ version, regardless of the "
    "configuration; actual version to be determined.\n"
    "To continue using this feature when it is not permitted by default, set the following "
    "parameter in your configuration:\n"
    '    "deprecated_features.permit.transient_nonexcl_queues = true"'
)
# rabbit_binary_generator:amqp_exception_explanation: "<NAME> - <explanation>", at most 255
# characters (a shortstr); rabbit_channel raises it as internal_error, a hard (connection) error
REFUSAL_TEXT = f"INTERNAL_ERROR - {TRANSIENT_NONEXCL_DENIED}"[:255]


@dataclass(frozen=True, slots=True)
class Frame:
    """One AMQP frame as it travels: type, channel, payload (without the frame end)."""

    type: int
    channel: int
    payload: bytes

    @property
    def method_index(self) -> int | None:
        """pamqp's ``index`` of a method frame's method (class << 16 | method), else None."""
        if self.type != FRAME_METHOD or len(self.payload) < 4:
            return None
        return int(struct.unpack_from(">I", self.payload)[0])

    def decode(self) -> Any:
        """The pamqp method object of a method frame."""
        _, _, method = pamqp_frame.unmarshal(self.to_bytes())
        return method

    def to_bytes(self) -> bytes:
        return struct.pack(">BHI", self.type, self.channel, len(self.payload)) + self.payload + b"\xce"

    @classmethod
    def method(cls, channel: int, method: Any) -> Frame:
        raw = pamqp_frame.marshal(method, channel)
        return cls(raw[0], channel, raw[7:-1])


class Link:
    """One client connection through the proxy, and its own connection to the broker."""

    def __init__(
        self,
        proxy: AmqpProxy,
        number: int,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        server: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self.proxy = proxy
        self.number = number
        self._client_reader, self._client_writer = client
        self._server_reader, self._server_writer = server
        self.vhost = "/"  # from the client's connection.open
        # a hook answered for the broker and ended the AMQP connection: nothing more goes
        # upstream, and the client's socket closes after its close-ok (as RabbitMQ does)
        self.detached = False
        self.closed = asyncio.Event()

    def to_client(self, frame: Frame) -> None:
        if not self._client_writer.is_closing():
            self._client_writer.write(frame.to_bytes())

    def to_server(self, frame: Frame) -> None:
        if not self.detached and not self._server_writer.is_closing():
            self._server_writer.write(frame.to_bytes())

    def close_connection(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        """Answer the client for the broker with connection.close, and drop the upstream
        connection (the broker sees the client vanish and cleans up its queues and consumers)."""
        self.to_client(Frame.method(0, commands.Connection.Close(code, text[:255], class_id, method_id)))
        self.detached = True
        self._server_writer.close()

    def abort(self) -> None:
        """Cut both sockets at once, no AMQP close on either side."""
        self.detached = True
        for writer in (self._client_writer, self._server_writer):
            transport = writer.transport
            transport.abort()
        self.closed.set()

    def reset(self) -> None:
        """Cut the client's socket with a TCP reset (SO_LINGER 0), as a broker that cannot take
        the connection may, and drop the upstream one."""
        self.detached = True
        sock = self._client_writer.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.abort()

    def close(self) -> None:
        for writer in (self._client_writer, self._server_writer):
            writer.close()
        self.closed.set()

    async def run(self) -> None:
        hooks = self.proxy.hooks
        try:
            header = await self._client_reader.readexactly(len(PROTOCOL_HEADER))
            for hook in hooks:
                await hook.client_connected(self)
            self._server_writer.write(header)
            upstream = asyncio.create_task(self._pump(self._server_reader, False))
            try:
                await self._pump(self._client_reader, True)
            finally:
                upstream.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await upstream
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.close()

    async def _pump(self, reader: asyncio.StreamReader, from_client: bool) -> None:
        """Frames of one direction, in order, through the hooks.  Returns at the end of the
        stream; the upstream end of a detached link ends nothing."""
        while True:
            try:
                head = await reader.readexactly(7)
            except (asyncio.IncompleteReadError, ConnectionError):
                if not from_client and self.detached:
                    await asyncio.Event().wait()  # the client's side decides when it ends
                return
            type_, channel, size = struct.unpack(">BHI", head)
            payload = await reader.readexactly(size + 1)
            frames: Sequence[Frame] = [Frame(type_, channel, payload[:-1])]
            if from_client:
                if self.detached:
                    if frames[0].method_index == CONNECTION_CLOSE_OK:
                        return
                    continue
                if frames[0].method_index == CONNECTION_OPEN:
                    self.vhost = frames[0].decode().virtual_host
            for hook in self.proxy.hooks:
                frames = await _through(hook, self, frames, from_client)
            for frame in frames:
                self.to_server(frame) if from_client else self.to_client(frame)


async def _through(hook: Hook, link: Link, frames: Iterable[Frame], from_client: bool) -> list[Frame]:
    out: list[Frame] = []
    for frame in frames:
        if link.detached:
            break
        if from_client:
            out += await hook.client_frame(link, frame)
        else:
            out += await hook.server_frame(link, frame)
    return out


class Hook:
    """A step of the proxy's frame chain; the base class changes nothing.

    ``client_frame`` / ``server_frame`` return the frames to pass on for one frame from the
    client / the broker: ``[frame]`` unchanged, another frame, several, or none.  They may
    await (a stall holds that direction of that link only), write to either side
    (``link.to_client``, ``link.to_server``), or end the link (``link.close_connection``,
    ``link.abort``).
    """

    async def client_connected(self, link: Link) -> None:
        """A client sent the protocol header; the upstream connection is open."""

    async def client_frame(self, link: Link, frame: Frame) -> list[Frame]:
        return [frame]

    async def server_frame(self, link: Link, frame: Frame) -> list[Frame]:
        return [frame]


class ServerVersion(Hook):
    """connection.start says the broker is ``version`` (None: no ``version`` property)."""

    def __init__(self, version: str | None, product: str | None = None) -> None:
        self.version = version
        self.product = product

    async def server_frame(self, link: Link, frame: Frame) -> list[Frame]:
        if frame.method_index != CONNECTION_START:
            return [frame]
        start = frame.decode()
        properties = dict(start.server_properties)
        properties.pop("version", None)
        if self.version is not None:
            properties["version"] = self.version
        if self.product is not None:
            properties["product"] = self.product
        start.server_properties = properties
        return [Frame.method(frame.channel, start)]


class MethodLog(Hook):
    """Records the methods the clients sent (pamqp objects, with the link's number), as they
    reach this hook: before the hooks after it, whatever those do with them."""

    def __init__(self) -> None:
        self.methods: list[tuple[int, Any]] = []

    async def client_frame(self, link: Link, frame: Frame) -> list[Frame]:
        if frame.method_index is not None:
            self.methods.append((link.number, frame.decode()))
        return [frame]

    def sent(self, method: type) -> list[Any]:
        """The methods of one pamqp class, e.g. ``commands.Queue.Declare``, in order."""
        return [m for _, m in self.methods if isinstance(m, method)]

    def declares(self, queue: str | None = None) -> list[Any]:
        """The queue.declare methods (of ``queue``, if given)."""
        found = self.sent(commands.Queue.Declare)
        return found if queue is None else [d for d in found if d.queue == queue]


class RefuseTransientQueues(Hook):
    """RabbitMQ 4.3's answer to a queue.declare of a new transient (non-durable) non-exclusive
    queue: connection.close 541 with the deprecation text (rabbit_amqqueue:declare,
    is_queue_args_combination_permitted; rabbit_channel raises it as a hard error).

    As in rabbit_channel, a queue that exists already gets the equivalence check instead: such
    a declare goes to the real broker, and so do passive ones.  Whether the queue exists is
    asked of the broker with a passive declare on a connection of the proxy's own, in the
    link's vhost (an exclusive queue of another connection exists too).  ``refused`` lists the
    queue names refused.
    """

    def __init__(self, broker_url: str) -> None:
        parts = urlsplit(broker_url)
        self._base = f"{parts.scheme}://{parts.netloc}/"
        self._connections: dict[str, aiormq.abc.AbstractConnection] = {}
        self.refused: list[str] = []

    async def client_frame(self, link: Link, frame: Frame) -> list[Frame]:
        if frame.method_index != QUEUE_DECLARE:
            return [frame]
        declare = frame.decode()
        if declare.passive or declare.durable or declare.exclusive:
            return [frame]
        if declare.queue and await self._exists(link.vhost, declare.queue):
            return [frame]
        self.refused.append(declare.queue)
        class_id, method_id = divmod(QUEUE_DECLARE, 1 << 16)
        link.close_connection(541, REFUSAL_TEXT, class_id, method_id)
        return []

    async def _exists(self, vhost: str, queue: str) -> bool:
        connection = self._connections.get(vhost)
        if connection is None or connection.is_closed:
            connection = await aiormq.connect(self._base + quote(vhost, safe=""))
            self._connections[vhost] = connection
        channel = await connection.channel()
        try:
            await channel.queue_declare(queue, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return False
        except aiormq.exceptions.ChannelLockedResource:
            return True
        with contextlib.suppress(Exception):
            await channel.close()
        return True

    async def close(self) -> None:
        for connection in self._connections.values():
            with contextlib.suppress(Exception):
                await connection.close()
        self._connections.clear()


class AmqpProxy:
    """Listens on 127.0.0.1 (a free port) and relays each connection to ``upstream`` through
    ``hooks``, in their order."""

    def __init__(self, upstream: tuple[str, int], hooks: Sequence[Hook] = ()) -> None:
        self.upstream = upstream
        self.hooks = list(hooks)
        self.links: list[Link] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            server = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        link = Link(self, len(self.links), (reader, writer), server)
        self.links.append(link)
        await link.run()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in self.links:
            link.abort()
        for hook in self.hooks:
            closer = getattr(hook, "close", None)
            if closer is not None:
                await closer()


class ProxyThread:
    """An :class:`AmqpProxy` on an event loop of its own, for synchronous tests; a context
    manager.  ``url`` is ``broker_url`` with the proxy's address."""

    def __init__(self, broker_url: str, hooks: Sequence[Hook] = ()) -> None:
        parts = urlsplit(broker_url)
        self._broker = parts
        self.proxy = AmqpProxy((parts.hostname or "127.0.0.1", parts.port or 5672), hooks)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="amqp-proxy", daemon=True)

    @property
    def url(self) -> str:
        credentials = self._broker.netloc.rsplit("@", 1)[0] + "@" if "@" in self._broker.netloc else ""
        return f"{self._broker.scheme}://{credentials}127.0.0.1:{self.proxy.port}{self._broker.path}"

    def run(self, coro: Any, timeout: float = 10) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def __enter__(self) -> ProxyThread:
        self._thread.start()
        self.run(self.proxy.start())
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.run(self.proxy.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()
