"""Hostile numbers from clients (issue #24): header values of thousands of digits, or almost numbers
of tens of thousands, against real RabbitMQ.

* A publisher sends them to another user's selector subscription (activemq profile): on a topic
  (the session's own filter) and on a queue with competing selector consumers (the process's
  dispatcher).  The selector subscriber keeps its connection and gets what it matches; the
  poison messages are compared as JMS and ActiveMQ say (text that is not a number within the
  bound compares FALSE with a number: not matched); a bystander stays served.  Before, ``int()``
  raised ValueError in the delivery callback (the subscriber's AMQP link closed, the message was
  requeued and knocked the next consumer off) and the near-number stalled the event loop for seconds.
* A client sends a 5,000-digit ACK id or integer header: a clean ERROR naming the limit, no
  traceback in the adapter's log, and a bystander stays served.

stomp.py and raw sockets are the independent clients."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterator

import pytest

from adapter.numbers import MAX_DIGITS
from tests.support import (
    AdapterProcess,
    BrokerProbe,
    StompClient,
    expect_receipt,
    frame_headers,
    read_frames,
    unique,
)

NEAR_NUMBER = "1" * 20_000 + "x"  # the old pattern backtracked quadratically on it (~9 s)
HUGE = "1" * 5_000  # beyond int()'s 4,300 digits
POISON = {"near-number": NEAR_NUMBER, "huge": HUGE, "huge-negative": "-" + HUGE}
CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0"


def _no_errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


@pytest.fixture
def amq(start_adapter: Callable[..., AdapterProcess]) -> AdapterProcess:
    return start_adapter(profile="activemq")


@pytest.fixture
def clients(amq: AdapterProcess) -> Iterator[Callable[[], StompClient]]:
    opened: list[StompClient] = []

    def connect() -> StompClient:
        client = StompClient(amq.port)
        opened.append(client)
        return client

    yield connect
    for client in opened:
        client.close()


def _publish_poison_then_good(producer: StompClient, destination: str) -> None:
    for name, value in POISON.items():
        producer.conn.send(destination, name, headers={"price": value, "colour": "red"})
    producer.conn.send(destination, "good", headers={"price": "20", "colour": "blue"}, receipt="sent")
    expect_receipt(producer, "sent")


def test_poison_numbers_on_a_topic_selector_subscription(
    clients: Callable[[], StompClient], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    topic = f"/topic/{unique('poison')}"
    selective, bystander, producer = clients(), clients(), clients()
    selective.conn.subscribe(topic, "s", headers={"selector": "price > 10", "receipt": "s"})
    expect_receipt(selective, "s")
    bystander.conn.subscribe(topic, "b", headers={"receipt": "b"})
    expect_receipt(bystander, "b")

    _publish_poison_then_good(producer, topic)

    assert [m.body for m in bystander.messages(len(POISON) + 1)] == [*POISON, "good"]
    assert selective.next("MESSAGE").body == "good"  # the poison compares FALSE: not matched
    assert selective.nothing_more() and selective.nothing_more("ERROR")
    assert selective.conn.is_connected() and not selective.recorder.disconnected.is_set()
    # and it is still served
    producer.conn.send(topic, "later", headers={"price": "11"})
    assert selective.next("MESSAGE").body == "later"
    assert not _no_errors_logged(caplog)


def test_poison_numbers_on_a_queue_with_selector_consumers(
    clients: Callable[[], StompClient], broker: BrokerProbe, caplog: pytest.LogCaptureFixture
) -> None:
    """Competing selector consumers (the process's dispatcher): the poison arrives on either
    consumer's channel and is tested against the price selector there; it goes to the red one."""
    caplog.set_level(logging.WARNING)
    queue = unique("poison-q")
    broker.track_queue(queue)
    destination = f"/queue/{queue}"
    pricey, red, producer = clients(), clients(), clients()
    for client, sub_id, selector in ((pricey, "p", "price > 10"), (red, "r", "colour = 'red'")):
        client.conn.subscribe(
            destination, sub_id, ack="auto", headers={"selector": selector, "receipt": sub_id}
        )
        expect_receipt(client, sub_id)

    _publish_poison_then_good(producer, destination)

    assert sorted(m.body for m in red.messages(len(POISON))) == sorted(POISON)
    assert pricey.next("MESSAGE").body == "good"
    assert pricey.nothing_more() and red.nothing_more()
    for client in (pricey, red):
        assert client.nothing_more("ERROR")
        assert client.conn.is_connected() and not client.recorder.disconnected.is_set()
    producer.conn.send(destination, "later", headers={"price": "11", "colour": "red"})
    later = [c for c in (pricey, red) if not c.nothing_more(wait=2.0)]
    assert len(later) == 1  # exactly one of them got it: both still consume
    assert not _no_errors_logged(caplog)
    pricey.close()
    red.close()
    assert broker.idle_depth(queue) == 0  # every message delivered (auto ack), none stuck


# --- integers in client frames ---------------------------------------------------------------


def _connected(raw_socket: Callable[..., socket.socket]) -> socket.socket:
    sock = raw_socket()
    sock.sendall(CONNECT)
    frames, _ = read_frames(sock, timeout=5, count=1)
    assert frames and frames[0].startswith(b"CONNECTED"), frames
    return sock


def _error_then_close(sock: socket.socket) -> tuple[dict[str, str], bytes]:
    frames, closed = read_frames(sock, timeout=5, count=1)
    errors = [frame_headers(f) for f in frames if f.startswith(b"ERROR")]
    assert errors, f"no ERROR frame, got {frames!r}"
    assert closed, "connection left open after ERROR"
    _, headers, body = errors[0]
    return headers, body


def test_an_ack_id_of_5000_digits_is_a_clean_error(
    raw_socket: Callable[..., socket.socket],
    stomp_client: Callable[..., StompClient],
    broker: BrokerProbe,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    queue = unique("ack-digits")
    broker.track_queue(queue)
    bystander = stomp_client("1.2")
    bystander.conn.subscribe(f"/queue/{queue}-b", id="b")
    broker.track_queue(f"{queue}-b")

    for receipt in ("", "receipt:a\n"):  # the quick path (no receipt) and the general one
        sock = _connected(raw_socket)
        sock.sendall(
            f"SUBSCRIBE\nid:s\ndestination:/queue/{queue}\nack:client-individual\n\n\0".encode()
            + f"SEND\ndestination:/queue/{queue}\n\nhello\0".encode()
        )
        frames, _ = read_frames(sock, timeout=5, count=1)
        message = [frame_headers(f) for f in frames if f.startswith(b"MESSAGE")]
        assert message, frames
        ack = message[0][1]["ack"]
        poisoned = ack.rsplit("@@", 1)[0] + "@@" + HUGE  # this subscription, a 5,000-digit tag
        sock.sendall(f"ACK\nid:{poisoned}\n{receipt}\n\0".encode())
        headers, body = _error_then_close(sock)
        assert headers["message"] == "Processing error", (headers, body)
        assert f"at most {MAX_DIGITS}".encode() in body, body

    bystander.conn.send(f"/queue/{queue}-b", "still here")
    assert bystander.next("MESSAGE").body == "still here"
    assert not _no_errors_logged(caplog)


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        ("SEND\ndestination:/queue/{q}\nx-max-length:{huge}\n\nbody\0", "Processing error"),
        ("SEND\ndestination:/queue/{q}\npriority:{huge}\n\nbody\0", "Processing error"),
        ("SEND\ndestination:/queue/{q}\ntimestamp:-{huge}\n\nbody\0", "Processing error"),
        ("SUBSCRIBE\nid:s\ndestination:/queue/{q}\nprefetch-count:{huge}\n\n\0", "Processing error"),
        ("SUBSCRIBE\nid:s\ndestination:/queue/{q}\nx-message-ttl:{huge}\n\n\0", "Processing error"),
        ("SEND\ndestination:/queue/{q}\ncontent-length:{huge}\n\nbody\0", "Bad content-length"),
    ],
    ids=["x-max-length", "priority", "timestamp", "prefetch-count", "x-message-ttl", "content-length"],
)
def test_an_integer_header_of_5000_digits_is_a_clean_error(
    raw_socket: Callable[..., socket.socket],
    stomp_client: Callable[..., StompClient],
    broker: BrokerProbe,
    caplog: pytest.LogCaptureFixture,
    frame: str,
    message: str,
) -> None:
    caplog.set_level(logging.WARNING)
    queue = unique("int-digits")
    broker.track_queue(queue)
    bystander = stomp_client("1.2")
    bystander.conn.subscribe(f"/queue/{queue}-b", id="b")
    broker.track_queue(f"{queue}-b")

    sock = _connected(raw_socket)
    sock.sendall(frame.format(q=queue, huge=HUGE).encode())
    headers, body = _error_then_close(sock)
    assert headers["message"] == message, (headers, body)
    assert b"digits" in body and len(body) < 1000, body  # names the limit; does not echo the value

    bystander.conn.send(f"/queue/{queue}-b", "still here")
    assert bystander.next("MESSAGE").body == "still here"
    assert not _no_errors_logged(caplog)
