"""The activemq profile against the real RabbitMQ, checked from the broker's side with an
independent AMQP client (aio-pika through BrokerProbe): what the adapter declares, publishes and
leaves behind.  The comparison with ActiveMQ itself is tests/activemq."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest

from tests.support import AdapterProcess, BrokerProbe, Frame, RawSession, frame_headers, read_frames, unique


def stomp(port: int, *frames: str, count: int) -> list[tuple[str, dict[str, str], bytes]]:
    """Open a raw STOMP connection, write the frames, read ``count`` answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"".join(f.encode() + b"\0" for f in frames))
        raw, _closed = read_frames(sock, count=count)
    return [frame_headers(f) for f in raw]


CONNECT = "CONNECT\naccept-version:1.2\nlogin:guest\npasscode:guest\nclient-id:{client}\n\n"


def test_profile_off_by_default(adapter: AdapterProcess) -> None:
    assert adapter.settings.profile == "rabbitmq"


def test_queue_declared_shared_and_durable_ttl_from_expires(
    start_adapter: Callable[..., AdapterProcess], broker: BrokerProbe
) -> None:
    port = start_adapter(profile="activemq").port
    queue = unique("amq-q-")
    broker.track_queue(queue)
    expires = int(time.time() * 1000) + 600_000
    answers = stomp(
        port,
        CONNECT.format(client="c"),
        f"SEND\ndestination:/queue/{queue}\npersistent:false\nexpires:{expires}\npriority:6\nreceipt:1\n\nx",
        f"SEND\ndestination:/queue/{queue}\nexpires:1\nreceipt:2\n\nexpired",
        count=3,
    )
    assert [a[0] for a in answers] == ["CONNECTED", "RECEIPT", "RECEIPT"]
    info = broker.queue_info(queue)
    assert info is not None
    assert (info["durable"], info["exclusive"], info["auto_delete"]) == (True, False, False)
    got = broker.get(queue)
    assert got is not None and got.body == b"x"
    assert 0 < int(got.properties.expiration) <= 600_000
    assert got.properties.priority == 6
    assert got.headers["expires"] == str(expires)
    assert broker.get(queue) is None  # the expired one was never published


def test_selector_drops_non_matching_from_the_subscription_queue(
    start_adapter: Callable[..., AdapterProcess], broker: BrokerProbe
) -> None:
    port = start_adapter(profile="activemq").port
    topic = unique("sel")
    client = unique("app-")
    queue = f"activemq-durable:{len(client)}:{client}:s"
    broker.track_queue(queue)
    answers = stomp(
        port,
        CONNECT.format(client=client),
        f"SUBSCRIBE\ndestination:/topic/{topic}\nid:1\nack:client\nselector:n > 1\n"
        "activemq.subscriptionName:s\nreceipt:s\n\n",
        f"SEND\ndestination:/topic/{topic}\nn:1\nreceipt:a\n\nno",
        f"SEND\ndestination:/topic/{topic}\nn:2\nreceipt:b\n\nyes",
        count=5,
    )
    messages = [a for a in answers if a[0] == "MESSAGE"]
    assert [m[2] for m in messages] == [b"yes"]
    # the unmatched one was acked by the adapter; the matched one, unacked, went back at close
    assert broker.wait_depth(queue, 1) == 1
    info = broker.queue_info(queue)
    assert info is not None and (info["durable"], info["auto_delete"]) == (True, False)


def test_bad_input_errors(start_adapter: Callable[..., AdapterProcess]) -> None:
    port = start_adapter(profile="activemq").port
    cases = [
        ("SEND\ndestination:/topic/t\nexpires:soon\n\n", "Processing error", b"expires"),
        ("SUBSCRIBE\ndestination:/topic/t\nid:1\nselector:a LIKE\n\n", "Invalid selector", b"a LIKE"),
        (
            "SUBSCRIBE\ndestination:/topic/t\nid:1\nselector:x = " + "1 + " * 2000 + "1\n\n",
            "Invalid selector",
            b"",
        ),
        (
            "SUBSCRIBE\ndestination:/temp-queue/q\nid:1\nselector:a = 1\n\n",
            "Selector not supported",
            b"a = 1",
        ),
        ("SUBSCRIBE\ndestination:/queue/q\nid:1\nselector:a = \n\n", "Invalid selector", b"a = "),
        (
            "SEND\ndestination:/topic/t\ntransformation:jms-map-json\n\n{}",
            "Transformation not supported",
            b"jms-map-json",
        ),
        (
            "SUBSCRIBE\ndestination:/topic/t\nid:1\ntransformation:jms-object-json\n\n",
            "Transformation not supported",
            b"jms-object-json",
        ),
    ]
    for frame, message, quoted in cases:
        answers = stomp(port, CONNECT.format(client="c"), frame, count=2)
        assert answers[-1][0] == "ERROR", frame
        assert answers[-1][1]["message"] == message
        assert quoted in answers[-1][2]


def test_client_id_is_free_again_after_an_abrupt_close(start_adapter: Callable[..., AdapterProcess]) -> None:
    """A connection that drops without DISCONNECT gives its client-id back (per process)."""
    adapter = start_adapter(profile="activemq")
    client_id = unique("cid")
    connect = CONNECT.format(client=client_id)
    holder = socket.create_connection(("127.0.0.1", adapter.port), timeout=5)
    holder.sendall(connect.encode() + b"\0")
    assert frame_headers(read_frames(holder, count=1)[0][0])[0] == "CONNECTED"
    refused = stomp(adapter.port, connect, count=1)
    assert refused[0][0] == "ERROR" and refused[0][1]["message"] == f"Client {client_id} already connected"
    holder.close()  # no DISCONNECT
    deadline = time.monotonic() + 10
    while adapter.connection_count:  # the adapter notices the close asynchronously
        assert time.monotonic() < deadline, "the adapter kept the closed connection"
        time.sleep(0.02)
    assert stomp(adapter.port, connect, count=1)[0][0] == "CONNECTED"


def test_exclusive_consumer_is_an_amqp_exclusive_consume(
    start_adapter: Callable[..., AdapterProcess], broker: BrokerProbe
) -> None:
    """activemq.exclusive:true: the broker refuses a second consumer while the exclusive one lasts
    (and an exclusive one while another consumes); all messages go to the exclusive one."""
    adapter = start_adapter(profile="activemq")
    queue = unique("amq-excl")
    broker.track_queue(queue)
    login = "CONNECT\naccept-version:1.2\nlogin:guest\npasscode:guest\n\n"
    holder = socket.create_connection(("127.0.0.1", adapter.port), timeout=5)
    subscribe = f"SUBSCRIBE\ndestination:/queue/{queue}\nid:1\nactivemq.exclusive:true\nreceipt:s\n\n"
    holder.sendall(login.encode() + b"\0" + subscribe.encode() + b"\0")
    answers = [frame_headers(f)[0] for f in read_frames(holder, count=2)[0]]
    assert answers == ["CONNECTED", "RECEIPT"]
    other = stomp(adapter.port, login, f"SUBSCRIBE\ndestination:/queue/{queue}\nid:2\nreceipt:t\n\n", count=2)
    assert other[1][0] == "ERROR" and "exclusive" in other[1][2].decode()
    for n in range(3):
        broker.publish("", queue, f"m{n}".encode())
    got = [frame_headers(f)[2] for f in read_frames(holder, count=3)[0]]
    assert got == [b"m0", b"m1", b"m2"]
    holder.close()
    broker.idle_depth(queue)  # waits until the broker has removed the exclusive consumer
    # and while a plain consumer is there, an exclusive SUBSCRIBE is refused
    plain = socket.create_connection(("127.0.0.1", adapter.port), timeout=5)
    plain.sendall(
        login.encode() + b"\0" + subscribe.replace("activemq.exclusive:true\n", "").encode() + b"\0"
    )
    assert [frame_headers(f)[0] for f in read_frames(plain, count=2)[0]] == ["CONNECTED", "RECEIPT"]
    refused = stomp(adapter.port, login, subscribe, count=2)
    assert refused[1][0] == "ERROR"
    plain.close()


def test_an_activemq_listener_beside_the_default_ones(start_adapter) -> None:
    """adapter.activemq_listeners: one adapter serves RabbitMQ-style clients on its listeners and
    legacy ActiveMQ clients on these, each with its own rules (here: SUBSCRIBE /temp-queue/NAME,
    refused by the plugin's rules, accepted by ActiveMQ's)."""
    adapter = start_adapter(activemq_listeners=["127.0.0.1:0"])
    legacy_port = adapter.server.activemq_addresses[0][1]
    subscribe = b"SUBSCRIBE\ndestination:/temp-queue/answers\nid:1\nreceipt:r\n\n\0"
    connect = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0"
    answers = {}
    for name, port in (("default", adapter.port), ("activemq", legacy_port)):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(connect + subscribe)
            frames, _closed = read_frames(sock, timeout=5, count=2)
            answers[name] = [f.split(b"\n", 1)[0] for f in frames]
    assert answers == {"default": [b"CONNECTED", b"ERROR"], "activemq": [b"CONNECTED", b"RECEIPT"]}


def _received(session: RawSession, sent: list[Frame]) -> Frame:
    """The MESSAGE among ``sent`` (what came with a RECEIPT), or the next one."""
    messages = [frame for frame in sent if frame[0] == "MESSAGE"]
    while not messages:
        messages = [frame for frame in session.frames_until(("MESSAGE",)) if frame[0] == "MESSAGE"]
    return messages[0]


@pytest.mark.parametrize("sessions_per_connection", [1, 2])
def test_a_nack_after_the_dead_letter_queue_was_deleted_loses_nothing(
    start_adapter: Callable[..., AdapterProcess], broker: BrokerProbe, sessions_per_connection: int
) -> None:
    """ActiveMQ.DLQ deleted after the session declared it (by an operator, a policy, another
    tool): the copy of the next NACKed message routes nowhere.  It is published mandatory, so
    the broker returns it; the adapter declares the queue again and copies the message once
    more, and the NACK's RECEIPT means the copy is in ActiveMQ.DLQ and the original gone from
    its queue.  A bystander session (on the same AMQP connection when sessions share one) is
    served throughout, and the NACKing session goes on."""
    adapter = start_adapter(profile="activemq", amqp_sessions_per_connection=sessions_per_connection)
    queue, elsewhere, after = unique("amq-dlq-gone-"), unique("amq-dlq-bystander-"), unique("amq-dlq-after-")
    broker.track_queue(queue, elsewhere, after)
    bystander = RawSession(adapter.port)
    session = RawSession(adapter.port)
    if sessions_per_connection > 1:  # the two sessions on one AMQP connection, a channel each

        async def shared() -> tuple[int, int]:
            mux = adapter.server.context.amqp_mux
            assert mux is not None
            return len(mux.shared), mux.shared.sessions

        assert adapter.run(shared()) == (1, 2)
    got = session.send(f"SUBSCRIBE\ndestination:/queue/{queue}\nid:1\nack:client-individual\nreceipt:s\n\n")
    assert got[-1][0] == "RECEIPT", got
    for n in range(2):
        got = session.send(f"SEND\ndestination:/queue/{queue}\npersistent:true\nreceipt:p{n}\n\nnacked {n}")
        assert got[-1][0] == "RECEIPT", got
        message = _received(session, got)
        assert message[2] == f"nacked {n}".encode()
        got = session.send(f"NACK\nid:{message[1]['ack']}\nreceipt:n{n}\n\n")
        assert got[-1][0] == "RECEIPT", got
        if n == 0:  # the session has declared ActiveMQ.DLQ; now it goes
            broker.delete_queue("ActiveMQ.DLQ")
            assert not broker.queue_exists("ActiveMQ.DLQ")
            bystander.round_trip(elsewhere)
    copy = broker.get("ActiveMQ.DLQ")
    assert copy is not None and copy.body == b"nacked 1"
    assert copy.headers["original-destination"] == f"/queue/{queue}"
    assert broker.get("ActiveMQ.DLQ") is None
    bystander.round_trip(elsewhere)
    session.round_trip(after)
    bystander.disconnect()
    session.disconnect()
    assert broker.idle_depth(queue) == 0  # the original was acknowledged: nothing requeued
