"""STOMP over WebSocket (web_stomp.* listeners), met by an independent WebSocket client (the
`websockets` library, sync API) and by raw HTTP, against the real RabbitMQ.

What the plugin does is in tests/compat/test_web_stomp.py (the same conversations against
rabbitmq_web_stomp); these tests cover the adapter's own settings and the bad-input cases that
need them (limits, timeouts, origins, HTTP Basic auth, PROXY header, wss://)."""

from __future__ import annotations

import base64
import http.client
import logging
import socket
import ssl
import threading
import time
from pathlib import Path

import pytest
import trustme
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.support import free_port, read_frames, run_adapter_with_config, unique, wait_for_port

CONNECT = "CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0"


@pytest.fixture
def queue_name(broker):  # type: ignore[no-untyped-def]
    """A fresh ``/queue/...`` destination whose durable queue is deleted after the test."""

    def make() -> str:
        name = unique("ws")
        broker.track_queue(name)
        return f"/queue/{name}"

    return make


def ws_adapter(start_adapter, **settings):  # type: ignore[no-untyped-def]
    adapter = start_adapter(web_stomp_listeners=["127.0.0.1:0"], **settings)
    return adapter, adapter.server.web_addresses[0][1]


def open_ws(port: int, subprotocols: list[str] | None = None, **kwargs) -> ClientConnection:  # type: ignore[no-untyped-def]
    kwargs.setdefault("compression", None)
    return connect(
        f"ws://127.0.0.1:{port}/ws",
        subprotocols=(subprotocols if subprotocols is not None else ["v12.stomp"]) or None,
        open_timeout=5,
        **kwargs,
    )


def recv(ws: ClientConnection, timeout: float = 5.0) -> str | bytes:
    return ws.recv(timeout=timeout)


def command(message: str | bytes) -> str:
    text = message.decode() if isinstance(message, bytes) else message
    return text.split("\n", 1)[0]


def client_frame(payload: bytes, opcode: int = 0x1) -> bytes:
    """One final, masked client frame (RFC 6455 5.2) with a zero mask, written by hand for input
    a WebSocket library refuses to send."""
    if len(payload) < 126:
        length = bytes((0x80 | len(payload),))
    else:
        length = bytes((0x80 | 126,)) + len(payload).to_bytes(2, "big")
    return bytes((0x80 | opcode,)) + length + b"\0\0\0\0" + payload


def until_closed(ws: ClientConnection, timeout: float = 5.0) -> list[str | bytes]:
    """Every message until the server closes; the close frame is in ws.close_code/close_reason."""
    got: list[str | bytes] = []
    deadline = time.monotonic() + timeout
    with pytest.raises(ConnectionClosed):
        while True:
            got.append(ws.recv(timeout=max(0.01, deadline - time.monotonic())))
    return got


def test_subscribe_send_receive_one_message_per_frame(start_adapter, queue_name):
    _adapter, port = ws_adapter(start_adapter)
    queue = queue_name()
    with open_ws(port) as ws:
        assert ws.subprotocol == "v12.stomp"
        ws.send(CONNECT)
        connected = recv(ws)
        assert isinstance(connected, str)  # ws_frame = text by default
        assert command(connected) == "CONNECTED" and "version:1.2" in connected
        ws.send(f"SUBSCRIBE\nid:s1\ndestination:{queue}\nreceipt:r1\n\n\0")
        ws.send(f"SEND\ndestination:{queue}\ncontent-type:text/plain\n\nhello\0")
        receipt, message = recv(ws), recv(ws)
        # each STOMP frame is its own WebSocket message, NUL and the plugin's LF at its end
        assert receipt == "RECEIPT\nreceipt-id:r1\n\n\0\n"
        assert command(message) == "MESSAGE" and message.endswith("\n\nhello\0\n")
        assert f"destination:{queue}\n" in message
        ws.send("UNSUBSCRIBE\nid:s1\n\n\0")
        ws.send("DISCONNECT\nreceipt:bye\n\n\0")
        rest = until_closed(ws)
    assert rest == ["RECEIPT\nreceipt-id:bye\n\n\0\n"]  # the plugin loses it: docs/compatibility.md
    assert (ws.close_code, ws.close_reason) == (1000, "STOMP died")


def test_receipts_of_one_multiple_confirm_are_one_message_each(start_adapter, queue_name):
    """Pipelined receipted SENDs draw broker confirms with multiple=true, each settling several
    receipts at once: every RECEIPT is still its own WebSocket message, as the plugin sends them
    (a client reading one frame per message, as the plugin allows, would otherwise wait forever
    for the second one)."""
    _adapter, port = ws_adapter(start_adapter)
    queue = queue_name()
    count = 300
    with open_ws(port) as ws:
        ws.send(CONNECT)
        assert command(recv(ws)) == "CONNECTED"
        for n in range(count):
            ws.send(f"SEND\ndestination:{queue}\nreceipt:r{n}\n\nbody-{n}\0")
        messages = [recv(ws, timeout=30) for _ in range(count)]
    assert messages == [f"RECEIPT\nreceipt-id:r{n}\n\n\0\n" for n in range(count)]


@pytest.mark.parametrize(
    ("offered", "chosen"),
    [
        (["v10.stomp", "v11.stomp"], "v11.stomp"),
        (["v12.stomp", "v10.stomp", "v11.stomp"], "v12.stomp"),
        (["stomp"], None),
        (["mqtt"], None),
        ([], None),
    ],
)
def test_subprotocol_negotiation(start_adapter, offered, chosen):
    _adapter, port = ws_adapter(start_adapter)
    with open_ws(port, subprotocols=offered) as ws:
        assert ws.subprotocol == chosen
        ws.send(CONNECT)
        assert command(recv(ws)) == "CONNECTED"


def test_frames_split_and_joined_across_messages(start_adapter, queue_name):
    _adapter, port = ws_adapter(start_adapter)
    queue = queue_name()
    with open_ws(port) as ws:
        for piece in ("CONN", "ECT\naccept-version:1.2\nlogin:gu", "est\npasscode:guest\n\n", "\0"):
            ws.send(piece)
        assert command(recv(ws)) == "CONNECTED"
        # three frames in one message, then one frame over two binary messages
        ws.send(
            f"SUBSCRIBE\nid:1\ndestination:{queue}\n\n\0"
            f"SEND\ndestination:{queue}\n\none\0"
            f"SEND\ndestination:{queue}\nreceipt:r\n\ntwo\0"
        )
        ws.send(f"SEND\ndestination:{queue}\n\nth".encode())
        ws.send(b"ree\0")
        got = [recv(ws) for _ in range(4)]
    bodies = [m.split("\n\n", 1)[1] for m in got if command(m) == "MESSAGE"]
    assert bodies == ["one\0\n", "two\0\n", "three\0\n"]
    assert "RECEIPT\nreceipt-id:r\n\n\0\n" in got


def test_error_frame_then_close_1000(start_adapter):
    _adapter, port = ws_adapter(start_adapter)
    with open_ws(port) as ws:
        ws.send(CONNECT)
        recv(ws)
        ws.send("FOO\n\n\0")
        got = until_closed(ws)
    assert [command(m) for m in got] == ["ERROR"]
    assert "message:Bad command" in got[0]
    assert (ws.close_code, ws.close_reason) == (1000, "STOMP died")


def test_failed_login_gets_error_and_close(start_adapter):
    _adapter, port = ws_adapter(start_adapter)
    with open_ws(port) as ws:
        ws.send("CONNECT\naccept-version:1.2\nlogin:guest\npasscode:wrong\n\n\0")
        got = until_closed(ws)
    assert [command(m) for m in got] == ["ERROR"] and "Access refused" in got[0]
    assert ws.close_code == 1000


def test_message_over_the_limit_gets_1009_and_others_are_served(start_adapter):
    _adapter, port = ws_adapter(start_adapter, web_stomp_max_frame_size=1000)
    with open_ws(port) as bystander, open_ws(port) as ws:
        bystander.send(CONNECT)
        assert command(recv(bystander)) == "CONNECTED"
        ws.send(CONNECT)
        recv(ws)
        ws.send("SEND\ndestination:/queue/x\n\n" + "x" * 2000 + "\0")
        until_closed(ws)
        assert ws.close_code == 1009
        bystander.send(f"SUBSCRIBE\nid:1\ndestination:/topic/{unique('ws')}\nreceipt:still-here\n\n\0")
        assert command(recv(bystander)) == "RECEIPT"


def test_message_limit_zero_refuses_every_non_empty_message(start_adapter):
    # ws_opts.max_frame_size = 0 is valid in the plugin's schema; cowboy then closes with 1009
    _adapter, port = ws_adapter(start_adapter, web_stomp_max_frame_size=0)
    with open_ws(port) as ws:
        ws.send(CONNECT)
        assert until_closed(ws) == []
    assert ws.close_code == 1009


def assert_still_served(bystander: ClientConnection) -> None:
    bystander.send(f"SUBSCRIBE\nid:1\ndestination:/topic/{unique('ws')}\nreceipt:still-here\n\n\0")
    assert command(recv(bystander)) == "RECEIPT"


def test_invalid_utf8_in_a_text_message_gets_1007(start_adapter):
    _adapter, port = ws_adapter(start_adapter)
    with open_ws(port) as bystander, open_ws(port) as ws:
        bystander.send(CONNECT)
        assert command(recv(bystander)) == "CONNECTED"
        # the library refuses to send invalid UTF-8 as text: write the frame ourselves
        ws.socket.sendall(client_frame(b"CONNECT\nx:\xff\n\n\0"))
        until_closed(ws)
        assert ws.close_code == 1007
        assert_still_served(bystander)


def test_binary_frames_when_configured_and_binary_input_in_text_mode(start_adapter):
    _adapter, port = ws_adapter(start_adapter, web_stomp_ws_frame="binary")
    with open_ws(port) as ws:
        ws.send(CONNECT.encode())
        connected = recv(ws)
        assert isinstance(connected, bytes) and connected.startswith(b"CONNECTED\n")
    _adapter, port = ws_adapter(start_adapter)
    with open_ws(port) as ws:
        ws.send(CONNECT.encode())  # a binary message on a text listener is read as well (plugin)
        assert isinstance(recv(ws), str)


def test_binary_body_round_trip_over_binary_frames(start_adapter, queue_name):
    _adapter, port = ws_adapter(start_adapter, web_stomp_ws_frame="binary")
    queue = queue_name()
    body = bytes(range(256)) * 4
    with open_ws(port) as ws:
        ws.send(CONNECT.encode())
        recv(ws)
        ws.send(f"SUBSCRIBE\nid:1\ndestination:{queue}\n\n\0".encode())
        ws.send(f"SEND\ndestination:{queue}\ncontent-length:{len(body)}\n\n".encode() + body + b"\0")
        message = recv(ws)
    assert isinstance(message, bytes)
    assert message.endswith(b"\n\n" + body + b"\0\n")


def test_compression_negotiated_round_trip(start_adapter, queue_name):
    _adapter, port = ws_adapter(start_adapter)
    queue = queue_name()
    with open_ws(port, compression="deflate") as ws:
        extensions = ws.response.headers.get("Sec-WebSocket-Extensions", "")
        assert extensions.startswith("permessage-deflate")
        ws.send(CONNECT)
        recv(ws)
        ws.send(f"SUBSCRIBE\nid:1\ndestination:{queue}\n\n\0")
        for n in range(20):  # context takeover: later messages reuse the window
            ws.send(f"SEND\ndestination:{queue}\n\nmessage {n} " + "abc" * 50 + "\0")
        bodies = [recv(ws).split("\n\n", 1)[1] for _ in range(20)]
    assert bodies == [f"message {n} " + "abc" * 50 + "\0\n" for n in range(20)]


def test_compression_off(start_adapter):
    _adapter, port = ws_adapter(start_adapter, web_stomp_compress=False)
    with open_ws(port, compression="deflate") as ws:
        assert "Sec-WebSocket-Extensions" not in ws.response.headers
        ws.send(CONNECT)
        assert command(recv(ws)) == "CONNECTED"


def test_heart_beats_are_newline_messages(start_adapter):
    _adapter, port = ws_adapter(start_adapter)
    with open_ws(port) as ws:
        ws.send(CONNECT.replace("\n\n\0", "\nheart-beat:0,200\n\n\0"))
        assert "heart-beat:200,0" in recv(ws)
        assert [recv(ws, 2) for _ in range(3)] == ["\n", "\n", "\n"]


def test_client_heart_beat_timeout_closes(start_adapter):
    _adapter, port = ws_adapter(start_adapter)
    with open_ws(port) as ws:
        ws.send(CONNECT.replace("\n\n\0", "\nheart-beat:200,0\n\n\0"))
        recv(ws)
        got = until_closed(ws, 5)
    assert command(got[-1]) == "ERROR" and "Heart-beat timeout" in got[-1]
    assert ws.close_code == 1000


def test_idle_websocket_is_closed(start_adapter, caplog):
    caplog.set_level(logging.INFO, logger="adapter.websocket")
    _adapter, port = ws_adapter(start_adapter, web_stomp_idle_timeout=0.5)
    with open_ws(port, ping_interval=None) as ws:
        ws.send(CONNECT)
        recv(ws)
        until_closed(ws, 5)
    assert ws.close_code == 1000
    assert any("no WebSocket input for 0.5 s" in r.getMessage() for r in caplog.records)


def test_ping_flood_does_not_stop_other_clients(start_adapter):
    _adapter, port = ws_adapter(start_adapter)
    with open_ws(port) as bystander:
        bystander.send(CONNECT)
        recv(bystander)
        flood = socket.create_connection(("127.0.0.1", port))
        flood.sendall(
            b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        ping = bytes((0x89, 0x80 | 125)) + b"\0\0\0\0" + b"p" * 125
        flood.settimeout(0.5)
        sent = 0
        try:  # the flooder never reads its pongs: the adapter stops reading it
            for _ in range(200):
                flood.sendall(ping * 500)
                sent += 500
        except (TimeoutError, OSError):
            pass
        assert sent < 200 * 500  # back-pressure reached the flooder
        bystander.send(f"SUBSCRIBE\nid:1\ndestination:/topic/{unique('ws')}\nreceipt:ok\n\n\0")
        assert command(recv(bystander)) == "RECEIPT"
        flood.close()


def test_plain_http_requests(start_adapter):
    _adapter, port = ws_adapter(start_adapter)

    def get(path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        result = response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        conn.close()
        return result

    status, headers, _body = get("/ws")
    assert status == 426 and headers["upgrade"] == "websocket"
    assert get("/nothing-here")[0] == 404
    status, headers, body = get("/console")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert b"<script" in body and b"http://" not in body.replace(b"http://www.w3.org", b"")


def test_garbage_instead_of_http_gets_400_and_others_are_served(start_adapter):
    _adapter, port = ws_adapter(start_adapter)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"CONNECT\naccept-version:1.2\n\n\0")  # STOMP sent to the WebSocket port
        answer = sock.recv(1000)
    assert answer.startswith(b"HTTP/1.1 400")
    with open_ws(port) as ws:
        ws.send(CONNECT)
        assert command(recv(ws)) == "CONNECTED"


def test_half_open_request_is_dropped_after_the_request_timeout(start_adapter, caplog):
    caplog.set_level(logging.INFO, logger="adapter.websocket")
    _adapter, port = ws_adapter(start_adapter, web_stomp_request_timeout=0.5)
    with (
        open_ws(port) as bystander,
        socket.create_connection(("127.0.0.1", port), timeout=5) as silent,
        socket.create_connection(("127.0.0.1", port), timeout=5) as partial,
    ):
        bystander.send(CONNECT)
        assert command(recv(bystander)) == "CONNECTED"
        partial.sendall(b"GET /ws HTTP/1.1\r\nHost: x\r\n")  # and nothing more
        # as cowboy: 408 for a request that did not arrive whole, a silent close for nothing
        assert partial.recv(100).startswith(b"HTTP/1.1 408 ")
        assert silent.recv(100) == b""
        assert_still_served(bystander)
    assert any("no complete HTTP request in 0.5 s" in r.getMessage() for r in caplog.records)


def test_allowed_origins(start_adapter):
    _adapter, port = ws_adapter(start_adapter, web_stomp_allow_origins=["https://app.example"])
    with open_ws(port, origin="https://app.example") as ws:
        ws.send(CONNECT)
        assert command(recv(ws)) == "CONNECTED"
    with pytest.raises(Exception, match="403"):
        open_ws(port, origin="https://evil.example")
    with open_ws(port) as ws:  # no Origin header: not a browser, allowed (as the plugin does)
        ws.send(CONNECT)
        assert command(recv(ws)) == "CONNECTED"


OPEN_ORIGINS = "accepts WebSockets from every web origin"


def test_start_up_warns_when_any_web_page_may_log_in_as_the_default_user(start_adapter, caplog):
    """No web_stomp.allow_origins and a default user: any page open in a browser on this host
    (loopback_users notwithstanding) can open ws://localhost/ws and CONNECT without a login as
    guest; the adapter serves it, as the plugin does, and says so at start-up."""
    caplog.set_level(logging.INFO, logger="adapter")
    adapter, port = ws_adapter(start_adapter)
    (warning,) = [r for r in caplog.records if OPEN_ORIGINS in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert f"127.0.0.1:{port}" in warning.getMessage() and "'guest'" in warning.getMessage()
    assert "web_stomp.allow_origins" in warning.getMessage()
    with open_ws(port, origin="https://evil.example") as ws:  # still served: the warning is the change
        ws.send("CONNECT\naccept-version:1.2\n\n\0")
        assert command(recv(ws)) == "CONNECTED"


@pytest.mark.parametrize(
    "settings",
    [{"web_stomp_allow_origins": ["https://app.example"]}, {"default_user": ""}],
    ids=["origins listed", "no default user"],
)
def test_no_open_origins_warning_when_pages_cannot_log_in_freely(start_adapter, caplog, settings):
    caplog.set_level(logging.INFO, logger="adapter")
    ws_adapter(start_adapter, **settings)
    assert any("listening on" in r.getMessage() for r in caplog.records)
    assert not any(OPEN_ORIGINS in r.getMessage() for r in caplog.records)


def test_http_basic_auth_replaces_connect_credentials(start_adapter):
    _adapter, port = ws_adapter(start_adapter, web_stomp_use_http_auth=True)
    good = "Basic " + base64.b64encode(b"guest:guest").decode()
    bad = "Basic " + base64.b64encode(b"guest:nope").decode()
    with open_ws(port, additional_headers={"Authorization": good}) as ws:
        ws.send("CONNECT\naccept-version:1.2\nlogin:nobody\npasscode:nothing\n\n\0")
        assert command(recv(ws)) == "CONNECTED"
    with open_ws(port, additional_headers={"Authorization": bad}) as ws:
        ws.send(CONNECT)  # right credentials in CONNECT, wrong ones in HTTP: HTTP wins
        got = until_closed(ws)
        assert command(got[0]) == "ERROR" and "Access refused" in got[0]
    with open_ws(port) as ws:  # no Authorization header: the default user (guest)
        ws.send("CONNECT\naccept-version:1.2\nlogin:nobody\npasscode:nothing\n\n\0")
        assert command(recv(ws)) == "CONNECTED"


def test_with_http_auth_a_bearer_token_is_the_forced_credential(start_adapter):
    """use_http_auth: the HTTP request's credentials replace CONNECT's, a bearer token too
    (the login ("", token)): a made-up bearer JWT never lets CONNECT's own credentials in."""
    _adapter, port = ws_adapter(start_adapter, web_stomp_use_http_auth=True)
    fake = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJndWVzdCIsImV4cCI6NDEwMjQ0NDgwMH0.c2ln"  # sub guest, exp 2100
    with (
        open_ws(port) as bystander,
        open_ws(port, additional_headers={"Authorization": f"Bearer {fake}"}) as ws,
    ):
        bystander.send(CONNECT)
        assert command(recv(bystander)) == "CONNECTED"
        ws.send(CONNECT)  # guest's right credentials in CONNECT: the bearer token wins
        got = until_closed(ws)
        assert command(got[0]) == "ERROR" and "Access refused" in got[0], got
        assert_still_served(bystander)


@pytest.mark.parametrize(
    "authorization", ["Bearer abc", "Basic !!!", "Basic " + base64.b64encode(b"no-colon").decode()]
)
def test_unreadable_authorization_header_fails_the_connection(start_adapter, caplog, authorization):
    """With use_http_auth, only a missing header means the default user; another scheme or
    unreadable Basic credentials end the WebSocket with 1011 before any login, where the plugin's
    handler fails (docs/compatibility.md W9)."""
    _adapter, port = ws_adapter(start_adapter, web_stomp_use_http_auth=True)
    with open_ws(port) as bystander, open_ws(port, additional_headers={"Authorization": authorization}) as ws:
        bystander.send(CONNECT)
        assert command(recv(bystander)) == "CONNECTED"
        assert until_closed(ws) == []  # no CONNECTED for anyone, not even the default user
        assert (ws.close_code, ws.close_reason) == (1011, "Bad Authorization header")
        assert_still_served(bystander)
    assert any("Authorization header" in r.getMessage() for r in caplog.records)


def test_two_authorization_headers_fail_the_connection(start_adapter):
    """Two Authorization headers are one unreadable value (cowboy joins them with ", "), never
    the last one's credentials."""
    _adapter, port = ws_adapter(start_adapter, web_stomp_use_http_auth=True)
    guest = "Basic " + base64.b64encode(b"guest:guest").decode()
    with open_ws(port, additional_headers=[("Authorization", guest), ("Authorization", guest)]) as ws:
        assert until_closed(ws) == []
        assert (ws.close_code, ws.close_reason) == (1011, "Bad Authorization header")


def test_proxy_protocol_gives_the_client_address(start_adapter):
    _adapter, port = ws_adapter(start_adapter, web_stomp_proxy_protocol=True)

    def upgrade(proxy_line: bytes) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(
            proxy_line + b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(1000)
        assert head.startswith(b"HTTP/1.1 101")
        sock.sendall(client_frame(CONNECT.encode()))
        return sock

    # guest may only log in from loopback: the address in the PROXY header decides
    remote = upgrade(b"PROXY TCP4 203.0.113.7 127.0.0.1 40000 15674\r\n")
    assert b"non-loopback access denied" in remote.recv(1000)
    remote.close()
    local = upgrade(b"PROXY TCP4 127.0.0.1 127.0.0.1 40001 15674\r\n")
    assert b"CONNECTED" in local.recv(1000)
    local.close()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:  # no header: dropped
        sock.sendall(b"GET /ws HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(100) == b""


def test_tcp_and_websocket_clients_meet_in_one_process(start_adapter, queue_name):
    adapter, port = ws_adapter(start_adapter)
    queue = queue_name()
    with open_ws(port) as ws:
        ws.send(CONNECT)
        recv(ws)
        ws.send(f"SUBSCRIBE\nid:1\ndestination:{queue}\nreceipt:r\n\n\0")
        assert command(recv(ws)) == "RECEIPT"
        with socket.create_connection(("127.0.0.1", adapter.port), timeout=5) as tcp:
            tcp.sendall(CONNECT.encode() + f"SEND\ndestination:{queue}\nreceipt:s\n\nfrom tcp\0".encode())
            frames, _closed = read_frames(tcp, count=2)
            assert [f.split(b"\n", 1)[0] for f in frames] == [b"CONNECTED", b"RECEIPT"]
        message = recv(ws)
    assert command(message) == "MESSAGE" and message.endswith("\n\nfrom tcp\0\n")


def test_wss_listener(start_adapter, tmp_path: Path):
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    adapter = start_adapter(
        web_stomp_ssl_listeners=["127.0.0.1:0"],
        web_stomp_ssl_certfile=str(tmp_path / "server.pem"),
        web_stomp_hsts_policy="max-age=31536000",
    )
    port = adapter.server.web_addresses[0][1]
    context = ssl.create_default_context()
    ca.configure_trust(context)
    with connect(f"wss://127.0.0.1:{port}/ws", ssl=context, subprotocols=["v12.stomp"]) as ws:
        assert ws.response.headers["Strict-Transport-Security"] == "max-age=31536000"
        ws.send(CONNECT)
        assert command(recv(ws)) == "CONNECTED"


def test_config_file_contract(tmp_path: Path, amqp_url: str):
    """`--config FILE` with web_stomp.tcp.port (and web_stomp.tcp.ip) starts the WebSocket
    listener beside --listen, path /ws (the issue's contract), in a real adapter process."""
    ws_port, tcp_port = free_port(), free_port()
    process, log_path = run_adapter_with_config(
        tmp_path, amqp_url, f"web_stomp.tcp.port = {ws_port}\nweb_stomp.tcp.ip = 127.0.0.1\n", tcp_port
    )
    try:
        wait_for_port(ws_port, process, "the WebSocket listener", log_path)
        wait_for_port(tcp_port, process, "the TCP listener", log_path)
        with open_ws(ws_port) as ws:
            ws.send(CONNECT)
            assert command(recv(ws)) == "CONNECTED"
        assert f"listening on 127.0.0.1:{ws_port} (WebSocket)" in log_path.read_text()
    finally:
        process.terminate()
        process.wait(15)


def test_config_file_without_web_stomp_keys_opens_no_websocket_listener(tmp_path: Path, amqp_url: str):
    """The other half of the contract: no web_stomp.* key, no WebSocket listener (the TCP one
    serves, and of the listeners the process logs none is a WebSocket one)."""
    tcp_port = free_port()
    process, log_path = run_adapter_with_config(tmp_path, amqp_url, "stomp.default_vhost = /\n", tcp_port)
    try:
        wait_for_port(tcp_port, process, "the TCP listener", log_path)
        with socket.create_connection(("127.0.0.1", tcp_port), timeout=5) as sock:
            sock.sendall(CONNECT.encode())
            frames, _closed = read_frames(sock, count=1)
            assert frames[0].startswith(b"CONNECTED\n")  # started and serving
        listening = [line for line in log_path.read_text().splitlines() if "listening on" in line]
        assert listening and not any("WebSocket" in line for line in listening), listening
    finally:
        process.terminate()
        process.wait(15)


def test_many_websocket_clients_at_once(start_adapter):
    _adapter, port = ws_adapter(start_adapter)
    topic = f"/topic/{unique('ws')}"
    errors: list[BaseException] = []
    received: list[int] = []

    def client(n: int) -> None:
        try:
            with open_ws(port) as ws:
                ws.send(CONNECT)
                recv(ws)
                ws.send(f"SUBSCRIBE\nid:1\ndestination:{topic}\nreceipt:r\n\n\0")
                recv(ws)
                barrier.wait(10)
                ws.send(f"SEND\ndestination:{topic}\n\nfrom {n}\0")
                received.append(sum(1 for _ in range(10) if command(recv(ws)) == "MESSAGE"))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    barrier = threading.Barrier(10)
    threads = [threading.Thread(target=client, args=(n,)) for n in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors and received == [10] * 10


def test_wss_with_a_proxy_header_before_the_handshake(start_adapter, tmp_path: Path):
    """web_stomp.proxy_protocol on a wss:// listener: the PROXY header comes before the TLS
    handshake (a load balancer passing TLS through), and its address is the client's."""
    ca = trustme.CA()
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    adapter = start_adapter(
        web_stomp_ssl_listeners=["127.0.0.1:0"],
        web_stomp_ssl_certfile=str(tmp_path / "server.pem"),
        web_stomp_proxy_protocol=True,
    )
    port = adapter.server.web_addresses[0][1]
    context = ssl.create_default_context()
    ca.configure_trust(context)

    def first_answer(source: str) -> str:
        raw = socket.create_connection(("127.0.0.1", port), timeout=5)
        raw.sendall(f"PROXY TCP4 {source} 127.0.0.1 40000 15673\r\n".encode())
        with connect(f"wss://127.0.0.1:{port}/ws", sock=raw, ssl=context, subprotocols=["v12.stomp"]) as ws:
            ws.send(CONNECT)
            return str(recv(ws))

    assert "non-loopback access denied" in first_answer("203.0.113.7")
    assert command(first_answer("127.0.0.1")) == "CONNECTED"
