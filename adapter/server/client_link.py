"""The shell's side of one client's AMQP link: the login, the broker calls, the release.

``ClientLink`` runs what the STOMP connection (adapter/session/connection.py) cannot do without
I/O, each as a task of the server:

* the broker calls of the frame being handled (declare, consume, bind ...): the connection is
  ``busy`` meanwhile; the client's socket is not read (the ``broker`` pause reason), and the
  answer goes back with ``call_returned`` before the shell pumps again;
* the login (``OpenConnection``: a pooled link at once, else ``BrokerLogin.open`` over the broker
  nodes), DISCONNECT's wait for outstanding confirms and its release of the link, an OAuth 2.0
  token's refresh (``UpdateSecret``: connection.update-secret);
* the link's own events: its loss (counted, then ERROR and close) and the broker's flow control.

The link itself is the STOMP connection's ``amqp`` (its one holder); ``LinkGlue``
(adapter/amqp/link_lifecycle.py) owns the steps around it (queues to delete, the release).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..amqp.connection import AmqpError, SessionLink
from ..amqp.link_lifecycle import LinkGlue
from ..amqp.login import BrokerLogin, logged_in
from ..mapping import operations as ops
from ..mapping.destinations import ProcessingError
from .token_expiry import update_secret_call

if TYPE_CHECKING:
    from ..session.connection import StompConnection
    from .client_features import ClientFeatures
    from .flow import FlowControl

__all__ = ["ClientLink", "LinkShell"]

log = logging.getLogger("adapter.connection")

# How long DISCONNECT waits for outstanding publisher confirms before closing anyway
_CONFIRM_WAIT_ON_DISCONNECT = 30.0


class LinkShell(Protocol):
    """What the link needs of the shell around it."""

    peer: str
    stomp: StompConnection[SessionLink]
    flow: FlowControl
    features: ClientFeatures

    def pump_batch(self) -> None: ...


# a broker call: awaited in the frame's task, its answer goes back into the frame's generator
_Call = Callable[["ClientLink", Any], Awaitable[object]]


class ClientLink:
    """The login, broker calls and release of one client's AMQP link (see the module
    docstring)."""

    __slots__ = ("_confirm_waiter", "_loop", "_server", "_shell", "glue")

    def __init__(self, shell: LinkShell, server: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._shell = shell
        self._server = server
        self._loop = loop
        self.glue = LinkGlue(server, BrokerLogin(server, loop))
        self._confirm_waiter: asyncio.Future[None] | None = None  # DISCONNECT's AwaitConfirms

    # ------------------------------------------------------------------ broker calls
    def start_call(self, op: ops.Operation) -> None:
        """The STOMP connection is busy with ``op``: run it (see the module docstring)."""
        self._begin(_CALLS.get(type(op), ClientLink.execute), op)

    def _begin(self, call: _Call, op: Any) -> None:
        self._shell.flow.pause("broker")
        self._server.spawn(self._run_call(call, op))

    async def _run_call(self, call: _Call, op: Any) -> None:
        stomp = self._shell.stomp
        if stomp.closed:
            return  # closed between spawning this task and its first step: the link is gone
        try:
            result = await call(self, op)
        except AmqpError:
            # amqp_closed has already sent the ERROR and closed the client
            return
        except ProcessingError as error:
            stomp.processing_error(error)
            return
        except (OSError, TimeoutError) as error:
            stomp.run_all(stomp.session.on_connection_lost(str(error) or type(error).__name__))
            return
        except Exception:  # a bug must not take the server down: report and close this client
            stomp.internal_error()
            return
        stomp.call_returned(result)
        if stomp.closed:
            return
        self._shell.flow.resume("broker")
        self._shell.pump_batch()

    def open(self, op: ops.OpenConnection, in_frame: bool) -> ops.LoginResult | None:
        """CONNECT's login: a pooled link at once (the pump goes on, no task), else a call."""
        shell = self._shell
        shell.features.at_login(op)
        pooled = self.glue.login.pooled(op, shell.stomp)
        if pooled is not None:
            return self._logged_in(pooled)
        shell.stomp.start_call(op, in_frame)
        self._begin(ClientLink.login, op)
        return None

    async def login(self, op: ops.OpenConnection) -> ops.LoginResult:
        """Log in (``BrokerLogin.open``: the node loop, within the login timeout)."""
        stomp = self._shell.stomp
        result = await self.glue.login.open(op, stomp, self._shell.peer, lambda: stomp.closed)
        if isinstance(result, ops.LoginResult):
            return result
        if stomp.closed:  # by the login timeout or a server shutdown, while the broker answered
            # given back in this task: a shutdown waits for it, and so for the link's close
            await self.glue.give_back_late(result, session_failed=bool(stomp.session.errors_sent))
            return ops.LoginResult(False, "other", "closed")
        return self._logged_in(result)

    def _logged_in(self, amqp: SessionLink) -> ops.LoginResult:
        stomp = self._shell.stomp
        if stomp.closed:  # by the login timeout, while the broker answered
            self.glue.came_too_late(amqp, session_failed=bool(stomp.session.errors_sent))
            return ops.LoginResult(False, "other", "closed")
        stomp.amqp = amqp
        return logged_in(amqp)

    def requeue_got(self, op: ops.RequeueGot, in_frame: bool) -> None:
        stomp = self._shell.stomp
        assert stomp.amqp is not None
        # on the link the gets ran on; a probe's close is waited for (adapter/amqp/probe.py)
        closing = stomp.amqp.requeue_got(op.delivery_tags)
        stomp.counters.nacks += len(op.delivery_tags)
        if closing is not None:
            stomp.start_call(op, in_frame)
            self._begin(functools.partial(_handed_back, closing), op)

    async def await_confirms(self, op: ops.AwaitConfirms) -> bool:
        """True when every confirm came (DISCONNECT goes ahead either way; a NACK to a
        dead-letter queue does not acknowledge the original without it)."""
        stomp = self._shell.stomp
        if stomp.session.confirms_outstanding:
            self._confirm_waiter = self._loop.create_future()
            stomp.awaiting_confirms = True
            try:
                async with asyncio.timeout(_CONFIRM_WAIT_ON_DISCONNECT):
                    await self._confirm_waiter
            except TimeoutError:
                log.warning(
                    "peer=%s: publisher confirms did not all come within %g s",
                    self._shell.peer,
                    _CONFIRM_WAIT_ON_DISCONNECT,
                )
                return False
            finally:
                stomp.awaiting_confirms = False
        return True

    def confirms_settled(self) -> None:
        waiter = self._confirm_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def release(self, op: ops.CloseAmqp) -> None:
        """DISCONNECT: the link goes (its RECEIPT waits for it)."""
        stomp = self._shell.stomp
        amqp = self.let_go()
        assert amqp is not None
        await self.glue.release(amqp, session_failed=bool(stomp.session.errors_sent))

    async def execute(self, op: Any) -> object:
        """A plain broker call on the session's link."""
        amqp = self._shell.stomp.amqp
        assert amqp is not None
        return await amqp.execute(op)

    async def join_shared(self, op: ops.JoinShared) -> bool:
        return await self._shell.features.join_shared(op)

    async def update_secret(self, op: ops.UpdateSecret) -> str | None:
        """A token refresh (SEND to /auth/token): the link's AMQP connection takes the new
        token; None, or why not (adapter/server/token_expiry.py)."""
        return await update_secret_call(self._shell.stomp.amqp, op.token)

    # ------------------------------------------------------------------ the link's own events
    def amqp_closed(self, error: AmqpError) -> None:
        stomp = self._shell.stomp
        if not error.channel_only:
            stomp.amqp = None  # the connection itself is gone; a closed channel still needs closing
        if stomp.closed:
            return
        if not error.channel_only:
            # the broker closed the connection (connection.close: forced, a memory alarm ...) or
            # the link died without one (network, broker crash)
            reason = "closed_by_broker" if error.code else "connection_lost"
            self._server.stats.amqp_connection_failures[reason] += 1
        # a synchronous call of the current frame was waiting: ERROR, RECEIPT, close
        # (docs/behaviour.md#error-handling)
        stomp.broker_failed(error.name, error.code, error.text, of_frame=stomp.busy)

    def broker_backpressure(self, paused: bool) -> None:
        if paused:
            self._shell.flow.pause("broker-flow")
        else:
            self._shell.flow.resume("broker-flow", self._shell.stomp.closed)

    # ------------------------------------------------------------------ the end
    def let_go(self) -> SessionLink | None:
        """The session is done with its AMQP link: leave the feature runtimes (before the
        channel closes, so its unacknowledged messages requeue); the link, if any, is the
        caller's to give back."""
        self._shell.features.leave_all()
        stomp = self._shell.stomp
        amqp, stomp.amqp = stomp.amqp, None
        return amqp

    def finish(self, done: Callable[[], None]) -> None:
        """The connection finished: stop waiting for confirms, close the link (in the
        background) or say it is done."""
        if self._confirm_waiter is not None and not self._confirm_waiter.done():
            self._confirm_waiter.cancel()
        amqp = self.let_go()
        if amqp is None:
            done()
        else:
            failed = bool(self._shell.stomp.session.errors_sent)
            self.glue.close(amqp, self._shell.peer, session_failed=failed, done=done)
        # let go of the shell (it refers to this link: dropped, the finished connection is
        # freed by reference counting); a call still under way (a login the client did not
        # wait for) and the link's late events find what they read, and nothing is pumped
        self._shell = _FinishedShell(self._shell)


class _FinishedShell:
    """The shell as a finished link sees it: the STOMP connection (closed), its flow control,
    features and peer; nothing more is pumped."""

    __slots__ = ("features", "flow", "peer", "stomp")

    def __init__(self, shell: LinkShell) -> None:
        self.peer = shell.peer
        self.stomp = shell.stomp
        self.flow = shell.flow
        self.features = shell.features

    def pump_batch(self) -> None:
        pass


async def _handed_back(closing: Awaitable[None], link: ClientLink, op: ops.RequeueGot) -> object:
    """A probe's close after a browse (``RequeueGot``): over, however it ended (a close that
    timed out dropped the socket, and the broker requeued what the probe held then)."""
    await asyncio.wait([asyncio.ensure_future(closing)])
    return None


# the broker calls that are not a plain ``SessionLink.execute``
_CALLS: dict[type, _Call] = {
    ops.AwaitConfirms: ClientLink.await_confirms,
    ops.CloseAmqp: ClientLink.release,
    ops.JoinShared: ClientLink.join_shared,
    ops.UpdateSecret: ClientLink.update_secret,
}
