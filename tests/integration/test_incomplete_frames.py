"""Frames a client starts and does not finish are bounded: in time (``frame_timeout``) and in
the bytes all connections together may hold (``incomplete_frames_budget``).  Without these, a
logged-in client could park max_frame_size - 1 bytes per connection for ever (the plugin's
weakness too)."""

from __future__ import annotations

import socket
import time

from tests.support import frame_headers, read_frames, unique

CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0"


def logged_in(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(CONNECT)
    frames, _ = read_frames(sock, timeout=5, count=1)
    assert frames[0].startswith(b"CONNECTED")
    return sock


def error_then_close(sock: socket.socket, timeout: float = 5) -> dict[str, str]:
    frames, closed = read_frames(sock, timeout=timeout, count=1)
    assert frames, "no frame before the close"
    command, headers, _ = frame_headers(frames[0])
    assert command == "ERROR", frames
    assert closed
    return headers


def test_a_frame_left_unfinished_gets_an_error_after_frame_timeout(start_adapter, broker):
    adapter = start_adapter(frame_timeout=0.5)
    sock = logged_in(adapter.port)
    try:
        sock.sendall(b"SEND\ndestination:/queue/never\n\nhalf a bo")
        headers = error_then_close(sock)
        assert headers["message"] == "Frame timeout"
    finally:
        sock.close()
    # the bytes it held are released
    assert adapter.run(_incomplete(adapter)) == 0


def test_a_large_frame_s_head_alone_gets_an_error_after_frame_timeout(start_adapter, broker):
    """A head announcing a large body (collected apart from the parser's buffer) and no body
    byte: the head is still an unfinished frame, held and timed."""
    adapter = start_adapter(frame_timeout=0.5)
    sock = logged_in(adapter.port)
    try:
        head = b"SEND\ndestination:/queue/never\ncontent-length:100000\nx-pad:" + b"p" * 50_000
        sock.sendall(head + b"\n\n")
        headers = error_then_close(sock)
        assert headers["message"] == "Frame timeout"
    finally:
        sock.close()
    assert adapter.run(_incomplete(adapter)) == 0


def test_a_client_streaming_frames_across_reads_is_not_timed_out(start_adapter, broker):
    """The clock restarts with every completed frame: a steady sender whose reads always end
    mid-frame, for longer than frame_timeout in all, is never cut off."""
    adapter = start_adapter(frame_timeout=0.6)
    queue = unique("stream")
    broker.track_queue(queue)
    sock = logged_in(adapter.port)
    try:
        frame = f"SEND\ndestination:/queue/{queue}\n\nmessage body\0".encode()
        pieces = [frame[:10], frame[10:] + frame[:10]]  # every write ends inside the next frame
        sock.sendall(pieces[0])
        deadline = time.monotonic() + 2.0  # over three times frame_timeout
        sent = 0
        while time.monotonic() < deadline:
            time.sleep(0.2)
            sock.sendall(pieces[1])
            sent += 1
        sock.sendall(frame[10:] + b"SEND\ndestination:/queue/" + queue.encode() + b"\nreceipt:r\n\nlast\0")
        frames, closed = read_frames(sock, timeout=5, count=1)
        assert frames[0].startswith(b"RECEIPT"), frames
        assert not closed
        assert broker.wait_depth(queue, sent + 2) == sent + 2
    finally:
        sock.close()


def test_the_connection_that_breaks_the_shared_budget_is_closed_and_others_go_on(start_adapter, broker):
    adapter = start_adapter(incomplete_frames_budget=100_000)
    queue = unique("budget")
    broker.track_queue(queue)
    first, second = logged_in(adapter.port), logged_in(adapter.port)
    try:
        head = f"SEND\ndestination:/queue/{queue}\nreceipt:r\n\n".encode()
        first.sendall(head + b"a" * 60_000)
        time.sleep(0.2)  # let the adapter read it before the second connection's bytes arrive
        second.sendall(head + b"b" * 60_000)
        headers = error_then_close(second)
        assert headers["message"] == "Too much incomplete input"
        # the first connection was within the budget: it finishes its frame normally
        first.sendall(b"a\0")
        frames, closed = read_frames(first, timeout=5, count=1)
        assert frames[0].startswith(b"RECEIPT") and not closed
        assert broker.wait_depth(queue, 1) == 1
    finally:
        first.close()
        second.close()


async def _incomplete(adapter) -> int:  # type: ignore[no-untyped-def]
    return adapter.server.context.incomplete_input
