"""The timers of one client connection: the login timeout, the STOMP heart-beats and an OAuth
2.0 token's expiry.

``ClientTimers`` arms the login timer when the socket opens (it also bounds a PROXY header that
arrives slowly) and, at CONNECT, the heart-beat timers (``heartbeats.HeartBeats``) with the
intervals the client negotiated.  A token login's session asks for its expiry timer
(``TokenExpiry``, at login and after each refresh: ``token_expiry.TokenExpiryGuard``); when it
fires and the session agrees the token ran out, the session's ERROR ends the connection.

It is the timers' ``HeartBeatHost``: it reads the connection's output and flow control, writes
the heart-beat EOL, and answers a timeout with the session's ERROR through the STOMP connection
(adapter/session/connection.py).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from ..session import State
from ..session.token_session import EXPIRED_MESSAGE
from .heartbeats import HeartBeats
from .token_expiry import TokenExpiryGuard

if TYPE_CHECKING:
    from ..liveness import Liveness
    from ..mapping import operations as ops
    from ..session.connection import StompConnection
    from .flow import FlowControl

__all__ = ["ClientTimers", "TimedShell"]


class TimerSettings(Protocol):
    @property
    def login_timeout(self) -> float: ...

    @property
    def heartbeat_tolerance(self) -> float: ...

    @property
    def idle_client_timeout(self) -> float: ...  # adapter.idle_client_timeout (0: off)


class TimedShell(Protocol):
    """What the timers need of the shell around the STOMP connection."""

    def write_heartbeat(self) -> None: ...

    def login_timed_out(self) -> None: ...


class ClientTimers:
    """The login timer and the heart-beats of one connection (see the module docstring)."""

    __slots__ = (
        "_flow",
        "_heartbeats",
        "_login_timer",
        "_loop",
        "_settings",
        "_shell",
        "_stomp",
        "_token_expiry",
    )

    def __init__(
        self,
        shell: TimedShell,
        stomp: StompConnection[Any],
        flow: FlowControl,
        settings: TimerSettings,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._shell = shell
        self._settings = settings
        self._stomp = stomp
        self._flow = flow
        self._loop = loop
        self._login_timer: asyncio.TimerHandle | None = None
        self._heartbeats = HeartBeats(self, loop)
        self._token_expiry = TokenExpiryGuard(loop, self._token_expired)

    @property
    def liveness(self) -> Liveness:
        """The heart-beat monitor's flags, set by the shell on every read and write."""
        return self._heartbeats.liveness

    def start_login(self) -> None:
        self._login_timer = self._loop.call_later(self._settings.login_timeout, self._login_tick)

    def _login_tick(self) -> None:
        self._login_timer = None
        if self._stomp.closed or self._stomp.session.state is State.CONNECTED:
            return
        self._shell.login_timed_out()

    def logged_in(self, op: ops.Established) -> None:
        """CONNECTED: the login timer stops, the heart-beats start: one every half of the
        client's interval (it is late after a whole one); the client may be late by the
        tolerance (adapter.heartbeat_tolerance); without heart-beats, the idle timeout."""
        self._stop_login()
        settings = self._settings
        self._heartbeats.start(
            op.send_ms / 2000,
            op.receive_ms * settings.heartbeat_tolerance / 1000,
            settings.idle_client_timeout,
        )

    def _stop_login(self) -> None:
        if self._login_timer is not None:
            self._login_timer.cancel()
            self._login_timer = None

    def stop(self) -> None:
        """The connection is closed: the timers stop for good, and let go of the shell (it
        refers to these timers: dropped, the closed connection is freed by reference counting;
        a timer already under way finds a shell that does nothing)."""
        if self._login_timer is not None:
            self._login_timer.cancel()
            self._login_timer = None
        self._token_expiry.close()
        self._heartbeats.close()
        self._shell = _CLOSED_SHELL

    # an OAuth 2.0 token's expiry
    def token_expires(self, expires_at: float | None) -> None:
        """``TokenExpiry``: the session's token now expires at ``expires_at`` (None: never)."""
        self._token_expiry.arm(expires_at)

    def _token_expired(self) -> None:
        """The token's exp passed: ERROR and close, unless a refresh moved it meanwhile."""
        stomp = self._stomp
        if stomp.closed:
            return
        tokens = stomp.session.tokens
        if tokens.refresh_pending:
            return  # a refresh received before exp: its TokenExpiry arms the timer again
        detail = tokens.expired()
        if detail is None:
            self._token_expiry.arm(tokens.claims.expires_at if tokens.claims is not None else None)
            return
        stomp.close_with_error(EXPIRED_MESSAGE, detail)

    # the HeartBeatHost side (adapter/server/heartbeats.py)
    def heartbeat_output_pending(self) -> bool:
        return bool(self._stomp.output.out)

    def write_heartbeat(self) -> None:
        self._shell.write_heartbeat()

    def reading_excused(self) -> bool:
        # while we are not reading the client (waiting for the broker, broker flow control)
        # its heart-beats wait unread in the socket: not the client's fault
        return self._flow.paused

    def heartbeat_timed_out(self, interval: float) -> None:
        self._stomp.close_with_error(
            "Heart-beat timeout", f"No data received from the client for {interval:.1f} s\n"
        )

    def idle_timed_out(self, seconds: float) -> None:
        self._stomp.close_with_error(
            "Idle timeout",
            f"Nothing received from the client for {seconds:g} s and no heart-beats negotiated "
            "(adapter.idle_client_timeout)\n",
        )


class _ClosedShell:
    """The shell of stopped timers: the connection is closed already."""

    def write_heartbeat(self) -> None:
        pass

    def login_timed_out(self) -> None:
        pass


_CLOSED_SHELL: TimedShell = _ClosedShell()
