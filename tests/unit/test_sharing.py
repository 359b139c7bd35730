"""adapter/sharing/runtime.py over in-memory stand-ins: the hub writes each delivery to every
member, measures them after the broker read and cuts off the one too far behind while the others
go on; the broker ending the group reaches every member; links join one group per key, the first
one opens it, and the bound on groups a connection opens makes later ones plain; a link turns
what its hubs tell it into the session's answers on its connection (a ``Host`` here)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from adapter.amqp.connection import AmqpError
from adapter.mapping import operations as ops
from adapter.mapping.properties import MessageProperties
from adapter.sharing.rules import MAX_OPENED_PER_CONNECTION, Eviction, Member, Registry
from adapter.sharing.runtime import SharedHub, SharedMembership


@dataclass
class Subscriber:
    name: str
    frames: list[bytes] = field(default_factory=list)
    lag: int = 0
    flushes: int = 0
    evicted: list[Eviction] = field(default_factory=list)
    lost: list[AmqpError | None] = field(default_factory=list)
    link: SharedMembership | None = None

    def deliver_shared(self, member: Member, pieces: tuple[bytes, ...]) -> None:
        self.frames.append(b"".join((member.head, pieces[0], member.id_prefix, *pieces[1:])))

    def flush(self) -> None:
        self.flushes += 1

    def shared_lag(self) -> int:
        return self.lag

    def shared_evicted(self, eviction: Eviction) -> None:
        self.evicted.append(eviction)
        if self.link is not None:
            self.link.leave_all()  # as the connection's close does

    def shared_lost(self, member: Member, error: AmqpError | None) -> None:
        self.lost.append(error)


@dataclass
class Host(Subscriber):
    """A client connection as its SharedMembership sees it (SharedMembershipHost): its output as a
    Subscriber's, and the session's answers recorded."""

    name: str = "host"
    peer: str = "10.0.0.1:4000"
    closed: bool = False
    errors: list[tuple[str, str]] = field(default_factory=list)  # close_with_error
    failures: list[tuple[int, bool]] = field(default_factory=list)  # broker_failed: code, of_frame
    cancelled: list[str] = field(default_factory=list)  # on_server_cancel

    def close_with_error(self, message: str, detail: str) -> None:
        self.errors.append((message, detail))
        self._close()

    def broker_failed(self, error: AmqpError, *, of_frame: bool) -> None:
        self.failures.append((error.code, of_frame))
        self._close()

    def on_server_cancel(self, consumer_tag: str) -> None:
        self.cancelled.append(consumer_tag)

    def _close(self) -> None:
        self.closed = True
        if self.link is not None:
            self.link.leave_all()  # as the connection's close does


@dataclass
class Services:
    spawned: list[Any] = field(default_factory=list)
    broker: Any = None
    nodes: Any = None
    login_timeout: float = 1.0
    descriptors: Any = None
    stats: Any = None

    def spawn(self, coro: Any) -> Any:
        self.spawned.append(coro)
        coro.close()  # never run: these tests open no connection
        return None


class Approving:
    """A group's RightsCheck whose broker always says yes."""

    def __init__(self) -> None:
        self.checks = 0

    async def confirm(self) -> None:
        self.checks += 1


def delivery(n: int) -> ops.Delivery:
    return ops.Delivery("hub", n, False, "amq.topic", "news", MessageProperties(), f"m{n}".encode())


def open_hub(registry: Registry, members: list[Subscriber]) -> SharedHub:
    group, new = registry.group(("/", "guest", b"d", "/topic/news"))
    assert group is not None and new
    hub = SharedHub(group, registry, Services(), asyncio.get_running_loop())  # type: ignore[arg-type]
    hub.ready.set_result(None)
    for i, subscriber in enumerate(members):
        group.add_member(
            Member(subscriber, f"T_{i}", f"MESSAGE\nsubscription:{i}\n".encode(), f"T_{i}@@s@@".encode())
        )
    return hub


async def test_every_member_gets_each_delivery_and_the_slow_one_is_cut_off_not_the_others() -> None:
    registry = Registry(max_lag=100, lag_budget=10**6)
    slow, bystander = Subscriber("slow"), Subscriber("bystander")
    hub = open_hub(registry, [slow, bystander])
    hub.on_deliver(delivery(1))
    hub.on_deliver(delivery(2))
    hub.on_read_done()
    assert [len(s.frames) for s in (slow, bystander)] == [2, 2]
    assert slow.frames[0].startswith(
        b"MESSAGE\nsubscription:0\ndestination:/topic/news\nmessage-id:T_0@@s@@1\n"
    )
    assert slow.flushes == bystander.flushes == 1
    slow.lag = 101
    hub.on_deliver(delivery(3))
    hub.on_read_done()
    (eviction,) = slow.evicted
    assert eviction.setting == "adapter.shared_subscription_max_lag" and eviction.lag == 101
    assert bystander.evicted == []
    # the evicted one's connection closed (here: removed by hand); the bystander goes on
    for member in list(hub.group.members):
        if member.subscriber is slow:
            registry.leave(member)
    hub.on_deliver(delivery(4))
    hub.on_read_done()
    assert [f.split(b"\n\n", 1)[1][:2] for f in bystander.frames] == [b"m1", b"m2", b"m3", b"m4"]
    assert len(slow.frames) == 3


async def test_the_broker_closing_the_group_reaches_every_member_and_forgets_it() -> None:
    registry = Registry(max_lag=100, lag_budget=10**6)
    members = [Subscriber(f"s{i}") for i in range(3)]
    hub = open_hub(registry, members)
    hub.on_amqp_closed(AmqpError(320, "CONNECTION_FORCED - closed via management plugin", from_broker=True))
    assert [[e.code for e in s.lost if e is not None] for s in members] == [[320]] * 3
    assert registry.groups == {} and hub.closed
    hub.on_deliver(delivery(1))  # late bytes of a dead link go nowhere
    assert all(s.frames == [] for s in members)


async def test_a_cancelled_consumer_reaches_every_member_as_a_server_cancel() -> None:
    registry = Registry(max_lag=100, lag_budget=10**6)
    members = [Subscriber("a"), Subscriber("b")]
    hub = open_hub(registry, members)
    hub.on_server_cancel("stomp-adapter-shared")
    assert [s.lost for s in members] == [[None], [None]]
    assert registry.groups == {}


async def test_links_of_one_key_share_one_group_and_only_the_first_opens_it() -> None:
    registry = Registry(max_lag=100, lag_budget=10**6)
    services = Services()
    loop = asyncio.get_running_loop()
    op = ops.JoinShared(
        "/topic/news", "T_s", b"MESSAGE\n", b"T_s@@x@@", ops.QueueDeclare("q"), "amq.topic", "news"
    )
    first = SharedMembership(registry, services, loop, Host(), "guest", "pw", "/")  # type: ignore[arg-type]
    join = asyncio.ensure_future(first.join_group(op))
    await asyncio.sleep(0)
    assert len(services.spawned) == 1  # the open
    (group,) = registry.groups.values()
    hub = group.link
    assert isinstance(hub, SharedHub)
    hub.ready.set_result(None)
    hub.rights = Approving()  # type: ignore[assignment]  # what the open leaves (rights_check.py)
    assert await join is True
    assert hub.rights.checks == 0  # the first member's join is the open itself
    second = SharedMembership(registry, services, loop, Host(), "guest", "pw", "/")  # type: ignore[arg-type]
    assert await second.join_group(op) is True
    assert len(services.spawned) == 1 and len(group.members) == 2
    assert hub.rights.checks == 1  # a later member's join asks the broker (its own credentials)
    other = SharedMembership(registry, services, loop, Host(), "guest", "other", "/")  # type: ignore[arg-type]
    asyncio.ensure_future(other.join_group(op))
    await asyncio.sleep(0)
    assert len(registry.groups) == 2  # another passcode: a group of its own
    first.leave_all()
    assert not hub.closed
    second.leave_all()
    assert hub.closed and group.key not in registry.groups


async def test_a_connection_that_opened_its_share_of_groups_gets_plain_subscriptions() -> None:
    registry = Registry(max_lag=100, lag_budget=10**6)
    services = Services()
    link = SharedMembership(registry, services, asyncio.get_running_loop(), Host(), "guest", "pw", "/")  # type: ignore[arg-type]
    for n in range(MAX_OPENED_PER_CONNECTION):
        op = ops.JoinShared(f"/topic/{n}", f"T_{n}", b"", b"", ops.QueueDeclare("q"), "amq.topic", str(n))
        asyncio.ensure_future(link.join_group(op))
    await asyncio.sleep(0)
    op = ops.JoinShared("/topic/more", "T_more", b"", b"", ops.QueueDeclare("q"), "amq.topic", "more")
    assert await link.join_group(op) is False
    assert len(services.spawned) == MAX_OPENED_PER_CONNECTION


# ---------------------------------------------------------------------- a link and its connection
NEWS = ops.JoinShared(
    "/topic/news",
    "T_s",
    b"MESSAGE\nsubscription:s\n",
    b"T_s@@x@@",
    ops.QueueDeclare("q"),
    "amq.topic",
    "news",
)


async def joined(
    registry: Registry, host: Host, op: ops.JoinShared = NEWS
) -> tuple[SharedMembership, SharedHub]:
    """A link of ``host`` that joined (and opened) the group of ``op``, its hub ready."""
    link = SharedMembership(registry, Services(), asyncio.get_running_loop(), host, "guest", "pw", "/")  # type: ignore[arg-type]
    host.link = link
    join = asyncio.ensure_future(link.join_group(op))
    await asyncio.sleep(0)
    hub = registry.groups[("/", "guest", link._digest, op.destination)].link  # noqa: SLF001
    assert isinstance(hub, SharedHub)
    hub.ready.set_result(None)
    assert await join is True
    return link, hub


async def test_a_links_messages_go_straight_to_its_connections_output() -> None:
    host = Host()
    _link, hub = await joined(Registry(max_lag=100, lag_budget=10**6), host)
    hub.on_deliver(delivery(1))
    hub.on_read_done()
    (frame,) = host.frames
    assert frame.startswith(b"MESSAGE\nsubscription:s\ndestination:/topic/news\nmessage-id:T_s@@x@@1\n")
    assert host.flushes == 1


async def test_a_member_too_far_behind_gets_slow_consumer_naming_the_bound_and_leaves() -> None:
    registry = Registry(max_lag=100, lag_budget=10**6)
    host = Host(lag=101)
    _link, hub = await joined(registry, host)
    hub.on_deliver(delivery(1))
    hub.on_read_done()
    ((message, detail),) = host.errors
    assert message == "Slow consumer"
    assert "101 bytes" in detail and "over the 100 bytes this subscriber" in detail
    assert "adapter.shared_subscription_max_lag" in detail
    assert hub.closed and registry.groups == {}  # its last member left with the close


async def test_the_broker_ending_a_group_is_what_a_plain_subscription_gets() -> None:
    registry = Registry(max_lag=100, lag_budget=10**6)
    cancelled, failed, gone = Host(), Host(), Host()
    _, cancelled_hub = await joined(registry, cancelled)
    other = ops.JoinShared("/topic/b", "T_b", b"", b"", ops.QueueDeclare("q"), "amq.topic", "b")
    _, failed_hub = await joined(registry, failed, other)
    third = ops.JoinShared("/topic/c", "T_c", b"", b"", ops.QueueDeclare("q"), "amq.topic", "c")
    _, gone_hub = await joined(registry, gone, third)
    cancelled_hub.on_server_cancel("stomp-adapter-shared")  # the queue was deleted
    assert cancelled.cancelled == ["T_s"] and cancelled.failures == []
    failed_hub.on_amqp_closed(AmqpError(403, "ACCESS_REFUSED - no read access", from_broker=True))
    assert failed.failures == [(403, False)]  # not the answer of a frame being handled
    gone.closed = True
    gone_hub.on_amqp_closed(AmqpError(320, "CONNECTION_FORCED", from_broker=True))
    assert gone.failures == [] and gone.cancelled == []  # a closed connection is told nothing


async def test_a_join_the_broker_refuses_is_answered_as_the_frames_and_raised() -> None:
    registry = Registry(max_lag=100, lag_budget=10**6)
    host = Host()
    link = SharedMembership(registry, Services(), asyncio.get_running_loop(), host, "guest", "pw", "/")  # type: ignore[arg-type]
    join = asyncio.ensure_future(link.join_group(NEWS))
    await asyncio.sleep(0)
    (group,) = registry.groups.values()
    hub = group.link
    assert isinstance(hub, SharedHub)
    hub._fail_open(AmqpError(403, "ACCESS_REFUSED - no configure access", from_broker=True))  # noqa: SLF001
    with pytest.raises(AmqpError):
        await join
    assert host.failures == [(403, True)]  # with the SUBSCRIBE's receipt, as its own call would
