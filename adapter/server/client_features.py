"""A client connection's part in the process-wide feature runtimes.

Two runtimes outside the connection send it MESSAGEs and ask things of it: the shared topic
subscriptions (adapter.shared_subscriptions, ``sharing.runtime.SharedMembership``) and the queue dispatchers
of the activemq profile (``dispatch.runtime.DispatchGlue``).  ``ClientFeatures`` is the one object
they talk to (the ``SharedMembershipHost`` and the dispatcher's ``Owner``), so neither the shell nor the
STOMP connection carries their methods: their MESSAGEs go to the STOMP connection's sources
(``deliver_shared``, ``deliver_dispatched``, adapter/session/connection.py), which hold them behind
a RECEIPT or add them to the client's output.  Each runtime's part is made on first use (``None`` until then).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ..dispatch.runtime import DispatchGlue, DispatchMembership
from ..sharing.runtime import SharedMembership

if TYPE_CHECKING:
    from ..amqp.connection import AmqpError, SessionLink
    from ..mapping import operations as ops
    from ..session.connection import StompConnection
    from ..sharing.rules import Member
    from ..sharing.runtime import HubServices

__all__ = ["ClientFeatures", "FeatureShell"]


class FeatureShell(Protocol):
    """What the runtimes need of the shell: the client's address, its socket, its output."""

    peer: str

    @property
    def transport(self) -> asyncio.WriteTransport | None: ...

    def flush(self) -> None: ...


class ClientFeatures:
    """The connection's side of the shared groups and the queue dispatchers (see the module
    docstring)."""

    __slots__ = (
        "_loop",
        "_services",
        "_shell",
        "_stomp",
        "deliver_shared",
        "dispatch",
        "flush",
        "peer",
        "shared",
    )

    def __init__(
        self,
        shell: FeatureShell,
        stomp: StompConnection[SessionLink],
        services: HubServices,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._shell = shell
        self._stomp = stomp
        self._services = services
        self._loop = loop
        self.shared: SharedMembership | None = None  # made at login, with adapter.shared_subscriptions
        self.dispatch: DispatchGlue | None = None  # activemq profile: made on the first selector
        # the hubs call these per delivery and per broker read: bound once, no call in between
        self.deliver_shared: Callable[[Member, tuple[bytes, ...]], None] = stomp.deliver_shared
        self.flush: Callable[[], None] = shell.flush
        self.peer = shell.peer

    # ------------------------------------------------------------------ what the runtimes read
    @property
    def closed(self) -> bool:
        return self._stomp.closed

    def shared_lag(self) -> int:
        """Bytes written for this client that its socket has not taken (or that wait behind
        the RECEIPT of the frame being handled)."""
        transport = self._shell.transport
        unsent = transport.get_write_buffer_size() if transport is not None else 0
        held = self._stomp.held
        if held:
            unsent += sum(map(len, held))
        return unsent

    def close_with_error(self, message: str, detail: str) -> None:
        self._stomp.close_with_error(message, detail)

    def broker_failed(self, error: AmqpError, *, of_frame: bool) -> None:
        self._stomp.broker_failed(error.name, error.code, error.text, of_frame=of_frame)

    def on_server_cancel(self, consumer_tag: str) -> None:
        self._stomp.on_server_cancel(consumer_tag)

    def deliver_dispatched(self, delivery: ops.Delivery) -> None:
        self._stomp.deliver_dispatched(delivery)

    def settle_dispatched(self, delivery_tag: int, ack: bool, requeue: bool) -> None:
        """The queue's dispatcher settles a delivery of this connection's channel (acks are
        gathered and written, coalesced, one loop turn later: DispatchGlue.flush)."""
        amqp, glue = self._stomp.amqp, self.dispatch
        if amqp is None or glue is None or not amqp.is_open:
            return  # the channel is gone: the broker has requeued it
        counters = self._stomp.counters
        if ack:
            counters.acks += 1
        else:
            counters.nacks += 1
        glue.settle(amqp, delivery_tag, ack, requeue)

    # ------------------------------------------------------------------ what the connection asks
    def at_login(self, op: ops.OpenConnection) -> None:
        settings = self._stomp.session.settings
        self.peer = self._shell.peer  # final by CONNECT (after a PROXY header)
        self.shared = SharedMembership.at_login(
            settings.registries.shared, self._services, self._loop, self, op
        )

    async def join_shared(self, op: ops.JoinShared) -> bool:
        assert self.shared is not None
        return await self.shared.join_group(op)

    def leave_shared(self, op: ops.LeaveShared) -> None:
        if self.shared is not None:
            self.shared.leave(op.consumer_tag)

    def dispatch_op(self, op: ops.DispatchOp) -> None:
        glue = self.dispatch
        if glue is None:
            session = self._stomp.session
            assert session.vhost is not None
            link = DispatchMembership(
                self, session.settings.registries.dispatchers, session.vhost, self._loop
            )
            stomp = self._stomp
            glue = self.dispatch = DispatchGlue(
                link, self._loop, lambda: stomp.amqp, lambda: not session.plain_acks
            )
        glue.execute(op)

    def set_paused(self, paused: bool) -> None:
        """The client reads slowly: nothing routed from other channels either."""
        if self.dispatch is not None:
            self.dispatch.set_paused(paused)

    def leave_all(self) -> None:
        """The session is done with its AMQP link: leave the queue dispatchers (before the
        channel closes, so its unacknowledged messages requeue) and the shared groups."""
        glue, self.dispatch = self.dispatch, None
        if glue is not None:
            glue.leave()
        if self.shared is not None:
            self.shared.leave_all()
        # no runtime asks anything of this connection any more: let go of the shell (it refers
        # to this object: dropped, the closed connection is freed by reference counting)
        self._shell = _LEFT
        self.flush = _left_flush


class _LeftShell:
    """The shell of a connection that left the runtimes: no socket, nothing to flush."""

    peer = "?"
    transport = None

    def flush(self) -> None:
        pass


_LEFT: FeatureShell = _LeftShell()


def _left_flush() -> None:
    """A runtime's flush after the connection left it: nothing to write."""
