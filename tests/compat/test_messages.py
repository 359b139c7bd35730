"""MESSAGE frames: header order, properties, escaping, per-version ids, AMQP-published messages,
temp-queue replies."""

from __future__ import annotations

import pytest

from tests.compat.conversation import (
    AMQP_VIEW,
    Custom,
    NoFrameControlHeaders,
    Step,
    Transcript,
    amqp_message_frame,
    capture,
    connect,
    disconnect,
    frame,
    send,
    subscribe,
)
from tests.compat.conversation import Conversation as C

pytestmark = pytest.mark.compat

PROPERTIES = [
    ("content-type", "text/plain"),
    ("correlation-id", "c-1"),
    ("persistent", "true"),
    ("priority", "5"),
    ("type", "t"),
    ("app-id", "app"),
    ("amqp-message-id", "m-1"),
    ("reply-to", "/queue/replies"),
    ("expiration", "600000"),
    ("timestamp", "1700000000"),
    ("user-id", "guest"),
    ("content-encoding", "identity"),
    ("x-custom", "a\\cb\\nc\\\\d"),
]


def test_message_headers_and_properties(compat):
    """Every AMQP property a SEND can set, a custom header with escapes, 1.2 client-individual
    (``ack`` header), ACK by id; then the queue is empty."""
    compat(
        C(
            [
                Step(connect("1.2"), 1),
                Step(send("/queue/{q}", *PROPERTIES, ("receipt", "s1"), body="payload"), 1),
                Step(
                    subscribe("/queue/{q}", ("id", "s"), ("ack", "client-individual"), ("receipt", "r1")),
                    2,
                    unordered=True,
                    capture=capture("MESSAGE", "ack", "ack"),
                ),
                Step(frame("ACK", ("id", "{ack}"), ("receipt", "a1")), 1),
                Step(disconnect(), 1),
            ]
        ),
        expect=[NoFrameControlHeaders(("receipt",))],
    )


def test_custom_header_order(compat):
    compat(
        C(
            [
                Step(connect("1.2"), 1),
                Step(subscribe("/queue/{q}", ("id", "s"), ("receipt", "r1")), 1),
                # neither sorted nor reverse-sorted, so frame order, reversed order and a broker that
                # sorts the table (it does not, for tables published over the network) all differ
                Step(send("/queue/{q}", ("zeta", "1"), ("alpha", "2"), ("mid", "3"), body="x"), 1),
            ]
        )
    )


def test_content_length_and_nul_body(compat):
    """A body with NUL bytes framed by content-length.  (The plugin copies the SEND's
    content-length into the AMQP headers table but removes it again when it renders the MESSAGE,
    so STOMP clients see no difference; see test_amqp_view_of_a_send for AMQP consumers.)"""
    compat(
        C(
            [
                Step(connect("1.2"), 1),
                Step(send("/queue/{q}", ("content-length", "5"), body=b"a\0b\0c"), 0),
                Step(subscribe("/queue/{q}", ("id", "s")), 1),
            ]
        ),
    )


def test_stomp_11_client_ack_with_message_id(compat):
    """1.1: no ``ack`` header on MESSAGE, ACK by ``message-id``; cumulative ``client`` mode."""
    compat(
        C(
            [
                Step(connect("1.1"), 1),
                Step(send("/queue/{q}", body="one"), 0),
                Step(send("/queue/{q}", body="two"), 0),
                Step(
                    subscribe("/queue/{q}", ("id", "s"), ("ack", "client")),
                    2,
                    capture=capture("MESSAGE", "message-id", "last", index=1),
                ),
                Step(frame("ACK", ("message-id", "{last}"), ("subscription", "s"), ("receipt", "a")), 1),
                Step(disconnect(), 1),
            ]
        )
    )


def test_stomp_10_left_trimming(compat):
    """1.0: header values (destination, receipt, custom) are left-trimmed, trailing blanks kept."""
    compat(
        C(
            [
                Step(connect("1.0"), 1),
                Step(subscribe(" /queue/{q}", ("receipt", " r1")), 1),
                Step(send("  /queue/{q}", ("h", "  v w "), body="1.0"), 1),
                Step(disconnect(), 1),
            ]
        )
    )


def _stomp_10_escapes(plugin: Transcript, adapter: Transcript) -> None:
    """The plugin decodes escapes for 1.0 too (``\\c`` arrives as ``:``); the adapter takes 1.0
    header bytes literally (1.0 has no escaping), so the backslash is part of the value.  Both
    escape on output, so the plugin shows ``\\c`` and the adapter ``\\\\c``."""
    p = plugin.frames(0, "MESSAGE")[0]
    a = adapter.frames(0, "MESSAGE")[0]
    assert ("k\\c", "v\\cw") in p.headers, p.headers
    assert ("k\\\\c", "v\\\\cw") in a.headers, a.headers
    a.headers = [(k.replace("\\\\", "\\"), v.replace("\\\\", "\\")) for k, v in a.headers]


def test_stomp_10_escapes(compat):
    compat(
        C(
            [
                Step(connect("1.0"), 1),
                Step(subscribe("/queue/{q}", ("receipt", "r1")), 1),
                Step(send("/queue/{q}", ("k\\c", "v\\cw"), body="1.0"), 1),
            ]
        ),
        expect=[Custom(_stomp_10_escapes, "STOMP 1.0 has no header escaping: 1.0 input is taken literally")],
    )


def _typed_headers(plugin: Transcript, adapter: Transcript) -> None:
    """The plugin keeps only longstr and 32/64-bit signed integers of the AMQP headers table and
    drops every other type; the adapter renders all of them as text."""
    p = plugin.frames(0, "MESSAGE")[0]
    a = adapter.frames(0, "MESSAGE")[0]
    dropped = {"flag", "small", "short", "float", "nested", "array", "void"}
    assert not dropped & {k for k, _ in p.headers}, p.headers
    extra = [(k, v) for k, v in a.headers if k in dropped]
    assert dict(extra) == {
        "flag": "true",
        "small": "7",
        "short": "1000",
        "float": "1.5",
        "nested": '{"a"\\c"b"}',  # ':' escaped on the wire
        "array": '[1,"x"]',
        "void": "",
    }, extra
    a.headers = [(k, v) for k, v in a.headers if k not in dropped]


async def _publish_typed(channel, ctx):
    import aio_pika

    headers = {
        "text": "plain",
        "int32": 70000,
        "int64": 2**40,
        "flag": True,
        "small": 7,
        "short": 1000,
        "float": 1.5,
        "nested": {"a": "b"},
        "array": [1, "x"],
        "void": None,
    }
    await channel.default_exchange.publish(
        aio_pika.Message(b"from amqp", headers=headers, content_type="application/x", message_id="m"),
        routing_key=ctx["q"],
    )


def test_amqp_published_header_types(compat):
    """A message published by an AMQP 0-9-1 client with header values of many field types."""
    compat(
        C(
            [
                Step(connect("1.2"), 1),
                Step(subscribe("/queue/{q}", ("id", "s"), ("durable", "false"), ("receipt", "r")), 1),
                Step(amqp=_publish_typed, expect=1),
            ]
        ),
        expect=[Custom(_typed_headers, "non-string AMQP header values are shown as text")],
    )


def test_temp_queue_reply_to(compat):
    """reply-to:/temp-queue/… creates a private queue; the replier sees /reply-queue/amq.gen-…,
    replies there, and the requester gets the reply on subscription /temp-queue/…"""
    compat(
        C(
            [
                Step(connect("1.2"), 1, conn=0),
                Step(connect("1.2"), 1, conn=1),
                Step(subscribe("/queue/{q}", ("id", "server"), ("receipt", "r1")), 1, conn=1),
                Step(
                    send("/queue/{q}", ("reply-to", "/temp-queue/answers"), ("receipt", "s1"), body="ping"),
                    {0: 1, 1: 1},
                    conn=0,
                    capture=capture("MESSAGE", "reply-to", "reply"),
                ),
                Step(send("{reply}", ("receipt", "s2"), body="pong"), {1: 1, 0: 1}, conn=1),
                Step(send("/queue/{q}", ("reply-to", "/temp-queue/answers"), body="again"), {1: 1}, conn=0),
            ]
        ),
        expect=[NoFrameControlHeaders(("receipt",))],
    )


async def _get_one(channel, ctx):
    queue = await channel.get_queue(ctx["q"], ensure=False)
    message = await queue.get(no_ack=True, fail=False)
    return [] if message is None else [amqp_message_frame(message)]


def _frame_control_in_table(plugin: Transcript, adapter: Transcript) -> None:
    p = plugin.frames(AMQP_VIEW, "AMQP")[0]
    a = adapter.frames(AMQP_VIEW, "AMQP")[0]
    control = {"table:receipt", "table:transaction", "table:content-length"}
    assert control <= {k for k, _ in p.headers}, p.headers
    assert not control & {k for k, _ in a.headers}, a.headers
    p.headers = [(k, v) for k, v in p.headers if k not in control]


def test_amqp_view_of_a_send(compat):
    """What an AMQP consumer gets from a transactional SEND with receipt and content-length:
    properties and headers table.  (The order of the two RECEIPTs differs on purpose:
    test_commit_receipt_order.)"""
    compat(
        C(
            [
                Step(connect("1.2"), 1),
                Step(frame("BEGIN", ("transaction", "t"), ("receipt", "b")), 1),
                Step(
                    send(
                        "/queue/{q}",
                        ("transaction", "t"),
                        ("receipt", "s1"),
                        ("content-length", "4"),
                        ("custom", "1"),
                        ("persistent", "true"),
                        ("content-type", "text/x"),
                        body="body",
                    ),
                    0,
                ),
                Step(frame("COMMIT", ("transaction", "t"), ("receipt", "c")), 2, unordered=True),
                Step(amqp=_get_one),
            ]
        ),
        expect=[Custom(_frame_control_in_table, "frame-control headers are not copied into the AMQP table")],
    )
