"""A session's AMQP link: what the server uses of it, and the asyncio half of its channel.

A STOMP session reaches the broker through one link: a channel core (adapter/amqp/channel.py)
plus the socket it writes to, of one of two kinds:

* a connection of its own (``connection.AmqpConnection``, the default: one session per AMQP
  connection, the socket and the handshake its own);
* a channel on a connection it shares with other sessions (``shared.ChannelLink``, with
  ``adapter.amqp_sessions_per_connection`` above 1: the socket and the handshake are the
  ``SharedConnection``'s).

``SessionLink`` is the interface the server (the shell, the login, the queue dispatchers, the
shared subscriptions) talks to: the per-message methods, the session's synchronous calls, the
flush, flow control, closing, and what the handshake learnt of the broker.  Nothing on the
server asks which kind it holds, except the login, which gives each back where it came from.
``tests/unit/test_amqp_link.py`` checks that both kinds (and the shell tests' in-memory
stand-in) offer all of it, methods with the same parameters; mypy checks the types wherever a
link is handed on.

``AsyncChannel`` is the part both kinds hold (each holds one, neither extends it): the channel
core and the asyncio half of one session's channel: the future of its one synchronous call
(``execute``, ``call``), the flush scheduled for that call, and the failure told to the session
once.  It is the channel core's ``ChannelOwner``; how bytes reach the socket (``flush``) and
what a failure means beyond that are the link's, handed in as callables.

``BrokerEvents`` is what a link reports to whoever holds it (a session's shell, the reuse pool,
the shared connections' registry).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

from ..mapping.destinations import BrokerGeneration
from ..mapping.operations import BasicGet, Delivery, QueueDeclare
from ..mapping.properties import MessageProperties
from . import wire
from .channel import ChannelCore
from .client import BrokerCall, ConnectionCore
from .errors import AmqpError, stomp_error


class BrokerEvents(Protocol):
    def on_deliver(self, delivery: Delivery) -> None: ...

    def on_confirm(self, delivery_tag: int, multiple: bool, ack: bool) -> None: ...

    def on_server_cancel(self, consumer_tag: str) -> None: ...

    # basic.return: a mandatory publish of this session's channel could not be routed (it
    # comes before that publish's confirm)
    def on_return(self, code: int, text: str, exchange: str, routing_key: str) -> None: ...

    def on_amqp_closed(self, error: AmqpError) -> None: ...

    def on_broker_backpressure(self, paused: bool) -> None: ...

    def on_read_done(self) -> None: ...


class SessionLink(Protocol):
    """One session's AMQP link, as the server uses it (see the module docstring)."""

    # what connection.start said of the broker (the CONNECTED frame's server header, the
    # generation whose queue flags the session declares with)
    @property
    def server_properties(self) -> dict[str, object]: ...

    @property
    def broker_version(self) -> str | None: ...

    @property
    def broker_generation(self) -> BrokerGeneration: ...

    # per message: only buffered, written by flush (once per batch of frames)
    def publish(
        self, exchange: str, routing_key: str, properties: MessageProperties, body: bytes
    ) -> None: ...

    # the adapter's own copies of a message it settles once the copy is confirmed: an
    # unroutable one comes back (BrokerEvents.on_return)
    def publish_mandatory(
        self, exchange: str, routing_key: str, properties: MessageProperties, body: bytes
    ) -> None: ...

    def ack(self, delivery_tag: int, multiple: bool) -> None: ...

    def nack(self, delivery_tag: int, multiple: bool, requeue: bool) -> None: ...

    # what basic.get took, handed back; returns what the session waits for before its next call
    def requeue_got(self, delivery_tags: tuple[int, ...]) -> Awaitable[None] | None: ...

    def declare_nowait(self, op: QueueDeclare) -> None: ...

    def flush(self) -> None: ...

    # the session's synchronous operations
    async def execute(self, op: BrokerCall) -> str | Delivery | None: ...

    # flow control: the session's client does not read (or reads again)
    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    # the end
    @property
    def is_open(self) -> bool: ...

    async def delete_queue_on_fresh_channel(self, queue: str) -> None: ...

    async def close(self, timeout: float = 5.0) -> None: ...

    def close_nowait(self) -> None: ...

    def drop(self) -> None: ...


class AsyncChannel:
    """A channel core with the asyncio half of one session's channel (see the module
    docstring).  ``flush`` writes what the channel buffered, ``connected`` says whether there
    is a socket to write to, ``failed`` is the link's answer to a failure (it ends with
    ``fail``)."""

    __slots__ = (
        "_connected",
        "_failed",
        "_flush_handle",
        "_flush_now",
        "_loop",
        "closing",
        "core",
        "pending",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        connection: ConnectionCore,
        channel: int,
        out: list[bytes | memoryview],
        events: BrokerEvents,
        *,
        flush: Callable[[], None],
        connected: Callable[[], bool],
        failed: Callable[[AmqpError], None],
    ) -> None:
        self._loop = loop
        self._flush_now = flush
        self._connected = connected
        self._failed = failed
        self._flush_handle: asyncio.Handle | None = None
        self.core: ChannelCore[BrokerEvents] = ChannelCore(connection, channel, out, events, self)
        # the call waiting for its reply: a str or None, or a basic.get's Delivery
        self.pending: asyncio.Future[object] | None = None
        self.closing = False  # the session has been told the link failed, or it is closing

    # --------------------------------------------------------------------- synchronous calls
    # publish, ack, nack and declare_nowait are the core's: they only buffer, and the client
    # connection that owns this link calls flush() after every batch of STOMP frames it
    # handles.  Scheduling a flush per call instead would cost an extra event-loop turn (a
    # zero-timeout poll) for every read.
    async def execute(self, op: BrokerCall) -> str | Delivery | None:
        """One of the session's synchronous operations as its AMQP method, waiting for the
        reply: the queue name for a QueueDeclare (the server-named one when asked), the message
        of a BasicGet (None: the queue was empty), else None.
        Raises AmqpError (ProcessingError for a value AMQP cannot carry)."""
        frame, reply = self.core.operation_call(op)
        if isinstance(op, BasicGet):
            got = await self._call(frame, (reply, wire.BASIC_GET_EMPTY))
            assert got is None or isinstance(got, Delivery)
            return got
        result = await self.call(frame, reply)
        if isinstance(op, QueueDeclare):
            return result if result is not None else op.queue
        return None

    async def call(self, frame: bytes, *replies: tuple[int, int]) -> str | None:
        """Send a synchronous method and wait for one of ``replies``; returns what
        ``wire.decode_reply`` makes of it (a declared queue's name).  Raises AmqpError."""
        result = await self._call(frame, replies)
        assert result is None or isinstance(result, str)
        return result

    async def _call(self, frame: bytes, replies: tuple[tuple[int, int], ...]) -> object:
        if not self._connected():
            raise AmqpError(504, "AMQP connection is closed")
        assert self.pending is None, "synchronous AMQP calls must not overlap"
        future: asyncio.Future[object] = self._loop.create_future()
        self.core.start_call(frame, replies)
        self.pending = future
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        self._flush_handle = None
        self._flush_now()

    # --------------------------------------------------------------------- the core's owner
    def got(self, delivery: Delivery) -> None:
        future, self.pending = self.pending, None
        if future is not None and not future.done():
            future.set_result(delivery)

    def replied(self, method: tuple[int, int], payload: bytes) -> None:
        # decode before taking the call off: a reply that does not decode fails the link
        # (data_received), and fail() then rejects the call still waiting for it
        result = wire.decode_reply(method, payload)
        future, self.pending = self.pending, None
        if future is not None and not future.done():
            future.set_result(result)

    def channel_failed(self, error: AmqpError) -> None:
        self._failed(error)

    def returned(self, code: int, text: str, exchange: str, routing_key: str) -> None:
        """basic.return of a mandatory publish (the adapter's own copies): the session of this
        channel hears it, and only that one (on a shared connection each channel has its own
        core and owner)."""
        self.core.events.on_return(code, text, exchange, routing_key)

    def encode_failed(self, error: wire.EncodeError) -> Exception:
        return stomp_error(error)

    # --------------------------------------------------------------------- failing
    def fail(self, error: AmqpError) -> None:
        """The link is unusable: reject the pending call and tell the session once."""
        rpc, self.pending = self.pending, None
        self.core.call_replies = None
        if rpc is not None and not rpc.done():
            rpc.set_exception(error)
        if not self.closing:
            self.closing = True
            self.core.events.on_amqp_closed(error)

    def reject_pending(self, error: AmqpError) -> None:
        """The call waiting (if one is) fails with ``error``; nothing more ends it."""
        rpc, self.pending = self.pending, None
        self.core.call_replies = None
        if rpc is not None and not rpc.done():
            rpc.set_exception(error)

    def detach(self) -> None:
        """The channel is over (its socket ended, or the session left its channel on a shared
        connection): let go of the link's callables and have the core let go of this owner
        (they refer back: dropped, the finished link is freed by reference counting).  A late
        call finds no connection; a late failure or reply is heard by nobody."""
        self._flush_now = _nothing
        self._connected = _not_connected
        self._failed = _unheard
        self.core.owner = _DETACHED


def _nothing() -> None:
    """A detached channel's flush: its link writes nothing more."""


def _not_connected() -> bool:
    return False


def _unheard(error: AmqpError) -> None:
    """A detached channel's failure: its link has ended already."""


class _Detached:
    """The owner of a detached channel core: what still comes for it is heard by nobody."""

    def replied(self, method: tuple[int, int], payload: bytes) -> None:
        pass

    def got(self, delivery: Delivery) -> None:
        pass

    def channel_failed(self, error: AmqpError) -> None:
        pass

    def returned(self, code: int, text: str, exchange: str, routing_key: str) -> None:
        pass

    def encode_failed(self, error: wire.EncodeError) -> Exception:
        return stomp_error(error)


_DETACHED = _Detached()
