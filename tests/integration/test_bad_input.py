"""Bad input: each case gets an ERROR frame and a close, and other clients keep working."""

from __future__ import annotations

import socket

import pytest

from tests.support import frame_headers, read_frames, unique

CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0"

BAD_STREAMS = {
    "header without colon": b"SEND\ndestination:/queue/x\nnocolon\n\nbody\0",
    "undefined escape": b"SEND\ndestination:/queue/x\nfoo:bar\\tbaz\n\nbody\0",
    "stray CR in header": b"SEND\ndestination:/queue/x\nfoo:b\rar\n\nbody\0",
    "negative content-length": b"SEND\ndestination:/queue/x\ncontent-length:-1\n\nbody\0",
    "non-numeric content-length": b"SEND\ndestination:/queue/x\ncontent-length:abc\n\nbody\0",
    "content-length shorter than body": b"SEND\ndestination:/queue/x\ncontent-length:2\n\nbody\0",
    "oversized body": b"SEND\ndestination:/queue/x\ncontent-length:5000000\n\n",
    "too many headers": b"SEND\ndestination:/queue/x\n"
    + b"".join(b"h%d:v\n" % i for i in range(200))
    + b"\nbody\0",
    "garbage bytes": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)) * 4 + b"\n\n\0",
}


def _assert_error_then_close(sock: socket.socket) -> tuple[dict[str, str], bytes]:
    frames, closed = read_frames(sock, timeout=5, count=1)
    errors = [frame_headers(f) for f in frames if f.startswith(b"ERROR")]
    assert errors, f"no ERROR frame, got {frames!r}"
    assert closed, "connection left open after ERROR"
    _, headers, body = errors[0]
    assert headers["message"]
    assert body, "ERROR without detail in its body"
    return headers, body


@pytest.mark.parametrize("stream", list(BAD_STREAMS.values()), ids=list(BAD_STREAMS))
def test_malformed_input_after_login_gets_error_and_close(raw_socket, stomp_client, broker, stream):
    bystander = stomp_client("1.2")
    queue = unique("bystander")
    broker.track_queue(queue)
    bystander.conn.subscribe(f"/queue/{queue}", id="b")

    sock = raw_socket()
    sock.sendall(CONNECT)
    frames, _ = read_frames(sock, timeout=5, count=1)
    assert frames[0].startswith(b"CONNECTED")
    sock.sendall(stream)
    _assert_error_then_close(sock)

    # the server keeps serving everyone else
    bystander.conn.send(f"/queue/{queue}", "still here")
    assert bystander.next("MESSAGE").body == "still here"


@pytest.mark.parametrize(
    "stream",
    [b"garbage\x00\xff\xfe\n\n\0", b"CONNECT\naccept-version:1.2\nhost:/\n\n" + b"x" * 70000],
    ids=["garbage command", "oversized before login"],
)
def test_bad_input_before_login(raw_socket, stream):
    sock = raw_socket()
    sock.sendall(stream)
    _assert_error_then_close(sock)


def test_large_header_block_before_login_is_limited(raw_socket):
    # before login the frame limit is 64 KiB (newer plugin's max_frame_size_unauthenticated)
    sock = raw_socket()
    sock.sendall(b"CONNECT\nfoo:" + b"a" * 70000)
    headers, body = _assert_error_then_close(sock)
    assert headers["message"] == "Frame too big"


def test_unknown_command_gets_error(raw_socket):
    sock = raw_socket()
    sock.sendall(CONNECT)
    read_frames(sock, timeout=5, count=1)
    sock.sendall(b"FROB\nreceipt:r1\n\n\0")
    headers, body = _assert_error_then_close(sock)
    assert headers["message"] == "Bad command"
    assert headers["receipt-id"] == "r1"
    assert body == b'Could not interpret command "FROB"\n'


def test_many_bad_clients_do_not_disturb_a_good_one(raw_socket, stomp_client, adapter, broker):
    good = stomp_client("1.2")
    queue = unique("good")
    broker.track_queue(queue)
    good.conn.subscribe(f"/queue/{queue}", id="g")
    for i in range(20):
        sock = raw_socket()
        sock.sendall(CONNECT + b"SEND\ndestination:/queue/x\nbroken\n\n\0")
        _assert_error_then_close(sock)
        good.conn.send(f"/queue/{queue}", f"m{i}")
    assert [m.body for m in good.messages(20)] == [f"m{i}" for i in range(20)]


def test_client_still_sending_an_oversized_frame_reads_the_error(raw_socket):
    # A client that streams a body far over max_frame_size (4 MiB) is still writing when the
    # adapter answers ERROR.  Closing at once would reset the connection (unread input) and the
    # client would see "connection reset" instead of the reason; the adapter half-closes and
    # drains instead, so the ERROR arrives.
    sock = raw_socket()
    sock.sendall(CONNECT)
    frames, _ = read_frames(sock, timeout=5, count=1)
    assert frames[0].startswith(b"CONNECTED")
    body = b"x" * (16 * 1024 * 1024)
    sock.sendall(b"SEND\ndestination:/queue/x\ncontent-length:%d\n\n" % len(body) + body + b"\0")
    headers, body = _assert_error_then_close(sock)
    assert headers["message"] == "Frame too big"


@pytest.mark.parametrize(
    "frame",
    [
        b"SEND\ndestination:/queue/" + b"q" * 300 + b"\nreceipt:r\n\nx\0",
        b"SUBSCRIBE\ndestination:/queue/huge-arg\nid:s\nx-max-length:99999999999999999999\n\n\0",
    ],
    ids=["name over 255 bytes", "integer over 64 bits"],
)
def test_values_amqp_cannot_carry_get_processing_error(raw_socket, stomp_client, broker, frame):
    broker.track_queue("huge-arg")
    sock = raw_socket()
    sock.sendall(CONNECT)
    frames, _ = read_frames(sock, timeout=5, count=1)
    assert frames[0].startswith(b"CONNECTED")
    sock.sendall(frame)
    headers, body = _assert_error_then_close(sock)
    assert headers["message"] == "Processing error"
    client = stomp_client("1.2")
    queue = unique("after-processing-error")
    client.conn.subscribe(f"/topic/{queue}", id="s")
    client.conn.send(f"/topic/{queue}", "ok")
    assert client.next("MESSAGE").body == "ok"
