"""adapter.amqp_sessions_per_connection against the real broker: concurrent sessions of one user
share AMQP connections (seen as this process's sockets to 5672, and by the management API), a
channel error ends one session only, the loss of the shared connection reaches every session on
it, a wrong passcode is refused by the broker, and a client that floods or never reads does not
stall its neighbours on the same connection.  Users other than guest are throwaway users the
probe creates and deletes."""

from __future__ import annotations

import logging
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import pytest

from adapter.mapping.profile import BROWSE_LIMIT
from tests.amqp_proxy import ProxyThread, ServerVersion
from tests.integration.test_shutdown_at_scale import SlowClose, SwallowClose
from tests.support import (
    AdapterProcess,
    BrokerProbe,
    RawSession,
    amqp_client_ports,
    unique,
    wait_until,
)

PER_CONNECTION = 4


def mux_adapter(start_adapter: Callable[..., AdapterProcess], **settings: Any) -> AdapterProcess:
    return start_adapter(amqp_sessions_per_connection=PER_CONNECTION, **settings)


def broker_connections(broker: BrokerProbe, ports: set[int]) -> list[dict[str, Any]]:
    """The management API's view of the AMQP connections from these local ports."""
    return [c for c in broker.management("/api/connections") if c.get("peer_port") in ports]


def test_concurrent_sessions_share_connections(start_adapter: Any, broker: BrokerProbe) -> None:
    adapter = mux_adapter(start_adapter)
    before = amqp_client_ports()
    sessions = [RawSession(adapter.port) for _ in range(2 * PER_CONNECTION)]
    assert all(s.command == "CONNECTED" for s in sessions)
    queue = unique("mux")
    broker.track_queue(queue)
    for s in sessions:  # each opens its channel
        got = s.send(f"SEND\ndestination:/queue/{queue}\nreceipt:r\n\nx")
        assert got[-1][0] == "RECEIPT", got
    ports = amqp_client_ports() - before
    assert len(ports) == 2  # 8 sessions on 2 AMQP connections

    async def counts() -> tuple[int, int, int]:
        mux = adapter.server.context.amqp_mux
        assert mux is not None
        return len(mux.shared), mux.shared.sessions, mux.joined

    assert adapter.run(counts()) == (2, 8, 6)  # two logins, six joins
    # the broker's view: two connections, four channels each
    assert wait_until(
        lambda: sorted(c.get("channels", 0) for c in broker_connections(broker, ports)) == [4, 4], 15
    )
    for s in sessions:
        s.disconnect()
    assert broker.wait_depth(queue, 2 * PER_CONNECTION) == 2 * PER_CONNECTION


def test_a_channel_error_ends_only_its_session(start_adapter: Any, broker: BrokerProbe) -> None:
    adapter = mux_adapter(start_adapter)
    before = amqp_client_ports()
    neighbour = RawSession(adapter.port)
    victim = RawSession(adapter.port)
    queue = unique("mux")
    broker.track_queue(queue)
    neighbour.round_trip(queue)
    # a queue that does not exist: the broker closes the victim's channel (404)
    got = victim.send(f"SUBSCRIBE\nid:1\ndestination:/amq/queue/{unique('absent')}\nreceipt:s\n\n")
    assert got[0][0] == "ERROR" and "not_found" in got[0][1].get("message", ""), got
    assert len(amqp_client_ports() - before) == 1  # the shared connection stays
    neighbour.round_trip(queue)
    again = RawSession(adapter.port)  # and takes new sessions
    other = unique("mux")
    broker.track_queue(other)
    again.round_trip(other)
    assert len(amqp_client_ports() - before) == 1
    neighbour.disconnect()


def test_closing_the_shared_connection_reaches_every_session(start_adapter: Any, broker: BrokerProbe) -> None:
    adapter = mux_adapter(start_adapter)
    before = amqp_client_ports()
    sessions = [RawSession(adapter.port) for _ in range(3)]
    queue = unique("mux")
    broker.track_queue(queue)
    for s in sessions:
        assert s.send(f"SEND\ndestination:/queue/{queue}\nreceipt:r\n\nx")[-1][0] == "RECEIPT"
    ports = amqp_client_ports() - before
    assert len(ports) == 1
    assert wait_until(lambda: len(broker_connections(broker, ports)) == 1, 15)
    name = broker_connections(broker, ports)[0]["name"]
    broker.management(f"/api/connections/{urllib.parse.quote(name, safe='')}", method="DELETE")
    for s in sessions:
        got = s.frames_until(("ERROR",))
        error = [frame for frame in got if frame[0] == "ERROR"][0]
        assert error[1]["message"] == "connection_forced", error
    # each reconnects on its own
    fresh = RawSession(adapter.port)
    assert fresh.command == "CONNECTED"
    other = unique("mux")
    broker.track_queue(other)
    fresh.round_trip(other)
    fresh.disconnect()


def test_a_message_larger_than_one_read_reaches_its_subscriber(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    """A delivery whose last frames come in a read without any method of its channel (here a
    body of 1 MiB: the adapter reads at most 256 KiB at a time, so the read that completes the
    delivery holds body frames only; the same happens to a small message whose frames TCP
    splits) is written to its client in that read, not held until the next method of its
    channel.  The subscriber's channel sees nothing else: the publisher is another session, its
    SEND without a receipt (no confirm)."""
    adapter = mux_adapter(start_adapter)
    before = amqp_client_ports()
    subscriber, publisher = RawSession(adapter.port), RawSession(adapter.port)
    queue = unique("mux")
    broker.track_queue(queue)
    got = subscriber.send(f"SUBSCRIBE\nid:big\ndestination:/queue/{queue}\nreceipt:s\n\n")
    assert got[-1][0] == "RECEIPT", got
    body = b"b" * (1024 * 1024)
    publisher.sock.sendall(
        f"SEND\ndestination:/queue/{queue}\ncontent-length:{len(body)}\n\n".encode() + body + b"\0"
    )
    assert len(amqp_client_ports() - before) == 1  # both on one shared connection
    got = subscriber.frames_until(("MESSAGE", "ERROR"))
    assert got and got[-1][0] == "MESSAGE" and got[-1][2] == body, [frame[:2] for frame in got]
    subscriber.disconnect()
    publisher.disconnect()


def test_a_wrong_passcode_is_refused_by_the_broker(start_adapter: Any, broker: BrokerProbe) -> None:
    adapter = mux_adapter(start_adapter)
    password = unique("pw")
    user = broker.create_user(password, "muxuser")
    first = RawSession(adapter.port, user, password)
    assert first.command == "CONNECTED"
    intruder = RawSession(adapter.port, user, "not-" + password)
    assert intruder.command == "ERROR", (intruder.command, intruder.headers)
    assert intruder.headers.get("message") == "Bad CONNECT"
    second = RawSession(adapter.port, user, password)  # the right one joins
    assert second.command == "CONNECTED"
    first.disconnect()
    second.disconnect()


def test_a_client_that_never_reads_does_not_stall_its_neighbours(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    adapter = mux_adapter(start_adapter, amqp_shared_max_paused_bytes=256 * 1024)
    before = amqp_client_ports()
    bystander = RawSession(adapter.port)
    hostile = RawSession(adapter.port)
    flood = unique("mux-flood")
    broker.declare_queue(flood, durable=True)  # as a SUBSCRIBE to /queue/ declares it
    body = b"x" * 16384

    async def fill(channel: Any) -> None:  # 32 MB: far more than the client's socket and the bound
        import aio_pika

        for _ in range(2000):
            await channel.default_exchange.publish(aio_pika.Message(body), routing_key=flood)

    broker.run(fill)
    assert broker.wait_depth(flood, 2000, timeout=20) == 2000
    hostile.sock.sendall(f"SUBSCRIBE\nid:1\ndestination:/queue/{flood}\n\n\0".encode())
    # and it never reads again; meanwhile its neighbour on the same AMQP connection is served
    queue = unique("mux")
    broker.track_queue(queue)
    for _ in range(5):
        bystander.round_trip(queue)
    assert len(amqp_client_ports() - before) == 1

    # the hostile session ends (its unread messages requeue), its neighbour goes on
    def hostile_ended() -> bool:
        return adapter.connection_count == 1

    assert wait_until(hostile_ended, 20)
    # what the hostile client finds when it reads at last: an ERROR naming the bound
    hostile.sock.settimeout(10)
    tail = b""
    try:
        while chunk := hostile.sock.recv(1 << 20):
            tail = (tail + chunk)[-4096:]
    except OSError:
        pass  # reset after the adapter gave up lingering: the bound is in the log then
    if tail:
        assert b"ERROR" in tail and b"adapter.amqp_shared_max_paused_bytes" in tail, tail[-600:]
    bystander.round_trip(queue)
    assert wait_until(lambda: broker.idle_depth(flood) > 0, 10)
    bystander.disconnect()


def test_a_subscribe_flood_does_not_stall_its_neighbours(start_adapter: Any, broker: BrokerProbe) -> None:
    adapter = mux_adapter(start_adapter)
    bystander = RawSession(adapter.port)
    hostile = RawSession(adapter.port)
    queue = unique("mux")
    broker.track_queue(queue)
    frames = b"".join(
        f"SUBSCRIBE\nid:{n}\ndestination:/topic/{unique('flood')}\n\n\0".encode() for n in range(500)
    )
    hostile.sock.sendall(frames)
    for _ in range(3):
        bystander.round_trip(queue)
    bystander.disconnect()


def _queue_stays_until_the_connection_s_last_session(
    adapter: AdapterProcess, broker: BrokerProbe, before: set[int], queue: str, frame: str
) -> None:
    """``frame`` (with ``receipt:s``) leaves ``queue`` on the shared connection of its session
    and a neighbour's: when the session leaves, the queue stays for the neighbour, the retired
    connection takes no new session (a login of its own), and the queue goes with the
    neighbour, the connection's last session."""
    owner = RawSession(adapter.port)
    neighbour = RawSession(adapter.port)
    broker.track_queue(queue)
    got = owner.send(frame)
    assert got[-1][0] == "RECEIPT", got
    owner.disconnect()
    assert broker.queue_exists(queue)  # the connection is still open for the neighbour
    late = RawSession(adapter.port)  # joins no retired connection: a login of its own
    assert late.command == "CONNECTED"
    plain = unique("mux")
    broker.track_queue(plain)
    late.round_trip(plain)
    assert len(amqp_client_ports() - before) == 2
    neighbour.disconnect()
    assert broker.wait_gone(queue)  # with the connection's last session
    late.disconnect()


def test_an_exclusive_queue_lives_until_the_last_session_on_its_connection_ends(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    """An exclusive queue belongs to the AMQP connection: with multiplexing it outlives the
    session that declared it while a neighbour keeps the connection, which then takes no new
    session and closes with its last one (docs/compatibility.md)."""
    adapter = mux_adapter(start_adapter)
    before = amqp_client_ports()
    queue = unique("mux-exclusive")
    frame = f"SUBSCRIBE\nid:1\ndestination:/queue/{queue}\nexclusive:true\nreceipt:s\n\n"
    _queue_stays_until_the_connection_s_last_session(adapter, broker, before, queue, frame)


def test_an_exclusive_auto_delete_queue_never_consumed_goes_with_the_connection(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    """A SEND with durable:false declares an exclusive auto-delete queue and consumes nothing:
    the broker deletes an auto-delete queue only when a consumer of it goes, so the queue lives
    as long as the connection.  Alone on its connection, the session takes it along when it
    leaves, as without multiplexing; with a neighbour, the connection takes no new session and
    the queue goes with the last one (docs/configuration.md, "Queues that belong to the
    connection")."""
    adapter = mux_adapter(start_adapter)
    before = amqp_client_ports()
    alone = RawSession(adapter.port)
    queue = unique("mux-unconsumed")
    broker.track_queue(queue)
    got = alone.send(f"SEND\ndestination:/queue/{queue}\ndurable:false\nreceipt:s\n\nx")
    assert got[-1][0] == "RECEIPT", got
    assert broker.queue_exists(queue)
    alone.disconnect()
    assert broker.wait_gone(queue)  # its connection closed with it: not kept idle
    other = unique("mux-unconsumed")
    frame = f"SEND\ndestination:/queue/{other}\npersistent:false\nreceipt:s\n\nx"
    _queue_stays_until_the_connection_s_last_session(adapter, broker, before, other, frame)


def test_a_consumed_temporary_queue_leaves_the_connection_open_to_new_sessions(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    """The temp-queue of a reply-to (exclusive, auto-delete, named by the broker) is consumed by
    its session, so it goes when that consumer goes: the connection stays shared."""
    adapter = mux_adapter(start_adapter)
    before = amqp_client_ports()
    first = RawSession(adapter.port)
    queue = unique("mux")
    broker.track_queue(queue)
    got = first.send(f"SEND\ndestination:/queue/{queue}\nreply-to:/temp-queue/t\nreceipt:s\n\nx")
    assert got[-1][0] == "RECEIPT", got
    first.disconnect()
    second = RawSession(adapter.port)  # joins the idle connection: no new login
    second.round_trip(queue)
    assert joined(adapter) == 1
    assert len(amqp_client_ports() - before) == 1
    second.disconnect()


def joined(adapter: AdapterProcess) -> int:
    async def count() -> int:
        assert adapter.server.context.amqp_mux is not None
        return adapter.server.context.amqp_mux.joined

    return int(adapter.run(count()))


def broker_info(adapter: AdapterProcess) -> list[tuple[str, str, str, float]]:
    """The stomp_adapter_broker_info series as a scrape renders them: node, version, rules, value."""
    from prometheus_client.parser import text_string_to_metric_families

    from adapter.server.metrics import build_registry, render

    async def scrape() -> bytes:
        return render(build_registry(adapter.server.context))

    text = adapter.run(scrape()).decode()
    [family] = [f for f in text_string_to_metric_families(text) if f.name == "stomp_adapter_broker_info"]
    return sorted((s.labels["node"], s.labels["version"], s.labels["rules"], s.value) for s in family.samples)


def test_broker_info_metric_names_the_node_of_each_shared_connection(
    amqp_url: str, start_adapter: Any, broker: BrokerProbe
) -> None:
    """Two nodes (proxies announcing 3.12.0 and 4.3.0): a CONNECT that joins a shared connection
    stays on that connection's node and reaches no other, so the metric names only the nodes a
    fresh login reached; the next fresh login (another user) goes to the next node in the round
    robin, and the metric then names both."""
    with (
        ProxyThread(amqp_url, [ServerVersion("3.12.0")]) as old,
        ProxyThread(amqp_url, [ServerVersion("4.3.0")]) as new,
    ):
        adapter = mux_adapter(start_adapter, amqp_url=f"{old.url},{new.url}")
        old_node = (f"amqp://127.0.0.1:{old.proxy.port}", "3.12.0", "3.11-3.13", 1.0)
        new_node = (f"amqp://127.0.0.1:{new.proxy.port}", "4.3.0", "4.x", 1.0)
        first = RawSession(adapter.port)
        second = RawSession(adapter.port)
        assert (first.command, second.command) == ("CONNECTED", "CONNECTED")
        assert joined(adapter) == 1
        assert broker_info(adapter) == [old_node]
        user = broker.create_user("pw", "mux")
        other = RawSession(adapter.port, user, "pw")  # no connection of this user: a fresh login
        assert other.command == "CONNECTED" and joined(adapter) == 1
        assert broker_info(adapter) == sorted([old_node, new_node])
        for session in (first, second, other):  # each is served on its node
            queue = unique("mux-nodes")
            broker.track_queue(queue)
            session.round_trip(queue)
            session.disconnect()
        adapter.stop()  # before the proxies go


def test_revoked_write_permission_applies_to_a_session_that_joins(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    """RabbitMQ checks permissions per channel, and every session has its own: a write
    permission revoked while a shared connection is open applies to the next session on it."""
    adapter = mux_adapter(start_adapter)
    user = broker.create_user("pw", "mux")
    queue = unique("mux")
    broker.track_queue(queue)
    first = RawSession(adapter.port, user, "pw")
    assert first.send(f"SEND\ndestination:/queue/{queue}\nreceipt:s1\n\nx")[-1][0] == "RECEIPT"
    broker.management(
        f"/api/permissions/%2F/{urllib.parse.quote(user, safe='')}",
        "PUT",
        {"configure": ".*", "write": "^$", "read": ".*"},
    )
    second = RawSession(adapter.port, user, "pw")
    assert second.command == "CONNECTED" and joined(adapter) == 1
    command, headers, body = second.send(f"SEND\ndestination:/queue/{queue}\nreceipt:s2\n\ny")[-1]
    assert (command, headers["message"]) == ("ERROR", "access_refused") and b"ACCESS_REFUSED" in body


def test_revoked_vhost_access_still_connects_a_session_that_joins_and_refuses_its_first_resource(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    """The trade-off docs/configuration.md states: vhost access is checked when a connection
    opens, so a session that joins gets CONNECTED and its first frame on a resource the ERROR."""
    adapter = mux_adapter(start_adapter)
    user = broker.create_user("pw", "mux")
    queue = unique("mux")
    broker.track_queue(queue)
    first = RawSession(adapter.port, user, "pw")
    assert first.send(f"SEND\ndestination:/queue/{queue}\nreceipt:s1\n\nx")[-1][0] == "RECEIPT"
    broker.management(f"/api/permissions/%2F/{urllib.parse.quote(user, safe='')}", "DELETE")
    second = RawSession(adapter.port, user, "pw")
    assert second.command == "CONNECTED" and joined(adapter) == 1
    command, headers, _ = second.send(f"SEND\ndestination:/queue/{queue}\nreceipt:s2\n\ny")[-1]
    assert (command, headers["message"]) == ("ERROR", "access_refused")


def test_a_new_password_accepted_by_the_broker_retires_the_connections_of_the_old_one(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    adapter = mux_adapter(start_adapter)
    user = broker.create_user("old-secret", "mux")
    old = RawSession(adapter.port, user, "old-secret")
    assert old.command == "CONNECTED"
    broker.set_password(user, "new-secret")
    new = RawSession(adapter.port, user, "new-secret")  # matches no shared connection: a fresh login
    assert new.command == "CONNECTED" and joined(adapter) == 0
    # the old password's connection takes no new session: the broker decides, and refuses
    refused = RawSession(adapter.port, user, "old-secret")
    assert (refused.command, refused.body) == ("ERROR", f"Access refused for user '{user}'\n".encode())
    old.disconnect()
    new.disconnect()


# ---------------------------------------------------------------- hard errors one session can cause
# AMQP "hard" errors (503 command_invalid, 540 not_implemented ...) close the whole connection,
# not the channel: on a shared connection one client's frame that provokes one must not end its
# neighbours' sessions.


def served_neighbour(adapter: AdapterProcess, broker: BrokerProbe) -> tuple[RawSession, str]:
    """A session a message round trip on its own queue (returned) has served, whose AMQP
    connection the next session of the same user joins."""
    neighbour = RawSession(adapter.port)
    queue = unique("mux")
    broker.track_queue(queue)
    neighbour.round_trip(queue)
    return neighbour, queue


def over_frame_max_ends_only_its_session(
    adapter: AdapterProcess, broker: BrokerProbe, frame: Callable[[str], str]
) -> None:
    """``frame(queue)``, whose AMQP frame would be over the broker's frame_max, gets its session
    an ERROR ``Processing error`` naming frame_max; the session sharing its connection stays
    served."""
    neighbour, queue = served_neighbour(adapter, broker)
    hostile = RawSession(adapter.port)
    target = unique("mux")
    broker.track_queue(target)
    got = hostile.send(frame(target))
    assert got[-1][0] == "ERROR" and got[-1][1]["message"] == "Processing error", got
    assert b"frame_max" in got[-1][2]
    neighbour.round_trip(queue)  # still served
    neighbour.disconnect()


def test_a_send_whose_headers_exceed_the_amqp_frame_ends_only_its_session(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    """The broker negotiates frame_max (128 KiB); STOMP allows 100 headers of 100 KiB each.  A
    content header frame over frame_max is a connection error (501 frame_error)."""
    big = "h" * 90_000
    over_frame_max_ends_only_its_session(
        mux_adapter(start_adapter),
        broker,
        lambda target: f"SEND\ndestination:/queue/{target}\nx-a:{big}\nx-b:{big}\nreceipt:r\n\nx",
    )


def test_a_subscribe_whose_queue_arguments_exceed_the_amqp_frame_ends_only_its_session(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    """queue.declare's arguments come from SUBSCRIBE headers: a method frame over frame_max is
    a connection error (501 frame_error) as a content header is."""
    big = "k" * 90_000
    over_frame_max_ends_only_its_session(
        mux_adapter(start_adapter),
        broker,
        lambda target: (
            f"SUBSCRIBE\nid:1\ndestination:/queue/{target}\nx-dead-letter-exchange:{big}\n"
            f"x-dead-letter-routing-key:{big}\nreceipt:s\n\n"
        ),
    )


def test_an_auto_ack_subscription_to_a_stream_ends_only_its_session(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    adapter = mux_adapter(start_adapter)
    stream = unique("stream")
    broker.declare_queue(stream, durable=True, arguments={"x-queue-type": "stream"})
    neighbour, queue = served_neighbour(adapter, broker)
    hostile = RawSession(adapter.port)
    got = hostile.send(f"SUBSCRIBE\nid:1\ndestination:/amq/queue/{stream}\nack:auto\nreceipt:s\n\n")
    assert got[-1][0] in ("ERROR", "RECEIPT"), got
    neighbour.round_trip(queue)  # still served
    neighbour.disconnect()


def test_an_undecodable_delivery_ends_only_the_session_it_was_for(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    """An AMQP publisher can put in a message what RabbitMQ passes on unread and the adapter
    refuses to decode (field tables nested deeper than it reads): that ends the session the
    delivery was for, as it ends a client's own connection without multiplexing, not the
    sessions that share its AMQP connection."""
    adapter = mux_adapter(start_adapter)
    neighbour, queue = served_neighbour(adapter, broker)
    victim = RawSession(adapter.port)
    poisoned = unique("poison")
    broker.track_queue(poisoned)
    got = victim.send(f"SUBSCRIBE\nid:1\ndestination:/queue/{poisoned}\nreceipt:s\n\n")
    assert got[-1][0] == "RECEIPT", got
    nested: dict[str, Any] = {"leaf": "x"}
    for _ in range(120):
        nested = {"n": nested}
    broker.publish("", poisoned, b"poison", headers={"deep": nested})
    got = victim.frames_until(("ERROR",))
    assert got and got[-1][0] == "ERROR", got
    neighbour.round_trip(queue)
    neighbour.disconnect()


# ------------------------------------------- requests the broker answers with a connection error
# Two requests a client can make on purpose are answered by RabbitMQ with a connection error, not
# a channel error: exchange.declare of a type it has no plugin for (503 command_invalid) and
# basic.get on a stream (540 not_implemented).  They run on a probe connection of the session's
# own (adapter/amqp/probe.py), so only the requester gets its ERROR, the one it gets without
# multiplexing, and every other session on the shared connection stays served.


class Pair:
    """A bystander and a requester of the same user on one shared AMQP connection, both served
    (each has sent and received a message on its own channel)."""

    def __init__(self, adapter: AdapterProcess, broker: BrokerProbe) -> None:
        self.before = amqp_client_ports()
        self.bystander = RawSession(adapter.port)
        self.requester = RawSession(adapter.port)
        self.queue, own = unique("mux-by"), unique("mux-req")
        broker.track_queue(self.queue, own)
        self.bystander.round_trip(self.queue)
        self.requester.round_trip(own)
        self.shared = amqp_client_ports() - self.before
        assert len(self.shared) == 1, self.shared

    def bystander_served(self) -> None:
        self.bystander.round_trip(self.queue)
        assert self.shared <= amqp_client_ports()  # on the very connection the two shared

    def only_the_shared_connection_left(self) -> bool:
        return wait_until(lambda: amqp_client_ports() - self.before == self.shared, 10)


def error_alone(adapter: AdapterProcess, frame: str) -> tuple[str, bytes]:
    """The ERROR (message header, body) ``frame`` gets from an adapter without multiplexing."""
    session = RawSession(adapter.port)
    session.sock.sendall(frame.encode() + b"\0")
    got = session.frames_until(("ERROR",))
    assert got and got[-1][0] == "ERROR", got
    return got[-1][1]["message"], got[-1][2]


def probes_opened(adapter: AdapterProcess) -> int:
    async def count() -> int:
        mux = adapter.server.context.amqp_mux
        assert mux is not None and mux.probes is not None
        return mux.probes.opened

    return int(adapter.run(count()))


def test_declaring_an_exchange_type_the_broker_does_not_have_ends_only_its_session(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    adapter = mux_adapter(start_adapter, declare_exchanges=True)
    pair = Pair(adapter, broker)
    name = unique("mux-decl")
    broker.track_exchange(name)
    frame = (
        f"SEND\ndestination:/exchange/{name}/k\ndeclare-exchange:true\nexchange-type:x-no-such-type\n"
        "receipt:r\n\nx"
    )
    got = pair.requester.send(frame)
    command, headers, body = got[-1]
    assert (command, headers.get("message")) == ("ERROR", "command_invalid"), got
    assert b"x-no-such-type" in body
    pair.bystander_served()
    assert broker.management(f"/api/exchanges/%2F/{name}") is None
    # exactly the ERROR a session with a connection of its own gets for the same frame
    alone = start_adapter(declare_exchanges=True, amqp_sessions_per_connection=1)
    assert (headers["message"], body) == error_alone(alone, frame)
    assert pair.only_the_shared_connection_left()  # the probe is gone
    pair.bystander_served()
    pair.bystander.disconnect()


def test_declaring_a_built_in_exchange_type_stays_on_the_shared_connection(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    """A built-in type cannot draw a connection error: it is declared on the session's own
    channel, without a probe, and the SEND is published after it."""
    adapter = mux_adapter(start_adapter, declare_exchanges=True)
    pair = Pair(adapter, broker)
    name, bound = unique("mux-decl"), unique("mux-bound")
    broker.track_exchange(name)
    declare = f"SEND\ndestination:/exchange/{name}/k\ndeclare-exchange:true\nexchange-type:direct\n"
    got = pair.requester.send(declare + "receipt:r1\n\nx")
    assert got[-1][0] == "RECEIPT", got
    assert broker.management(f"/api/exchanges/%2F/{name}")["type"] == "direct"
    broker.declare_queue(bound)
    broker.bind(bound, name, "k")
    got = pair.requester.send(declare + "receipt:r2\n\ny")
    assert got[-1][0] == "RECEIPT", got
    assert broker.wait_depth(bound, 1) == 1
    assert probes_opened(adapter) == 0
    pair.bystander_served()
    pair.requester.disconnect()
    pair.bystander.disconnect()


def test_browsing_a_stream_ends_only_its_session(start_adapter: Any, broker: BrokerProbe) -> None:
    adapter = mux_adapter(start_adapter, profile="activemq")
    stream = unique("mux-stream")
    broker.declare_queue(stream, durable=True, arguments={"x-queue-type": "stream"})
    broker.publish("", stream, b"in the stream")
    pair = Pair(adapter, broker)
    frame = f"SUBSCRIBE\nid:b\ndestination:/amq/queue/{stream}\nbrowser:true\nreceipt:s\n\n"
    pair.requester.sock.sendall(frame.encode() + b"\0")
    got = pair.requester.frames_until(("ERROR",))
    assert got and got[-1][0] == "ERROR" and got[-1][1].get("message") == "not_implemented", got
    pair.bystander_served()
    # exactly the ERROR a session with a connection of its own gets for the same frame
    alone = start_adapter(profile="activemq", amqp_sessions_per_connection=1)
    assert (got[-1][1]["message"], got[-1][2]) == error_alone(alone, frame)
    assert pair.only_the_shared_connection_left()  # the probe is gone
    pair.bystander_served()
    pair.bystander.disconnect()


def test_a_browse_runs_on_a_probe_and_leaves_every_message_in_order(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    """A browse of a plain queue with multiplexing: the queue's messages, then browser:end; the
    probe connection closes after the browse, every message is still on the queue, in order,
    and both sessions go on."""
    adapter = mux_adapter(start_adapter, profile="activemq")
    pair = Pair(adapter, broker)
    browsed = unique("mux-browse")
    broker.track_queue(browsed)
    for n in range(3):  # as the adapter declares a /queue/
        got = pair.requester.send(f"SEND\ndestination:/queue/{browsed}\nreceipt:p{n}\n\nm{n}")
        assert got[-1][0] == "RECEIPT", got
    got = pair.requester.send(f"SUBSCRIBE\nid:b\ndestination:/queue/{browsed}\nbrowser:true\nreceipt:s\n\n")
    assert got[-1][0] == "RECEIPT", got
    bodies = []
    while True:
        frames = pair.requester.frames_until(("MESSAGE",))
        assert frames, "closed during the browse"
        _command, headers, body = frames[-1]
        if headers.get("browser") == "end":
            break
        bodies.append(body)
    assert bodies == [b"m0", b"m1", b"m2"]
    assert probes_opened(adapter) == 1
    assert pair.only_the_shared_connection_left()  # the probe closed, handing them back
    assert broker.wait_depth(browsed, 3) == 3
    again = unique("mux-req")
    broker.track_queue(again)
    pair.requester.round_trip(again)  # the requester is still served
    pair.bystander_served()
    got = pair.bystander.send(f"SUBSCRIBE\nid:r\ndestination:/queue/{browsed}\nreceipt:r\n\n")
    assert got[-1][0] == "RECEIPT", got
    seen = [f[2] for f in got if f[0] == "MESSAGE"]
    while len(seen) < 3:
        seen += [f[2] for f in pair.bystander.frames_until(("MESSAGE",)) if f[0] == "MESSAGE"]
    assert seen == [b"m0", b"m1", b"m2"]
    pair.requester.disconnect()
    pair.bystander.disconnect()


def browse_then_consume(session: RawSession, broker: BrokerProbe) -> list[int]:
    """A queue longer than a browse takes (BROWSE_LIMIT), a browse of it, and a consuming
    SUBSCRIBE to it in the same write: the order in which the consumer gets the messages."""
    queue = unique("browse-then-consume")
    broker.track_queue(queue)
    total = BROWSE_LIMIT + 20
    session.sock.sendall(
        b"".join(f"SEND\ndestination:/queue/{queue}\n\nm{n}\0".encode() for n in range(total - 1))
    )
    got = session.send(f"SEND\ndestination:/queue/{queue}\nreceipt:p\n\nm{total - 1}")
    assert got[-1][0] == "RECEIPT", got
    assert broker.wait_depth(queue, total) == total
    session.sock.sendall(
        f"SUBSCRIBE\nid:b\ndestination:/queue/{queue}\nbrowser:true\n\n\0"
        f"SUBSCRIBE\nid:c\ndestination:/queue/{queue}\nreceipt:c\n\n\0".encode()
    )
    consumed: list[int] = []
    browsed = 0
    deadline = time.monotonic() + 20
    while len(consumed) < total:
        assert time.monotonic() < deadline, (browsed, len(consumed))
        for command, headers, body in session.frames_until(("MESSAGE",)):
            if command == "MESSAGE" and headers.get("subscription") == "c":
                consumed.append(int(body[1:]))
            elif command == "MESSAGE" and headers.get("browser") != "end":
                browsed += 1
    assert browsed == BROWSE_LIMIT
    return consumed


def test_a_subscribe_right_after_a_browse_gets_the_messages_in_order_without_multiplexing(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    """The reference: the browse's nacks go on the session's channel before its basic.consume."""
    adapter = start_adapter(profile="activemq")
    session = RawSession(adapter.port)
    consumed = browse_then_consume(session, broker)
    assert consumed == sorted(consumed), consumed[:5]
    session.disconnect()


def test_a_subscribe_right_after_a_browse_gets_the_messages_in_order(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    """The same with multiplexing: the browse ran on a probe, whose nacks went out a loop turn
    after the browse ended, on another connection, while the consume went on the shared one;
    the consumer got some of the messages the browse had not taken before the browsed ones
    (4 runs of 8 here before the fix) (#27)."""
    adapter = mux_adapter(start_adapter, profile="activemq")
    pair = Pair(adapter, broker)
    consumed = browse_then_consume(pair.requester, broker)
    assert consumed == sorted(consumed), consumed[:5]
    pair.bystander_served()
    pair.requester.disconnect()
    pair.bystander.disconnect()


# ---------------------------------------------------------------- shutdown
# tests/integration/test_shutdown_at_scale.py with an AMQP connection per session; here the
# sessions close their channels and each shared connection closes with its last one.


def test_at_the_shutdown_deadline_unanswered_shared_connection_closes_are_dropped(
    amqp_url: str, start_adapter: Any, broker: BrokerProbe, caplog: pytest.LogCaptureFixture
) -> None:
    hook = SwallowClose()
    with ProxyThread(amqp_url, [hook]) as proxy:
        adapter = mux_adapter(start_adapter, amqp_url=proxy.url, shutdown_timeout=1)
        queue = unique("mux-requeued")
        broker.declare_queue(queue, durable=True)
        broker.publish("", queue, b"held")
        holder = RawSession(adapter.port)
        got = holder.send(f"SUBSCRIBE\nid:s\ndestination:/queue/{queue}\nack:client\nreceipt:r\n\n")
        while not any(frame[0] == "MESSAGE" and frame[2] == b"held" for frame in got):
            got = holder.frames_until(("MESSAGE",))  # delivered, never acknowledged
            assert got, "closed before the message came"
        subscribers = [RawSession(adapter.port) for _ in range(5)]
        for number, session in enumerate(subscribers):
            got = session.send(f"SUBSCRIBE\nid:t{number}\ndestination:/topic/{unique('news')}\nreceipt:r\n\n")
            assert got[-1][0] == "RECEIPT", got
        with caplog.at_level(logging.INFO, "adapter.server"):
            adapter.stop()  # returns: the unanswered closes do not hold the shutdown
        for session in [holder, *subscribers]:
            got = session.frames_until(("ERROR",))
            assert [f[1]["message"] for f in got if f[0] == "ERROR"] == ["Server shutdown"], got
        assert "shutting down: closing 6 connection(s)" in caplog.text
        assert hook.swallowed == 2  # 6 sessions on 2 shared connections, each asked to close once
        # the holder's channel close requeued what it held, and the broker cleans up the rest
        assert broker.wait_depth(queue, 1, timeout=15) == 1


def test_at_shutdown_every_shared_connection_closes_cleanly(amqp_url: str, start_adapter: Any) -> None:
    hook = SlowClose()
    with ProxyThread(amqp_url, [hook]) as proxy:
        adapter = mux_adapter(start_adapter, amqp_url=proxy.url, shutdown_timeout=30)
        sessions = [RawSession(adapter.port) for _ in range(5 * PER_CONNECTION)]
        for number, session in enumerate(sessions):
            got = session.send(
                f"SUBSCRIBE\nid:t{number}\ndestination:/topic/{unique('turns')}\nreceipt:r\n\n"
            )
            assert got[-1][0] == "RECEIPT", got
        adapter.stop()
        for session in sessions:
            got = session.frames_until(("ERROR",))
            assert [f[1]["message"] for f in got if f[0] == "ERROR"] == ["Server shutdown"], got
        assert hook.closed == 5  # each shared connection closed cleanly (close-ok) in time
