"""Resources the adapter must release like the plugin does."""

from __future__ import annotations

import time

import pytest

from tests.compat.conversation import (
    Conversation,
    ErrorCloses,
    Step,
    amqp_sockets_of_this_process,
    connect,
    disconnect,
    send,
    subscribe,
)

pytestmark = pytest.mark.compat


ENDINGS = {
    "broker closes the channel": ([Step(send("/exchange/{q}/k", body="x"), 1)], []),
    "ERROR for a bad frame": ([Step(send("/queue/a/b", body="x"), 1)], [ErrorCloses()]),
    "DISCONNECT": ([Step(subscribe("/topic/{q}", ("id", "1")), 0), Step(disconnect(), 1)], []),
    "client closes the socket": ([Step(subscribe("/queue/{q}", ("id", "1"), ("receipt", "r")), 1)], []),
}


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_amqp_connection_released(compat, broker_host_port, ending):
    """The plugin's AMQP connection ends with the STOMP connection, however that ends; the
    adapter's must too (it once stayed open, with 0 channels, after a channel error)."""
    port = broker_host_port[1]
    baseline = amqp_sockets_of_this_process(port)
    if baseline is None:
        pytest.fail("needs /proc to count the adapter's AMQP sockets", pytrace=False)
    steps, expect = ENDINGS[ending]
    compat(Conversation([Step(connect("1.2"), 1), *steps]), expect=expect)
    deadline = time.monotonic() + 3
    while (amqp_sockets_of_this_process(port) or set()) - baseline and time.monotonic() < deadline:
        time.sleep(0.05)
    left = (amqp_sockets_of_this_process(port) or set()) - baseline
    assert not left, f"the adapter left {len(left)} AMQP connection(s) to the broker open"
