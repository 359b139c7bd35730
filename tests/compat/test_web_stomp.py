"""The adapter's web_stomp listener against RabbitMQ's rabbitmq_web_stomp plugin (port 15674,
path /ws): the same conversations over WebSocket, compared frame by frame, with the servers'
Close frames (code and reason) and the broker state.  Each declared difference is listed in
docs/compatibility.md ("Web STOMP")."""

from __future__ import annotations

import http.client

import pytest

from tests.compat.conversation import (
    Conversation,
    Custom,
    ErrorCloses,
    NoFrameControlHeaders,
    Step,
    Transcript,
    WsMessages,
    capture,
    connect,
    disconnect,
    frame,
    send,
    subscribe,
)

pytestmark = pytest.mark.compat


def disconnect_receipt(receipt: str = "bye", conn: int = 0) -> Custom:
    """rabbitmq_web_stomp closes the WebSocket on DISCONNECT before the RECEIPT it asked for goes
    out (the RECEIPT is lost); the adapter sends the RECEIPT, then closes (STOMP 1.2: a DISCONNECT
    with a receipt gets its RECEIPT)."""

    def check(plugin: Transcript, adapter: Transcript) -> None:
        p_step, a_step = plugin.closed_at(conn), adapter.closed_at(conn)
        assert p_step is not None and p_step == a_step, (p_step, a_step)
        p_frames = plugin.steps[p_step].received[conn].frames
        a_frames = adapter.steps[a_step].received[conn].frames
        assert [f.command for f in p_frames] == [], p_frames
        assert [(f.command, f.header("receipt-id")) for f in a_frames] == [("RECEIPT", receipt)], a_frames
        a_frames.clear()

    return Custom(check, "the RECEIPT of a DISCONNECT is sent before the close")


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2", "1.0,1.1,1.2"])
def test_connect_and_disconnect(web_compat, version):
    web_compat(
        Conversation([Step(connect(version), 1), Step(disconnect(), 1)], names=()),
        expect=[disconnect_receipt()],
    )


def test_disconnect_without_receipt(web_compat):
    web_compat(Conversation([Step(connect("1.2"), 1), Step(disconnect(None), 0)], names=()))


@pytest.mark.parametrize(
    "destination", ["/queue/{q}", "/topic/{q}", "/exchange/amq.direct/{q}", "/amq/queue/{q}"]
)
def test_subscribe_send_receive(web_compat, destination):
    steps = [Step(connect("1.2"), 1)]
    if destination.startswith("/amq/queue/"):
        steps.append(Step(subscribe("/queue/{q}", ("id", "0"), ("receipt", "d")), 1))
    steps += [
        Step(subscribe(destination, ("id", "1"), ("receipt", "r")), 1),
        Step(
            send(destination, ("receipt", "s"), ("content-type", "text/plain"), body="hello"),
            2,
            unordered=True,
        ),
        Step(send(destination, ("x-custom", "a\\cb"), body="second"), 1),
    ]
    web_compat(Conversation(steps), expect=[NoFrameControlHeaders()])


def test_client_ack_nack_and_redelivery(web_compat):
    """ACK and NACK over WebSocket; the nacked message comes back redelivered."""
    web_compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                Step(send("/queue/{q}", body="one"), 0),
                Step(send("/queue/{q}", body="two"), 0),
                Step(
                    subscribe(
                        "/queue/{q}", ("id", "1"), ("ack", "client-individual"), ("prefetch-count", "1")
                    ),
                    1,
                    capture=capture("MESSAGE", "ack", "ack1"),
                ),
                Step(
                    frame("ACK", ("id", "{ack1}"), ("receipt", "a")),
                    2,
                    unordered=True,
                    capture=capture("MESSAGE", "ack", "ack2"),
                ),
                Step(frame("NACK", ("id", "{ack2}"), ("receipt", "n")), 2, unordered=True),
            ]
        )
    )


def test_transaction(web_compat):
    web_compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                Step(subscribe("/queue/{q}", ("id", "1"), ("receipt", "r")), 1),
                Step(frame("BEGIN", ("transaction", "t1")), 0),
                Step(send("/queue/{q}", ("transaction", "t1"), body="in tx"), 0),
                Step(frame("COMMIT", ("transaction", "t1"), ("receipt", "c")), 2, unordered=True),
                Step(frame("BEGIN", ("transaction", "t2")), 0),
                Step(send("/queue/{q}", ("transaction", "t2"), body="aborted"), 0),
                Step(frame("ABORT", ("transaction", "t2"), ("receipt", "a")), 1),
            ]
        ),
        expect=[NoFrameControlHeaders(("transaction",))],
    )


def test_reply_to_temp_queue(web_compat):
    web_compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                Step(subscribe("/queue/{q}", ("id", "1"), ("receipt", "r")), 1),
                Step(send("/queue/{q}", ("reply-to", "/temp-queue/answers"), body="question"), 1),
            ]
        )
    )


def test_bad_password(web_compat):
    web_compat(Conversation([Step(connect("1.2", passcode="wrong"), 1)], names=()), expect=[ErrorCloses()])


@pytest.mark.parametrize("command", ["FOO", "send"])
def test_unknown_command(web_compat, command):
    web_compat(
        Conversation(
            [Step(connect("1.2"), 1), Step(frame(command, ("destination", "/queue/x")), 1)], names=()
        ),
        expect=[ErrorCloses()],
    )


def test_invalid_destination(web_compat):
    web_compat(
        Conversation([Step(connect("1.2"), 1), Step(send("/queue/a/b", body="x"), 1)], names=()),
        expect=[ErrorCloses()],
    )


def test_heart_beat_header(web_compat):
    web_compat(Conversation([Step(connect("1.2", ("heart-beat", "0,0")), 1)], names=()))


def test_frame_before_connect(web_compat):
    web_compat(Conversation([Step(send("/queue/{q}", body="early"), 1)]), expect=[ErrorCloses()])


def closed_with_1011_without_error(message: str, conn: int = 0) -> Custom:
    """rabbitmq_web_stomp closes with 1011 (internal error: its frame parser crashed) and no
    ERROR; the adapter sends ERROR ``message`` and closes with 1000 ``STOMP died`` (STOMP 1.2: an
    ERROR before the close; the same difference as number 3 over TCP)."""

    def check(plugin: Transcript, adapter: Transcript) -> None:
        step = plugin.closed_at(conn)
        assert step is not None and adapter.closed_at(conn) == step
        p_result, a_result = plugin.steps[step].received[conn], adapter.steps[step].received[conn]
        assert p_result.frames == [] and p_result.close_frame == "1011", p_result
        assert [f.command for f in a_result.frames] == ["ERROR"], a_result.frames
        assert a_result.frames[0].header("message") == message
        assert a_result.close_frame == "1000 STOMP died", a_result.close_frame
        a_result.frames.clear()
        a_result.close_frame = p_result.close_frame

    return Custom(check, "an ERROR before the close for a frame that cannot be parsed")


def test_parse_error(web_compat):
    web_compat(
        Conversation(
            [Step(connect("1.2"), 1), Step(b"SEND\ndestination:/queue/x\ncontent-length:zz\n\nabc\0", 1)],
            names=(),
        ),
        expect=[closed_with_1011_without_error("Bad content-length")],
    )


@pytest.mark.parametrize(
    "offered",
    [
        ("v10.stomp", "v11.stomp"),
        ("v12.stomp", "v10.stomp"),
        ("stomp",),
        ("mqtt",),  # no STOMP sub-protocol: the handshake succeeds without one
        (),
    ],
)
def test_subprotocol_choice(web_compat, offered):
    web_compat(Conversation([Step(connect("1.2"), 1)], names=(), subprotocols=offered))


def test_several_frames_in_one_message(web_compat):
    joined = (
        connect("1.2"),
        subscribe("/queue/{q}", ("id", "1"), ("receipt", "r")),
        send("/queue/{q}", body="joined"),
    )
    web_compat(Conversation([Step(WsMessages(("".join(joined),)), 3)]))


def test_one_frame_over_several_messages(web_compat):
    web_compat(
        Conversation(
            [
                Step(
                    WsMessages(("CONN", "ECT\naccept-version:1.2\nlogin:guest\n", "passcode:guest\n\n\0")), 1
                ),
                Step(subscribe("/queue/{q}", ("id", "1"), ("receipt", "r")), 1),
                # split inside the command, a header, the body, and before the NUL; heart-beat
                # EOLs in a message of their own between two frames
                Step(WsMessages(("SE", "ND\ndestination:/queue/{q}\n\nsp", "lit", "\0", "\n\n")), 1),
                Step(WsMessages(("SEND\ndestination:/queue/{q}\n\nlast\0",)), 1),
            ]
        )
    )


def test_binary_messages_on_a_text_listener(web_compat):
    """A client may send binary messages; both servers answer in text (web_stomp.ws_frame)."""
    web_compat(
        Conversation(
            [
                Step(WsMessages((connect("1.2"),), opcode="binary"), 1),
                Step(
                    WsMessages((subscribe("/queue/{q}", ("id", "1"), ("receipt", "r")),), opcode="binary"), 1
                ),
                Step(WsMessages((send("/queue/{q}", body="binary in"),), opcode="binary"), 1),
            ]
        )
    )


def close_1007_with_reason(conn: int = 0) -> Custom:
    """Both close with 1007 for invalid UTF-8 in a text message; the adapter says why
    (docs/compatibility.md W4), the plugin gives no reason."""

    def check(plugin: Transcript, adapter: Transcript) -> None:
        step = plugin.closed_at(conn)
        assert step is not None and adapter.closed_at(conn) == step
        p_result, a_result = plugin.steps[step].received[conn], adapter.steps[step].received[conn]
        assert p_result.close_frame == "1007", p_result
        assert a_result.close_frame == "1007 Invalid UTF-8 in a text message", a_result
        a_result.close_frame = p_result.close_frame

    return Custom(check, "a reason with close 1007")


def test_invalid_utf8_in_a_text_message(web_compat):
    web_compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                Step(WsMessages((b"SEND\ndestination:/queue/x\n\n\xff\0",), opcode="text"), 1),
            ],
            names=(),
        ),
        expect=[close_1007_with_reason()],
    )


def http_get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, str | None]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        response.read()
        return response.status, response.getheader("upgrade")
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/ws", None),  # a plain GET on the WebSocket path: 426 with Upgrade: websocket
        ("/ws?x=1", None),
        ("/ws", {"Upgrade": "h2c", "Connection": "Upgrade"}),
        ("/nothing-here", None),  # 404
    ],
)
def test_plain_http_status(web_plugin_port, web_adapter, path, headers):
    """The status and Upgrade header of non-WebSocket requests, from both servers (their bodies
    and Connection headers differ: docs/compatibility.md W6)."""
    adapter_port = web_adapter.server.web_addresses[0][1]
    assert http_get(adapter_port, path, headers) == http_get(web_plugin_port, path, headers)
