"""Queue browsing (activemq profile, ``browser:true``) against the real RabbitMQ: hostile input
first.  A browser on a long queue gets at most ``BROWSE_LIMIT`` messages (ActiveMQ's default page
size), and at most ``BROWSE_BYTES`` of bodies, then ``browser:end``; every message stays on the
queue, in order; a bystander connection stays served.  The STOMP side is stomp.py, the broker
side an independent AMQP client (BrokerProbe)."""

from __future__ import annotations

from collections.abc import Callable

from adapter.mapping.profile import BROWSE_BYTES, BROWSE_LIMIT
from tests.support import AdapterProcess, BrokerProbe, StompClient, expect_receipt, unique


def fill(client: StompClient, queue: str, bodies: list[str]) -> None:
    for n, body in enumerate(bodies):
        headers = {"receipt": "filled"} if n == len(bodies) - 1 else {}
        client.conn.send(f"/queue/{queue}", body, headers=headers)
    expect_receipt(client, "filled", timeout=60)


def browse(client: StompClient, queue: str, sub_id: str) -> list[str]:
    client.conn.subscribe(f"/queue/{queue}", sub_id, headers={"browser": "true", "receipt": sub_id})
    expect_receipt(client, sub_id)
    bodies = []
    while True:
        frame = client.next("MESSAGE", timeout=30)
        if frame.headers.get("browser") == "end":
            return bodies
        bodies.append(frame.body)


def test_a_browser_on_a_long_queue_is_bounded_and_leaves_every_message(
    start_adapter: Callable[..., AdapterProcess], broker: BrokerProbe
) -> None:
    adapter = start_adapter(profile="activemq")
    queue, big, by = unique("browse"), unique("browse-big"), unique("by")
    broker.track_queue(queue, big, by)
    bystander = StompClient(adapter.port)
    bystander.conn.subscribe(f"/queue/{by}", "b", headers={"receipt": "bs"})
    expect_receipt(bystander, "bs")

    sender = StompClient(adapter.port)
    total = 3 * BROWSE_LIMIT
    fill(sender, queue, [f"m{n}" for n in range(total)])
    browser = StompClient(adapter.port)
    assert browse(browser, queue, "1") == [f"m{n}" for n in range(BROWSE_LIMIT)]
    assert broker.wait_depth(queue, total) == total  # nothing consumed

    # bodies of 1 MiB: the browse stops at BROWSE_BYTES
    mib = 1024 * 1024
    fill(sender, big, [f"{n:02d}" + "x" * (mib - 2) for n in range(BROWSE_BYTES // mib + 4)])
    browsed = browse(browser, big, "2")
    assert [body[:2] for body in browsed] == [f"{n:02d}" for n in range(BROWSE_BYTES // mib)]
    assert broker.wait_depth(big, BROWSE_BYTES // mib + 4) == BROWSE_BYTES // mib + 4

    bystander.conn.send(f"/queue/{by}", "served", headers={"receipt": "bsend"})
    expect_receipt(bystander, "bsend")
    assert bystander.next("MESSAGE", timeout=10).body == "served"

    # the messages are still there, in their order, for a consumer
    reader = StompClient(adapter.port)
    reader.conn.subscribe(f"/queue/{queue}", "r", headers={"receipt": "rs"})
    expect_receipt(reader, "rs")
    assert [reader.next("MESSAGE", timeout=10).body for _ in range(total)] == [f"m{n}" for n in range(total)]
    for client in (reader, browser, sender, bystander):
        client.close()
