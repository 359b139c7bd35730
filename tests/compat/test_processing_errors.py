"""Frames with malformed typed header values: ERROR 'Processing error'.

The plugin crashes inside the frame handler and always answers the body ``Processing error``;
the adapter says what was wrong (docs/behaviour.md, "Processing error bodies").
"""

from __future__ import annotations

import pytest

from tests.compat.conversation import (
    Conversation,
    Custom,
    ErrorBody,
    ErrorCloses,
    Step,
    Transcript,
    connect,
    send,
    subscribe,
)

pytestmark = pytest.mark.compat

CASES = [
    (
        "SUBSCRIBE ack",
        subscribe("/queue/{q}", ("ack", "sometimes")),
        "ack must be one of auto, client, client-individual, got 'sometimes'",
    ),
    (
        "SUBSCRIBE prefetch-count",
        subscribe("/queue/{q}", ("prefetch-count", "many")),
        "prefetch-count must be an integer, got 'many'",
    ),
    (
        "SUBSCRIBE durable",
        subscribe("/queue/{q}", ("durable", "yes")),
        "header 'durable'/'persistent' must be true or false",
    ),
    (
        "SUBSCRIBE x-max-length",
        subscribe("/queue/{q}", ("x-max-length", "ten")),
        "header 'x-max-length' must be an integer, got 'ten'",
    ),
    (
        "SEND priority",
        send("/queue/{q}", ("priority", "high"), body="x"),
        "Header 'priority' must be an integer, got 'high'",
    ),
    (
        "SEND reply-to",
        send("/queue/{q}", ("reply-to", "/bogus/x"), body="x"),
        "reply-to '/bogus/x' is not a valid destination",
    ),
    (
        "CONNECT heart-beat",
        connect("1.2", ("heart-beat", "abc")),
        "heart-beat must be two comma-separated integers, got 'abc'",
    ),
]

WHY = "Processing error bodies say what was wrong (the plugin's is always 'Processing error')"


@pytest.mark.parametrize(("name", "data", "detail"), CASES, ids=[c[0] for c in CASES])
def test_processing_error(compat, name, data, detail):
    steps = [Step(data, 1)] if name.startswith("CONNECT") else [Step(connect("1.2"), 1), Step(data, 1)]
    compat(
        Conversation(steps),
        expect=[ErrorCloses(), ErrorBody("Processing error", b"Processing error", detail.encode(), WHY)],
    )


def _no_queue_declared(plugin: Transcript, adapter: Transcript) -> None:
    """The plugin declares the /queue before it derives the consumer tag from the id, so the
    failed SUBSCRIBE leaves the queue behind; the adapter validates the id first."""
    assert plugin.state_after_close is not None and adapter.state_after_close == [], adapter
    assert [(q["name"], q["durable"], q["consumers"]) for q in plugin.state_after_close] == [("{q}", True, 0)]
    plugin.state_after_close = []


def test_subscription_id_starting_with_temp_queue(compat):
    compat(
        Conversation([Step(connect("1.2"), 1), Step(subscribe("/queue/{q}", ("id", "/temp-queue/x")), 1)]),
        expect=[
            ErrorCloses(),
            ErrorBody(
                "Processing error",
                b"Processing error",
                b"subscription id may not start with /temp-queue/",
                WHY,
            ),
            Custom(_no_queue_declared, "a SUBSCRIBE is validated completely before anything is declared"),
        ],
    )


def test_empty_reply_to(compat):
    """An empty reply-to is accepted by both (docs/destinations.md still says the adapter refuses it)."""
    compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                Step(send("/queue/{q}", ("reply-to", ""), body="x"), 0),
                Step(subscribe("/queue/{q}", ("id", "s")), 1),
            ]
        )
    )
