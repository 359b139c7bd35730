"""The STOMP heart-beat timers of one client connection (STOMP 1.1+ "Heart-beating").

The decisions (write a heart-beat? give the client up?) are ``adapter.liveness.Liveness``'s, the
same monitor the AMQP link can use; this module only arms the two timers the CONNECT negotiated
and tells its ``HeartBeatHost`` what the monitor decided.  The host (``ClientConnection``) sets
``liveness.read`` on every read and ``liveness.wrote`` on every flush: plain attribute stores.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from ..liveness import Liveness


class HeartBeatHost(Protocol):
    """What the timers act on: the client socket's side of one connection."""

    def heartbeat_output_pending(self) -> bool:
        """Bytes are buffered and about to be written (they count as a heart-beat)."""
        ...

    def write_heartbeat(self) -> None:
        """Write one EOL to the client (STOMP's heart-beat), now."""
        ...

    def reading_excused(self) -> bool:
        """The client's socket is not being read (flow control, a pending broker call)."""
        ...

    def heartbeat_timed_out(self, interval: float) -> None:
        """Nothing came from the client for ``interval`` seconds: ERROR and close."""
        ...

    def idle_timed_out(self, seconds: float) -> None:
        """A client without heart-beats sent nothing for ``seconds`` (adapter.idle_client_timeout):
        ERROR and close."""
        ...


class HeartBeats:
    """Two timers: send every ``send`` seconds, check the client every ``receive`` seconds."""

    __slots__ = ("_host", "_loop", "_receive_timer", "_send_timer", "liveness")

    def __init__(self, host: HeartBeatHost, loop: asyncio.AbstractEventLoop) -> None:
        self._host = host
        self._loop = loop
        self.liveness = Liveness(misses_allowed=1)
        self._send_timer: asyncio.TimerHandle | None = None
        self._receive_timer: asyncio.TimerHandle | None = None

    @property
    def running(self) -> bool:
        return self._send_timer is not None or self._receive_timer is not None

    def start(self, send: float, receive: float, idle: float = 0.0) -> None:
        """Arm the timers negotiated at CONNECT (0: that direction is off).  The send interval
        is already halved by the caller's choice; the receive one includes the tolerance.
        ``idle`` (adapter.idle_client_timeout, 0: off): with no receive interval negotiated, the
        client is given up after sending nothing for ``idle`` to 2 x ``idle`` seconds (the same
        monitor, ticking every ``idle``: the first tick that finds nothing read gives up)."""
        self.stop()
        self.liveness.reset()
        if send:
            self._send_timer = self._loop.call_later(send, self.send_tick, send)
        if receive:
            self._receive_timer = self._loop.call_later(receive, self.receive_tick, receive)
        elif idle:
            self._receive_timer = self._loop.call_later(idle, self.idle_tick, idle)

    def stop(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        if self._receive_timer is not None:
            self._receive_timer.cancel()
            self._receive_timer = None

    def close(self) -> None:
        """The connection is closed: stop, and let go of the host (it refers back to these
        timers: dropped, the closed connection is freed by reference counting; a tick already
        under way finds a host that does nothing)."""
        self.stop()
        self._host = _CLOSED

    def send_tick(self, interval: float) -> None:
        host = self._host
        if self.liveness.send_tick(host.heartbeat_output_pending()):
            host.write_heartbeat()
            if self._send_timer is None:  # the write closed the connection (stop): no re-arming
                return
        self._send_timer = self._loop.call_later(interval, self.send_tick, interval)

    def receive_tick(self, interval: float) -> None:
        host = self._host
        if self.liveness.receive_tick(host.reading_excused()):
            self._receive_timer = None
            self.stop()
            host.heartbeat_timed_out(interval)
            return
        self._receive_timer = self._loop.call_later(interval, self.receive_tick, interval)

    def idle_tick(self, idle: float) -> None:
        host = self._host
        if self.liveness.receive_tick(host.reading_excused()):
            self._receive_timer = None
            self.stop()
            host.idle_timed_out(idle)
            return
        self._receive_timer = self._loop.call_later(idle, self.idle_tick, idle)


class _ClosedHost:
    """The host of closed timers: nothing to write, nobody to give up."""

    def heartbeat_output_pending(self) -> bool:
        return False

    def write_heartbeat(self) -> None:
        pass

    def reading_excused(self) -> bool:
        return True

    def heartbeat_timed_out(self, interval: float) -> None:
        pass

    def idle_timed_out(self, seconds: float) -> None:
        pass


_CLOSED: HeartBeatHost = _ClosedHost()
