"""The asyncio side of shared topic subscriptions (``adapter.shared_subscriptions``).

``adapter/sharing/rules.py`` decides who shares, renders each delivery once and keeps the lag
accounts; this module owns what has sockets:

* ``SharedHub``: one per shared group, the AMQP connection that consumes for it.  The group's
  first member opens it with that member's own credentials (user, passcode, vhost: the broker
  decides, as for a plain subscription), then declares the queue, consumes and binds as a plain
  SUBSCRIBE would.  The hub, not the first member, owns the connection: it outlives any one
  member and ends (consumer cancelled, queue deleted, connection closed) when its last member
  leaves.  When the broker ends it (consumer cancelled, channel or connection closed, e.g.
  access refused or the user deleted) every member gets the ERROR a plain subscriber would
  get.  Each delivery is written to every member's output; after each read from the broker
  every member written to is flushed and measured, and one too far behind is evicted (ERROR
  naming the limit, then closed) without the hub ever pausing for it.
* ``SharedMembership``: one per client connection (made at its CONNECT when the setting is on): the
  credentials its groups are keyed by and opened with, its members by consumer tag, and what
  the hubs tell them (it is their ``Subscriber``): a join the broker refused, a group the broker
  ended, a member evicted for lag each become what the session answers (ERROR, or the
  cancellation of a plain subscription), through its ``SharedMembershipHost``, the connection.  The
  MESSAGE bytes go straight to the connection's output: the hubs' per-delivery call is the
  connection's own method, bound once.

A group is keyed by (vhost, user, passcode digest, destination): a session only ever joins a
group whose connection the broker opened for the same user with the same passcode, and the
session itself logged in with it on its own connection first.  The passcode is kept in the
link (in memory, never logged) for as long as the client is connected, because the link may
have to open a group later (docs/configuration.md says so).

One AMQP connection per group rather than one channel per group on a connection per user: a
channel error (a topic this user may not read) must end that group alone, and the AMQP client
here has one channel per connection.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Protocol

from ..amqp.connection import AmqpError, SessionLink
from ..amqp.login import BrokerSettings, DescriptorWatch, LoginFailures, login_refused, own_login
from ..amqp.pool import PasscodeCheck
from ..amqp.rights_check import RightsCheck, revokes
from ..errors import StompError
from ..mapping import operations as ops
from ..mapping.tokens import read_claims
from .rules import Eviction, Member, Registry, SharedGroup

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine
    from typing import Any

    from ..amqp.admission import Gate
    from ..amqp.brokers import BrokerNodes

log = logging.getLogger("adapter.sharing")
# lines about one client connection, under the shell's logger
connection_log = logging.getLogger("adapter.connection")

# the hub's consumer tag on its own channel (no client ever sees it)
_HUB_TAG = "stomp-adapter-shared"
# how long a hub waits for the broker to delete its queue and close
_CLOSE_TIMEOUT = 5.0


class Subscriber(Protocol):
    """What a hub needs of a member's connection (its ``SharedMembership``)."""

    def deliver_shared(self, member: Member, pieces: tuple[bytes, ...]) -> None: ...

    def flush(self) -> None: ...

    def shared_lag(self) -> int: ...

    def shared_evicted(self, eviction: Eviction) -> None: ...

    def shared_lost(self, member: Member, error: AmqpError | None) -> None: ...


class HubServices(Protocol):
    """What a hub uses of the server (a server's ``ServerContext`` has all of these)."""

    broker: BrokerSettings
    nodes: BrokerNodes
    login_timeout: float
    logins: Gate  # a hub's login takes its turn like a client's (adapter.max_logins_in_flight)

    @property
    def descriptors(self) -> DescriptorWatch: ...

    @property
    def stats(self) -> LoginFailures: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]: ...


class SharedHub:
    """One shared group's AMQP connection (see the module docstring)."""

    __slots__ = (
        "_amqp",
        "_loop",
        "_queue",
        "_recheck",
        "_registry",
        "_services",
        "closed",
        "error",
        "group",
        "ready",
        "rights",
    )

    def __init__(
        self, group: SharedGroup, registry: Registry, services: HubServices, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.group = group
        group.link = self
        self._registry = registry
        self._services = services
        self._loop = loop
        self._amqp: SessionLink | None = None
        self._queue = ""
        self.ready: asyncio.Future[None] = loop.create_future()
        self.closed = False
        self.error: BaseException | None = None  # why it ended, for a member that joins late
        # the broker's word on later members' rights (adapter/amqp/rights_check.py), and the
        # timer that asks again when it is older than the registry's reauthorise_seconds
        self.rights: RightsCheck | None = None
        self._recheck: asyncio.TimerHandle | None = None

    async def open(self, user: str, password: str, vhost: str, op: ops.JoinShared) -> None:
        """Log in with the first member's credentials, declare, consume, bind; ``ready`` says
        how it went (the members waiting for it raise its error, as a plain SUBSCRIBE would)."""
        services = self._services
        login = own_login(services, self._loop)
        try:
            result = await login.open(
                ops.OpenConnection(user, password, vhost),
                self,
                f"shared {op.destination}",
                lambda: self.closed,
            )
            if isinstance(result, ops.LoginResult):
                # the member logged in with these credentials moments ago: changed since
                raise login_refused(result)
            self._amqp = result
            if self.closed:  # every waiting member left meanwhile
                raise AmqpError(0, "shared subscription ended")
            queue = await result.execute(op.declare)
            assert isinstance(queue, str)
            self._queue = queue
            await result.execute(ops.BasicConsume(queue, _HUB_TAG, no_ack=True))
            bind = ops.QueueBind(queue, op.bind_exchange, op.bind_key)
            await result.execute(bind)
            self.rights = RightsCheck(
                services, self._loop, (user, password, vhost), bind, op.destination, op.declare
            )
        except (AmqpError, OSError, TimeoutError, StompError) as error:
            # StompError: a name AMQP cannot carry (not UTF-8, too long), refused before it
            # was sent; the members get the ERROR a plain SUBSCRIBE gets
            self._fail_open(error)
            return
        except Exception as error:  # a bug must not leave the members waiting forever
            log.exception("shared subscription %r: opening failed", op.destination)
            self._fail_open(error)
            return
        if not self.ready.done():
            self.ready.set_result(None)
        if self.closed:
            self._end_link()
        else:
            self._schedule_recheck(self._registry.reauthorise_seconds)

    # ------------------------------------------------------------------ rights
    async def authorise(self) -> None:
        """The broker says the group's user may still read it (a check that began after this
        call: rights_check.py), or the AmqpError of its refusal is raised; a refusal of the
        user's rights ends the group for every member, each with that ERROR."""
        rights = self.rights
        assert rights is not None, "authorise() before the group opened"
        try:
            await rights.confirm()
        except AmqpError as error:
            if revokes(error):
                self._ended(error)
            raise

    def _schedule_recheck(self, delay: float) -> None:
        self._recheck = self._loop.call_later(max(0.0, delay), self._recheck_due)

    def _recheck_due(self) -> None:
        self._recheck = None
        if self.closed or self.rights is None:
            return
        # a join's check counts: ask only when the last answer is as old as the setting
        age = self._loop.time() - self.rights.started_at
        interval = self._registry.reauthorise_seconds
        if age < interval:
            self._schedule_recheck(interval - age)
            return
        self._services.spawn(self._reauthorise())

    async def _reauthorise(self) -> None:
        try:
            await self.authorise()
        except AmqpError as error:
            if not self.closed:
                log.warning("shared subscription %r: rights not checked again: %s", self.group.key[3], error)
        if not self.closed:
            self._schedule_recheck(self._registry.reauthorise_seconds)

    def _fail_open(self, error: BaseException) -> None:
        self.error = error
        self.closed = True
        self._registry.forget(self.group)
        if not self.ready.done():
            self.ready.set_exception(error)
            # the members waiting raise it; with none left waiting it must not be logged as lost
            self.ready.exception()
        self._end_link()

    # ------------------------------------------------------------------ BrokerEvents
    def on_deliver(self, delivery: ops.Delivery) -> None:
        group = self.group
        if self.closed or not group.members:
            return
        pieces = self._registry.renderer.render(delivery)
        for member in group.members:
            member.subscriber.deliver_shared(member, pieces)  # type: ignore[attr-defined]
        group.touched = True

    def on_read_done(self) -> None:
        """After one read from the broker: flush every member, measure how far behind each is,
        evict those over a bound."""
        group = self.group
        if not group.touched:
            return
        group.touched = False
        registry = self._registry
        evictions: list[Eviction] = []
        for member in group.members:
            subscriber: Subscriber = member.subscriber  # type: ignore[assignment]
            subscriber.flush()
            lag = subscriber.shared_lag()
            if lag or member.lag:
                evictions += registry.measured(member, lag)
        for eviction in evictions:
            # closes the connection, whose link leaves the group (SharedMembership.leave_all)
            subscriber = eviction.member.subscriber  # type: ignore[assignment]
            subscriber.shared_evicted(eviction)

    def on_confirm(self, delivery_tag: int, multiple: bool, ack: bool) -> None:
        pass  # the hub publishes nothing

    def on_broker_backpressure(self, paused: bool) -> None:
        pass  # nor is it ever blocked as a publisher

    def on_return(self, code: int, text: str, exchange: str, routing_key: str) -> None:
        pass  # nor anything mandatory

    def on_server_cancel(self, consumer_tag: str) -> None:
        """The broker cancelled the consumer (its queue was deleted): each member gets the ERROR
        a plain subscription gets, and stays connected."""
        self._ended(None)

    def on_amqp_closed(self, error: AmqpError) -> None:
        if not error.channel_only:
            self._amqp = None
        if not self.ready.done():
            return  # open() sees it as the error of its call
        self._ended(error)

    def _ended(self, error: AmqpError | None) -> None:
        if self.closed:
            return
        self.closed = True
        self.error = error or AmqpError(404, "NOT_FOUND - the shared subscription was cancelled")
        self._registry.forget(self.group)
        members = list(self.group.members)
        log.info(
            "shared subscription %r ended by the broker (%s): %d subscribers told",
            self.group.key[3],
            error or "consumer cancelled",
            len(members),
        )
        for member in members:
            self._registry.leave(member)
            subscriber: Subscriber = member.subscriber  # type: ignore[assignment]
            subscriber.shared_lost(member, error)
        self._end_link()

    # ------------------------------------------------------------------ the end
    def close(self) -> None:
        """The last member left: cancel, delete the queue, close (in the background; the last
        member's RECEIPT does not wait for it)."""
        if self.closed:
            return
        self.closed = True
        self._registry.forget(self.group)
        if self.ready.done():
            self._end_link()
        # else open() ends the link when it finishes

    def _end_link(self) -> None:
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None
        amqp, self._amqp = self._amqp, None
        if amqp is None:
            return
        self._services.spawn(self._close_amqp(amqp, self._queue if self.error is None else ""))

    async def _close_amqp(self, amqp: SessionLink, queue: str) -> None:
        try:
            if queue and amqp.is_open:
                async with asyncio.timeout(_CLOSE_TIMEOUT):
                    await amqp.execute(ops.BasicCancel(_HUB_TAG))
                    await amqp.execute(ops.QueueDelete(queue))
        except (AmqpError, OSError, TimeoutError) as error:
            log.info("shared subscription %r: could not delete queue %r: %s", self.group.key[3], queue, error)
        await amqp.close()


# one key per process: digests are comparable within the process only
_PASSCODES = PasscodeCheck()


class SharedMembershipHost(Protocol):
    """What a ``SharedMembership`` needs of its client connection (``ClientConnection``)."""

    peer: str

    @property
    def closed(self) -> bool: ...

    # the output, which the hubs reach through the link without a call in between
    def deliver_shared(self, member: Member, pieces: tuple[bytes, ...]) -> None: ...

    def flush(self) -> None: ...

    def shared_lag(self) -> int: ...

    # the session's answers
    def close_with_error(self, message: str, detail: str) -> None: ...

    def broker_failed(self, error: AmqpError, *, of_frame: bool) -> None: ...

    def on_server_cancel(self, consumer_tag: str) -> None: ...


class SharedMembership:
    """A client connection's side of the shared groups: its credentials, its members, and the
    ``Subscriber`` its members' hubs talk to (see the module docstring)."""

    __slots__ = (
        "_digest",
        "_host",
        "_loop",
        "_members",
        "_opened",
        "_password",
        "_registry",
        "_services",
        "_user",
        "_vhost",
        "deliver_shared",
        "flush",
        "shared_lag",
    )

    def __init__(
        self,
        registry: Registry,
        services: HubServices,
        loop: asyncio.AbstractEventLoop,
        host: SharedMembershipHost,
        user: str,
        password: str,
        vhost: str,
    ) -> None:
        self._registry = registry
        self._services = services
        self._loop = loop
        self._host = host
        self._user = user
        self._password = password
        self._vhost = vhost
        self._digest = _PASSCODES.digest(password)
        self._members: dict[str, Member] = {}
        self._opened: list[SharedHub] = []  # the groups this connection opened (the bound)
        # the hubs call these per delivery and per broker read: the connection's own methods,
        # bound once, so that the fan-out pays no call in between
        self.deliver_shared: Callable[[Member, tuple[bytes, ...]], None] = host.deliver_shared
        self.flush: Callable[[], None] = host.flush
        self.shared_lag: Callable[[], int] = host.shared_lag

    @classmethod
    def at_login(
        cls,
        registry: Registry | None,
        services: HubServices,
        loop: asyncio.AbstractEventLoop,
        host: SharedMembershipHost,
        op: ops.OpenConnection,
    ) -> SharedMembership | None:
        """The link of a session that logs in with ``op``'s credentials (a group it opens is
        opened with them); None with ``adapter.shared_subscriptions`` off (no registry) and for
        an OAuth 2.0 token login, which never shares (its rights change with each refresh:
        the session subscribes it plainly, adapter/session/subscriptions.py)."""
        if registry is None or read_claims(op.password) is not None:
            return None
        return cls(registry, services, loop, host, op.user, op.password, op.vhost)

    async def join_group(self, op: ops.JoinShared) -> bool:
        """Join (opening the group if it is new); False: a new group would pass the bounds
        (adapter/sharing/rules.py).  The group's error is answered as a plain SUBSCRIBE's
        broker call would be (ERROR with the frame's receipt, then close) and raised."""
        try:
            return await self._join_group(op)
        except AmqpError as error:
            self._host.broker_failed(error, of_frame=True)
            raise

    async def _join_group(self, op: ops.JoinShared) -> bool:
        registry = self._registry
        opened = self._opened = [hub for hub in self._opened if not hub.closed]
        group, new = registry.group((self._vhost, self._user, self._digest, op.destination), len(opened))
        if group is None:
            return False  # over the bounds: the session subscribes plainly
        if new:
            hub = SharedHub(group, registry, self._services, self._loop)
            opened.append(hub)
            self._services.spawn(hub.open(self._user, self._password, self._vhost, op))
        hub = group.link  # type: ignore[assignment]
        assert isinstance(hub, SharedHub)
        if not hub.ready.done():
            await asyncio.shield(hub.ready)  # a waiter that goes away must not cancel the open
        elif not new and not hub.closed:
            # the group was opened with the same credentials, maybe long ago: the broker says
            # whether they still read it (a refusal ends the group for every member too)
            await hub.authorise()
        if hub.closed and hub.error is not None:
            raise hub.error
        if self._host.closed:
            if not group.members:
                hub.close()
            return True  # nothing more happens on this connection
        if hub.closed:  # ended without an error of its own (its members all left): a new one
            return await self._join_group(op)
        member = Member(self, op.consumer_tag, op.head, op.id_prefix)
        group.add_member(member)
        self._members[op.consumer_tag] = member
        return True

    def leave(self, consumer_tag: str) -> None:
        member = self._members.pop(consumer_tag, None)
        if member is not None:
            self._leave(member)

    def leave_all(self) -> None:
        members, self._members = list(self._members.values()), {}
        for member in members:
            self._leave(member)

    def _leave(self, member: Member) -> None:
        emptied = self._registry.leave(member)
        if emptied is not None:
            hub = emptied.link
            assert isinstance(hub, SharedHub)
            hub.close()

    # ------------------------------------------------------------------ Subscriber (the hubs')
    def shared_evicted(self, eviction: Eviction) -> None:
        """``eviction.member`` fell too far behind: ERROR naming the bound, then close (which
        leaves every group, ``leave_all``)."""
        host = self._host
        if host.closed:
            return
        setting = eviction.setting
        what = "this subscriber" if setting.endswith("max_lag") else "all shared subscribers together"
        connection_log.warning(
            "peer=%s: %d bytes of shared subscription messages waiting, over %s = %d: closed",
            host.peer,
            eviction.lag,
            setting,
            eviction.limit,
        )
        host.close_with_error(
            "Slow consumer",
            f"{eviction.lag} bytes of MESSAGE frames of a shared subscription were waiting for "
            f"this client to read them, over the {eviction.limit} bytes {what} may have "
            f"waiting ({setting}); the connection is closed\n",
        )

    def shared_lost(self, member: Member, error: AmqpError | None) -> None:
        """The broker ended the group ``member`` is in: what a plain subscription would get (a
        cancelled consumer: the server's cancellation; a closed channel or connection: ERROR)."""
        self._members.pop(member.consumer_tag, None)
        host = self._host
        if host.closed:
            return
        if error is None:
            host.on_server_cancel(member.consumer_tag)
        else:
            host.broker_failed(error, of_frame=False)
