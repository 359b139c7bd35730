"""BEGIN / COMMIT / ABORT, transactional ACK, transaction errors; receipts and DISCONNECT."""

from __future__ import annotations

import pytest

from tests.compat.conversation import (
    Conversation,
    Custom,
    ErrorCloses,
    ErrorReceiptId,
    NoFrameControlHeaders,
    Step,
    Transcript,
    capture,
    connect,
    disconnect,
    frame,
    send,
    subscribe,
)

pytestmark = pytest.mark.compat


def test_commit(compat):
    """Buffered SENDs are published at COMMIT; COMMIT's RECEIPT comes before the SEND's RECEIPT
    (a publisher confirm); the plugin's MESSAGEs carry transaction and receipt headers."""
    compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                Step(subscribe("/queue/{q}", ("id", "s"), ("receipt", "r")), 1),
                Step(frame("BEGIN", ("transaction", "tx1"), ("receipt", "b")), 1),
                Step(send("/queue/{q}", ("transaction", "tx1"), body="first"), 0),
                Step(send("/queue/{q}", ("transaction", "tx1"), ("receipt", "s2"), body="second"), 0),
                Step(frame("COMMIT", ("transaction", "tx1"), ("receipt", "c")), 4, unordered=True),
            ]
        ),
        expect=[NoFrameControlHeaders(("transaction", "receipt"))],
    )


def _commit_receipt_after_confirms(plugin: Transcript, adapter: Transcript) -> None:
    """The plugin answers COMMIT before the broker has confirmed its publish; the adapter's COMMIT
    RECEIPT waits for that confirm, which also releases the SEND's receipt, so it comes second."""
    p_ids = [f.header("receipt-id") for f in plugin.steps[-1].received[0].frames]
    a_frames = adapter.steps[-1].received[0].frames
    assert p_ids == ["c", "s1"], p_ids
    assert [f.header("receipt-id") for f in a_frames] == ["s1", "c"]
    a_frames.reverse()


def test_commit_receipt_order(compat):
    """Without a subscriber: the plugin sends COMMIT's RECEIPT, then the SEND's; the adapter's
    COMMIT RECEIPT waits for the confirms, after the SEND's (docs/compatibility.md, 16)."""
    compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                Step(frame("BEGIN", ("transaction", "tx1")), 0),
                Step(send("/queue/{q}", ("transaction", "tx1"), ("receipt", "s1"), body="one"), 0),
                Step(frame("COMMIT", ("transaction", "tx1"), ("receipt", "c")), 2),
            ]
        ),
        expect=[Custom(_commit_receipt_after_confirms, "a COMMIT RECEIPT means the broker has the messages")],
    )


def test_abort(compat):
    compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                Step(frame("BEGIN", ("transaction", "tx1")), 0),
                Step(send("/queue/{q}", ("transaction", "tx1"), body="dropped"), 0),
                Step(frame("ABORT", ("transaction", "tx1"), ("receipt", "a")), 1),
                Step(subscribe("/queue/{q}", ("id", "s"), ("receipt", "r")), 1),
            ]
        )
    )


def test_transactional_ack(compat):
    """An ACK in a transaction takes effect at COMMIT (the message stays unacked until then)."""
    compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                Step(send("/queue/{q}", body="m"), 0),
                Step(
                    subscribe("/queue/{q}", ("id", "s"), ("ack", "client-individual")),
                    1,
                    capture=capture("MESSAGE", "ack", "m"),
                ),
                Step(frame("BEGIN", ("transaction", "t")), 0),
                Step(frame("ACK", ("id", "{m}"), ("transaction", "t"), ("receipt", "a")), 1),
                Step(frame("ABORT", ("transaction", "t")), 0),
                Step(frame("BEGIN", ("transaction", "t2")), 0),
                Step(frame("ACK", ("id", "{m}"), ("transaction", "t2")), 0),
                Step(frame("COMMIT", ("transaction", "t2"), ("receipt", "c")), 1),
                Step(frame("UNSUBSCRIBE", ("id", "s"), ("receipt", "u")), 1),
            ]
        )
    )


TX_ERRORS = [
    [frame("BEGIN", ("receipt", "x"))],
    [frame("COMMIT", ("receipt", "x"))],
    [frame("ABORT", ("receipt", "x"))],
    [frame("COMMIT", ("transaction", "nope"), ("receipt", "x"))],
    [frame("ABORT", ("transaction", "nope"), ("receipt", "x"))],
]


@pytest.mark.parametrize("frames", TX_ERRORS, ids=lambda f: repr(f[0].split("\n\n")[0]))
def test_transaction_errors(compat, frames):
    compat(
        Conversation([Step(connect("1.2"), 1), *[Step(f, 1) for f in frames]]),
        expect=[ErrorCloses(), ErrorReceiptId("x")],
    )


@pytest.mark.parametrize("destination", ["/queue/{q}", "/queue/a/b"], ids=repr)
def test_send_with_unknown_transaction(compat, destination):
    compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                Step(send(destination, ("transaction", "nope"), ("receipt", "x"), body="m"), 1),
            ]
        ),
        expect=[ErrorCloses(), ErrorReceiptId("x")],
    )


def _begin_twice(plugin: Transcript, adapter: Transcript) -> None:
    """The plugin silently resets an open transaction on a second BEGIN (RECEIPT, connection
    stays usable); the adapter refuses: ERROR 'Bad transaction' with receipt-id, then close."""
    p_frames = plugin.steps[3].received[0].frames
    a_result = adapter.steps[3].received[0]
    assert [f.command for f in p_frames] == ["RECEIPT"], p_frames
    assert plugin.closed_at(0) is None
    assert [f.command for f in a_result.frames] == ["ERROR"] and a_result.closed, a_result
    error = a_result.frames[0]
    assert error.header("message") == "Bad transaction", error.headers
    assert error.header("receipt-id") == "b2", error.headers
    a_result.frames, a_result.closed = list(p_frames), False


def test_begin_of_open_transaction(compat):
    compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                Step(frame("BEGIN", ("transaction", "t"), ("receipt", "b1")), 1),
                Step(send("/queue/{q}", ("transaction", "t"), body="first"), 0),
                Step(frame("BEGIN", ("transaction", "t"), ("receipt", "b2")), 1),
            ]
        ),
        expect=[Custom(_begin_twice, "BEGIN of an open transaction is an error")],
    )


def test_send_receipt_then_disconnect(compat):
    """SEND with receipt and DISCONNECT with receipt in one packet: the plugin loses the SEND's
    receipt (still waiting for its confirm when the connection closes); the adapter waits for the
    confirm and sends both."""

    def check(plugin: Transcript, adapter: Transcript) -> None:
        p = plugin.steps[1].received[0]
        a = adapter.steps[1].received[0]
        assert [f.header("receipt-id") for f in p.frames] == ["d"], p.frames
        assert [f.header("receipt-id") for f in a.frames] == ["s", "d"], a.frames
        del a.frames[0]

    compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                Step(lambda ctx: send("/queue/{q}", ("receipt", "s"), body="m") + disconnect("d"), 1),
            ],
            state_after_close=True,
        ),
        expect=[Custom(check, "DISCONNECT waits for pending publisher confirms")],
    )
