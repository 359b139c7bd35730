"""adapter/sharing/rules.py: who shares, the MESSAGE rendered once per delivery (byte for byte
what a plain subscription renders), the lag bounds and whom they cut off; and the session's side
(SUBSCRIBE, UNSUBSCRIBE, ACK of a shared subscription).  No broker, no loop."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapter.mapping import operations as ops
from adapter.mapping.destinations import DestinationKind
from adapter.mapping.properties import MessageProperties
from adapter.session import SessionRegistries
from adapter.session.frames import Frames
from adapter.session.subscription import Subscription
from adapter.sharing.rules import (
    MAX_GROUPS,
    MAX_OPENED_PER_CONNECTION,
    SHAREABLE_HEADERS,
    Member,
    Registry,
    Renderer,
    member_head,
    shareable,
)
from adapter.stomp.frame import Frame
from tests.unit.test_session import SESSION_ID, command_of, connected, frames_of, header, make_session, run

TOPIC = DestinationKind.TOPIC


# --- who shares (hostile first: anything that could change what a subscriber gets keeps it plain)
@pytest.mark.parametrize(
    "extra",
    [
        {"selector": "a = 1"},
        {"x-queue-name": "mine"},
        {"durable": "true"},
        {"persistent": "true"},
        {"auto-delete": "false"},
        {"prefetch-count": "10"},
        {"x-max-length": "5"},
        {"exclusive": "true"},
        {"activemq.noLocal": "true"},
        {"ack": "client"},
        {"ack": "client-individual"},
        {"unknown-header": "x"},
    ],
)
def test_a_subscription_with_any_other_header_stays_plain(extra: dict[str, str]) -> None:
    assert not shareable(TOPIC, {"destination": "/topic/a", "id": "1", **extra})


@pytest.mark.parametrize(
    "kind", [DestinationKind.QUEUE, DestinationKind.AMQ_QUEUE, DestinationKind.TEMP_QUEUE]
)
def test_queues_never_share(kind: DestinationKind) -> None:
    assert not shareable(kind, {"destination": "/queue/a", "id": "1"})


def test_plain_topic_and_exchange_subscriptions_share() -> None:
    headers = {"destination": "/topic/a", "id": "1", "ack": "auto", "receipt": "r"}
    assert set(headers) == SHAREABLE_HEADERS
    assert shareable(TOPIC, headers)
    assert shareable(DestinationKind.EXCHANGE, {"destination": "/exchange/x/k"})


# --- rendering once: a member's bytes are exactly a plain subscription's MESSAGE
def plain_message(delivery: ops.Delivery, sub_id: str | None, trailing_lf: bool = True) -> bytes:
    tag = f"T_{sub_id}" if sub_id is not None else "Q_/topic/a"
    subscriptions = {tag: Subscription(tag, sub_id, "/topic/a", None, "auto")}
    frames = Frames(subscriptions, SESSION_ID, trailing_lf)
    return frames.render_message(delivery._replace(consumer_tag=tag))


def shared_message(delivery: ops.Delivery, sub_id: str | None, trailing_lf: bool = True) -> bytes:
    tag = f"T_{sub_id}" if sub_id is not None else "Q_/topic/a"
    head, prefix = member_head(sub_id, tag, SESSION_ID)
    pieces = Renderer(trailing_lf).render(delivery)
    return b"".join((head, pieces[0], prefix, *pieces[1:]))


texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)


@given(
    sub_id=st.none() | texts,
    routing_key=texts,
    redelivered=st.booleans(),
    headers=st.dictionaries(texts, texts, max_size=4),
    body=st.binary(max_size=100) | st.just(b"x" * 70_000),
    trailing_lf=st.booleans(),
)
def test_the_shared_rendering_is_the_plain_one(
    sub_id: str | None,
    routing_key: str,
    redelivered: bool,
    headers: dict[str, str],
    body: bytes,
    trailing_lf: bool,
) -> None:
    properties = MessageProperties(content_type="text/plain", headers=dict(headers) or None)
    delivery = ops.Delivery("hub", 7, redelivered, "amq.topic", routing_key, properties, body)
    assert shared_message(delivery, sub_id, trailing_lf) == plain_message(delivery, sub_id, trailing_lf)


def test_a_large_body_is_its_own_piece_never_copied() -> None:
    body = b"y" * 100_000
    delivery = ops.Delivery("hub", 1, False, "amq.topic", "a", MessageProperties(), body)
    pieces = Renderer(True).render(delivery)
    assert len(pieces) == 4 and pieces[2] is body


# --- lag: the bounds, whom they cut off
def members(registry: Registry, count: int, key: str = "/topic/a") -> list[Member]:
    group, _new = registry.group(("/", "guest", b"d", key))
    made = [Member(object(), f"T_{i}", b"", b"") for i in range(count)]
    for member in made:
        group.add_member(member)
    return made


def test_a_member_at_the_bound_stays_and_one_over_it_is_evicted_naming_the_setting() -> None:
    registry = Registry(max_lag=1000, lag_budget=10**9)
    slow, bystander = members(registry, 2)
    assert registry.measured(slow, 1000) == []
    assert registry.measured(bystander, 10) == []
    (eviction,) = registry.measured(slow, 1001)
    assert eviction.member is slow and eviction.lag == 1001 and eviction.limit == 1000
    assert eviction.setting == "adapter.shared_subscription_max_lag"
    assert registry.evicted == 1
    assert registry.total_lag == 10  # the evicted one no longer counts


def test_over_the_process_budget_the_member_furthest_behind_goes_first() -> None:
    registry = Registry(max_lag=1000, lag_budget=1500)
    a, b = members(registry, 2, "/topic/a")
    (c,) = members(registry, 1, "/topic/b")
    assert registry.measured(a, 900) == []
    assert registry.measured(b, 100) == []
    (eviction,) = registry.measured(c, 600)  # 1600 in all: a, the worst, in another group
    assert eviction.member is a and eviction.setting == "adapter.shared_subscription_lag_budget"
    assert registry.total_lag == 700


def test_many_members_over_the_budget_are_evicted_until_under_it() -> None:
    registry = Registry(max_lag=10**6, lag_budget=1000)
    crowd = members(registry, 50)
    evicted = []
    for member in crowd:
        evicted += registry.measured(member, 100)
    assert registry.total_lag <= 1000
    assert len(evicted) == 40 and len({e.member for e in evicted}) == 40


def test_a_member_that_leaves_takes_its_lag_and_the_last_one_ends_the_group() -> None:
    registry = Registry(max_lag=1000, lag_budget=10**9)
    first, second = members(registry, 2)
    registry.measured(first, 500)
    assert registry.leave(first) is None
    assert registry.total_lag == 0
    group = second.group
    assert registry.leave(second) is group and group is not None
    assert registry.groups == {}
    _again, new = registry.group(group.key)
    assert new  # a later subscriber starts a new group


def test_groups_are_apart_by_user_passcode_vhost_and_destination() -> None:
    registry = Registry(max_lag=1, lag_budget=1)
    keys = [
        ("/", "guest", b"d1", "/topic/a"),
        ("/", "guest", b"d2", "/topic/a"),  # another passcode: never rides on this group
        ("/", "bob", b"d1", "/topic/a"),
        ("v", "guest", b"d1", "/topic/a"),
        ("/", "guest", b"d1", "/topic/b"),
    ]
    assert [registry.group(key)[1] for key in keys] == [True] * 5
    assert registry.group(keys[0])[1] is False


def test_a_connection_opens_a_bounded_number_of_groups_and_the_process_too() -> None:
    registry = Registry(max_lag=1, lag_budget=1)
    assert registry.group(("/", "u", b"d", "/topic/x"), MAX_OPENED_PER_CONNECTION)[0] is None
    for n in range(MAX_GROUPS):
        assert registry.group(("/", "u", b"d", f"/topic/{n}"))[1]
    assert registry.group(("/", "u", b"d", "/topic/one-more")) == (None, False)
    assert registry.group(("/", "u", b"d", "/topic/0"))[0] is not None  # joining one stays possible


# --- the session's side
def shared_session() -> object:
    return connected(registries=SessionRegistries(shared=Registry(max_lag=1000, lag_budget=10**6)))


def joined(answer: object) -> object:
    """The driver's answers, with ``answer`` for JoinShared (True: joined; False: declined)."""

    def reply(op: ops.Operation) -> object:
        if isinstance(op, ops.JoinShared):
            return answer
        if isinstance(op, ops.QueueDeclare):
            return op.queue or "amq.gen-test"
        return None

    return reply


def test_subscribe_joins_without_any_broker_call_and_answers_the_receipt() -> None:
    session = shared_session()
    out = run(
        session, Frame("SUBSCRIBE", {"destination": "/topic/a.b", "id": "s1", "receipt": "r"}), joined(True)
    )  # type: ignore[arg-type]
    (join,) = [op for op in out if isinstance(op, ops.JoinShared)]
    assert not [op for op in out if isinstance(op, ops.BasicConsume | ops.QueueDeclare | ops.QueueBind)]
    assert join.destination == "/topic/a.b" and join.consumer_tag == "T_s1"
    assert (join.bind_exchange, join.bind_key) == ("amq.topic", "a.b")
    assert join.head == b"MESSAGE\nsubscription:s1\n"
    assert join.id_prefix == f"T_s1@@{SESSION_ID}@@".encode()
    assert command_of(frames_of(out)[-1]) == "RECEIPT"
    out = run(session, Frame("UNSUBSCRIBE", {"id": "s1", "receipt": "r2"}))  # type: ignore[arg-type]
    assert out[0] == ops.LeaveShared("T_s1") and command_of(frames_of(out)[-1]) == "RECEIPT"
    assert not [op for op in out if isinstance(op, ops.BasicCancel)]


@pytest.mark.parametrize(
    "headers",
    [
        {"destination": "/topic/a", "id": "s", "ack": "client"},
        {"destination": "/topic/a", "id": "s", "selector": "x = 1"},
        {"destination": "/topic/a", "id": "s", "x-queue-name": "q"},
        {"destination": "/topic/a", "id": "s", "durable": "true"},
        {"destination": "/queue/a", "id": "s"},
    ],
)
def test_other_subscriptions_consume_on_their_own_channel(headers: dict[str, str]) -> None:
    session = shared_session()
    out = run(session, Frame("SUBSCRIBE", headers))  # type: ignore[arg-type]
    assert not [op for op in out if isinstance(op, ops.JoinShared)]
    assert [op for op in out if isinstance(op, ops.BasicConsume)]


def test_a_declined_join_subscribes_plainly_with_one_receipt() -> None:
    session = shared_session()
    out = run(
        session, Frame("SUBSCRIBE", {"destination": "/topic/a", "id": "s", "receipt": "r"}), joined(False)
    )  # type: ignore[arg-type]
    kinds = [type(op) for op in out if not isinstance(op, ops.SendFrame)]
    assert kinds == [ops.JoinShared, ops.QueueDeclare, ops.BasicConsume, ops.QueueBind]
    assert [command_of(f) for f in frames_of(out)] == ["RECEIPT"]
    out = run(session, Frame("UNSUBSCRIBE", {"id": "s"}))  # type: ignore[arg-type]
    assert out == [ops.BasicCancel("T_s")]


def test_off_nothing_is_shared() -> None:
    session = connected()
    out = run(session, Frame("SUBSCRIBE", {"destination": "/topic/a", "id": "s"}))
    assert not [op for op in out if isinstance(op, ops.JoinShared)]


def test_an_ack_of_a_shared_message_is_refused_as_the_broker_refuses_an_auto_ack_one() -> None:
    session = shared_session()
    run(session, Frame("SUBSCRIBE", {"destination": "/topic/a", "id": "s"}), joined(True))  # type: ignore[arg-type]
    ack = Frame("ACK", {"id": f"T_s@@{SESSION_ID}@@3"})
    assert session.quick_ack(ack) is None  # type: ignore[attr-defined]
    out = run(session, ack)  # type: ignore[arg-type]
    assert not [op for op in out if isinstance(op, ops.BasicAck)]
    error = frames_of(out)[0]
    assert header(error, "message") == "precondition_failed"
    assert b"unknown delivery tag 3" in error
    assert isinstance(out[-1], ops.CloseClient)


def test_a_token_session_never_shares() -> None:
    """A group is opened with its first member's credentials and kept for the whole group:
    a token session's rights change with each refresh (update-secret), so it subscribes
    plainly, on its own connection, with the token it holds now."""
    token = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2ln"  # {"alg":"RS256"}.{"sub":"alice"}
    session = make_session(registries=SessionRegistries(shared=Registry(max_lag=1000, lag_budget=10**6)))
    out = run(session, Frame("CONNECT", {"accept-version": "1.2", "host": "/", "passcode": token}))
    assert command_of(frames_of(out)[-1]) == "CONNECTED"
    out = run(session, Frame("SUBSCRIBE", {"destination": "/topic/a", "id": "s"}), joined(True))
    assert not [op for op in out if isinstance(op, ops.JoinShared)]
    assert [op for op in out if isinstance(op, ops.BasicConsume)]
