"""adapter.amqp_connection_reuse against the real broker: which CONNECT gets a pooled AMQP
connection and which one must not, what a session leaves behind, and when pooled connections
close.  The adapter runs in-process, so its AMQP connections are seen as this process's sockets
to 5672 (tests.support.amqp_client_ports); the broker's own view comes from aio-pika and the
management API.  Users other than guest are throwaway users the probe creates and deletes."""

from __future__ import annotations

import socket
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import pytest

from tests.support import (
    AdapterProcess,
    BrokerProbe,
    RawSession,
    amqp_client_ports,
    read_frames,
    unique,
    wait_until,
)

IDLE_SECONDS = 1.5
# the reuse pool itself: with --amqp-sessions-per-connection the shared connections replace it
# (tests/integration/test_multiplexing.py asserts their trade-offs)
pytestmark = pytest.mark.own_amqp_connection


def reuse_adapter(start_adapter: Callable[..., AdapterProcess]) -> AdapterProcess:
    return start_adapter(amqp_connection_reuse=True, amqp_connection_idle_seconds=IDLE_SECONDS)


def pooled(adapter: AdapterProcess) -> int:
    async def count() -> int:
        assert adapter.server.context.amqp_reuse is not None
        return len(adapter.server.context.amqp_reuse.pool)

    return int(adapter.run(count()))


def reused(adapter: AdapterProcess) -> int:
    async def count() -> int:
        assert adapter.server.context.amqp_reuse is not None
        return adapter.server.context.amqp_reuse.reused

    return int(adapter.run(count()))


def scrape(adapter: AdapterProcess) -> str:
    from prometheus_client import generate_latest

    async def text() -> str:
        return generate_latest(adapter.server.registry).decode()

    return str(adapter.run(text()))


def test_a_second_connect_of_the_same_user_reuses_the_amqp_connection(start_adapter: Any) -> None:
    adapter = reuse_adapter(start_adapter)
    before = amqp_client_ports()
    first = RawSession(adapter.port)
    assert first.command == "CONNECTED"
    ports = amqp_client_ports() - before
    assert len(ports) == 1
    first.disconnect()
    assert wait_until(lambda: pooled(adapter) == 1, 5)
    assert amqp_client_ports() - before == ports  # kept open, with no session

    second = RawSession(adapter.port)
    assert second.command == "CONNECTED"
    assert amqp_client_ports() - before == ports  # the same AMQP connection, no new one
    assert reused(adapter) == 1 and pooled(adapter) == 0
    second.disconnect()
    assert wait_until(lambda: pooled(adapter) == 1, 5)
    series = scrape(adapter)
    assert "stomp_adapter_amqp_connections_reused_total 1.0" in series
    assert "stomp_adapter_amqp_connections_pooled 1.0" in series


def test_a_wrong_passcode_on_a_pooled_user_is_refused_as_without_reuse(start_adapter: Any) -> None:
    adapter = reuse_adapter(start_adapter)
    RawSession(adapter.port).disconnect()
    assert wait_until(lambda: pooled(adapter) == 1, 5)
    refused = RawSession(adapter.port, passcode="wrong")
    assert refused.command == "ERROR"
    assert refused.headers["message"] == "Bad CONNECT"
    assert refused.body == b"Access refused for user 'guest'\n"
    assert refused.closed
    assert reused(adapter) == 0
    assert pooled(adapter) == 1  # the broker refused the passcode: guest's connection stays


def test_another_user_with_the_same_passcode_never_gets_the_pooled_connection(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    adapter = reuse_adapter(start_adapter)
    other = broker.create_user("guest", "reuse")  # the same passcode as guest
    before = amqp_client_ports()
    RawSession(adapter.port).disconnect()
    assert wait_until(lambda: pooled(adapter) == 1, 5)
    guest_port = amqp_client_ports() - before
    session = RawSession(adapter.port, login=other, passcode="guest")
    assert session.command == "CONNECTED"
    assert reused(adapter) == 0
    assert len(amqp_client_ports() - before - guest_port) == 1  # a connection of its own
    session.disconnect()


def test_a_reused_connection_starts_clean(start_adapter: Any, broker: BrokerProbe) -> None:
    """The first session's consumer, prefetch and unacknowledged message do not outlive it."""
    adapter = reuse_adapter(start_adapter)
    queue = unique("reuse")
    broker.declare_queue(queue, durable=True)
    broker.publish("", queue, b"one")
    first = RawSession(adapter.port)
    got = first.send(
        f"SUBSCRIBE\nid:s\ndestination:/queue/{queue}\nack:client\nprefetch-count:1\nreceipt:sub\n\n"
    )
    if not any(command == "MESSAGE" for command, _, _ in got):
        got += first.frames_until(("MESSAGE",))
    assert [command for command, _, _ in got].count("MESSAGE") == 1
    first.disconnect()  # the message was never acknowledged
    assert broker.wait_depth(queue, 1) == 1  # requeued: the channel and its consumer are gone
    assert wait_until(lambda: pooled(adapter) == 1, 5)

    broker.publish("", queue, b"two")
    second = RawSession(adapter.port)
    assert reused(adapter) == 1
    got = second.send(f"SUBSCRIBE\nid:s\ndestination:/queue/{queue}\nack:auto\nreceipt:sub\n\n")
    while [command for command, _, _ in got].count("MESSAGE") < 2:
        more = second.frames_until(("MESSAGE",))
        assert more, f"closed before both messages came: {got}"
        got += more
    # no prefetch limit of 1 and no unacknowledged message left from the first session
    assert sorted(body for command, _, body in got if command == "MESSAGE") == [b"one", b"two"]
    second.disconnect()


def test_a_session_with_a_temp_queue_leaves_nothing_and_is_not_pooled(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    adapter = reuse_adapter(start_adapter)
    queue = unique("reuse")
    broker.declare_queue(queue, durable=True)
    before = amqp_client_ports()
    session = RawSession(adapter.port)
    got = session.send(f"SEND\ndestination:/queue/{queue}\nreply-to:/temp-queue/r\nreceipt:s\n\nrequest")
    assert got[-1][0] == "RECEIPT", got
    message = broker.get(queue)
    assert message is not None
    temp_queue = message.properties.reply_to
    assert temp_queue and broker.queue_exists(temp_queue)
    session.disconnect()
    assert broker.wait_gone(temp_queue)
    assert pooled(adapter) == 0
    assert wait_until(lambda: not amqp_client_ports() - before, 5)  # closed, not pooled


def test_a_session_with_a_topic_subscription_leaves_nothing_and_is_not_pooled(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    adapter = reuse_adapter(start_adapter)
    key = unique("reuse")
    before = amqp_client_ports()
    session = RawSession(adapter.port)
    got = session.send(f"SUBSCRIBE\nid:t\ndestination:/topic/{key}\nreceipt:sub\n\n")
    assert got[-1][0] == "RECEIPT", got
    queues = [b["destination"] for b in broker.exchange_bindings("amq.topic") if b["routing_key"] == key]
    assert len(queues) == 1
    session.disconnect()
    assert broker.wait_gone(queues[0])
    assert pooled(adapter) == 0
    assert wait_until(lambda: not amqp_client_ports() - before, 5)


def test_a_session_whose_channel_failed_is_not_pooled(start_adapter: Any) -> None:
    adapter = reuse_adapter(start_adapter)
    before = amqp_client_ports()
    session = RawSession(adapter.port)
    got = session.send(f"SUBSCRIBE\nid:x\ndestination:/amq/queue/{unique('missing')}\nreceipt:sub\n\n")
    assert got[0][0] == "ERROR", got  # the broker closed the channel (404)
    session.sock.close()
    assert wait_until(lambda: not amqp_client_ports() - before, 5)
    assert pooled(adapter) == 0


def test_idle_pooled_connections_close_after_the_idle_expiry(start_adapter: Any) -> None:
    adapter = reuse_adapter(start_adapter)
    before = amqp_client_ports()
    RawSession(adapter.port).disconnect()
    assert wait_until(lambda: pooled(adapter) == 1, 5)
    assert amqp_client_ports() - before
    assert wait_until(lambda: pooled(adapter) == 0 and not amqp_client_ports() - before, IDLE_SECONDS + 5)


def test_a_password_change_takes_effect_once_the_pooled_connection_expired(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    adapter = reuse_adapter(start_adapter)
    user = broker.create_user("old-secret", "reuse")
    RawSession(adapter.port, login=user, passcode="old-secret").disconnect()
    assert wait_until(lambda: pooled(adapter) == 1, 5)
    broker.set_password(user, "new-secret")
    assert wait_until(lambda: pooled(adapter) == 0, IDLE_SECONDS + 5)
    refused = RawSession(adapter.port, login=user, passcode="old-secret")
    assert (refused.command, refused.body) == ("ERROR", f"Access refused for user '{user}'\n".encode())
    accepted = RawSession(adapter.port, login=user, passcode="new-secret")
    assert accepted.command == "CONNECTED"
    accepted.disconnect()
    assert reused(adapter) == 0


def test_a_new_passcode_accepted_by_the_broker_drops_the_old_pooled_connection(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    adapter = start_adapter(amqp_connection_reuse=True, amqp_connection_idle_seconds=60)
    user = broker.create_user("old-secret", "reuse")
    RawSession(adapter.port, login=user, passcode="old-secret").disconnect()
    assert wait_until(lambda: pooled(adapter) == 1, 5)
    broker.set_password(user, "new-secret")
    accepted = RawSession(adapter.port, login=user, passcode="new-secret")  # a fresh login
    assert accepted.command == "CONNECTED"
    assert reused(adapter) == 0
    assert pooled(adapter) == 0  # the old passcode's connection is gone at once, not after 60 s
    accepted.disconnect()
    assert wait_until(lambda: pooled(adapter) == 1, 5)


def test_a_deleted_user_is_refused_once_the_pooled_connection_is_gone(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    """RabbitMQ closes a deleted user's connections (320 CONNECTION_FORCED), pooled ones too;
    at the latest the idle expiry closes it."""
    adapter = reuse_adapter(start_adapter)
    user = broker.create_user("secret", "reuse")
    RawSession(adapter.port, login=user, passcode="secret").disconnect()
    assert wait_until(lambda: pooled(adapter) == 1, 5)
    broker.delete_user(user)
    assert wait_until(lambda: pooled(adapter) == 0, IDLE_SECONDS + 5)
    refused = RawSession(adapter.port, login=user, passcode="secret")
    assert refused.command == "ERROR" and refused.headers["message"] == "Bad CONNECT"


def test_a_session_that_got_an_error_frame_is_not_pooled(start_adapter: Any) -> None:
    adapter = reuse_adapter(start_adapter)
    before = amqp_client_ports()
    session = RawSession(adapter.port)
    got = session.send("SEND\ndestination:/queue/a/b\nreceipt:s\n\nx")  # not a valid destination
    assert got[0][0] == "ERROR", got
    assert wait_until(lambda: not amqp_client_ports() - before, 5)
    assert pooled(adapter) == 0


def test_a_client_that_just_closes_its_socket_leaves_a_pooled_connection(start_adapter: Any) -> None:
    """Scripts that exit without DISCONNECT are the case reuse is for: the channel is closed
    and the connection pooled as after a DISCONNECT."""
    adapter = reuse_adapter(start_adapter)
    session = RawSession(adapter.port)
    session.sock.close()
    assert wait_until(lambda: pooled(adapter) == 1, 5)
    again = RawSession(adapter.port)
    assert again.command == "CONNECTED" and reused(adapter) == 1
    again.disconnect()


def test_a_slow_reader_that_wrote_nothing_on_its_channel_leaves_no_paused_connection(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    """A client that stops reading makes the adapter pause its AMQP socket; when it leaves
    without having used its channel, the next session of the same user must still be served (a
    review found the connection pooled with its reading paused: the next SUBSCRIBE never got its
    RECEIPT)."""
    adapter = reuse_adapter(start_adapter)
    slow = socket.socket()
    RawSession.opened.append(slow)
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect(("127.0.0.1", adapter.port))
    slow.settimeout(5)
    slow.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0")
    frames, _ = read_frames(slow, timeout=5, count=1)
    assert frames and frames[0].startswith(b"CONNECTED"), frames
    # BEGIN/ABORT with long receipt ids: RECEIPTs that fill the client's socket, no AMQP frame
    receipted = b"".join(
        f"BEGIN\ntransaction:t{i}\nreceipt:{'r' * 1000}{i}\n\n\0ABORT\ntransaction:t{i}\n\n\0".encode()
        for i in range(40)
    )

    async def amqp_reading_paused() -> bool:
        return any(
            connection._amqp is not None and connection._amqp.socket.reading_paused
            for connection in adapter.server.context.connections
        )

    slow.setblocking(False)
    deadline = time.monotonic() + 10
    while not adapter.run(amqp_reading_paused()):
        assert time.monotonic() < deadline, "the adapter never paused the AMQP socket"
        try:
            slow.send(receipted)
        except BlockingIOError:
            time.sleep(0.01)
    slow.close()
    queue = unique("reuse-after-pause")
    broker.track_queue(queue)
    next_session = RawSession(adapter.port)
    assert next_session.command == "CONNECTED"
    got = next_session.send(f"SUBSCRIBE\nid:s\ndestination:/queue/{queue}\nreceipt:sub\n\n")
    assert got[-1][0] == "RECEIPT", got
    next_session.disconnect()


def pooled_after_a_send(
    start_adapter: Callable[..., AdapterProcess], broker: BrokerProbe
) -> tuple[AdapterProcess, str, str]:
    """A reuse adapter, a throwaway user and a queue it sent to in one session that used its
    channel and left its AMQP connection pooled."""
    adapter = reuse_adapter(start_adapter)
    user = broker.create_user("pw", prefix="reuse-revoke")
    queue = unique("reuse-revoke")
    broker.track_queue(queue)
    first = RawSession(adapter.port, user, "pw")
    assert first.send(f"SEND\ndestination:/queue/{queue}\nreceipt:s1\n\nx")[-1][0] == "RECEIPT"
    first.disconnect()
    assert wait_until(lambda: pooled(adapter) == 1, 5)
    return adapter, user, queue


def test_revoked_write_permission_applies_to_the_next_session_on_a_pooled_connection(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    """Every session has a channel of its own, and RabbitMQ caches permission checks per
    channel: a permission revoked between two sessions applies to the second at once."""
    adapter, user, queue = pooled_after_a_send(start_adapter, broker)
    broker.management(
        f"/api/permissions/%2F/{urllib.parse.quote(user, safe='')}",
        "PUT",
        {"configure": ".*", "write": "^$", "read": ".*"},
    )
    second = RawSession(adapter.port, user, "pw")
    assert second.command == "CONNECTED" and reused(adapter) == 1
    command, headers, body = second.send(f"SEND\ndestination:/queue/{queue}\nreceipt:s2\n\ny")[-1]
    assert (command, headers["message"]) == ("ERROR", "access_refused")
    assert b"ACCESS_REFUSED" in body


def test_revoked_vhost_access_connects_on_a_pooled_connection_and_refuses_its_first_resource(
    start_adapter: Any, broker: BrokerProbe
) -> None:
    """Vhost access is checked when a connection opens: the next session on a pooled
    connection still gets CONNECTED, and its first frame that touches a queue or exchange gets
    ERROR access_refused (a fresh login would get the CONNECT refused)."""
    adapter, user, queue = pooled_after_a_send(start_adapter, broker)
    broker.management(f"/api/permissions/%2F/{urllib.parse.quote(user, safe='')}", "DELETE")
    second = RawSession(adapter.port, user, "pw")
    assert second.command == "CONNECTED" and reused(adapter) == 1
    command, headers, _ = second.send(f"SEND\ndestination:/queue/{queue}\nreceipt:s2\n\ny")[-1]
    assert (command, headers["message"]) == ("ERROR", "access_refused")
    fresh = RawSession(adapter.port, user, "pw")  # the failed session's connection was not pooled
    assert fresh.command == "ERROR"
