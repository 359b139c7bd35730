"""Dead connections reaped (issue 38 item 4): ``adapter.min_client_heartbeat`` asks every STOMP 1.1/1.2
client that can send heart-beats for them (the negotiated interval stays the larger of the two
sides'), and ``adapter.idle_client_timeout`` closes, with an ERROR, a connection that has sent
nothing at all for that long while it negotiated no heart-beats.  Both are off by default; both
closes are counted by their ERROR's message (``stomp_adapter_error_frames_total``)."""

from __future__ import annotations

import socket
import time
from typing import Any

from tests.support import RawSession, frame_headers, read_frames, unique


def connect(port: int, heart_beat: str | None, version: str = "1.2") -> tuple[socket.socket, dict[str, str]]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    RawSession.opened.append(sock)  # closed after the test
    beat = f"heart-beat:{heart_beat}\n" if heart_beat is not None else ""
    sock.sendall(
        f"CONNECT\naccept-version:{version}\nhost:/\nlogin:guest\npasscode:guest\n{beat}\n\0".encode()
    )
    frames, _ = read_frames(sock, timeout=5, count=1)
    command, headers, _ = frame_headers(frames[0])
    assert command == "CONNECTED", headers
    return sock, headers


def test_connected_asks_a_client_that_can_send_heart_beats_for_them(start_adapter: Any) -> None:
    adapter = start_adapter(min_client_heartbeat=10_000)
    _, headers = connect(adapter.port, "1000,0")  # can send every second
    assert headers["heart-beat"] == "0,10000"  # the server wants one every 10 s at least
    _, headers = connect(adapter.port, "30000,0")  # the larger side wins, as the spec says
    assert headers["heart-beat"] == "0,30000"
    _, headers = connect(adapter.port, "0,0")  # cannot send any: nothing to ask
    assert headers["heart-beat"] == "0,0"
    plain = start_adapter()
    _, headers = connect(plain.port, "1000,0")
    assert headers["heart-beat"] == "0,1000"  # off by default: the client's own offer


def test_a_silent_connection_without_heart_beats_is_closed_with_an_error(start_adapter: Any) -> None:
    adapter = start_adapter(idle_client_timeout=1)
    silent, _ = connect(adapter.port, None, version="1.0")
    talking, _ = connect(adapter.port, "0,0")
    beating, _ = connect(adapter.port, "500,0")  # negotiated heart-beats: their own monitor
    queue = unique("idle")
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:  # the talking one sends a frame now and then
        talking.sendall(f"SEND\ndestination:/queue/{queue}\n\nx\0".encode())
        beating.sendall(b"\n")
        time.sleep(0.3)
    frames, closed = read_frames(silent, timeout=5, count=1)
    command, headers, body = frame_headers(frames[0])
    assert (command, headers["message"]) == ("ERROR", "Idle timeout") and closed, (command, headers)
    assert b"adapter.idle_client_timeout" in body
    for alive in (talking, beating):
        alive.sendall(b"DISCONNECT\nreceipt:bye\n\n\0")
        frames, _ = read_frames(alive, timeout=5, count=1)
        assert frame_headers(frames[0])[0] == "RECEIPT"

    async def errors() -> int:
        from adapter.server.metrics import build_registry, render

        text = render(build_registry(adapter.server.context)).decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("stomp_adapter_error_frames_total") and "Idle timeout" in line
        )

    assert adapter.run(errors()) == 1
