"""The shell's side of a session's OAuth 2.0 token: the expiry timer and the refresh call.

Owns one timer per client connection: armed at the token's ``exp`` (``TokenExpiry`` from the
session, at login and after each refresh), it asks the session whether the token has indeed
run out (a refresh may have crossed it) and then ends the session with the ERROR the session
words (docs/behaviour.md, "OAuth 2.0 tokens").  RabbitMQ 3.x never closes a connection whose
token expired, so this timer is the only enforcement there; 4.3 closes the connection itself,
without a STOMP ERROR, and this timer comes first.

``update_secret_call`` is the broker call behind ``UpdateSecret``: the link's AMQP connection
takes the new token (adapter/amqp/secret.py); what the session is told back is None (taken) or
why not.  A 530 from the broker closed the connection: that error reaches the client through
the link's ``on_amqp_closed`` (its ERROR names the broker's reason), so it is raised on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from ..amqp.errors import AmqpError
from ..amqp.link import SessionLink
from ..amqp.secret import update_secret

# the timer fires this long after exp (timers may fire a little early; the session forgives
# a quarter of a second): the session closes within 1 s of exp
_AFTER_EXPIRY = 0.05


class TokenExpiryGuard:
    """The expiry timer of one client connection (see the module docstring)."""

    __slots__ = ("_loop", "_expired", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop, expired: Callable[[], None]) -> None:
        self._loop = loop
        self._expired = expired  # the connection asks its session and closes
        self._timer: asyncio.TimerHandle | None = None

    def arm(self, expires_at: float | None) -> None:
        """The session's token now expires at ``expires_at`` (None: never, as far as the
        adapter can tell)."""
        self.cancel()
        if expires_at is not None:
            delay = max(0.0, expires_at - time.time()) + _AFTER_EXPIRY
            self._timer = self._loop.call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._expired()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self) -> None:
        """The connection is closed: cancel, and let go of its callback (it refers back to
        the connection: dropped, the closed connection is freed by reference counting)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._expired = _closed


async def update_secret_call(link: SessionLink | None, token: str) -> str | None:
    """``UpdateSecret`` on the session's link: None once the broker took the token, else why
    not.  Raises the AmqpError of a broker that closed the connection over it."""
    if link is None:
        return "the session has no AMQP connection"
    try:
        await update_secret(link, token)
    except TimeoutError:
        return "the broker did not answer connection.update-secret in time"
    except AmqpError as error:
        if error.code:
            raise  # the broker closed the connection: on_amqp_closed sends the ERROR
        return error.text
    return None


def _closed() -> None:
    """The expiry after ``close``: the connection is closed already."""
