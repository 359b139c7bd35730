"""ACK / NACK in the three ack modes, and ACK errors."""

from __future__ import annotations

import pytest

from tests.compat.conversation import (
    Conversation,
    ErrorCloses,
    ErrorReceiptId,
    Step,
    capture,
    connect,
    disconnect,
    frame,
    send,
    subscribe,
)

pytestmark = pytest.mark.compat


def _fill(count: int) -> list[Step]:
    return [Step(send("/queue/{q}", body=f"m{i}"), 0) for i in range(1, count + 1)]


def test_client_individual_ack_and_nack(compat):
    """ACK one, NACK (requeue by default) the other: it comes back redelivered; ACK it."""
    compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                *_fill(2),
                Step(
                    subscribe("/queue/{q}", ("id", "s"), ("ack", "client-individual")),
                    2,
                    capture=lambda frames, ctx: ctx.update(
                        first=frames[0].header("ack") or "", second=frames[1].header("ack") or ""
                    ),
                ),
                Step(frame("ACK", ("id", "{first}"), ("receipt", "a1")), 1),
                Step(
                    frame("NACK", ("id", "{second}"), ("receipt", "n1")),
                    2,
                    capture=capture("MESSAGE", "ack", "again"),
                ),
                Step(frame("ACK", ("id", "{again}"), ("receipt", "a2")), 1),
                Step(disconnect(), 1),
            ]
        )
    )


def test_client_ack_is_cumulative(compat):
    """ack:client — one ACK of the third message acknowledges all three; prefetch-count limits
    the deliveries meanwhile; the queue is empty afterwards."""
    compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                *_fill(4),
                Step(
                    subscribe("/queue/{q}", ("id", "s"), ("ack", "client"), ("prefetch-count", "3")),
                    3,
                    capture=capture("MESSAGE", "ack", "third", index=2),
                ),
                Step(frame("ACK", ("id", "{third}"), ("receipt", "a")), 2),
                Step(frame("UNSUBSCRIBE", ("id", "s"), ("receipt", "u")), 1),
            ]
        )
    )


def test_nack_without_requeue(compat):
    compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                *_fill(1),
                Step(
                    subscribe("/queue/{q}", ("id", "s"), ("ack", "client-individual")),
                    1,
                    capture=capture("MESSAGE", "ack", "m"),
                ),
                Step(frame("NACK", ("id", "{m}"), ("requeue", "false"), ("receipt", "n")), 1),
                Step(frame("UNSUBSCRIBE", ("id", "s"), ("receipt", "u")), 1),
            ]
        )
    )


def test_unacked_messages_return_after_disconnect(compat):
    compat(
        Conversation(
            [
                Step(connect("1.1"), 1),
                *_fill(2),
                Step(subscribe("/queue/{q}", ("id", "s"), ("ack", "client")), 2),
                Step(disconnect(), 1),
            ],
            state_after_close=True,
        )
    )


ACK_ERRORS = [
    ("1.2", "ACK", []),
    ("1.2", "NACK", []),
    ("1.1", "ACK", [("id", "T_s@@x@@1")]),  # 1.1 reads message-id, not id
    ("1.2", "ACK", [("id", "not-an-ack-id")]),
    ("1.2", "ACK", [("id", "T_nosuch@@session-x@@1")]),
    ("1.2", "NACK", [("id", "a@@b@@c@@d")]),
]


@pytest.mark.parametrize(("version", "command", "headers"), ACK_ERRORS, ids=lambda v: repr(v))
def test_ack_errors(compat, version, command, headers):
    compat(
        Conversation(
            [
                Step(connect(version), 1),
                Step(subscribe("/queue/{q}", ("id", "s"), ("ack", "client")), 0),
                Step(frame(command, *headers, ("receipt", "r")), 1),
            ]
        ),
        expect=[ErrorCloses(), ErrorReceiptId("r")],
    )


def test_ack_unknown_delivery_tag(compat):
    """The ACK goes to the broker, which closes the channel: RECEIPT, then ERROR
    precondition_failed, then close."""
    compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                Step(subscribe("/queue/{q}", ("id", "s"), ("ack", "client")), 0),
                Step(frame("ACK", ("id", "T_s@@session-whatever@@42"), ("receipt", "r")), 2),
            ]
        ),
    )


def test_client_ack_is_channel_wide(compat):
    """Kept from the plugin (one AMQP channel per STOMP connection): a cumulative ``client`` ACK
    also acknowledges earlier deliveries of *other* subscriptions on the connection."""
    plugin, adapter = compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                Step(send("/queue/{q}", body="individual"), 0),
                Step(send("/queue/{r}", body="cumulative"), 0),
                Step(subscribe("/queue/{q}", ("id", "i"), ("ack", "client-individual")), 1),
                Step(
                    subscribe("/queue/{r}", ("id", "c"), ("ack", "client")),
                    1,
                    capture=capture("MESSAGE", "ack", "c"),
                ),
                Step(frame("ACK", ("id", "{c}"), ("receipt", "a")), 1),
                Step(disconnect(), 1),
            ],
            names=("q", "r"),
            state_after_close=True,
        )
    )
    # both queues are empty after the disconnect: nothing was left unacked to be requeued
    for transcript in (plugin, adapter):
        assert [q["messages"] for q in transcript.state_after_close or []] == [0, 0], (
            transcript.state_after_close
        )
