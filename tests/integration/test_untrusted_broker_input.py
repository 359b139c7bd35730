"""What the broker hands back is untrusted input: bytes that are not UTF-8 in header names, consumer
tags and close texts reach the client byte for byte and never take a connection down.

Regression tests for the Reliability issue's defects 1, 3 and 4 (each failed before the fix:
consumers got "AMQP connection died", a SUBSCRIBE never got its RECEIPT, a CONNECT logged a
traceback).  Raw sockets on the STOMP side, because a header name that is not UTF-8 is exactly
what a well-behaved client library refuses to send or parse.
"""

from __future__ import annotations

import logging
import socket

import pytest

from tests.support import frame_headers, read_frames, unique


def connect(sock: socket.socket, host: bytes = b"/") -> list[bytes]:
    sock.sendall(b"CONNECT\naccept-version:1.2\nhost:" + host + b"\nlogin:guest\npasscode:guest\n\n\0")
    frames, _ = read_frames(sock, timeout=5, count=1)
    return frames


def raw_headers(frame: bytes) -> list[bytes]:
    return frame.partition(b"\n\n")[0].split(b"\n")[1:]


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


@pytest.mark.parametrize("ack", ["client-individual", "auto"])
def test_header_name_that_is_not_utf8_is_delivered_byte_for_byte(raw_socket, broker, caplog, ack):
    queue = unique("poison")
    broker.track_queue(queue)
    consumer = raw_socket()
    assert connect(consumer)[0].startswith(b"CONNECTED")
    consumer.sendall(f"SUBSCRIBE\ndestination:/queue/{queue}\nid:c\nack:{ack}\nreceipt:sub\n\n\0".encode())
    frames, _ = read_frames(consumer, timeout=5, count=1)
    assert frames[0].startswith(b"RECEIPT")

    producer = raw_socket()
    assert connect(producer)[0].startswith(b"CONNECTED")
    producer.sendall(
        f"SEND\ndestination:/queue/{queue}\n".encode() + b"x-\xff-name:v\xfe\nreceipt:p\n\nbody\0"
    )
    frames, _ = read_frames(producer, timeout=5, count=1)
    assert frames[0].startswith(b"RECEIPT")

    frames, closed = read_frames(consumer, timeout=5, count=1)
    assert not closed
    assert frames[0].startswith(b"MESSAGE"), frames
    assert b"x-\xff-name:v\xfe" in raw_headers(frames[0])
    assert frames[0].endswith(b"\n\nbody")
    if ack == "client-individual":
        ack_id = next(h for h in raw_headers(frames[0]) if h.startswith(b"ack:"))[4:]
        consumer.sendall(b"ACK\nid:" + ack_id + b"\nreceipt:a\n\n\0")
        frames, closed = read_frames(consumer, timeout=5, count=1)
        assert frames[0].startswith(b"RECEIPT") and not closed
    consumer.sendall(b"DISCONNECT\nreceipt:bye\n\n\0")
    frames, _ = read_frames(consumer, timeout=5, count=1)
    assert frames[0].startswith(b"RECEIPT")
    assert broker.idle_depth(queue) == 0  # consumed once, not requeued in a loop
    assert no_tracebacks(caplog) == []


def test_subscription_id_that_is_not_utf8_gets_its_receipt_and_messages(raw_socket, broker, caplog):
    """The broker echoes the consumer tag (CESU-8 bytes here) in basic.consume-ok and in every
    delivery; the reply must complete the SUBSCRIBE, never strand it."""
    queue = unique("cesu")
    broker.track_queue(queue)
    sock = raw_socket()
    assert connect(sock)[0].startswith(b"CONNECTED")
    sock.sendall(
        f"SUBSCRIBE\ndestination:/queue/{queue}\n".encode() + b"id:s1\xed\xa0\x80\nreceipt:sub\n\n\0"
    )
    frames, closed = read_frames(sock, timeout=5, count=1)
    assert frames and frames[0].startswith(b"RECEIPT") and not closed
    sock.sendall(f"SEND\ndestination:/queue/{queue}\n\nhello\0".encode())
    frames, closed = read_frames(sock, timeout=5, count=1)
    assert frames[0].startswith(b"MESSAGE") and not closed
    assert b"subscription:s1\xed\xa0\x80" in raw_headers(frames[0])
    assert no_tracebacks(caplog) == []


def test_close_text_that_is_not_utf8_is_answered_without_a_traceback(raw_socket, stomp_client, caplog):
    """A CONNECT for a virtual host whose name is not UTF-8: RabbitMQ closes the connection with
    a reply text quoting those bytes; the client gets the usual answer, the log no traceback."""
    sock = raw_socket()
    frames = connect(sock, host=b"r\xf4\x90\x80\x80l")
    command, headers, _ = frame_headers(frames[0].decode("utf-8", "replace").encode())
    assert command == "ERROR"
    assert headers["message"] == "Bad CONNECT"
    assert no_tracebacks(caplog) == []
    # everyone else is still served
    client = stomp_client("1.2")
    queue = unique("after-close-text")
    client.conn.subscribe(f"/topic/{queue}", id="s")
    client.conn.send(f"/topic/{queue}", "ok")
    assert client.next("MESSAGE").body == "ok"
