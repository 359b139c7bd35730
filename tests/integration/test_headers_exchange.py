"""Headers-exchange bindings from SUBSCRIBE (issue 38 item 3; docs/destinations.md): a SUBSCRIBE to
a headers exchange with ``x-match`` binds with the frame's other headers, so the subscriber gets
only the messages whose headers match, published by a STOMP client or an AMQP one; without
``x-match`` the binding is the plugin's (every message)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import AdapterProcess, BrokerProbe, RawSession, unique


def subscribe(adapter: AdapterProcess, frame: str) -> RawSession:
    session = RawSession(adapter.port)
    got = session.send(frame)
    assert got[-1][0] == "RECEIPT", got
    return session


def bodies(session: RawSession, count: int) -> list[bytes]:
    got: list[bytes] = []
    while len(got) < count:
        frames = session.frames_until(("MESSAGE",))
        got += [frame[2] for frame in frames if frame[0] == "MESSAGE"]
    return got


def publish(adapter: AdapterProcess, exchange: str, messages: list[tuple[dict[str, str], bytes]]) -> None:
    sender = RawSession(adapter.port)
    for headers, body in messages:
        lines = "".join(f"{name}:{value}\n" for name, value in headers.items())
        got = sender.send(f"SEND\ndestination:/exchange/{exchange}\n{lines}receipt:r\n\n{body.decode()}")
        assert got[-1][0] == "RECEIPT", got
    sender.disconnect()


def test_x_match_all_binds_with_the_frame_s_other_headers(
    adapter: AdapterProcess, broker: BrokerProbe
) -> None:
    exchange = unique("hx")
    broker.declare_exchange(exchange, "headers")
    matching = subscribe(
        adapter,
        f"SUBSCRIBE\nid:s\ndestination:/exchange/{exchange}\nx-match:all\nlocationID:99\nreceipt:r\n\n",
    )
    everything = subscribe(adapter, f"SUBSCRIBE\nid:s\ndestination:/exchange/{exchange}\nreceipt:r\n\n")
    publish(adapter, exchange, [({"locationID": "98"}, b"m98"), ({"locationID": "99"}, b"m99")])
    broker.publish(exchange, "", b"amqp99", headers={"locationID": "99"})
    publish(
        adapter, exchange, [({"locationID": "98", "other": "x"}, b"m98b"), ({"locationID": "99"}, b"last")]
    )
    assert bodies(matching, 3) == [b"m99", b"amqp99", b"last"]  # nothing else in between
    assert bodies(everything, 5) == [b"m98", b"m99", b"amqp99", b"m98b", b"last"]  # the plugin's binding
    bindings = [b for b in broker.exchange_bindings(exchange) if b["arguments"]]
    assert [b["arguments"] for b in bindings] == [{"x-match": "all", "locationID": "99"}]


def test_x_match_any_takes_either_header(adapter: AdapterProcess, broker: BrokerProbe) -> None:
    exchange = unique("hx")
    broker.declare_exchange(exchange, "headers")
    session = subscribe(
        adapter,
        f"SUBSCRIBE\nid:s\ndestination:/exchange/{exchange}\nx-match:any\ncolour:red\nsize:large\nreceipt:r\n\n",
    )
    publish(
        adapter,
        exchange,
        [({"colour": "red"}, b"red"), ({"colour": "blue"}, b"blue"), ({"size": "large"}, b"large")],
    )
    assert bodies(session, 2) == [b"red", b"large"]


@pytest.mark.parametrize("x_match", ["some", "ALL", ""])
def test_an_x_match_that_is_not_one_of_the_four_is_a_processing_error(
    adapter: AdapterProcess, broker: BrokerProbe, x_match: str
) -> None:
    exchange = unique("hx")
    broker.declare_exchange(exchange, "headers")
    session = RawSession(adapter.port)
    got = session.send(
        f"SUBSCRIBE\nid:s\ndestination:/exchange/{exchange}\nx-match:{x_match}\nk:v\nreceipt:r\n\n"
    )
    command, headers, body = got[-1]
    assert (command, headers["message"]) == ("ERROR", "Processing error"), got
    assert b"x-match" in body


def test_a_shared_subscription_with_x_match_stays_plain(start_adapter: Any, broker: BrokerProbe) -> None:
    adapter = start_adapter(shared_subscriptions=True)
    exchange = unique("hx")
    broker.declare_exchange(exchange, "headers")
    first = subscribe(
        adapter, f"SUBSCRIBE\nid:s\ndestination:/exchange/{exchange}\nx-match:all\nk:1\nreceipt:r\n\n"
    )
    second = subscribe(
        adapter, f"SUBSCRIBE\nid:s\ndestination:/exchange/{exchange}\nx-match:all\nk:2\nreceipt:r\n\n"
    )
    publish(adapter, exchange, [({"k": "1"}, b"one"), ({"k": "2"}, b"two")])
    assert bodies(first, 1) == [b"one"] and bodies(second, 1) == [b"two"]
