"""Opt-in exchange declaration (``adapter.declare_exchanges``, issue #26 item 5) against the real
RabbitMQ: the exchange exists afterwards with the type and flags the headers asked for (read back
through the management API), and every refusal (the setting off, a bad type, a pre-declared
exchange with other properties, a reserved ``amq.`` name, a name over 255 bytes, a type the
broker does not have) is a clean ERROR while a bystander client of the same adapter stays served.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import pytest

from tests.support import AdapterProcess, BrokerProbe, StompClient, unique

DECLARE = {"declare-exchange": "true"}


@pytest.fixture
def declaring(start_adapter: Callable[..., AdapterProcess]) -> AdapterProcess:
    return start_adapter(declare_exchanges=True)


def _connected(port: int) -> StompClient:
    client = StompClient(port)
    client.next("CONNECTED")
    return client


def _exchange(broker: BrokerProbe, name: str) -> dict[str, Any] | None:
    return broker.management(f"/api/exchanges/%2F/{quote(name, safe='')}")  # type: ignore[no-any-return]


def _bystander_served(bystander: StompClient, broker: BrokerProbe) -> None:
    queue = unique("bystander-")
    broker.track_queue(queue)
    bystander.conn.subscribe(f"/queue/{queue}", id="b", headers={"receipt": "rb"})
    assert bystander.next("RECEIPT").headers["receipt-id"] == "rb"
    bystander.conn.send(f"/queue/{queue}", "still here")
    assert bystander.next("MESSAGE").body == "still here"


def test_subscribe_and_send_declare_the_exchange_with_the_headers_properties(
    declaring: AdapterProcess, broker: BrokerProbe
) -> None:
    name = unique("decl-")
    broker.track_exchange(name)
    assert _exchange(broker, name) is None
    headers = {**DECLARE, "exchange-type": "direct", "exchange-durable": "false", "receipt": "r1"}
    consumer = _connected(declaring.port)
    consumer.conn.subscribe(f"/exchange/{name}/k", id="s1", headers=headers)
    assert consumer.next(("RECEIPT", "ERROR")).command == "RECEIPT"
    found = _exchange(broker, name)
    assert found is not None
    assert (found["type"], found["durable"], found["auto_delete"]) == ("direct", False, False)
    sender = _connected(declaring.port)  # another connection: it declares again, equivalently
    for n in range(3):  # declared once on this connection, then only published
        sender.conn.send(f"/exchange/{name}/k", f"m{n}", headers={**headers, "receipt": f"s{n}"})
        assert sender.next(("RECEIPT", "ERROR")).command == "RECEIPT"
    assert [consumer.next("MESSAGE").body for _ in range(3)] == ["m0", "m1", "m2"]


def test_send_declares_a_durable_topic_exchange_by_default(
    declaring: AdapterProcess, broker: BrokerProbe
) -> None:
    name = unique("decl-")
    broker.track_exchange(name)
    client = _connected(declaring.port)
    client.conn.send(f"/exchange/{name}/a.b", "x", headers={**DECLARE, "receipt": "r"})
    assert client.next(("RECEIPT", "ERROR")).command == "RECEIPT"
    found = _exchange(broker, name)
    assert found is not None
    assert (found["type"], found["durable"], found["auto_delete"]) == ("topic", True, False)


def test_off_by_default_the_header_is_refused_naming_the_setting(
    adapter: AdapterProcess, broker: BrokerProbe
) -> None:
    name = unique("decl-")
    broker.track_exchange(name)
    bystander = _connected(adapter.port)
    client = _connected(adapter.port)
    client.conn.send(f"/exchange/{name}/k", "x", headers={**DECLARE, "receipt": "r"})
    error = client.next("ERROR")
    assert error.headers["message"] == "Invalid header"
    assert "adapter.declare_exchanges" in error.body and "STOMP_ADAPTER_DECLARE_EXCHANGES" in error.body
    assert _exchange(broker, name) is None
    _bystander_served(bystander, broker)


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ({"exchange-type": "Topic"}, "exchange-type"),
        ({"exchange-durable": "yes"}, "exchange-durable"),
        ({"exchange-auto-delete": "1"}, "exchange-auto-delete"),
    ],
)
def test_bad_header_values_are_clean_errors(
    declaring: AdapterProcess, broker: BrokerProbe, headers: dict[str, str], named: str
) -> None:
    name = unique("decl-")
    broker.track_exchange(name)
    bystander = _connected(declaring.port)
    client = _connected(declaring.port)
    client.conn.subscribe(f"/exchange/{name}/k", id="s", headers={**DECLARE, **headers})
    error = client.next("ERROR")
    assert error.headers["message"] == "Invalid header" and named in error.body
    assert _exchange(broker, name) is None
    _bystander_served(bystander, broker)


def test_other_properties_than_the_existing_exchanges_are_the_brokers_406(
    declaring: AdapterProcess, broker: BrokerProbe
) -> None:
    name = unique("decl-")
    broker.declare_exchange(name, "fanout")  # non-durable fanout
    bystander = _connected(declaring.port)
    client = _connected(declaring.port)
    client.conn.send(
        f"/exchange/{name}/k", "x", headers={**DECLARE, "exchange-type": "topic", "receipt": "r"}
    )
    error = client.next("ERROR")
    assert error.headers["message"] == "precondition_failed"
    assert "inequivalent arg 'type'" in error.body
    found = _exchange(broker, name)
    assert found is not None and found["type"] == "fanout"
    _bystander_served(bystander, broker)


def test_a_reserved_amq_name_is_the_brokers_403(declaring: AdapterProcess, broker: BrokerProbe) -> None:
    name = unique("amq.decl-")
    broker.track_exchange(name)
    bystander = _connected(declaring.port)
    client = _connected(declaring.port)
    client.conn.subscribe(f"/exchange/{name}/k", id="s", headers={**DECLARE, "receipt": "r"})
    error = client.next("ERROR")
    assert error.headers["message"] == "access_refused"
    assert "amq." in error.body
    assert _exchange(broker, name) is None
    _bystander_served(bystander, broker)


def test_a_type_the_broker_does_not_have_is_a_clean_error(
    declaring: AdapterProcess, broker: BrokerProbe
) -> None:
    name = unique("decl-")
    broker.track_exchange(name)
    bystander = _connected(declaring.port)
    client = _connected(declaring.port)
    client.conn.send(
        f"/exchange/{name}/k", "x", headers={**DECLARE, "exchange-type": "x-no-such-type", "receipt": "r"}
    )
    error = client.next("ERROR")
    assert error.headers["message"] == "command_invalid"
    assert "x-no-such-type" in error.body
    assert _exchange(broker, name) is None
    _bystander_served(bystander, broker)


def test_a_name_over_255_bytes_is_a_processing_error(declaring: AdapterProcess, broker: BrokerProbe) -> None:
    bystander = _connected(declaring.port)
    client = _connected(declaring.port)
    client.conn.send("/exchange/" + "e" * 256 + "/k", "x", headers={**DECLARE, "receipt": "r"})
    error = client.next("ERROR")
    assert error.headers["message"] == "Processing error" and "255" in error.body
    _bystander_served(bystander, broker)


def test_an_existing_amq_exchange_declared_equivalently_is_accepted(declaring: AdapterProcess) -> None:
    """The broker refuses only new ``amq.`` names: /exchange/amq.topic with the default
    (durable topic) declaration goes through, as any equivalent redeclaration does."""
    client = _connected(declaring.port)
    client.conn.subscribe("/exchange/amq.topic/decl.k", id="s", headers={**DECLARE, "receipt": "r"})
    assert client.next(("RECEIPT", "ERROR")).command == "RECEIPT"
    client.conn.send("/exchange/amq.topic/decl.k", "through", headers=DECLARE)
    assert client.next("MESSAGE").body == "through"
