"""SEND / SUBSCRIBE per destination type, destination errors, and what they leave in the broker."""

from __future__ import annotations

import pytest

from tests.compat.conversation import (
    Conversation,
    ErrorCloses,
    ErrorReceiptId,
    NoFrameControlHeaders,
    Step,
    connect,
    disconnect,
    frame,
    send,
    subscribe,
)

pytestmark = pytest.mark.compat

# every SEND below carries a receipt, which the plugin copies into the message headers
RECEIPT_HEADER = NoFrameControlHeaders(("receipt",))


def test_queue_send_then_subscribe(compat):
    """SEND to /queue declares a durable queue; SUBSCRIBE then gets the message."""
    compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                Step(send("/queue/{q}", ("receipt", "s1"), body="to queue"), 1),
                Step(subscribe("/queue/{q}", ("id", "sub-1"), ("receipt", "r1")), 2, unordered=True),
                Step(send("{q}", ("receipt", "s2"), body="bare name"), 2, unordered=True),
                Step(disconnect("d"), 1),
            ]
        ),
        expect=[RECEIPT_HEADER],
    )


def test_topic(compat):
    """SUBSCRIBE /topic declares a subscription queue bound to amq.topic."""
    compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                Step(subscribe("/topic/{q}", ("id", "t"), ("receipt", "r1")), 1),
                Step(subscribe("/topic/{q}.*", ("receipt", "r2")), 1),
                Step(send("/topic/{q}", ("receipt", "s1"), body="one"), 2, unordered=True),
                Step(send("/topic/{q}.x", ("receipt", "s2"), body="two"), 2, unordered=True),
            ]
        ),
        expect=[RECEIPT_HEADER],
    )


def test_exchange_with_routing_key(compat):
    compat(
        Conversation(
            [
                Step(connect("1.1"), 1),
                Step(subscribe("/exchange/amq.direct/{q}", ("id", "e"), ("receipt", "r1")), 1),
                Step(send("/exchange/amq.direct/{q}", ("receipt", "s1"), body="direct"), 2, unordered=True),
                Step(send("/exchange/amq.direct/other-{q}", ("receipt", "s2"), body="unroutable"), 1),
            ]
        ),
        expect=[RECEIPT_HEADER],
    )


def test_amq_queue_existing(compat):
    """/amq/queue uses an existing queue (declared here by a /queue SEND) without declaring it."""
    compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                Step(send("/queue/{q}", ("durable", "false"), ("receipt", "s1"), body="x"), 1),
                Step(subscribe("/amq/queue/{q}", ("receipt", "r1")), 2, unordered=True),
                Step(send("/amq/queue/{q}", ("receipt", "s2"), body="y"), 2, unordered=True),
            ]
        ),
        expect=[RECEIPT_HEADER],
    )


def test_amq_queue_missing_subscribe(compat):
    """Consume of a missing queue: ERROR not_found, the SUBSCRIBE's RECEIPT, then close."""
    compat(
        Conversation(
            [Step(connect("1.2"), 1), Step(subscribe("/amq/queue/{q}", ("id", "m"), ("receipt", "r1")), 2)]
        ),
        expect=[ErrorReceiptId("r1")],
    )


def test_amq_queue_missing_send(compat):
    """A publish to a missing queue is dropped by the broker and still confirmed."""
    compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                Step(send("/amq/queue/{q}", ("receipt", "s1"), body="lost"), 1),
                Step(disconnect(), 1),
            ]
        )
    )


def test_exchange_missing_send(compat):
    """A publish to a missing exchange closes the channel: ERROR not_found, no RECEIPT, close."""
    compat(
        Conversation(
            [Step(connect("1.2"), 1), Step(send("/exchange/{q}/k", ("receipt", "s1"), body="x"), 1)]
        ),
    )


def test_exchange_missing_subscribe(compat):
    """bind fails: ERROR not_found, RECEIPT, close; the subscription queue is deleted again."""
    compat(
        Conversation(
            [Step(connect("1.2"), 1), Step(subscribe("/exchange/{q}/k", ("id", "x"), ("receipt", "r1")), 2)],
            state_after_close=True,
        ),
        expect=[ErrorReceiptId("r1")],
    )


INVALID = [
    "/queue",
    "/queue/",
    "/queue/a/b",
    "/topic",
    "/topic/a/b",
    "/exchange",
    "/exchange//foo",
    "/exchange/a/b/c",
    "/amq/queue",
    "/reply-queue",
    "/foo/bar",
    "/Queue/x",
    "a/b",
    "",
    "/temp-queue/x",
]


@pytest.mark.parametrize("destination", INVALID, ids=repr)
def test_invalid_destination_send(compat, destination):
    compat(
        Conversation(
            [Step(connect("1.2"), 1), Step(send(destination, ("receipt", "s1"), body="x"), 1)], names=()
        ),
        expect=[ErrorCloses(), ErrorReceiptId("s1")],
    )


@pytest.mark.parametrize("destination", ["/queue/", "/topic/a/b", "", "/temp-queue/x", "/foo"], ids=repr)
def test_invalid_destination_subscribe(compat, destination):
    compat(
        Conversation([Step(connect("1.2"), 1), Step(subscribe(destination, ("id", "1")), 1)], names=()),
        expect=[ErrorCloses()],
    )


@pytest.mark.parametrize("command", ["SEND", "SUBSCRIBE"])
def test_missing_destination(compat, command):
    compat(
        Conversation([Step(connect("1.2"), 1), Step(frame(command, ("id", "1")), 1)], names=()),
        expect=[ErrorCloses()],
    )


def test_message_id_on_send(compat):
    compat(
        Conversation([Step(connect("1.2"), 1), Step(send("/queue/{q}", ("message-id", "m1"), body="x"), 1)]),
        expect=[ErrorCloses()],
    )


def test_exchange_missing_durable_subscribe(compat):
    compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                Step(
                    subscribe(
                        "/exchange/{q}/{q}",
                        ("id", "d"),
                        ("durable", "true"),
                        ("auto-delete", "false"),
                        ("receipt", "r1"),
                    ),
                    2,
                ),
            ],
            state_after_close=True,
            claim_unbound_subscription_queues=True,
        ),
        expect=[
            ErrorReceiptId("r1"),
        ],
    )
