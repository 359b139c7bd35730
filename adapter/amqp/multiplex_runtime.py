"""Session multiplexing (``adapter.amqp_sessions_per_connection`` above 1) at run time: the
registry of the process's shared connections, beside its rules (adapter/amqp/multiplex.py).

Concurrent STOMP sessions of the same broker node, vhost, user and passcode share AMQP
connections (``SharedConnection``), each session on a channel of its own (``ChannelLink``,
adapter/amqp/shared.py).  A CONNECT that joins a connection does no I/O at all (its channel
opens with its first frame), so, like a pooled connection's, the login needs no task
(``BrokerLogin.pooled``).  A CONNECT that finds no connection with room, or none logged in with
its passcode, logs in afresh and the broker decides; its connection is then shared in turn.

A connection takes no new session once it is retired (blocked by the broker, a session left a
queue that lives as long as the connection, ``adapter.amqp_connection_max_age_seconds`` since
the broker authenticated the user on it) and closes when its last session leaves.  Otherwise,
with no session left, it waits ``adapter.amqp_connection_idle_seconds`` for the next login (at
most ``adapter.amqp_connection_pool_size`` such idle connections per process): the idle pool of
``adapter.amqp_connection_reuse`` is this one while multiplexing is on.

A failure of the connection reaches every session on it (the shared connection tells each
``ChannelLink``); this registry only forgets the connection.  The calls a client could make the
broker answer with a connection error run on a probe of the session's own instead
(adapter/amqp/probe.py): each link gets its ``Probe`` here, with the session's credentials.
docs/configuration.md says what the setting changes for the broker and for security.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from .connection import AmqpConnection, AmqpError, BrokerEvents, SessionLink
from .multiplex import SharedConnections
from .pool import PasscodeCheck
from .probe import Probe, ProbeOpener
from .probe_runtime import Unheard
from .shared import ChannelLink, PausedBytes, SharedConnection

log = logging.getLogger(__name__)

# connection.close 530: a channel.open over a channel limit
NOT_ALLOWED = 530
_USER_CHANNEL_LIMIT = "channels opened for user"


class _ConnectionEvents:
    """What a shared connection reports about itself (``BrokerEvents``; its channels' events go
    to their sessions, channel 0 carries none of those): a failure or a close forgets it; a
    block retires it."""

    __slots__ = ("_connection", "_mux")

    def __init__(self, mux: AmqpMultiplex, connection: SharedConnection) -> None:
        self._mux = mux
        self._connection = connection

    # deliveries, confirms, cancels, returns and reads of a connection no session reads: dropped, as a
    # probe's (the same no-ops, not a subclass)
    on_deliver = Unheard.on_deliver
    on_confirm = Unheard.on_confirm
    on_server_cancel = Unheard.on_server_cancel
    on_return = Unheard.on_return
    on_read_done = Unheard.on_read_done

    def on_amqp_closed(self, error: AmqpError) -> None:
        # the per-user limit only ("number of channels opened for user ..."): a node-wide one or
        # the negotiated channel_max says nothing about this user, and must not unshare it
        if (
            error.code == NOT_ALLOWED
            and error.from_broker
            and _USER_CHANNEL_LIMIT in error.text
            and not error.phase
        ):
            self._mux.channels_refused(self._connection)
        self._mux.forget(self._connection)

    def on_broker_backpressure(self, paused: bool) -> None:
        if self._connection.blocked:  # connection.blocked (its socket being full is not news)
            self._mux.retire(self._connection)


class AmqpMultiplex:
    """The shared connections of one process and the counters the metrics may read."""

    def __init__(
        self,
        *,
        per_connection: int,
        idle_seconds: float,
        max_age_seconds: float,
        max_idle: int,
        paused_bytes: PausedBytes | None = None,
        clock: Callable[[], float] = time.monotonic,
        passcodes: PasscodeCheck | None = None,
    ) -> None:
        self.shared: SharedConnections[SharedConnection] = SharedConnections(
            per_connection=per_connection,
            max_age_seconds=max_age_seconds,
            idle_seconds=idle_seconds,
            max_idle=max_idle,
        )
        self.passcodes = passcodes or PasscodeCheck()
        self.paused_bytes = paused_bytes or PausedBytes(8 * 1024 * 1024, 256 * 1024 * 1024)
        self._clock = clock
        self._closed = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._closing: set[SharedConnection] = set()  # closed during shutdown
        # where a session's calls that the shared connection must not carry run (a probe of its
        # own: adapter/amqp/probe.py); set by the server when its sessions can make such calls
        # (adapter.declare_exchanges, the activemq profile), None otherwise: then no session's
        # passcode is kept after its login
        self.probes: ProbeOpener | None = None
        self.joined = 0  # logins that joined a shared connection
        self.opened = 0  # logins that opened one

    # ------------------------------------------------------------------ logins
    def admit(
        self, labels: Iterable[str], user: str, vhost: str, passcode: str, events: BrokerEvents
    ) -> ChannelLink | None:
        """A channel on a shared connection of this user, vhost and passcode with room (in the
        nodes' configured order), or None: log in afresh (the broker decides)."""
        if self._closed:
            return None
        digest = self.passcodes.digest(passcode)
        now = self._clock()
        for label in labels:
            connection = self.shared.admit((label, vhost, user), digest, now)
            if connection is None:
                continue
            try:
                link = connection.new_link(events)
            except AmqpError:  # every channel number taken (closing ones included)
                self._close(self.shared.left(connection, now))
                continue
            link.on_left = self._left
            if self.probes is not None:
                link.probe = Probe(self.probes, user, passcode, vhost)
            self.joined += 1
            return link
        return None

    def logged_in(
        self,
        connection: AmqpConnection | SharedConnection,
        node_label: str,
        user: str,
        vhost: str,
        passcode: str,
        events: BrokerEvents,
    ) -> SessionLink:
        """A fresh login succeeded: share its connection; returns the session's channel."""
        if not isinstance(connection, SharedConnection):
            return connection  # a test's opener
        connection.attach(_ConnectionEvents(self, connection))
        connection.paused_bytes = self.paused_bytes
        stale = self.shared.opened(
            connection,
            (node_label, vhost, user),
            self.passcodes.digest(passcode),
            connection.channel_max,
            self._clock(),
        )
        self._close(stale)
        if self._closed:
            # a login still under way when the shutdown began: its connection takes no other
            # session and closes with this one, and the shutdown waits for it (``wait_closed``);
            # kept idle, it would stay open after the shutdown, its socket left to the loop's end
            self.shared.retire(connection)
        link = connection.new_link(events)
        link.on_left = self._left
        if self.probes is not None:
            link.probe = Probe(self.probes, user, passcode, vhost)
        self.opened += 1
        return link

    # ------------------------------------------------------------------ end of a session
    async def release(self, link: ChannelLink) -> None:
        """The session is over: close its channel (its leaving is counted by ``_left``)."""
        await link.close()

    def _left(self, link: ChannelLink) -> None:
        connection = link.carrier
        if link.left_connection_queue:
            # an exclusive queue of the session lives as long as the connection: take no new
            # session, so the connection (and the queue) ends with its last one
            self.shared.retire(connection)
        now = self._clock()
        self._close(self.shared.left(connection, now))
        self._schedule_expiry(self.shared.expiry_of(connection))

    def retire(self, connection: SharedConnection) -> None:
        self._close(self.shared.retire(connection))

    def channels_refused(self, connection: SharedConnection) -> None:
        """A channel.open on ``connection`` passed a channel limit and the broker closed it
        (every session on it got the ERROR): its user gets a connection per session from now
        on (adapter/amqp/multiplex.py), and the operator a line saying so."""
        entry = self.shared.entry(connection)
        idle = self.shared.channels_refused(connection)
        if idle is not None and entry is not None:
            _, vhost, user = entry.key
            log.warning(
                "user %r (vhost %r) reached a channel limit on a shared AMQP connection, which the "
                "broker closed with every session on it; from now on this process gives each of "
                "its sessions an AMQP connection of its own",
                user,
                vhost,
            )
            self._close(idle)

    def forget(self, connection: SharedConnection) -> None:
        """The connection failed or the broker closed it: its sessions have been told."""
        self.shared.forget(connection)

    # ------------------------------------------------------------------ expiry and shutdown
    def _schedule_expiry(self, deadline: float | None) -> None:
        if deadline is None or self._closed:
            return
        if self._timer is not None:
            if self._timer_at <= deadline:
                return
            self._timer.cancel()
        self._timer_at = deadline
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(max(0.0, deadline - self._clock()) + 0.01, self._expire)

    def _expire(self) -> None:
        self._timer = None
        self._close(self.shared.expired(self._clock()))
        self._schedule_expiry(self.shared.next_expiry())

    def _close(self, connections: list[SharedConnection]) -> None:
        for connection in connections:
            connection.close_nowait()
            if self._closed:  # shutdown waits for these (wait_closed)
                self._closing.add(connection)

    async def close_all(self) -> None:
        """Shutdown: no new joins; the idle connections are asked to close now and the others
        as their sessions end (a session's shutdown closes its channel); ``wait_closed`` waits
        for all of them at the end, so the clients are told first."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._close(self.shared.shutdown())

    async def wait_closed(self, timeout: float) -> None:
        """End of shutdown: wait for the connections that closed with their last session (the
        broker's close-ok), at most ``timeout`` seconds; then they are dropped."""
        closing, self._closing = self._closing, set()
        if closing:
            await asyncio.gather(*(c.close(timeout) for c in closing), return_exceptions=True)
