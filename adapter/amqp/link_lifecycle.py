"""A session's AMQP link over its life: how it comes (the login) and goes (queues deleted, the
link released), beside the link itself (adapter/amqp/link.py).

The link itself (``SessionLink``: an AMQP connection of the session's own, or with
``adapter.amqp_sessions_per_connection`` a channel on a shared one: adapter/amqp/link.py) is
held by the shell (``ClientConnection._amqp``) while the session uses it, because the shell calls
it for every message.  ``LinkGlue`` owns the steps around it, which the shell delegates:

* at CONNECT, its ``login`` (the server's ``BrokerLogin``, adapter/amqp/login.py, handed in
  by the shell as a ``LinkLogin``): a link without I/O when one is ready (a pooled
  connection, or a channel on a shared connection with room), else a login over the broker
  nodes in the frame's task; a link that arrives once the client is gone (the login timeout
  closed it meanwhile) is given back at once (``came_too_late``; in the login's task, whose
  end waits for the close: ``give_back_late``);
* the subscription queues the session asks to delete before its link goes
  (``delete_on_close``: a SUBSCRIBE the broker refused after its queue was declared);
* the release: at DISCONNECT (``release``, whose RECEIPT waits for it) or at the connection's
  end (``close``: in the background, in its turn among the process's AMQP closes,
  ``AMQP_CLOSES_AT_ONCE``, those queues deleted first, the link dropped if the shutdown's
  deadline comes first).  Where the link goes (the pool, its channel closed on the shared
  connection, or closed) is ``BrokerLogin.release``'s decision.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Generic, Protocol, TypeVar

from .admission import Gate, turn
from .connection import AmqpError, SessionLink

# lines about one client connection, under the shell's logger
log = logging.getLogger("adapter.connection")

# how long deleting one subscription queue may take at the end
_DELETE_TIMEOUT = 5.0


class LinkServices(Protocol):
    """What the glue uses of the server: the pacing of AMQP closes and a task spawner (a
    server's ``ServerContext`` has both)."""

    amqp_closes: Gate  # the AMQP connections closing at once (AMQP_CLOSES_AT_ONCE)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]: ...


class LinkLogin(Protocol):
    """What the glue uses of the login (adapter/amqp/login.py ``BrokerLogin``)."""

    @property
    def reusing(self) -> bool: ...

    async def release(self, amqp: SessionLink, *, queues_to_delete: bool, session_failed: bool) -> None: ...


Login = TypeVar("Login", bound=LinkLogin)


class LinkGlue(Generic[Login]):
    """One client connection's steps to and from its AMQP link (see the module docstring)."""

    __slots__ = ("_server", "delete_on_close", "login")

    def __init__(self, server: LinkServices, login: Login) -> None:
        self._server = server
        self.login = login
        self.delete_on_close: list[str] = []  # deleted before the link goes

    def came_too_late(self, amqp: SessionLink, *, session_failed: bool) -> None:
        """A link the login got after the client went away: closed, or given back."""
        if not self.login.reusing:
            amqp.close_nowait()
        else:
            self._server.spawn(self.release(amqp, session_failed=session_failed))

    async def give_back_late(self, amqp: SessionLink, *, session_failed: bool) -> None:
        """``came_too_late`` in the login's own task: the link is given back and its close
        waited for there, so a server shutdown, which waits for the login, finds no AMQP socket
        of it still closing (an event loop closed with one frees it unclosed); cancelled (the
        shutdown's deadline), drop it."""
        try:
            await self.release(amqp, session_failed=session_failed)
        except asyncio.CancelledError:
            amqp.drop()
            raise

    async def release(self, amqp: SessionLink, *, session_failed: bool) -> None:
        """Give the link back now (pooled, its channel closed, or closed)."""
        await self.login.release(
            amqp, queues_to_delete=bool(self.delete_on_close), session_failed=session_failed
        )

    def close(self, amqp: SessionLink, peer: str, *, session_failed: bool, done: Callable[[], None]) -> None:
        """The connection has ended: delete its queues and give its link back in the
        background, then call ``done`` (at once if the link is closed already)."""
        if not amqp.is_open:
            done()
            return
        task = self._server.spawn(self._close(amqp, peer, session_failed))
        task.add_done_callback(lambda _task: done())

    async def _close(self, amqp: SessionLink, peer: str, session_failed: bool) -> None:
        """In its turn (at most AMQP_CLOSES_AT_ONCE at once: adapter/amqp/admission.py);
        cancelled (the shutdown's deadline), drop it."""
        try:
            async with turn(self._server.amqp_closes):
                for queue in self.delete_on_close:
                    try:
                        await asyncio.wait_for(amqp.delete_queue_on_fresh_channel(queue), _DELETE_TIMEOUT)
                    except (AmqpError, TimeoutError) as error:
                        log.info("peer=%s: could not delete subscription queue %r: %s", peer, queue, error)
                await self.release(amqp, session_failed=session_failed)
        except asyncio.CancelledError:
            amqp.drop()
            raise
