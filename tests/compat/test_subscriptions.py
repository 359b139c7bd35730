"""SUBSCRIBE / UNSUBSCRIBE: receipts, errors, duplicate ids, durable subscriptions."""

from __future__ import annotations

import pytest

from tests.compat.conversation import (
    Conversation,
    Custom,
    ErrorCloses,
    ErrorReceiptId,
    Step,
    Transcript,
    connect,
    disconnect,
    frame,
    send,
    subscribe,
)

pytestmark = pytest.mark.compat


def test_unsubscribe_by_id_and_by_destination(compat):
    """Receipts for SUBSCRIBE/UNSUBSCRIBE; a non-durable topic subscription queue goes away with
    its UNSUBSCRIBE; no MESSAGE after UNSUBSCRIBE."""
    compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                Step(subscribe("/topic/{q}", ("id", "by-id"), ("receipt", "s1")), 1),
                Step(subscribe("/queue/{q}", ("receipt", "s2")), 1),
                Step(frame("UNSUBSCRIBE", ("id", "by-id"), ("receipt", "u1")), 1),
                Step(frame("UNSUBSCRIBE", ("destination", "/queue/{q}"), ("receipt", "u2")), 1),
                Step(send("/topic/{q}", ("receipt", "p1"), body="nobody listens"), 1),
            ]
        )
    )


UNSUBSCRIBE_ERRORS = [
    [],
    [("id", "unknown")],
    [("destination", "/queue/{q}")],
    [("id", "/temp-queue/x")],
    [("durable", "true"), ("destination", "/topic/{q}")],
]


@pytest.mark.parametrize("headers", UNSUBSCRIBE_ERRORS, ids=repr)
def test_unsubscribe_errors(compat, headers):
    compat(
        Conversation([Step(connect("1.2"), 1), Step(frame("UNSUBSCRIBE", *headers, ("receipt", "u")), 1)]),
        expect=[ErrorCloses(), ErrorReceiptId("u")],
    )


def test_duplicate_subscription_id_queue(compat):
    """ERROR, then the RECEIPT, then close — in both."""
    compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                Step(subscribe("/queue/{q}", ("id", "dup"), ("receipt", "r1")), 1),
                Step(subscribe("/queue/{q}", ("id", "dup"), ("receipt", "r2")), 2),
            ],
            state_after_close=True,
        ),
        expect=[ErrorReceiptId("r2")],
    )


def _leaked_queue(plugin: Transcript, adapter: Transcript) -> None:
    """The plugin declares the second subscription's queue before it notices the duplicate id and
    leaves it behind (auto-delete, but never consumed, so never deleted); the adapter checks the id
    first and declares nothing."""
    assert plugin.state_after_close is not None and adapter.state_after_close is not None
    assert adapter.state == adapter.state_after_close == [], adapter.state_after_close
    assert len(plugin.state_after_close) == 1, plugin.state_after_close
    leaked = plugin.state_after_close[0]
    assert leaked["name"].startswith("<stomp-subscription#") and leaked["consumers"] == 0
    assert leaked["auto_delete"] and not leaked["durable"]
    assert leaked["bindings"] == [["", leaked["name"], {}]]  # declared, never bound
    assert plugin.state == [leaked]
    plugin.state = plugin.state_after_close = []


def test_duplicate_subscription_id_topic(compat):
    compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                Step(subscribe("/topic/{q}", ("id", "dup"), ("receipt", "r1")), 1),
                Step(subscribe("/topic/{q}", ("id", "dup"), ("receipt", "r2")), 2),
            ],
            state_after_close=True,
            claim_unbound_subscription_queues=True,
        ),
        expect=[
            ErrorReceiptId("r2"),
            Custom(_leaked_queue, "no subscription queue is declared (and leaked) for a duplicate id"),
        ],
    )


def test_durable_topic_subscription(compat):
    """The durable subscription queue has the plugin's hashed name for the same destination and
    id (so subscriptions carry over between the plugin and the adapter), survives the
    disconnect, and collects messages published meanwhile.  Both runs use the same topic and id
    (one after the other, the queue is deleted in between), and the queue names are compared
    unmasked."""
    plugin, adapter = compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                Step(
                    subscribe(
                        "/topic/{t}",
                        ("id", "{sub}"),
                        ("durable", "true"),
                        ("auto-delete", "false"),
                        ("receipt", "r1"),
                    ),
                    1,
                ),
                Step(disconnect(), 1),
                Step(connect("1.2"), 1, conn=1),
                Step(send("/topic/{t}", ("receipt", "p"), body="while away"), 1, conn=1),
            ],
            names=("t", "sub"),
            shared_names=True,
            keep_random_names=True,
            state_after_close=True,
        )
    )
    # the comparison above already required equal names; spell out what was compared
    plugin_queues = [q["name"] for q in plugin.state_after_close or []]
    adapter_queues = [q["name"] for q in adapter.state_after_close or []]
    assert plugin_queues == adapter_queues
    assert len(plugin_queues) == 1 and plugin_queues[0].startswith("stomp-subscription-"), plugin_queues
    assert [q["messages"] for q in adapter.state_after_close or []] == [1]


def test_durable_unsubscribe_deletes_the_queue(compat):
    compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                Step(
                    subscribe(
                        "/topic/{t}",
                        ("id", "d"),
                        ("persistent", "true"),
                        ("auto-delete", "false"),
                        ("receipt", "r"),
                    ),
                    1,
                ),
                Step(frame("UNSUBSCRIBE", ("id", "d"), ("durable", "true"), ("receipt", "u")), 1),
            ],
            names=("t",),
            state_after_close=True,
        )
    )


def test_queue_arguments_and_flags(compat):
    """x- headers become queue arguments; flags from headers; a second SUBSCRIBE to the same
    /queue name on the connection does not redeclare it."""
    compat(
        Conversation(
            [
                Step(connect("1.2"), 1),
                Step(
                    subscribe(
                        "/queue/{q}",
                        ("id", "1"),
                        ("x-max-length", " 10 "),
                        ("x-message-ttl", "60000"),
                        ("x-dead-letter-exchange", "amq.fanout"),
                        ("auto-delete", "true"),
                        ("receipt", "r1"),
                    ),
                    1,
                ),
                Step(subscribe("/queue/{q}", ("id", "2"), ("x-max-length", "99"), ("receipt", "r2")), 1),
                Step(subscribe("/topic/{q}", ("id", "3"), ("exclusive", "true"), ("receipt", "r3")), 1),
                Step(
                    subscribe(
                        "/exchange/amq.fanout", ("id", "4"), ("x-expires", "100000"), ("receipt", "r4")
                    ),
                    1,
                ),
            ]
        )
    )
