"""CONNECT / CONNECTED: versions, heart-beats, login failures, frames out of place, bad input."""

from __future__ import annotations

import socket

import pytest

from tests.compat.conversation import (
    ClosedWithoutError,
    Conversation,
    Custom,
    ErrorBody,
    ErrorCloses,
    ErrorReceiptId,
    HeaderValue,
    Step,
    Transcript,
    connect,
    disconnect,
    frame,
    send,
)

pytestmark = pytest.mark.compat


@pytest.mark.parametrize(
    "accept_version",
    ["1.0", "1.1", "1.2", "1.0,1.1,1.2", "1.1,2.0", "2.0,1.0", "1.2, 1.1", None],
    ids=lambda v: f"accept-version={v}",
)
def test_version_negotiation(compat, accept_version):
    """CONNECTED headers in order (server, session, heart-beat, version) for every negotiation
    outcome, then DISCONNECT with receipt."""
    compat(Conversation([Step(connect(accept_version), 1), Step(disconnect("d1"), 1)], names=()))


def test_stomp_command_and_connect_receipt(compat):
    """STOMP instead of CONNECT; a receipt header on it gets no RECEIPT."""
    compat(
        Conversation(
            [Step(connect("1.1", ("receipt", "c1"), command="STOMP"), 1), Step(disconnect(), 1)], names=()
        )
    )


def _plugin_has_default_user(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"CONNECT\naccept-version:1.2\n\n\0")
        return sock.recv(4096).startswith(b"CONNECTED")


def test_default_credentials(compat, plugin_port, start_adapter):
    """CONNECT without login/passcode uses the configured default user, if there is one.

    The plugin's application default is guest/guest, but a broker configured through cuttlefish
    may have ``default_user = []`` (the 3.10.8 broker of the development machine has); the adapter
    under test is configured like the plugin it is compared with.
    """
    steps = [Step(frame("CONNECT", ("accept-version", "1.2")), 1), Step(disconnect(), 1)]
    if _plugin_has_default_user(plugin_port):
        compat(Conversation(steps, names=()), adapter_port=start_adapter().port)
    else:
        # ERROR "Missing login or passcode header(s)"; the plugin then answers the DISCONNECT with
        # "Illegal command", while the adapter has closed the connection after the first ERROR
        server = start_adapter(default_user="", default_pass="")
        compat(Conversation(steps[:1], names=()), expect=[ErrorCloses()], adapter_port=server.port)


def test_version_mismatch(compat):
    compat(Conversation([Step(connect("2.0,3.1"), 1)], names=()), expect=[ErrorCloses()])


# (client heart-beat, what the plugin answers, what the adapter answers).  The plugin rounds
# both intervals down to whole seconds (minimum 1 s); the adapter negotiates in milliseconds as
# the spec says, with a 100 ms floor.
HEART_BEATS = [
    ("0,0", "0,0", "0,0"),
    ("-1,-1", "0,0", "0,0"),
    ("500,1500", "1000,1000", "1500,500"),
    ("5000,3000", "3000,5000", "3000,5000"),
    ("10000,20000", "20000,10000", "20000,10000"),
    ("100,100", "1000,1000", "100,100"),
    ("999,0", "0,1000", "0,999"),
    ("50,2500", "2000,1000", "2500,100"),
]


@pytest.mark.parametrize(("client", "plugin_hb", "adapter_hb"), HEART_BEATS, ids=[h[0] for h in HEART_BEATS])
def test_heart_beat_negotiation(compat, client, plugin_hb, adapter_hb):
    expect = []
    if plugin_hb != adapter_hb:
        expect.append(
            HeaderValue(
                "CONNECTED",
                "heart-beat",
                plugin_hb,
                adapter_hb,
                why="heart-beats negotiated in ms (100 ms floor), the plugin rounds to whole seconds",
            )
        )
    compat(
        Conversation([Step(connect("1.2", ("heart-beat", client)), 1), Step(disconnect(), 1)], names=()),
        expect=expect,
    )


def test_heart_beat_for_stomp_10(compat):
    """A 1.0 client's heart-beat header is honoured too."""
    compat(
        Conversation([Step(connect("1.0", ("heart-beat", "0,5000")), 1), Step(disconnect(), 1)], names=()),
    )


def test_bad_password(compat):
    compat(Conversation([Step(connect("1.2", passcode="wrong"), 1)], names=()), expect=[ErrorCloses()])


def test_unknown_vhost(compat):
    compat(Conversation([Step(connect("1.2", host="{v}"), 1)], names=("v",)), expect=[ErrorCloses()])


def test_frame_before_connect(compat):
    compat(
        Conversation([Step(send("/queue/{q}", ("receipt", "r"), body="early"), 1)]),
        expect=[ErrorCloses(), ErrorReceiptId("r")],
    )


@pytest.mark.parametrize("command", ["FOO", "send", "SEND "], ids=repr)
def test_unknown_command(compat, command):
    compat(
        Conversation(
            [Step(connect("1.2"), 1), Step(frame(command, ("destination", "/queue/x")), 1)], names=()
        ),
        expect=[ErrorCloses()],
    )


def test_second_connect(compat):
    """The plugin's connection process crashes on a second CONNECT (silent close)."""
    compat(
        Conversation([Step(connect("1.2"), 1), Step(connect("1.2"), 1)], names=()),
        expect=[ClosedWithoutError("Already connected")],
    )


def test_parse_error_header_without_colon(compat):
    compat(
        Conversation([Step(connect("1.2"), 1), Step(frame("SEND", "destination:/queue/{q}", "nocolon"), 1)]),
        expect=[ClosedWithoutError("Bad header")],
    )


def test_connect_headers_are_not_unescaped(compat):
    """STOMP 1.2: CONNECT headers are not escaped, so ``\\c`` in a login stays two characters;
    the plugin decodes it (``no:body``)."""
    compat(
        Conversation([Step(connect("1.2", login="no\\cbody", passcode="x"), 1)], names=()),
        expect=[
            ErrorCloses(),
            ErrorBody(
                "Bad CONNECT",
                b"Access refused for user 'no:body'\n",
                b"Access refused for user 'no\\cbody'\n",
                "CONNECT/STOMP headers are taken literally (STOMP 1.2: CONNECT frames are not escaped)",
            ),
        ],
    )


def _content_length_on_subscribe(plugin: Transcript, adapter: Transcript) -> None:
    """content-length on a SUBSCRIBE: the plugin ignores it (reads to the NUL) and subscribes;
    the adapter honours it (STOMP 1.2: any frame may have a content-length), so it waits for a
    5-byte body, takes the NUL and the start of the next frame as that body, finds no NUL after
    it and closes with a parse error."""
    assert [f.command for f in plugin.steps[1].received[0].frames] == ["RECEIPT"]
    assert [f.command for f in plugin.steps[2].received[0].frames] == ["RECEIPT"]
    assert adapter.steps[1].received[0].frames == [] and not adapter.steps[1].received[0].closed
    a = adapter.steps[2].received[0]
    assert [f.command for f in a.frames] == ["ERROR"] and a.closed, a
    assert a.frames[0].header("message") == "Bad frame", a.frames[0].headers
    adapter.steps[1].received[0].frames = list(plugin.steps[1].received[0].frames)
    a.frames = list(plugin.steps[2].received[0].frames)
    # the plugin declared the queue (durable, so it stays); the adapter never got that far
    assert [q["name"] for q in plugin.state] == ["{q}"] and adapter.state == [], adapter.state
    plugin.state = []


def test_content_length_on_subscribe(compat):
    compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                Step(
                    frame(
                        "SUBSCRIBE", ("destination", "/queue/{q}"), ("receipt", "r"), ("content-length", "5")
                    ),
                    1,
                    timeout=0.5,
                ),
                Step(disconnect("d"), 1),
            ]
        ),
        expect=[
            Custom(_content_length_on_subscribe, "content-length is honoured on every frame (STOMP 1.2)")
        ],
    )
