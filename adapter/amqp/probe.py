"""The calls a shared AMQP connection must not carry, and the one-off connection (a *probe*) that
carries them for one session instead.

With ``adapter.amqp_sessions_per_connection`` above 1, STOMP sessions share an AMQP connection,
a channel each (adapter/amqp/shared.py).  A channel error ends one session; a connection error
ends every session on the connection.  RabbitMQ answers two requests a client can make on
purpose with a connection error:

* exchange.declare of a type it has no plugin for: 503 command_invalid (a SEND or SUBSCRIBE with
  ``declare-exchange:true`` and ``exchange-type:x-...``, adapter.declare_exchanges on);
* basic.get on a stream: 540 not_implemented (a queue browser, ``browser:true``, in the
  activemq profile: ``/amq/queue/NAME`` names an existing queue without saying it is a stream).

Neither can be told beforehand.  AMQP 0-9-1 has no way to ask which exchange types a broker
has (declaring one is the question), nor the type of a queue (queue.declare-ok carries only
the message and consumer counts; a declare that names ``x-queue-type`` fails on any other
difference of arguments, and creates the queue when it is missing); and anything learnt first
could be stale by the call (a queue deleted and declared again as a stream in between).  So
these calls (``needs_probe``: an exchange type other than the four built-in ones, every
basic.get) run on a connection of the session's own, opened with its credentials: the broker
decides there as it would on a connection of the session's own, and a connection error ends
that connection only.  The session then gets the ERROR it gets without multiplexing
(``ChannelLink`` closes its channel on the shared connection and reports the probe's reply
code and text).  Other calls, and every publish, ack and nack, stay on the shared connection:
a plain SEND costs nothing more.

The probe lives as long as it holds what a basic.get took (a browse's messages, taken one by
one and unacknowledged): ``RequeueGot`` hands them back there and closes it, as does the
session's end (the broker requeues them as the probe closes).  Otherwise it closes after its
call.  Opening one is the server's business (``ProbeOpener``: a login of its own with the
session's credentials, at most so many probes open at once per process:
adapter/amqp/probe_runtime.py).

Imports: the AMQP link and the mapping layer's operations and exchange rules.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from ..mapping.exchanges import BUILT_IN_TYPES
from ..mapping.operations import BasicGet, Delivery, ExchangeDeclare
from .errors import AmqpError

if TYPE_CHECKING:
    from .client import BrokerCall
    from .connection import AmqpConnection


def needs_probe(op: BrokerCall) -> bool:
    """Whether the broker may answer ``op`` with a connection error a client chose to draw:
    every basic.get (the queue may be a stream), an exchange.declare of a type that is not
    built in (the broker may have no plugin for it)."""
    if isinstance(op, BasicGet):
        return True
    return isinstance(op, ExchangeDeclare) and op.type not in BUILT_IN_TYPES


class ProbeOpener(Protocol):
    """The server's side (adapter/amqp/probe_runtime.py)."""

    async def open(self, user: str, password: str, vhost: str, ended: Callable[[], bool]) -> AmqpConnection:
        """A fresh AMQP connection logged in with these credentials, once there is room for
        one more probe; raises AmqpError (also for a login the broker refuses).  ``ended``:
        the session is over, stop trying."""
        ...

    def done(self, connection: AmqpConnection) -> Awaitable[None] | None:
        """Close ``connection`` (in the background) and give its place to the next probe;
        returns the close, for a caller that must know it is over (``requeue_got``)."""
        ...


class Probe:
    """One session's probes: its credentials (kept, in memory only, for as long as the session
    is connected), and the probe open while it holds messages a basic.get took."""

    __slots__ = ("_connection", "_holding", "_opener", "_password", "_user", "_vhost", "ended")

    def __init__(self, opener: ProbeOpener, user: str, password: str, vhost: str) -> None:
        self._opener = opener
        self._user = user
        self._password = password
        self._vhost = vhost
        self._connection: AmqpConnection | None = None
        self._holding = False  # a basic.get took a message on the open probe
        self.ended = False  # the session is over: no probe any more

    async def execute(self, op: BrokerCall) -> str | Delivery | None:
        """``op`` on the probe (opened for it unless one holds a browse's messages); raises
        AmqpError as the call would on the session's own connection, after which the probe is
        closed (the session ends)."""
        if self.ended:
            raise AmqpError(504, "AMQP channel is closed", channel_only=True)
        connection = self._connection
        if connection is None:
            connection = await self._opener.open(self._user, self._password, self._vhost, self._is_ended)
            if self.ended:  # the session ended while the probe was opening
                self._opener.done(connection)
                raise AmqpError(504, "AMQP channel is closed", channel_only=True)
            self._connection = connection
        try:
            result = await connection.execute(op)
        except AmqpError:
            self.close()
            raise
        if self._connection is not connection:
            return result  # closed meanwhile (the session ended): its close requeued what it took
        if isinstance(result, Delivery):
            self._holding = True
        elif not self._holding:
            self.close()
        return result

    def requeue_got(self, delivery_tags: tuple[int, ...]) -> Awaitable[None] | None:
        """Hand back what the probe's gets took, there, and close it.  Without a probe (it failed,
        or its first get found the queue empty) there is nothing to hand back: its close
        requeued what it held.

        Returns the probe's close (None: nothing to wait for).  The session waits for it before
        its next call: the nacks go on another connection than the session's channel, so a
        basic.consume of the same queue right after the browse could otherwise reach the queue
        before them, and its consumer get the messages the browse did not take before the ones
        it did (without a probe the nacks precede it on the channel).  The broker answers the
        close (close-ok) once the probe's channel is gone, after it handled the nacks."""
        connection = self._connection
        if connection is not None:
            connection.requeue_got(delivery_tags)  # written before the connection.close
        return self.close()

    def close(self) -> Awaitable[None] | None:
        connection, self._connection = self._connection, None
        self._holding = False
        if connection is not None:
            return self._opener.done(connection)
        return None

    def end(self) -> None:
        """The session is over (or failed): close the probe, open none again, forget the
        password."""
        self.ended = True
        self._password = ""
        self.close()

    def _is_ended(self) -> bool:
        return self.ended

    @property
    def is_open(self) -> bool:
        return self._connection is not None
