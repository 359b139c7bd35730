"""Shared AMQP connections and shared subscriptions keep each session's fate its own, against
the real broker (issue 33): what one session sends, or a limit or a revoked right of its user,
ends that session alone, and no session receives what its user may no longer read.

Every test has a bystander: a session of the same user on the same shared AMQP connection,
served before and after the hostile frame.  Users other than guest are throwaway users."""

from __future__ import annotations

import socket
import urllib.parse
from collections.abc import Callable
from typing import Any

import pytest

from tests.amqp_proxy import ProxyThread, ServerVersion
from tests.support import (
    AdapterProcess,
    BrokerProbe,
    RawSession,
    amqp_client_ports,
    frame_headers,
    read_frames,
    unique,
    wait_until,
)

PER_CONNECTION = 4
BAD = b"\xff\xfe"  # not UTF-8: a Latin-1 client's bytes, or an attacker's


def mux_adapter(start_adapter: Callable[..., AdapterProcess], **settings: Any) -> AdapterProcess:
    return start_adapter(amqp_sessions_per_connection=PER_CONNECTION, **settings)


class Bystander:
    """A session served on its own queue, whose AMQP connection the next session of the same
    user joins; ``served()`` checks it still is, on that very connection."""

    def __init__(
        self, adapter: AdapterProcess, broker: BrokerProbe, login: str = "guest", passcode: str = "guest"
    ):
        self.before = amqp_client_ports()
        self.session = RawSession(adapter.port, login, passcode)
        assert self.session.command == "CONNECTED", self.session.body
        self.queue = unique("iso-by")
        broker.track_queue(self.queue)
        self.session.round_trip(self.queue)
        self.connections = amqp_client_ports() - self.before

    def served(self) -> None:
        self.session.round_trip(self.queue)
        assert self.connections <= amqp_client_ports()


def raw_error(session: RawSession, frame: bytes) -> tuple[str, dict[str, str], bytes]:
    """Send ``frame`` (raw bytes, with a receipt) and return the answer: an ERROR expected."""
    session.sock.sendall(frame + b"\0")
    got = session.frames_until(("RECEIPT", "ERROR"))
    assert got, "the adapter closed without an answer"
    return got[-1]


# ------------------------------------------------------------------ item 1: names not UTF-8
def hostile_frames(target: str) -> dict[str, bytes]:
    """Frames carrying bytes that are not UTF-8 where RabbitMQ reads a short string."""
    t = target.encode()
    return {
        "queue": b"SUBSCRIBE\nid:1\ndestination:/queue/" + t + BAD + b"\nreceipt:r\n\n",
        "send-queue": b"SEND\ndestination:/queue/" + t + BAD + b"\nreceipt:r\n\nx",
        "amq-queue": b"SUBSCRIBE\nid:1\ndestination:/amq/queue/" + t + BAD + b"\nreceipt:r\n\n",
        "topic": b"SUBSCRIBE\nid:1\ndestination:/topic/" + t + BAD + b"\nreceipt:r\n\n",
        "exchange": b"SUBSCRIBE\nid:1\ndestination:/exchange/amq.direct" + BAD + b"/k\nreceipt:r\n\n",
        "consumer-tag": b"SUBSCRIBE\nid:a" + BAD + b"\ndestination:/queue/" + t + b"\nreceipt:r\n\n",
        "x-queue-name": b"SUBSCRIBE\nid:1\ndestination:/topic/"
        + t
        + b"\nx-queue-name:q"
        + BAD
        + b"\nreceipt:r\n\n",
        "reply-to": b"SEND\ndestination:/queue/"
        + t
        + b"\nreply-to:/temp-queue/r"
        + BAD
        + b"\nreceipt:r\n\nx",
    }


@pytest.mark.parametrize("kind", sorted(hostile_frames("x")))
@pytest.mark.parametrize("sharing", [False, True], ids=["plain", "shared-subscriptions"])
def test_a_name_that_is_not_utf8_ends_only_its_session(
    start_adapter: Any, broker: BrokerProbe, kind: str, sharing: bool
) -> None:
    """RabbitMQ answers a short string that is not UTF-8 with a connection error (501
    FRAME_ERROR): the adapter refuses the name itself, with an ERROR for the one session, and
    the session sharing its AMQP connection stays served."""
    adapter = mux_adapter(start_adapter, shared_subscriptions=sharing)
    bystander = Bystander(adapter, broker)
    hostile = RawSession(adapter.port)
    target = unique("iso")
    broker.track_queue(target)
    command, headers, body = raw_error(hostile, hostile_frames(target)[kind])
    assert (command, headers.get("message")) == ("ERROR", "Processing error"), (command, headers, body)
    assert b"not valid UTF-8" in body
    assert BAD not in body  # the client's bytes are not echoed
    bystander.served()
    again = RawSession(adapter.port)  # the shared connection still takes new sessions
    own = unique("iso-again")
    broker.track_queue(own)
    again.round_trip(own)
    assert bystander.connections <= amqp_client_ports()


def test_a_topic_send_whose_routing_key_is_not_utf8_is_published(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    """basic.publish is not checked by the broker (content-bearing methods are not): a SEND to
    a /topic/ whose name is not UTF-8 is published and receipted, as the plugin does."""
    adapter = mux_adapter(start_adapter)
    bystander = Bystander(adapter, broker)
    sender = RawSession(adapter.port)
    sender.sock.sendall(b"SEND\ndestination:/topic/t" + BAD + b"\nreceipt:r\n\nx\0")
    got = sender.frames_until(("RECEIPT", "ERROR"))
    assert got[-1][0] == "RECEIPT", got
    bystander.served()


def test_a_virtual_host_that_is_not_utf8_is_refused_alone(start_adapter: Any, broker: BrokerProbe) -> None:
    adapter = mux_adapter(start_adapter)
    bystander = Bystander(adapter, broker)
    sock = socket.create_connection(("127.0.0.1", adapter.port), timeout=5)
    RawSession.opened.append(sock)
    sock.sendall(b"CONNECT\naccept-version:1.2\nhost:v" + BAD + b"\nlogin:guest\npasscode:guest\n\n\0")
    frames, _ = read_frames(sock, timeout=5, count=1)
    command, headers, body = frame_headers(frames[0])
    # the plugin's answer to a virtual host that does not exist, with the name as it came
    assert (command, headers.get("message")) == ("ERROR", "Bad CONNECT"), (command, headers, body)
    assert body == b"Virtual host 'v" + BAD + b"' access denied"
    bystander.served()


CESU8 = b"\xed\xa0\x80"  # an encoded surrogate: Java's modified UTF-8 for characters beyond the BMP


@pytest.mark.parametrize("version", ["3.13.7", "4.3.0"])
def test_encoded_surrogates_are_refused_only_where_the_broker_refuses_them(
    amqp_url: str, start_adapter: Any, broker: BrokerProbe, version: str
) -> None:
    """RabbitMQ up to 4.2 takes encoded surrogates in a method's short strings (xmerl_ucs);
    4.3 checks UTF-8 strictly and answers them with a connection error.  Through a proxy that
    answers as each broker would: a consumer tag with them is subscribed on 3.13, and on 4.3
    refused for its session alone."""
    with ProxyThread(amqp_url, [ServerVersion(version)]) as proxy:
        adapter = mux_adapter(start_adapter, amqp_url=proxy.url)
        bystander = Bystander(adapter, broker)
        session = RawSession(adapter.port)
        queue = unique("iso-cesu")
        broker.track_queue(queue)
        command, headers, body = raw_error(
            session,
            b"SUBSCRIBE\nid:s" + CESU8 + b"\ndestination:/queue/" + queue.encode() + b"\nreceipt:r\n\n",
        )
        if version.startswith("4."):
            assert (command, headers.get("message")) == ("ERROR", "Processing error"), body
            assert b"not valid UTF-8" in body
        else:
            assert command == "RECEIPT", (command, headers, body)
        bystander.served()


# ------------------------------------------------------ item 6: a passcode is never echoed
@pytest.mark.parametrize(
    "connect",
    [
        b"CONNECT\naccept-version:1.2\nlogin:guest\npasscode:hunt\rer2\n\n\0",
        b"STOMP\naccept-version:1.2\npasscode hunter2\nlogin:guest\n\n\0",
        b"CONNECT\raccept-version:1.2\rlogin:guest\rpasscode:hunter2\r\n\n\0",
    ],
)
def test_the_error_for_a_broken_connect_does_not_echo_its_passcode(
    start_adapter: Any, broker: BrokerProbe, connect: bytes
) -> None:
    adapter = start_adapter()
    sock = socket.create_connection(("127.0.0.1", adapter.port), timeout=5)
    RawSession.opened.append(sock)
    sock.sendall(connect)
    frames, closed = read_frames(sock, timeout=5, count=1)
    command, headers, body = frame_headers(frames[0])
    assert command == "ERROR" and closed, (command, headers, body)
    assert b"hunt" not in frames[0] and b"er2" not in frames[0]
    assert b"not shown" in body


# ------------------------------------------------------------- item 2: a user's channel limit
def test_a_user_over_its_channel_limit_stops_being_multiplexed(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    """Over a user's ``max-channels`` RabbitMQ refuses channel.open with a connection error
    (530), which ends every session on the shared connection: the first time, every session of
    that user on it (never another user's: connections are per user).  From then on the
    user's sessions get a connection each, so the next session over the limit ends alone."""
    adapter = mux_adapter(start_adapter)
    user = broker.create_user("pw", "iso")
    broker.management(
        f"/api/user-limits/{urllib.parse.quote(user, safe='')}/max-channels", "PUT", {"value": 2}
    )
    guest = Bystander(adapter, broker)  # another user's session: never touched
    first = [Bystander(adapter, broker, user, "pw") for _ in range(2)]  # the user's 2 channels
    third = RawSession(adapter.port, user, "pw")
    queue = unique("iso-limit")
    broker.track_queue(queue)
    got = third.send(f"SEND\ndestination:/queue/{queue}\nreceipt:r\n\nx")  # channel.open: the third
    assert got[-1][0] == "ERROR" and got[-1][1]["message"] == "not_allowed", got
    for ended in first:  # the broker closed the shared connection: the first time, all of them
        frames = ended.session.frames_until(("ERROR",))
        assert frames and frames[-1][0] == "ERROR", frames
    guest.served()
    # from now on: a connection per session, and only the one over the limit ends
    assert wait_until(lambda: broker_channels_of(broker, user) == 0, 15)
    served = [Bystander(adapter, broker, user, "pw") for _ in range(2)]
    assert len({port for b in served for port in b.connections}) == 2
    over = RawSession(adapter.port, user, "pw")
    got = over.send(f"SEND\ndestination:/queue/{queue}\nreceipt:r\n\nx")
    assert got[-1][0] == "ERROR" and got[-1][1]["message"] == "not_allowed", got
    for session in served:
        session.served()
    guest.served()


def broker_channels_of(broker: BrokerProbe, user: str) -> int:
    return sum(c.get("channels", 0) for c in broker.management("/api/connections") if c.get("user") == user)


# ------------------------------------------------ item 4: revoked rights and shared subscriptions
def shared_subscriber(adapter: AdapterProcess, user: str, destination: str) -> tuple[RawSession, list[Any]]:
    """A session of ``user`` subscribed to ``destination`` (shared), and the SUBSCRIBE's answer."""
    session = RawSession(adapter.port, user, "pw")
    assert session.command == "CONNECTED", session.body
    got = session.send(f"SUBSCRIBE\nid:{unique('s')}\ndestination:{destination}\nreceipt:r\n\n")
    return session, got


def set_permissions(broker: BrokerProbe, user: str, **permissions: str) -> None:
    quoted = urllib.parse.quote(user, safe="")
    if not permissions:
        broker.management(f"/api/permissions/%2F/{quoted}", "DELETE")
        return
    broker.management(f"/api/permissions/%2F/{quoted}", "PUT", permissions)


def hub_checks(adapter: AdapterProcess) -> int:
    async def count() -> int:
        registry = adapter.server.context.shared_subscriptions
        assert registry is not None
        return sum(g.link.rights.checks for g in registry.groups.values() if g.link.rights is not None)

    return int(adapter.run(count()))


@pytest.mark.parametrize("multiplexing", [False, True], ids=["own-connections", "multiplexed"])
def test_a_revoked_read_permission_refuses_a_join_and_ends_the_group(
    start_adapter: Any, broker: BrokerProbe, multiplexing: bool
) -> None:
    """A later member used to join a live group without any broker call: after the user's
    read permission on the exchange was revoked, a new SUBSCRIBE still got its RECEIPT and the
    topic's messages.  Now the join asks the broker with the member's own credentials: it gets
    the access_refused ERROR a plain SUBSCRIBE gets, and the group, whose every member is that
    user, ends with the same ERROR."""
    settings: dict[str, Any] = {"shared_subscriptions": True}
    if multiplexing:
        settings["amqp_sessions_per_connection"] = PER_CONNECTION
    adapter = start_adapter(**settings)
    user = broker.create_user("pw", "iso")
    topic = unique("iso-topic")
    first, got = shared_subscriber(adapter, user, f"/topic/{topic}")
    assert got[-1][0] == "RECEIPT", got
    set_permissions(broker, user, configure=".*", write=".*", read="^(?!amq\\.topic$).*")
    late, got = shared_subscriber(adapter, user, f"/topic/{topic}")
    assert got[-1][0] == "ERROR" and got[-1][1]["message"] == "access_refused", got
    assert b"amq.topic" in got[-1][2]
    ended = first.frames_until(("ERROR",))
    assert ended and ended[-1][0] == "ERROR" and ended[-1][1]["message"] == "access_refused", ended
    broker.publish("amq.topic", topic, b"not for them")
    for session in (first, late):
        rest = session.frames_until(("MESSAGE",), timeout=1)
        assert not any(frame[0] == "MESSAGE" for frame in rest), rest


def test_a_user_whose_vhost_access_was_cleared_gets_no_topic_data_on_a_shared_connection(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    """With multiplexing, a CONNECT joins a shared connection without a login (docs/
    configuration.md says so); the first frame touching a queue or an exchange must then get
    access_refused, a shared subscription's join included."""
    adapter = start_adapter(shared_subscriptions=True, amqp_sessions_per_connection=PER_CONNECTION)
    user = broker.create_user("pw", "iso")
    topic = unique("iso-topic")
    first, got = shared_subscriber(adapter, user, f"/topic/{topic}")
    assert got[-1][0] == "RECEIPT", got
    set_permissions(broker, user)  # every permission on the vhost cleared
    late, got = shared_subscriber(adapter, user, f"/topic/{topic}")  # CONNECTED: joins
    assert got[-1][0] == "ERROR", got
    broker.publish("amq.topic", topic, b"not for them")
    rest = late.frames_until(("MESSAGE",), timeout=1)
    assert not any(frame[0] == "MESSAGE" for frame in rest), rest


def test_a_group_asks_again_when_its_answer_is_older_than_the_max_age(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    """Without any join, a group asks the broker again after
    adapter.amqp_connection_max_age_seconds: a member whose user lost the right to read ends
    with the ERROR within that time, instead of receiving for as long as it stays."""
    adapter = start_adapter(shared_subscriptions=True, amqp_connection_max_age_seconds=1)
    user = broker.create_user("pw", "iso")
    topic = unique("iso-topic")
    member, got = shared_subscriber(adapter, user, f"/topic/{topic}")
    assert got[-1][0] == "RECEIPT", got
    broker.publish("amq.topic", topic, b"before")
    assert member.frames_until(("MESSAGE",))[-1][2] == b"before"
    set_permissions(broker, user, configure=".*", write=".*", read="^(?!amq\\.topic$).*")
    ended = member.frames_until(("ERROR",), timeout=10)
    assert ended and ended[-1][0] == "ERROR" and ended[-1][1]["message"] == "access_refused", ended


def test_a_join_with_rights_is_answered_and_served(start_adapter: Any, broker: BrokerProbe) -> None:
    """The check changes nothing for a user who may read: each later join gets its RECEIPT
    after one check of the broker's, and every member gets the topic's messages."""
    adapter = start_adapter(shared_subscriptions=True)
    user = broker.create_user("pw", "iso")
    topic = unique("iso-topic")
    members = [shared_subscriber(adapter, user, f"/topic/{topic}") for _ in range(3)]
    assert all(got[-1][0] == "RECEIPT" for _, got in members)
    assert hub_checks(adapter) == 2  # the two later joins, one after the other
    broker.publish("amq.topic", topic, b"for all")
    for session, _ in members:
        assert session.frames_until(("MESSAGE",))[-1][2] == b"for all"


@pytest.mark.parametrize(
    "permissions",
    [
        {"configure": "^$", "write": ".*", "read": ".*"},  # may not declare a subscription queue
        {"configure": ".*", "write": ".*", "read": "^amq\\.topic$"},  # may not consume one
    ],
    ids=["configure", "queue-read"],
)
def test_a_join_meets_every_check_a_plain_subscribe_meets(
    start_adapter: Any, broker: BrokerProbe, permissions: dict[str, str]
) -> None:
    """The rights check does what the joiner's plain SUBSCRIBE would (declare, consume, bind), so
    a revoked configure or queue-read permission refuses the join as it refuses the plain one."""
    adapter = start_adapter(shared_subscriptions=True)
    user = broker.create_user("pw", "iso")
    topic = unique("iso-topic")
    _, got = shared_subscriber(adapter, user, f"/topic/{topic}")
    assert got[-1][0] == "RECEIPT", got
    set_permissions(broker, user, **permissions)
    late, got = shared_subscriber(adapter, user, f"/topic/{topic}")
    assert got[-1][0] == "ERROR" and got[-1][1]["message"] == "access_refused", got
    broker.publish("amq.topic", topic, b"not for them")
    rest = late.frames_until(("MESSAGE",), timeout=1)
    assert not any(frame[0] == "MESSAGE" for frame in rest), rest


def test_a_connection_limit_at_the_check_refuses_the_join_and_keeps_the_group(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    """A check that meets a connection limit learns nothing about the user's rights: the join
    is refused with the broker's answer, and the members already in the group go on."""
    vhost = broker.scratch_vhost("iso-vh")
    user = broker.create_user("pw", "iso")
    broker.management(
        f"/api/permissions/{vhost}/{urllib.parse.quote(user, safe='')}",
        "PUT",
        {"configure": ".*", "write": ".*", "read": ".*"},
    )
    adapter = start_adapter(shared_subscriptions=True, amqp_sessions_per_connection=PER_CONNECTION)
    topic = unique("iso-topic")

    def session() -> RawSession:
        raw = RawSession.__new__(RawSession)
        raw.sock = socket.create_connection(("127.0.0.1", adapter.port), timeout=5)
        RawSession.opened.append(raw.sock)
        raw.sock.sendall(
            f"CONNECT\naccept-version:1.2\nhost:{vhost}\nlogin:{user}\npasscode:pw\n\n\0".encode()
        )
        frames, _ = read_frames(raw.sock, timeout=5, count=1)
        raw.command, raw.headers, raw.body = frame_headers(frames[0])
        raw._data, raw._pending = b"", []
        assert raw.command == "CONNECTED", raw.body
        return raw

    member, joiner = session(), session()  # one shared AMQP connection
    got = member.send(f"SUBSCRIBE\nid:s\ndestination:/topic/{topic}\nreceipt:r\n\n")
    assert got[-1][0] == "RECEIPT", got  # the group's own connection: the vhost's second
    broker.management(f"/api/vhost-limits/{vhost}/max-connections", "PUT", {"value": 2})
    got = joiner.send(f"SUBSCRIBE\nid:s\ndestination:/topic/{topic}\nreceipt:r\n\n")
    assert got[-1][0] == "ERROR" and b"limit" in got[-1][2], got
    broker.management(f"/api/vhost-limits/{vhost}/max-connections", "DELETE")
    got = member.send(f"SEND\ndestination:/topic/{topic}\nreceipt:p\n\nstill")
    assert got[-1][0] == "RECEIPT", got
    # the group's MESSAGE comes on its own AMQP connection: before or after the SEND's RECEIPT
    messages = [f for f in got if f[0] == "MESSAGE"] or member.frames_until(("MESSAGE",))
    assert messages[-1][2] == b"still"  # the group goes on


def test_a_virtual_host_too_long_for_amqp_is_refused_without_a_login(start_adapter: Any) -> None:
    adapter = start_adapter()
    sock = socket.create_connection(("127.0.0.1", adapter.port), timeout=5)
    RawSession.opened.append(sock)
    sock.sendall(b"CONNECT\naccept-version:1.2\nhost:" + b"v" * 300 + b"\nlogin:guest\npasscode:guest\n\n\0")
    frames, _ = read_frames(sock, timeout=5, count=1)
    command, headers, body = frame_headers(frames[0])
    assert (command, headers.get("message")) == ("ERROR", "Bad CONNECT"), (command, headers, body)
    assert body.startswith(b"Virtual host 'vvv") and body.endswith(b"' access denied")


@pytest.mark.parametrize("multiplexing", [False, True], ids=["own-connection", "multiplexed"])
def test_a_nack_of_a_stream_message_ends_only_its_session(
    start_adapter: Any, broker: BrokerProbe, multiplexing: bool
) -> None:
    """RabbitMQ answers basic.nack on a stream with a connection error (540): the session
    answers the NACK itself with that ERROR, so a shared connection's other sessions go on."""
    adapter = mux_adapter(start_adapter) if multiplexing else start_adapter()
    stream = unique("iso-stream")
    broker.declare_queue(stream, durable=True, arguments={"x-queue-type": "stream"})
    bystander = Bystander(adapter, broker)
    session = RawSession(adapter.port)
    got = session.send(
        f"SUBSCRIBE\nid:s\ndestination:/amq/queue/{stream}\nack:client\nprefetch-count:10\n"
        "x-stream-offset:first\nreceipt:r\n\n"
    )
    assert got[-1][0] == "RECEIPT", got
    broker.publish("", stream, b"streamed")
    message = [f for f in session.frames_until(("MESSAGE",), timeout=10) if f[0] == "MESSAGE"][-1]
    got = session.send(f"NACK\nid:{message[1]['ack']}\nreceipt:n\n\n")
    command, headers, body = got[-1]
    assert (command, headers["message"]) == ("ERROR", "not_implemented"), got
    assert b"not supported by stream queues" in body
    bystander.served()


@pytest.mark.parametrize("earlier_prefetch", [False, True], ids=["its-own-prefetch", "an-earlier-one"])
def test_an_auto_ack_subscription_with_a_prefetch_to_a_stream_ends_only_its_session(
    start_adapter: Any, broker: BrokerProbe, earlier_prefetch: bool
) -> None:
    """A no-ack consume of a stream with a prefetch in effect is a connection error (540); the
    session lifts the prefetch around an auto-ack consume, so the broker answers with a channel
    error (406) and the shared connection's other sessions go on."""
    adapter = mux_adapter(start_adapter)
    stream = unique("iso-stream")
    broker.declare_queue(stream, durable=True, arguments={"x-queue-type": "stream"})
    bystander = Bystander(adapter, broker)
    session = RawSession(adapter.port)
    if earlier_prefetch:
        plain = unique("iso-q")
        broker.track_queue(plain)
        got = session.send(
            f"SUBSCRIBE\nid:p\ndestination:/queue/{plain}\nack:client\nprefetch-count:5\nreceipt:p\n\n"
        )
        assert got[-1][0] == "RECEIPT", got
        frame = f"SUBSCRIBE\nid:s\ndestination:/amq/queue/{stream}\nack:auto\nreceipt:r\n\n"
    else:
        frame = (
            f"SUBSCRIBE\nid:s\ndestination:/amq/queue/{stream}\nack:auto\nprefetch-count:10\nreceipt:r\n\n"
        )
    got = session.send(frame)
    assert got[-1][0] == "ERROR" and got[-1][1]["message"] == "precondition_failed", got
    bystander.served()
