"""AMQP connection reuse between STOMP sessions (``adapter.amqp_connection_reuse``, off by
default) at run time: the process's pool of idle connections, beside its rules
(adapter/amqp/pool.py).

A STOMP session that ends cleanly gives its AMQP connection back: its channel, if the session
used it, is closed in one round trip (the broker cancels its consumers, requeues what it had not
acknowledged, and forgets its qos and confirm mode), and the next session's channel gets a new
number and opens with its first frame; then the connection waits for the next CONNECT of the
same user, vhost and broker node with the same passcode.  That CONNECT takes it at once,
without any I/O, instead of a TCP connection and a six-method handshake, so the login needs no
task either (ClientConnection._execute).  What is never pooled: a connection that had any
error, that the broker blocked or closed, whose reading a slow client paused, that a session
declared an exclusive or auto-delete queue on (temp-queues, /topic/ subscriptions: such queues
belong to the connection), that has subscription queues to delete, or whose session ended with
an ERROR frame.  Idle connections close after
``idle_seconds``, every one ``max_age_seconds`` after the broker last authenticated it; the pool
is per process (per worker under --workers).  docs/configuration.md says what changes for the
broker and for security.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from .connection import AmqpConnection, AmqpError, BrokerEvents
from .pool import ConnectionPool, PasscodeCheck, Pooled, may_return
from .probe_runtime import Unheard

log = logging.getLogger(__name__)

# longest wait for the reply to a session's channel.close
_CHANNEL_TIMEOUT = 5.0


class _Idle:
    """The broker events (``BrokerEvents``) of a connection while no session has it: deliveries
    and confirms of a closing channel are dropped; a close, a failure or a block takes it out of
    the pool."""

    __slots__ = ("_connection", "_reuse")

    def __init__(self, reuse: AmqpReuse, connection: AmqpConnection) -> None:
        self._reuse = reuse
        self._connection = connection

    # deliveries, confirms, cancels, returns and reads of a connection no session reads: dropped, as a
    # probe's (the same no-ops, not a subclass)
    on_deliver = Unheard.on_deliver
    on_confirm = Unheard.on_confirm
    on_server_cancel = Unheard.on_server_cancel
    on_return = Unheard.on_return
    on_read_done = Unheard.on_read_done

    def on_amqp_closed(self, error: AmqpError) -> None:
        self._reuse.forget(self._connection)

    def on_broker_backpressure(self, paused: bool) -> None:
        if paused and not self._connection.reusable:  # connection.blocked, or its socket is full
            self._reuse.forget(self._connection)


class AmqpReuse:
    """The pool of one process and the counters the metrics may read."""

    def __init__(
        self,
        *,
        idle_seconds: float,
        max_age_seconds: float,
        max_size: int,
        clock: Callable[[], float] = time.monotonic,
        passcodes: PasscodeCheck | None = None,
    ) -> None:
        self.pool: ConnectionPool[AmqpConnection] = ConnectionPool(
            idle_seconds=idle_seconds, max_age_seconds=max_age_seconds, max_size=max_size
        )
        self.passcodes = passcodes or PasscodeCheck()
        self._clock = clock
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._closed = False
        self.reused = 0  # logins served by a pooled connection
        self.returned = 0  # connections given back to the pool
        self.not_returned = 0  # connections a session left that were closed instead

    # ------------------------------------------------------------------ login
    def acquire(
        self, node_labels: Iterable[str], user: str, vhost: str, passcode: str, events: BrokerEvents
    ) -> AmqpConnection | None:
        """A pooled connection of ``user`` on ``vhost`` with the same passcode, on the first
        node of ``node_labels`` that has one, with a fresh channel number and its events going to
        ``events`` from now on; None: log in afresh."""
        if self._closed or not len(self.pool):
            return None
        digest = self.passcodes.digest(passcode)
        for label in node_labels:
            key = (label, vhost, user)
            while (entry := self.pool.take(key, digest, self._clock())) is not None:
                connection = entry.connection
                if not connection.reusable:  # closed, failed or blocked since it was pooled
                    self._close(connection)
                    continue
                connection.attach(events)
                self.reused += 1
                return connection
        return None

    def logged_in(
        self, connection: AmqpConnection, node_label: str, user: str, vhost: str, passcode: str
    ) -> None:
        """A fresh login succeeded: remember what for, so that the connection can be pooled
        later; pooled connections of the same user logged in with another passcode go."""
        digest = self.passcodes.digest(passcode)
        key = (node_label, vhost, user)
        connection.pool_identity = (key, digest, self._clock())
        for stale in self.pool.other_passcodes(key, digest):
            self._close(stale)

    # ------------------------------------------------------------------ end of a session
    async def release(
        self, connection: AmqpConnection, *, queues_to_delete: bool, session_failed: bool
    ) -> None:
        """The session is over: pool the connection with its channel closed, or close it."""
        identity = connection.pool_identity
        reason = may_return(
            reusable=connection.reusable and identity is not None,
            shutting_down=self._closed,
            queues_to_delete=queues_to_delete,
            session_failed=session_failed,
        )
        if reason is None:
            connection.attach(_Idle(self, connection))  # the closing channel's frames are dropped
            try:
                async with asyncio.timeout(_CHANNEL_TIMEOUT):  # wait_for would cost a task
                    await connection.recycle_channel()
            except (AmqpError, TimeoutError) as error:
                reason = f"channel close failed: {error}"
            else:
                if self._closed or not connection.reusable:
                    reason = "not reusable after the channel closed"
        if reason is not None or identity is None:
            self.not_returned += 1
            await connection.close()
            return
        key, digest, authenticated_at = identity
        self.returned += 1
        entry = Pooled(connection, key, digest, authenticated_at, self._clock())
        for evicted in self.pool.put(entry):
            self._close(evicted)
        self._schedule_expiry(self.pool.expiry_of(entry))

    # ------------------------------------------------------------------ expiry and shutdown
    def forget(self, connection: AmqpConnection) -> None:
        """The broker closed a pooled connection, it failed, or it is blocked: never hand it out."""
        if self.pool.discard(connection):
            self._close(connection)

    def _schedule_expiry(self, deadline: float | None) -> None:
        """Make the timer fire by ``deadline`` (an entry's expiry, or the pool's next)."""
        if deadline is None or self._closed:
            return
        if self._timer is not None:
            if self._timer_at <= deadline:
                return  # it fires first, and looks for the next deadline then
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        # the pool's clock is time.monotonic; the loop's may differ, so wait a duration
        self._timer_at = deadline
        self._timer = loop.call_later(max(0.0, deadline - self._clock()) + 0.01, self._expire)

    def _expire(self) -> None:
        self._timer = None
        for connection in self.pool.expired(self._clock()):
            self._close(connection)
        self._schedule_expiry(self.pool.next_expiry())

    @staticmethod
    def _close(connection: AmqpConnection) -> None:
        connection.close_nowait()

    async def close_all(self) -> None:
        """Shutdown: close every pooled connection; nothing is pooled from now on."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        connections = self.pool.drain()
        if connections:
            await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)
