"""Opt-in exchange declaration (``adapter.declare_exchanges``, issue #26 item 5): the header rules
(adapter/mapping/exchanges.py), what SEND and SUBSCRIBE ask of the broker, the setting, and the
exchange.declare method on the wire.  Hostile inputs first: the flag off, bad types, bad
booleans, a declare header on a destination that is not an exchange, names AMQP cannot carry.
"""

from __future__ import annotations

import pytest
from pamqp import commands

from adapter.amqp import wire
from adapter.config import ConfigError, load_settings
from adapter.mapping import operations as ops
from adapter.mapping.destinations import StompError
from adapter.mapping.exchanges import ExchangeParams, requested_exchange
from adapter.stomp.frame import Frame
from tests.unit.test_amqp_client import opened
from tests.unit.test_session import command_of, connected, frames_of, header, run


def _send(destination: str, **headers: str) -> Frame:
    return Frame("SEND", {"destination": destination, **headers}, b"body")


def _subscribe(destination: str, **headers: str) -> Frame:
    return Frame("SUBSCRIBE", {"destination": destination, "id": "s1", **headers})


def _error(out: list[ops.Operation]) -> bytes:
    [frame] = [f for f in frames_of(out) if command_of(f) == "ERROR"]
    return frame


# --- the header rules ---------------------------------------------------------------------------
def test_no_header_or_false_asks_for_nothing() -> None:
    assert requested_exchange({}) is None
    assert requested_exchange({"declare-exchange": "false"}) is None
    assert requested_exchange({"declare-exchange": "False", "exchange-type": "nonsense"}) is None


def test_defaults_and_the_plugins_booleans() -> None:
    assert requested_exchange({"declare-exchange": "true"}) == ExchangeParams("topic", True, False)
    params = requested_exchange(
        {
            "declare-exchange": "True",
            "exchange-type": "fanout",
            "exchange-durable": "False",
            "exchange-auto-delete": "true",
        }
    )
    assert params == ExchangeParams("fanout", False, True)
    # a plugin-type extension is the broker's to accept or refuse
    assert requested_exchange({"declare-exchange": "true", "exchange-type": "x-consistent-hash"}) == (
        ExchangeParams("x-consistent-hash", True, False)
    )


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ({"declare-exchange": "yes"}, "declare-exchange"),
        ({"declare-exchange": "TRUE"}, "declare-exchange"),
        ({"declare-exchange": "true", "exchange-type": "Topic"}, "exchange-type"),
        ({"declare-exchange": "true", "exchange-type": ""}, "exchange-type"),
        ({"declare-exchange": "true", "exchange-type": "x-"}, "exchange-type"),
        ({"declare-exchange": "true", "exchange-type": "x-" + "a" * 300}, "exchange-type"),
        ({"declare-exchange": "true", "exchange-durable": "1"}, "exchange-durable"),
        ({"declare-exchange": "true", "exchange-auto-delete": " true"}, "exchange-auto-delete"),
    ],
)
def test_bad_values_are_refused_naming_the_header(headers: dict[str, str], named: str) -> None:
    with pytest.raises(StompError) as raised:
        requested_exchange(headers)
    assert named in raised.value.detail


# --- the flag off (the default) ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "frame",
    [
        _send("/exchange/ex1/k", **{"declare-exchange": "true"}),
        _subscribe("/exchange/ex1/k", **{"declare-exchange": "true"}),
    ],
)
def test_off_by_default_refused_naming_the_setting(frame: Frame) -> None:
    session = connected()
    out = run(session, frame)
    assert not any(isinstance(op, (ops.ExchangeDeclare, ops.BasicPublish, ops.QueueDeclare)) for op in out)
    error = _error(out)
    assert b"adapter.declare_exchanges" in error and b"STOMP_ADAPTER_DECLARE_EXCHANGES" in error
    assert header(error, "message") == "Invalid header"


def test_off_a_false_header_is_the_plugins_send() -> None:
    session = connected()
    out = run(session, _send("/exchange/ex1/k", **{"declare-exchange": "false"}))
    assert [op for op in out if isinstance(op, ops.BasicPublish)][0].exchange == "ex1"
    assert not any(isinstance(op, ops.ExchangeDeclare) for op in out)


# --- the flag on ------------------------------------------------------------------------------------
def test_send_declares_first_and_once_per_connection() -> None:
    session = connected(declare_exchanges=True)
    frame = _send(
        "/exchange/ex1/k",
        **{"declare-exchange": "true", "exchange-type": "direct", "exchange-durable": "false"},
    )
    out = run(session, frame)
    kinds = [type(op) for op in out]
    assert kinds.index(ops.ExchangeDeclare) < kinds.index(ops.BasicPublish)
    assert [op for op in out if isinstance(op, ops.ExchangeDeclare)] == [
        ops.ExchangeDeclare("ex1", "direct", durable=False, auto_delete=False)
    ]
    for _ in range(3):  # the same exchange again: no second declare, whatever the path
        again = run(session, frame)
        assert not any(isinstance(op, ops.ExchangeDeclare) for op in again)
        assert any(isinstance(op, ops.BasicPublish) for op in again)


def test_quick_send_declines_a_first_declare() -> None:
    session = connected(declare_exchanges=True)
    run(session, _send("/exchange/ex2/k"))  # published once: quick_send would take the next one
    asking = _send("/exchange/ex2/k", **{"declare-exchange": "true"})
    assert session.quick_send(asking) is None
    out = run(session, asking)
    assert [op.exchange for op in out if isinstance(op, ops.ExchangeDeclare)] == ["ex2"]


def test_subscribe_declares_before_the_queue_and_the_bind() -> None:
    session = connected(declare_exchanges=True)
    out = run(
        session, _subscribe("/exchange/ex3/k", **{"declare-exchange": "true", "exchange-type": "fanout"})
    )
    kinds = [type(op) for op in out]
    assert kinds.index(ops.ExchangeDeclare) < kinds.index(ops.QueueDeclare) < kinds.index(ops.QueueBind)
    [declare] = [op for op in out if isinstance(op, ops.ExchangeDeclare)]
    assert declare == ops.ExchangeDeclare("ex3", "fanout", durable=True, auto_delete=False)


def test_declare_header_on_another_kind_of_destination_is_refused() -> None:
    for destination in ("/queue/q1", "/topic/t1", "/amq/queue/q2"):
        session = connected(declare_exchanges=True)
        out = run(session, _send(destination, **{"declare-exchange": "true"}))
        assert not any(isinstance(op, ops.BasicPublish) for op in out)
        assert b"/exchange/" in _error(out)


def test_the_declared_exchanges_a_client_can_make_us_remember_are_bounded() -> None:
    session = connected(declare_exchanges=True)
    for n in range(1000):
        run(session, _send(f"/exchange/e{n}/k", **{"declare-exchange": "true"}))
    assert len(session.parts.targets.exchanges) <= 256  # noqa: SLF001


def test_exchange_declare_is_a_synchronous_broker_call() -> None:
    assert ops.ExchangeDeclare in ops.BROKER_CALLS
    assert ops.ExchangeDeclare in ops.SYNCHRONOUS_OPS


# --- the setting ------------------------------------------------------------------------------------
def test_setting_default_env_and_bad_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STOMP_ADAPTER_DECLARE_EXCHANGES", raising=False)
    assert load_settings().declare_exchanges is False
    monkeypatch.setenv("STOMP_ADAPTER_DECLARE_EXCHANGES", "true")
    assert load_settings().declare_exchanges is True
    monkeypatch.setenv("STOMP_ADAPTER_DECLARE_EXCHANGES", "maybe")
    with pytest.raises(ConfigError, match="DECLARE_EXCHANGES"):
        load_settings()


def test_cli_hands_the_setting_to_the_session() -> None:
    from adapter.cli import session_settings

    assert session_settings(load_settings(None, {"declare_exchanges": True})).declare_exchanges is True


# --- the wire -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("durable", "auto_delete"), [(True, False), (False, True)])
def test_exchange_declare_on_the_wire_and_its_reply(durable: bool, auto_delete: bool) -> None:
    client = opened()
    frame_bytes, reply = client.operation_call(ops.ExchangeDeclare("ex", "fanout", durable, auto_delete))
    assert reply == wire.EXCHANGE_DECLARE_OK == (40, 11)
    client.start_call(frame_bytes, (reply,))
    [(_, opening), (channel, method)] = client.take()
    assert isinstance(opening, commands.Channel.Open)
    assert isinstance(method, commands.Exchange.Declare) and channel == 1
    assert (method.exchange, method.exchange_type, method.durable, method.auto_delete) == (
        "ex",
        "fanout",
        durable,
        auto_delete,
    )
    assert not (method.passive or method.internal or method.nowait) and not method.arguments


def test_a_name_amqp_cannot_carry_is_the_encoders_error() -> None:
    client = opened()
    with pytest.raises(wire.EncodeError, match="longer than 255"):
        client.operation_call(ops.ExchangeDeclare("e" * 256, "topic", True, False))
