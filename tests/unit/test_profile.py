"""The behaviour profiles (adapter/mapping/profile.py) and the session driven in the activemq
profile: frames in, operations out, no broker.  The rabbitmq profile's rules are the plugin's and
are covered by test_destinations.py and test_session.py, which run with the default profile."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapter.config import ConfigError, load_settings
from adapter.dispatch import rules as dispatch
from adapter.mapping import operations as ops
from adapter.mapping.destinations import DestinationError, ProcessingError, parse_destination
from adapter.mapping.profile import (
    BROWSE_BYTES,
    BROWSE_LIMIT,
    ActiveMQRules,
    ClientIds,
    RabbitMQRules,
    activemq_binding_key,
    durable_subscription_queue,
    expires_to_ttl,
    rules_for,
    selector_lookup,
)
from adapter.mapping.properties import MessageProperties
from adapter.session import Session, SessionSettings
from adapter.session.extension import ProfileExtension
from adapter.session.frames import Frames
from adapter.stomp.frame import Frame
from tests.unit.test_session import SESSION_ID, command_of, connected, frames_of, header, run

NOW_MS = 1_700_000_000_000


def rules() -> ActiveMQRules:
    return ActiveMQRules(clock_ms=lambda: NOW_MS)


# --- configuration ------------------------------------------------------------------------------


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.upper().startswith("STOMP_ADAPTER_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_profile_defaults_to_rabbitmq(clean_environment: pytest.MonkeyPatch) -> None:
    assert load_settings().profile == "rabbitmq"
    assert SessionSettings().profile == "rabbitmq"


def test_profile_from_ini_environment_and_command_line(tmp_path, clean_environment) -> None:
    ini = tmp_path / "adapter.ini"
    ini.write_text("adapter.profile = activemq\n")
    assert load_settings(ini).profile == "activemq"
    clean_environment.setenv("STOMP_ADAPTER_PROFILE", "rabbitmq")
    assert load_settings(ini).profile == "rabbitmq"  # environment over ini
    assert load_settings(ini, {"profile": "activemq"}).profile == "activemq"  # command line over both


def test_unknown_profile_is_a_configuration_error(tmp_path, clean_environment) -> None:
    ini = tmp_path / "adapter.ini"
    ini.write_text("adapter.profile = artemis\n")
    with pytest.raises(ConfigError, match="adapter.profile"):
        load_settings(ini)


def test_cli_flag_reaches_the_sessions(clean_environment) -> None:
    from adapter.cli import build_parser, session_settings

    args = build_parser().parse_args(["--profile", "activemq"])
    settings = load_settings(None, {"profile": args.profile})
    assert session_settings(settings).profile == "activemq"
    assert build_parser().parse_args([]).profile is None


def test_rules_for() -> None:
    assert type(rules_for("rabbitmq")) is RabbitMQRules
    assert type(rules_for("activemq")) is ActiveMQRules
    with pytest.raises(ValueError):
        rules_for("artemis")


# --- destinations -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers", [{}, {"persistent": "false"}, {"persistent": "true"}, {"exclusive": "true"}]
)
def test_queue_is_always_shared_and_durable(headers: dict[str, str]) -> None:
    params = rules().send_queue_params(parse_destination("/queue/q"), headers, ())
    assert params is not None
    assert (params.durable, params.exclusive, params.auto_delete) == (True, False, False)


def test_plugin_rule_unchanged_in_default_profile() -> None:
    params = RabbitMQRules().send_queue_params(parse_destination("/queue/q"), {"persistent": "false"}, ())
    assert params is not None and params.exclusive  # the plugin's rule, kept for the default


@pytest.mark.parametrize(
    ("topic", "key"),
    [
        ("a.b", "a.b"),
        ("a.*", "a.*"),
        ("a.>", "a.#"),
        (">", "#"),
        ("*.b.>", "*.b.#"),
        ("a>.b", "a>.b"),  # only a whole word is a wildcard
        ("a.*x", "a.*x"),
    ],
)
def test_topic_wildcards(topic: str, key: str) -> None:
    assert activemq_binding_key(topic) == key


def test_hash_word_is_refused() -> None:
    with pytest.raises(DestinationError):
        activemq_binding_key("a.#")


@given(st.lists(st.text(alphabet="ab*>", min_size=1, max_size=3), min_size=1, max_size=5))
def test_wildcard_translation_is_word_by_word(words: list[str]) -> None:
    key = activemq_binding_key(".".join(words))
    assert key.split(".") == ["#" if w == ">" else w for w in words]


def test_temp_queue_subscribe_accepted_only_in_activemq_profile() -> None:
    dest = parse_destination("/temp-queue/replies")
    rules().check_subscribe_destination(dest)
    with pytest.raises(DestinationError):
        RabbitMQRules().check_subscribe_destination(dest)


def test_durable_subscription_queue_names() -> None:
    assert durable_subscription_queue("app", "sub") == "activemq-durable:3:app:sub"
    assert durable_subscription_queue("a.b", "c") != durable_subscription_queue("a", "b.c")
    long = durable_subscription_queue("x" * 200, "y" * 200)
    assert len(long.encode()) <= 255 and long.startswith("activemq-durable:")


def test_durable_subscription_plan() -> None:
    headers = {"activemq.subscriptionName": "sub", "id": "1"}
    plan = rules().subscribe_target(parse_destination("/topic/a.>"), headers, "1", "amq.topic", "app")
    assert plan.queue == "activemq-durable:3:app:sub"
    assert plan.declare is not None
    assert (plan.declare.durable, plan.declare.auto_delete, plan.declare.exclusive) == (True, False, False)
    assert (plan.bind_exchange, plan.bind_key) == ("amq.topic", "a.#")
    same = rules().subscribe_target(
        parse_destination("/topic/a.>"), {"durable-subscription-name": "sub"}, None, "amq.topic", "app"
    )
    assert same.queue == plan.queue
    with pytest.raises(DestinationError, match="client-id"):
        rules().subscribe_target(parse_destination("/topic/t"), headers, "1", "amq.topic", None)


def test_virtual_topic_consumer_queue_is_bound() -> None:
    """/queue/Consumer.<group>.VirtualTopic.X: the group's durable queue, bound to the topic."""
    plan = rules().subscribe_target(
        parse_destination("/queue/Consumer.A.VirtualTopic.orders.>"), {}, "1", "amq.topic", None
    )
    assert plan.queue == "Consumer.A.VirtualTopic.orders.>"
    assert plan.declare is not None and plan.declare.durable and not plan.declare.exclusive
    assert (plan.bind_exchange, plan.bind_key) == ("amq.topic", "VirtualTopic.orders.#")
    for name in ("Consumer.A.orders", "Consumer..VirtualTopic.x", "Consumer.A.VirtualTopic.", "Consumer.A"):
        plain = rules().subscribe_target(parse_destination(f"/queue/{name}"), {}, "1", "amq.topic", None)
        assert plain.bind_exchange is None, name
    # the plugin's rules know no virtual topics
    default = RabbitMQRules().subscribe_target(
        parse_destination("/queue/Consumer.A.VirtualTopic.x"), {}, "1", "amq.topic", None
    )
    assert default.bind_exchange is None


# --- SEND properties ----------------------------------------------------------------------------


def test_expires_becomes_remaining_ttl() -> None:
    assert expires_to_ttl(str(NOW_MS + 1500), NOW_MS) == "1500"
    assert expires_to_ttl("0", NOW_MS) is None
    assert expires_to_ttl(str(NOW_MS), NOW_MS) is False
    assert expires_to_ttl(str(NOW_MS - 1), NOW_MS) is False
    with pytest.raises(ProcessingError, match="expires"):
        expires_to_ttl("tomorrow", NOW_MS)


@given(st.integers(min_value=1, max_value=2**62))
def test_ttl_is_what_remains(expires: int) -> None:
    ttl = expires_to_ttl(str(expires), NOW_MS)
    if expires <= NOW_MS:
        assert ttl is False
    else:
        assert ttl == str(expires - NOW_MS)


def test_send_properties_expiry_and_priority() -> None:
    props = rules().send_properties({"expires": str(NOW_MS + 10), "priority": "7"}, None)
    assert props is not None
    assert (props.expiration, props.priority) == ("10", 7)
    assert props.headers == {"expires": str(NOW_MS + 10)}  # consumers still read the header
    assert rules().send_properties({"expires": "1"}, None) is None  # expired at SEND
    # the default profile copies expires as a plain header, as the plugin does
    plain = RabbitMQRules().send_properties({"expires": "1"}, None)
    assert plain is not None and plain.expiration is None


# --- prefetch -----------------------------------------------------------------------------------


def test_prefetch_size() -> None:
    assert rules().prefetch({"activemq.prefetchSize": "2"}) == 2
    assert rules().prefetch({"activemq.prefetchSize": "1000000"}) == 65535
    assert rules().prefetch({"prefetch-count": "3", "activemq.prefetchSize": "2"}) == 3
    assert rules().prefetch({}) is None
    # a subscription that acknowledges gets ActiveMQ's default queue prefetch when it gives none
    assert rules().prefetch({"ack": "client"}) == rules().prefetch({"ack": "client-individual"}) == 1000
    assert rules().prefetch({"ack": "client", "activemq.prefetchSize": "5"}) == 5
    assert rules().prefetch({"ack": "client", "prefetch-count": "0"}) == 0  # asked for: unlimited
    assert rules().prefetch({"ack": "auto"}) is None
    assert RabbitMQRules().prefetch({"ack": "client"}) is None
    for bad in ("0", "-1", "x"):
        with pytest.raises(ProcessingError, match="prefetchSize"):
            rules().prefetch({"activemq.prefetchSize": bad})
    assert RabbitMQRules().prefetch({"activemq.prefetchSize": "2"}) is None


# --- selectors ----------------------------------------------------------------------------------


def test_selector_compiled_for_topics_and_queues_refused_on_temp_queues() -> None:
    selector = rules().selector(parse_destination("/topic/t"), {"selector": "color = 'red'"})
    assert selector is not None
    props = MessageProperties(headers={"color": "red"})
    assert selector.matches(selector_lookup(props))
    assert not selector.matches(selector_lookup(MessageProperties(headers={})))
    queue_selector = rules().selector(parse_destination("/queue/q"), {"selector": "color = 'red'"})
    assert queue_selector is not None and queue_selector.matches(selector_lookup(props))
    with pytest.raises(DestinationError, match="Selector not supported"):
        rules().selector(parse_destination("/temp-queue/q"), {"selector": "color = 'red'"})
    with pytest.raises(DestinationError, match="color ="):
        rules().selector(parse_destination("/topic/t"), {"selector": "color = = 'red'"})
    assert RabbitMQRules().selector(parse_destination("/topic/t"), {"selector": "x = 1"}) is None


def test_selector_sees_jms_fields() -> None:
    props = MessageProperties(
        type="order", priority=7, correlation_id="c1", delivery_mode=2, headers={"n": "12"}
    )
    lookup = selector_lookup(props)
    assert lookup("JMSType") == "order"
    assert lookup("JMSPriority") == 7
    assert lookup("JMSCorrelationID") == "c1"
    assert lookup("JMSDeliveryMode") == "PERSISTENT"
    assert selector_lookup(MessageProperties())("JMSPriority") == 4  # JMS's default
    assert selector_lookup(MessageProperties())("JMSDeliveryMode") == "NON_PERSISTENT"
    selector = rules().selector(parse_destination("/topic/t"), {"selector": "n > 10 AND JMSPriority >= 5"})
    assert selector is not None and selector.matches(lookup)


# --- the session in the activemq profile --------------------------------------------------------


def amq_session(client_id: str | None = "app") -> Session:
    session = Session(SessionSettings(profile="activemq"), session_id=SESSION_ID, peer_is_loopback=True)
    headers = {"accept-version": "1.2", "host": "/"}
    if client_id is not None:
        headers["client-id"] = client_id
    out = run(session, Frame("CONNECT", headers))
    assert command_of(frames_of(out)[-1]) == "CONNECTED"
    assert session.identity.client_id == client_id
    return session


def test_send_to_queue_declares_a_shared_queue_whatever_persistent_says() -> None:
    out = run(amq_session(), Frame("SEND", {"destination": "/queue/q", "persistent": "false"}, b"x"))
    declare = next(op for op in out if isinstance(op, ops.QueueDeclare))
    assert (declare.durable, declare.exclusive, declare.auto_delete) == (True, False, False)
    assert any(isinstance(op, ops.BasicPublish) for op in out)


def test_expired_send_is_not_published_but_receipted() -> None:
    session = amq_session()
    out = run(session, Frame("SEND", {"destination": "/topic/t", "expires": "1", "receipt": "r1"}, b"x"))
    assert not any(isinstance(op, ops.BasicPublish) for op in out)
    assert [command_of(f) for f in frames_of(out)] == ["RECEIPT"]
    # the fast path declines it too, now that the destination is known
    assert session.quick_send(Frame("SEND", {"destination": "/topic/t", "expires": "1"}, b"x")) is None


def test_subscribe_topic_wildcard_with_selector_and_prefetch() -> None:
    session = amq_session()
    out = run(
        session,
        Frame(
            "SUBSCRIBE",
            {"destination": "/topic/a.>", "id": "1", "selector": "n > 1", "activemq.prefetchSize": "2"},
        ),
    )
    assert ops.BasicQos(2) in out
    bind = next(op for op in out if isinstance(op, ops.QueueBind))
    assert bind.routing_key == "a.#"
    tag = next(op for op in out if isinstance(op, ops.BasicConsume)).consumer_tag

    def deliver(n: str, delivery_tag: int) -> ops.Delivery:
        return ops.Delivery(
            tag, delivery_tag, False, "amq.topic", "a.b", MessageProperties(headers={"n": n}), b"b"
        )

    assert session.on_delivery(deliver("2", 1)).startswith(b"MESSAGE\n")
    dropped = deliver("1", 2)
    assert session.on_delivery(dropped) == b""
    assert session.dropped_delivery_ack(dropped) is None  # auto ack: nothing to settle


def test_dropped_delivery_is_acked_in_client_mode() -> None:
    session = amq_session()
    run(
        session,
        Frame("SUBSCRIBE", {"destination": "/topic/t", "id": "1", "ack": "client", "selector": "n > 1"}),
    )
    delivery = ops.Delivery("T_1", 5, False, "amq.topic", "t", MessageProperties(headers={}), b"")
    assert session.on_delivery(delivery) == b""
    assert session.dropped_delivery_ack(delivery) == ops.BasicAck(5, False)


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"destination": "/topic/t", "selector": "a = = 1"}, "Invalid selector"),
        ({"destination": "/temp-queue/q", "selector": "a = 1"}, "Selector not supported"),
        ({"destination": "/topic/t", "activemq.prefetchSize": "0"}, "Processing error"),
    ],
)
def test_subscribe_errors(headers: dict[str, str], message: str) -> None:
    out = run(amq_session(), Frame("SUBSCRIBE", headers))
    error = frames_of(out)[0]
    assert command_of(error) == "ERROR" and header(error, "message") == message
    if "selector" in headers:
        assert headers["selector"].encode() in error  # the ERROR quotes the selector
    assert not any(isinstance(op, ops.QueueDeclare | ops.BasicConsume) for op in out)


def test_temp_queue_subscription_shares_the_reply_to_queue() -> None:
    session = amq_session()
    out = run(session, Frame("SUBSCRIBE", {"destination": "/temp-queue/replies", "id": "r"}))
    assert out[0] == ops.QueueDeclare("", exclusive=True, auto_delete=True)
    assert ops.BasicConsume("amq.gen-test", "T_r", no_ack=True) in out
    out = run(session, Frame("SEND", {"destination": "/queue/q", "reply-to": "/temp-queue/replies"}))
    publish = next(op for op in out if isinstance(op, ops.BasicPublish))
    assert publish.properties.reply_to == "amq.gen-test"
    assert not any(isinstance(op, ops.BasicConsume) for op in out)  # no second consumer


def test_temp_queue_subscription_after_reply_to_replaces_the_implicit_consumer() -> None:
    session = amq_session()
    run(session, Frame("SEND", {"destination": "/queue/q", "reply-to": "/temp-queue/replies"}))
    out = run(session, Frame("SUBSCRIBE", {"destination": "/temp-queue/replies", "id": "r"}))
    assert out[0] == ops.BasicCancel("T_/temp-queue/replies")
    assert ops.BasicConsume("amq.gen-test", "T_r", no_ack=True) in out


def test_temp_topic_is_a_private_queue_apart_from_the_temp_queues() -> None:
    session = amq_session()
    out = run(session, Frame("SUBSCRIBE", {"destination": "/temp-topic/replies", "id": "t"}))
    assert out[0] == ops.QueueDeclare("", exclusive=True, auto_delete=True)
    assert ops.BasicConsume("amq.gen-test", "T_t", no_ack=True) in out
    out = run(session, Frame("SEND", {"destination": "/queue/q", "reply-to": "/temp-topic/replies"}))
    publish = next(op for op in out if isinstance(op, ops.BasicPublish))
    assert publish.properties.reply_to == "amq.gen-test"
    assert ops.QueueDeclare("", exclusive=True, auto_delete=True) not in out  # the same queue
    assert not any(isinstance(op, ops.BasicConsume) for op in out)
    # the temp queue of the same name is another queue, with its implicit reply consumer
    out = run(session, Frame("SEND", {"destination": "/queue/q", "reply-to": "/temp-queue/replies"}))
    assert ops.QueueDeclare("", exclusive=True, auto_delete=True) in out
    assert ops.BasicConsume("amq.gen-test", "T_/temp-queue/replies", no_ack=True) in out


def test_temp_topic_reply_to_before_its_subscription() -> None:
    session = amq_session()
    out = run(session, Frame("SEND", {"destination": "/queue/q", "reply-to": "/temp-topic/r"}))
    assert ops.BasicConsume("amq.gen-test", "T_/temp-topic/r", no_ack=True) in out
    out = run(session, Frame("SUBSCRIBE", {"destination": "/temp-topic/r", "id": "t"}))
    assert out[0] == ops.BasicCancel("T_/temp-topic/r")


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (Frame("SUBSCRIBE", {"destination": "/temp-topic/", "id": "t"}), "Invalid destination"),
        (Frame("SUBSCRIBE", {"destination": "/temp-topic/a/b", "id": "t"}), "Invalid destination"),
        (Frame("SEND", {"destination": "/temp-topic/a"}), "Invalid destination"),
        (Frame("SEND", {"destination": "/queue/q", "reply-to": "/temp-topic/"}), "Processing error"),
        (
            Frame("SUBSCRIBE", {"destination": "/temp-topic/a", "id": "t", "selector": "x = 1"}),
            "Selector not supported",
        ),
    ],
)
def test_temp_topic_errors(frame: Frame, message: str) -> None:
    out = run(amq_session(), frame)
    assert header(frames_of(out)[0], "message") == message
    assert not any(isinstance(op, ops.BasicPublish | ops.BasicConsume) for op in out)


def test_default_profile_knows_no_temp_topic() -> None:
    session = Session(SessionSettings(), session_id=SESSION_ID, peer_is_loopback=True)
    run(session, Frame("CONNECT", {"accept-version": "1.2", "host": "/"}))
    out = run(session, Frame("SUBSCRIBE", {"destination": "/temp-topic/a", "id": "t"}))
    assert header(frames_of(out)[0], "message") == "Unknown destination"  # as the plugin answers
    session = Session(SessionSettings(), session_id=SESSION_ID, peer_is_loopback=True)
    run(session, Frame("CONNECT", {"accept-version": "1.2", "host": "/"}))
    out = run(session, Frame("SEND", {"destination": "/queue/q", "reply-to": "/temp-topic/a"}))
    assert header(frames_of(out)[0], "message") == "Processing error"


def test_durable_subscription_and_activemq_unsubscribe_sequence() -> None:
    session = amq_session()
    sub = {"destination": "/topic/t", "id": "1", "activemq.subscriptionName": "s"}
    out = run(session, Frame("SUBSCRIBE", sub))
    declare = next(op for op in out if isinstance(op, ops.QueueDeclare))
    assert declare.queue == "activemq-durable:3:app:s" and declare.durable and not declare.auto_delete
    out = run(session, Frame("UNSUBSCRIBE", {"id": "1"}))
    assert out == [ops.BasicCancel("T_1")]  # the subscription stays
    out = run(session, Frame("UNSUBSCRIBE", {"id": "1", "activemq.subscriptionName": "s", "receipt": "r"}))
    assert out[0] == ops.QueueDelete("activemq-durable:3:app:s")
    assert command_of(frames_of(out)[0]) == "RECEIPT"
    out = run(session, Frame("UNSUBSCRIBE", {"durable-subscription-name": "s"}))
    assert out == [ops.QueueDelete("activemq-durable:3:app:s")]


def test_durable_subscription_without_client_id_is_refused() -> None:
    out = run(
        amq_session(client_id=None),
        Frame("SUBSCRIBE", {"destination": "/topic/t", "id": "1", "activemq.subscriptionName": "s"}),
    )
    assert header(frames_of(out)[0], "message") == "Missing client-id"


def test_default_profile_ignores_activemq_headers() -> None:
    session = Session(SessionSettings(), session_id=SESSION_ID, peer_is_loopback=True)
    run(session, Frame("CONNECT", {"accept-version": "1.2", "client-id": "app"}))
    assert session.identity.client_id is None
    out = run(
        session,
        Frame(
            "SUBSCRIBE",
            {"destination": "/topic/a.>", "id": "1", "selector": "x", "activemq.prefetchSize": "2"},
        ),
    )
    bind = next(op for op in out if isinstance(op, ops.QueueBind))
    assert bind.routing_key == "a.>"
    assert not any(isinstance(op, ops.BasicQos) for op in out)


@pytest.mark.parametrize(
    "frame",
    [
        Frame("SEND", {"destination": "/queue/q", "transformation": "jms-map-json"}, b"{}"),
        Frame("SEND", {"destination": "/topic/t", "transformation": "jms-object-xml", "receipt": "r"}),
        Frame("SUBSCRIBE", {"destination": "/queue/q", "id": "1", "transformation": "jms-map-json"}),
        Frame("SUBSCRIBE", {"destination": "/topic/t", "id": "1", "transformation": "jms-xml"}),
    ],
)
def test_a_transformation_the_adapter_cannot_do_is_refused(frame: Frame) -> None:
    session = amq_session()
    out = run(session, frame)
    error = frames_of(out)[0]
    assert command_of(error) == "ERROR" and header(error, "message") == "Transformation not supported"
    assert f"transformation:{frame.headers['transformation']}".encode() in error
    # nothing published or consumed (a SEND's queue is declared first, as for its other header
    # errors, in the plugin's order)
    assert not any(isinstance(op, ops.BasicPublish | ops.BasicConsume | ops.QueueBind) for op in out)
    if frame.command == "SEND" and "receipt" not in frame.headers:
        assert session.quick_send(frame) is None  # the fast path leaves the ERROR to the general one


def test_jms_byte_needs_no_conversion_and_the_default_profile_passes_transformation_on() -> None:
    frame = Frame("SEND", {"destination": "/queue/q", "transformation": "jms-byte"}, b"x")
    published = [op for op in run(amq_session(), frame) if isinstance(op, ops.BasicPublish)]
    assert published and published[0].body == b"x"
    session = Session(SessionSettings(), session_id=SESSION_ID, peer_is_loopback=True)
    run(session, Frame("CONNECT", {"accept-version": "1.2"}))
    frame = Frame("SEND", {"destination": "/queue/q", "transformation": "jms-map-json"}, b"{}")
    published = [op for op in run(session, frame) if isinstance(op, ops.BasicPublish)]
    assert published[0].properties.headers == {"transformation": "jms-map-json"}  # as the plugin does


# --- one connection per client-id (per adapter process) -----------------------------------------


def test_client_ids_registry() -> None:
    ids, first, second = ClientIds(), object(), object()
    assert ids.claim("app", first) and ids.claim("app", first)
    assert not ids.claim("app", second)
    ids.release("app", second)  # not its holder: nothing happens
    assert "app" in ids
    ids.release("app", first)
    assert "app" not in ids and ids.claim("app", second) and len(ids) == 1


def test_second_connection_with_a_connected_client_id_is_refused() -> None:
    settings = SessionSettings(profile="activemq")
    connect = Frame("CONNECT", {"accept-version": "1.2", "host": "/", "client-id": "app"})
    first = Session(settings, session_id=SESSION_ID, peer_is_loopback=True)
    assert command_of(frames_of(run(first, connect))[-1]) == "CONNECTED"
    second = Session(settings, session_id=SESSION_ID, peer_is_loopback=True)
    out = run(second, connect)
    error = frames_of(out)[-1]
    assert command_of(error) == "ERROR"
    assert header(error, "message") == "Client app already connected"
    assert b"InvalidClientIDException" in error
    assert isinstance(out[-1], ops.CloseClient) and second.user is None  # refused: not logged in
    second.on_closed()  # the refused connection holds nothing
    assert "app" in settings.registries.client_ids
    first.on_closed()
    third = Session(settings, session_id=SESSION_ID, peer_is_loopback=True)
    assert command_of(frames_of(run(third, connect))[-1]) == "CONNECTED"


def test_client_id_is_not_checked_in_the_default_profile() -> None:
    settings = SessionSettings()
    connect = Frame("CONNECT", {"accept-version": "1.2", "host": "/", "client-id": "app"})
    for _ in range(2):
        session = Session(settings, session_id=SESSION_ID, peer_is_loopback=True)
        assert command_of(frames_of(run(session, connect))[-1]) == "CONNECTED"
    assert len(settings.registries.client_ids) == 0


# ------------------------------------------------------------------------------ NACK to ActiveMQ.DLQ


def _nack_session() -> Session:
    session = amq_session(None)
    run(session, Frame("SUBSCRIBE", {"destination": "/queue/work", "id": "s", "ack": "client-individual"}))
    run(session, Frame("SUBSCRIBE", {"destination": "/queue/batch", "id": "c", "ack": "client"}))
    return session


def _deliver(
    session: Session, tag: int, persistent: bool = True, consumer: str = "T_s", queue: str = "work"
) -> None:
    props = MessageProperties(delivery_mode=2 if persistent else 1, headers={"k": "v"})
    assert session.on_delivery(ops.Delivery(consumer, tag, False, "", queue, props, f"body {tag}".encode()))


def test_nack_moves_a_persistent_message_to_the_dead_letter_queue_after_its_confirm() -> None:
    session = _nack_session()
    _deliver(session, 1)
    out = run(session, Frame("NACK", {"id": f"T_s@@{SESSION_ID}@@1", "receipt": "n"}))
    declare, confirm_select, publish, wait, ack = out[:5]
    assert declare == ops.QueueDeclare("ActiveMQ.DLQ", durable=True)
    assert isinstance(confirm_select, ops.ConfirmSelect)
    assert isinstance(publish, ops.BasicPublishMandatory) and (publish.exchange, publish.routing_key) == (
        "",
        "ActiveMQ.DLQ",
    )
    assert publish.body == b"body 1" and publish.properties.delivery_mode == 2
    assert publish.properties.headers == {"k": "v", "original-destination": "/queue/work"}
    assert isinstance(wait, ops.AwaitConfirms)
    assert ack == ops.BasicAck(1, False)
    assert command_of(frames_of(out)[-1]) == "RECEIPT"
    # the second NACK needs neither the declare nor confirm mode again
    _deliver(session, 2)
    out = run(session, Frame("NACK", {"id": f"T_s@@{SESSION_ID}@@2"}))
    assert [type(op) for op in out] == [ops.BasicPublishMandatory, ops.AwaitConfirms, ops.BasicAck]


def test_a_non_persistent_message_nacked_is_dropped_as_activemq_does() -> None:
    session = _nack_session()
    _deliver(session, 3, persistent=False)
    assert run(session, Frame("NACK", {"id": f"T_s@@{SESSION_ID}@@3"})) == [ops.BasicAck(3, False)]


def test_client_mode_nack_covers_every_earlier_delivery() -> None:
    session = _nack_session()
    for tag in (4, 5, 6):
        _deliver(session, tag, consumer="T_c", queue="batch")
    out = run(session, Frame("NACK", {"id": f"T_c@@{SESSION_ID}@@5"}))
    publishes = [op for op in out if isinstance(op, ops.BasicPublishMandatory)]
    assert [p.body for p in publishes] == [b"body 4", b"body 5"]
    assert out[-1] == ops.BasicAck(5, True)
    # 6 is still unsettled; an ACK forgets it, so a NACK of it afterwards is the broker's business
    assert session.quick_ack(Frame("ACK", {"id": f"T_c@@{SESSION_ID}@@6"})) == ops.BasicAck(6, True)
    assert run(session, Frame("NACK", {"id": f"T_c@@{SESSION_ID}@@6"}))[-1] == ops.BasicNack(6, True, True)


def test_a_refused_or_missing_confirm_keeps_the_original() -> None:
    for refused in (True, False):
        session = _nack_session()
        _deliver(session, 7)

        def answer(op: ops.Operation, session: Session = session, refused: bool = refused) -> object:
            if isinstance(op, ops.AwaitConfirms):
                if refused:
                    session.on_confirm(1, False, False)  # the broker nacks the copy
                    return True
                return False  # the wait timed out
            return "ActiveMQ.DLQ" if isinstance(op, ops.QueueDeclare) else None

        out = run(session, Frame("NACK", {"id": f"T_s@@{SESSION_ID}@@7"}), answer)
        assert not any(isinstance(op, ops.BasicAck) for op in out)
        (error,) = [f for f in frames_of(out) if command_of(f) == "ERROR"]
        assert header(error, "message") == "Message rejected by the broker"
        assert isinstance(out[-1], ops.CloseClient)


def _returning(session: Session, returns: list[int]) -> Callable[[ops.Operation], object]:
    """The broker's answers, with ``returns[n]`` copies of the n-th wait for confirms returned
    (basic.return comes before the confirm of the publish it returns)."""
    waits = iter(returns)

    def answer(op: ops.Operation) -> object:
        if isinstance(op, ops.AwaitConfirms):
            for _ in range(next(waits)):
                session.on_return()
            return True
        return op.queue if isinstance(op, ops.QueueDeclare) else None

    return answer


def test_a_copy_returned_because_the_queue_is_gone_is_copied_again_to_the_queue_declared_again() -> None:
    """ActiveMQ.DLQ deleted since the session declared it: the mandatory copy comes back; the
    queue is declared again and the message copied once more, and only then acknowledged."""
    session = _nack_session()
    _deliver(session, 1)
    run(session, Frame("NACK", {"id": f"T_s@@{SESSION_ID}@@1"}))  # declares ActiveMQ.DLQ
    _deliver(session, 2)
    out = run(
        session, Frame("NACK", {"id": f"T_s@@{SESSION_ID}@@2", "receipt": "n"}), _returning(session, [1, 0])
    )
    publish, wait, declare, again, wait_again, ack = out[:6]
    assert isinstance(publish, ops.BasicPublishMandatory) and publish.routing_key == "ActiveMQ.DLQ"
    assert isinstance(wait, ops.AwaitConfirms) and isinstance(wait_again, ops.AwaitConfirms)
    assert declare == ops.QueueDeclare("ActiveMQ.DLQ", durable=True)
    assert again == publish and again.body == b"body 2"
    assert ack == ops.BasicAck(2, False)
    assert command_of(frames_of(out)[-1]) == "RECEIPT"


def test_a_return_that_came_before_the_nack_does_not_count_against_its_copy() -> None:
    """A stray basic.return (none of this NACK's copies: the broker's, or one that came before)
    does not fail a later NACK, nor declare the queue again."""
    session = _nack_session()
    _deliver(session, 1)
    session.on_return()
    out = run(
        session, Frame("NACK", {"id": f"T_s@@{SESSION_ID}@@1", "receipt": "n"}), _returning(session, [0])
    )
    assert [type(op) for op in out if not isinstance(op, ops.SendFrame)] == [
        ops.QueueDeclare,
        ops.ConfirmSelect,
        ops.BasicPublishMandatory,
        ops.AwaitConfirms,
        ops.BasicAck,
    ]
    assert command_of(frames_of(out)[-1]) == "RECEIPT"


@pytest.mark.parametrize(("copies", "returns"), [(1, [1, 1]), (2, [1])])
def test_a_copy_returned_again_or_only_some_of_a_nack_s_is_an_error_and_keeps_the_original(
    copies: int, returns: list[int]
) -> None:
    """Returned once more after the queue was declared again, or a part of a cumulative NACK's
    copies returned (which ones, the broker does not say): ERROR, the original not acked."""
    session = _nack_session()
    for tag in range(1, copies + 1):
        _deliver(session, tag, consumer="T_c", queue="batch")
    out = run(session, Frame("NACK", {"id": f"T_c@@{SESSION_ID}@@{copies}"}), _returning(session, returns))
    assert not any(isinstance(op, (ops.BasicAck, ops.BasicNack)) for op in out)
    declares = [op for op in out if isinstance(op, ops.QueueDeclare)]
    assert len(declares) == len(returns)  # declared again only when every copy came back
    assert not any(isinstance(op, ops.BasicPublish) for op in out)  # every copy mandatory
    (error,) = [f for f in frames_of(out) if command_of(f) == "ERROR"]
    assert header(error, "message") == "Message rejected by the broker"
    assert b"could not route" in error
    assert isinstance(out[-1], ops.CloseClient)


def test_default_profile_nack_is_unchanged() -> None:
    session = Session(SessionSettings(), session_id=SESSION_ID, peer_is_loopback=True)
    run(session, Frame("CONNECT", {"accept-version": "1.2", "host": "/"}))
    run(session, Frame("SUBSCRIBE", {"destination": "/queue/work", "id": "s", "ack": "client-individual"}))
    # the default profile's per-delivery path is the plain one: the null extension, no hook on
    # the subscription (before the session became a router: no on_delivery swapped in)
    assert session.on_delivery.__func__ is Frames.render_message  # type: ignore[attr-defined]
    assert type(session.parts.extension) is ProfileExtension
    assert session.parts.subscriptions.by_tag["T_s"].hook is None
    assert run(session, Frame("NACK", {"id": f"T_s@@{SESSION_ID}@@1"})) == [ops.BasicNack(1, False, True)]


# ------------------------------------------------------------------------------ composite destinations


def test_composite_send_publishes_to_each_and_its_receipt_waits_for_all() -> None:
    session = amq_session(None)
    out = run(session, Frame("SEND", {"destination": "/queue/a,/topic/t.x", "receipt": "r"}, b"hi"))
    publishes = [op for op in out if isinstance(op, ops.BasicPublish)]
    assert [(p.exchange, p.routing_key) for p in publishes] == [("", "a"), ("amq.topic", "t.x")]
    assert any(isinstance(op, ops.QueueDeclare) and op.queue == "a" for op in out)
    assert frames_of(out) == []  # no RECEIPT before the broker confirmed both
    assert session.on_confirm(1, False, True) == []
    (receipt,) = session.on_confirm(2, False, True)
    assert command_of(receipt) == "RECEIPT" and header(receipt, "receipt-id") == "r"


def test_composite_send_with_a_refused_copy_is_an_error() -> None:
    session = amq_session(None)
    run(session, Frame("SEND", {"destination": "/queue/a,/queue/b", "receipt": "r"}, b"hi"))
    (error,) = session.on_confirm(2, True, False)
    assert command_of(error) == "ERROR" and header(error, "receipt-id") == "r"


def test_composite_destination_errors() -> None:
    session = amq_session(None)
    out = run(session, Frame("SEND", {"destination": "/queue/a,,/queue/b"}, b"x"))
    assert header(frames_of(out)[0], "message") == "Invalid destination"
    default = Session(SessionSettings(), session_id=SESSION_ID, peer_is_loopback=True)
    run(default, Frame("CONNECT", {"accept-version": "1.2", "host": "/"}))
    out = run(default, Frame("SEND", {"destination": "/queue/a,/queue/b"}, b"x"))
    # the plugin's rule: the comma is part of a queue name, and '/' is not allowed in it
    assert header(frames_of(out)[0], "message") == "Invalid destination"


# --- selectors on a queue: the session's side of the dispatcher (adapter/dispatch/rules.py) --


def test_queue_selector_subscription_joins_the_dispatcher_before_it_consumes() -> None:
    session = amq_session()
    out = run(
        session,
        Frame(
            "SUBSCRIBE",
            {
                "destination": "/queue/q",
                "id": "1",
                "ack": "client-individual",
                "selector": "n > 1",
                "activemq.prefetchSize": "3",
            },
        ),
    )
    kinds = [type(op) for op in out if not isinstance(op, ops.SendFrame)]
    assert kinds == [ops.QueueDeclare, ops.BasicQos, ops.JoinDispatch, ops.BasicConsume, ops.ActivateDispatch]
    assert ops.BasicQos(3 + dispatch.PARK_LIMIT) in out  # the STOMP prefetch plus the parking room
    join = next(op for op in out if isinstance(op, ops.JoinDispatch))
    assert (join.queue, join.consumer_tag, join.auto_ack, join.credit) == ("q", "T_1", False, 3)
    assert join.matches(MessageProperties(headers={"n": "2"}))
    assert not join.matches(MessageProperties(headers={"n": "1"}))
    consume = next(op for op in out if isinstance(op, ops.BasicConsume))
    assert consume.no_ack is False  # held messages need acks


def test_a_dispatched_subscription_is_activated_only_after_its_consume_and_its_receipt() -> None:
    # the broker may refuse the consume (no read permission, an exclusive consumer): until it
    # accepted it the member takes no held message, so none is acknowledged away for it
    out = run(
        amq_session(),
        Frame("SUBSCRIBE", {"destination": "/amq/queue/q", "id": "1", "selector": "n > 1", "receipt": "r"}),
    )
    kinds = [type(op) for op in out]
    assert kinds[-4:] == [ops.JoinDispatch, ops.BasicConsume, ops.SendFrame, ops.ActivateDispatch]
    receipt = out[-2]
    assert isinstance(receipt, ops.SendFrame) and command_of(receipt.data) == "RECEIPT"
    assert out[-1] == ops.ActivateDispatch("T_1")


def test_a_plain_queue_subscription_joins_the_queues_dispatcher_when_there_is_one() -> None:
    session = amq_session()
    plain = {"destination": "/queue/q", "id": "1", "ack": "client"}
    out = run(session, Frame("SUBSCRIBE", plain))
    assert not any(isinstance(op, ops.JoinDispatch) for op in out)  # no dispatcher: the broker's way
    assert next(op for op in out if isinstance(op, ops.BasicConsume)).no_ack is False
    session.settings.registries.dispatchers.get("/", "q")  # a selector subscription of the process made one
    out = run(session, Frame("SUBSCRIBE", {**plain, "id": "2", "ack": "auto"}))
    join = next(op for op in out if isinstance(op, ops.JoinDispatch))
    assert (join.consumer_tag, join.auto_ack) == ("T_2", True)
    assert join.matches(MessageProperties()) and join.matches(MessageProperties(headers={"n": "0"}))
    assert next(op for op in out if isinstance(op, ops.BasicConsume)).no_ack is False  # held: acked
    assert out[-1] == ops.ActivateDispatch("T_2")
    # a stream read from an offset is never held: it stays out
    out = run(session, Frame("SUBSCRIBE", {**plain, "id": "3", "x-stream-offset": "first"}))
    assert not any(isinstance(op, ops.JoinDispatch) for op in out)


def test_the_rabbitmq_profile_never_joins_a_dispatcher() -> None:
    session = Session(SessionSettings(), session_id=SESSION_ID, peer_is_loopback=True)
    run(session, Frame("CONNECT", {"accept-version": "1.2", "host": "/"}))
    session.settings.registries.dispatchers.get("/", "q")
    out = run(session, Frame("SUBSCRIBE", {"destination": "/queue/q", "id": "1"}))
    assert not any(isinstance(op, ops.DISPATCH_OPS) for op in out)
    assert next(op for op in out if isinstance(op, ops.BasicConsume)).no_ack is True


def test_auto_ack_queue_selector_consumes_with_acks_and_unlimited_credit() -> None:
    out = run(amq_session(), Frame("SUBSCRIBE", {"destination": "/queue/q", "id": "1", "selector": "n > 1"}))
    join = next(op for op in out if isinstance(op, ops.JoinDispatch))
    assert join.auto_ack and join.credit is None
    assert ops.BasicQos(dispatch.PARK_LIMIT) in out
    assert next(op for op in out if isinstance(op, ops.BasicConsume)).no_ack is False


def _dispatched_session(ack: str) -> Session:
    session = amq_session()
    run(session, Frame("SUBSCRIBE", {"destination": "/queue/q", "id": "1", "ack": ack, "selector": "n > 1"}))
    return session


def test_dispatched_delivery_goes_to_the_dispatcher_and_acks_to_dispatch_settle() -> None:
    session = _dispatched_session("client-individual")
    delivery = ops.Delivery("T_1", 7, False, "", "q", MessageProperties(headers={"n": "1"}), b"x")
    assert session.on_delivery(delivery) == b""
    assert session.dropped_delivery_ack(delivery) == ops.DispatchDelivery(delivery)
    # the dispatcher numbers what it gives this subscription: the number is in the message-id
    rendered = session.render_dispatched(delivery._replace(delivery_tag=1))
    message_id = header(rendered, "message-id")
    assert message_id is not None and message_id.endswith("@@1")
    ack = Frame("ACK", {"id": message_id})
    assert session.quick_ack(ack) is None  # never acked on this channel directly
    assert run(session, ack) == [ops.DispatchSettle("T_1", 1, False, ack=True)]


def test_dispatched_client_ack_is_cumulative_and_nack_goes_to_the_dead_letter_queue() -> None:
    session = _dispatched_session("client")
    props = MessageProperties(headers={"n": "5"}, delivery_mode=2)
    for number in (1, 2):
        session.render_dispatched(ops.Delivery("T_1", number, False, "", "q", props, b"x"))
    out = run(session, Frame("NACK", {"id": f"T_1@@{SESSION_ID}@@2"}), _confirmed)
    publishes = [op for op in out if isinstance(op, ops.BasicPublishMandatory)]
    assert [p.routing_key for p in publishes] == ["ActiveMQ.DLQ", "ActiveMQ.DLQ"]
    assert out[-1] == ops.DispatchSettle("T_1", 2, True, ack=True)


def test_dispatched_ack_in_a_transaction_is_replayed_at_commit() -> None:
    session = _dispatched_session("client-individual")
    run(session, Frame("BEGIN", {"transaction": "t"}))
    assert run(session, Frame("ACK", {"id": f"T_1@@{SESSION_ID}@@4", "transaction": "t"})) == []
    assert run(session, Frame("COMMIT", {"transaction": "t"})) == [
        ops.DispatchSettle("T_1", 4, False, ack=True)
    ]


def test_unsubscribe_leaves_the_dispatcher() -> None:
    session = _dispatched_session("client")
    out = run(session, Frame("UNSUBSCRIBE", {"id": "1"}))
    assert out == [ops.LeaveDispatch("T_1"), ops.BasicCancel("T_1")]


def _confirmed(op: ops.Operation) -> object:
    if isinstance(op, ops.AwaitConfirms):
        return True
    if isinstance(op, ops.QueueDeclare):
        return op.queue
    return None


def test_an_ack_committed_in_a_transaction_is_not_dead_lettered_by_a_later_nack() -> None:
    session = _dispatched_session("client")
    properties = MessageProperties(headers={"n": "5"}, delivery_mode=2)
    for number in (1, 2):
        session.render_dispatched(ops.Delivery("T_1", number, False, "", "q", properties, b"x"))
    run(session, Frame("BEGIN", {"transaction": "t"}))
    run(session, Frame("ACK", {"id": f"T_1@@{SESSION_ID}@@1", "transaction": "t"}))
    assert run(session, Frame("COMMIT", {"transaction": "t"})) == [
        ops.DispatchSettle("T_1", 1, True, ack=True)
    ]
    out = run(session, Frame("NACK", {"id": f"T_1@@{SESSION_ID}@@2"}), _confirmed)
    copies = [op for op in out if isinstance(op, ops.BasicPublishMandatory)]
    assert len(copies) == 1  # message 2 only: message 1 was acknowledged at the COMMIT


def test_a_server_cancelled_dispatched_subscription_forgets_its_messages() -> None:
    session = _dispatched_session("client")
    session.render_dispatched(
        ops.Delivery("T_1", 1, False, "", "q", MessageProperties(headers={"n": "5"}), b"x")
    )
    assert session.is_dispatched("T_1")
    error = session.on_server_cancel("T_1")
    assert error.startswith(b"ERROR") and not session.is_dispatched("T_1")
    # the shell took it out of its dispatcher (is_dispatched was read first); nothing of it is
    # left for a NACK to copy to the dead-letter queue
    out = run(
        session,
        Frame("SUBSCRIBE", {"destination": "/queue/q", "id": "1", "ack": "client", "selector": "n > 1"}),
    )
    assert any(isinstance(op, ops.JoinDispatch) for op in out)
    out = run(session, Frame("NACK", {"id": f"T_1@@{SESSION_ID}@@1"}), _confirmed)
    assert not any(isinstance(op, ops.BasicPublishMandatory) for op in out)


def delivery_of(consumer_tag: str, tag: int, body: bytes) -> ops.Delivery:
    return ops.Delivery(consumer_tag, tag, False, "", "q", MessageProperties(headers={}), body)


@pytest.mark.parametrize("destination", ["/topic/t", "/temp-queue/x", "/temp-topic/x", "/exchange/e/k"])
def test_a_browser_on_anything_but_a_queue_is_refused(destination: str) -> None:
    out = run(amq_session(), Frame("SUBSCRIBE", {"destination": destination, "id": "1", "browser": " TRUE"}))
    error = frames_of(out)[0]
    assert command_of(error) == "ERROR" and header(error, "message") == "Browsing not supported"
    assert not any(isinstance(op, ops.BasicConsume | ops.QueueBind | ops.BasicGet) for op in out)


def _drive(session: Session, frame: Frame, answer: Callable[[int], object]) -> list[ops.Operation]:
    """Run a frame's steps, answering the n-th BasicGet with ``answer(n)``."""
    steps = session.handle_frame(frame)
    seen: list[ops.Operation] = []
    gets = 0
    reply: object = None
    while True:
        try:
            op = steps.send(reply)
        except StopIteration:
            return seen
        seen.append(op)
        reply = None
        if isinstance(op, ops.BasicGet):
            gets += 1
            reply = answer(gets)


def test_a_browser_takes_messages_with_basic_get_and_hands_them_back() -> None:
    """browser:true on a queue: RECEIPT, basic.get until the queue is empty (each message sent
    as a MESSAGE of the subscription), each handed back (nack, requeue), then browser:end.  No
    consume: the browse takes nothing from the queue's consumers for good."""
    frame = Frame("SUBSCRIBE", {"destination": "/queue/q", "id": "b", "browser": "true", "receipt": "r"})
    seen = _drive(
        amq_session(), frame, lambda n: delivery_of("T_b", 6 + n, b"m%d" % (6 + n)) if n <= 2 else None
    )
    sent = b"".join(o.data for o in seen if isinstance(o, ops.SendFrame))
    assert sent.index(b"RECEIPT") < sent.index(b"m7") < sent.index(b"m8") < sent.index(b"browser:end")
    # handed back in one operation, on whatever connection the gets ran on (a probe's, with
    # multiplexing): never as BasicNacks on the session's own channel
    assert [o for o in seen if isinstance(o, ops.RequeueGot)] == [ops.RequeueGot((7, 8))]
    assert not any(isinstance(o, ops.BasicNack) for o in seen)
    assert sum(isinstance(o, ops.BasicGet) for o in seen) == 3
    assert not any(isinstance(o, ops.BasicConsume) for o in seen)


def test_a_browse_is_bounded_by_the_page_size_and_bytes() -> None:
    frame = Frame("SUBSCRIBE", {"destination": "/queue/q", "id": "b", "browser": "true"})
    seen = _drive(amq_session(), frame, lambda n: delivery_of("T_b", n, b"x"))
    assert sum(isinstance(o, ops.BasicGet) for o in seen) == BROWSE_LIMIT
    big = b"x" * (BROWSE_BYTES // 4)
    seen = _drive(amq_session(), frame, lambda n: delivery_of("T_b", n, big))
    assert sum(isinstance(o, ops.BasicGet) for o in seen) == 4
    assert [o for o in seen if isinstance(o, ops.RequeueGot)] == [ops.RequeueGot((1, 2, 3, 4))]


def test_an_empty_browse_still_hands_back_so_a_probe_closes() -> None:
    frame = Frame("SUBSCRIBE", {"destination": "/queue/q", "id": "b", "browser": "true"})
    seen = _drive(amq_session(), frame, lambda n: None)
    assert sum(isinstance(o, ops.BasicGet) for o in seen) == 1
    assert [o for o in seen if isinstance(o, ops.RequeueGot)] == [ops.RequeueGot(())]


def test_a_scheduled_send_goes_the_general_way_through_its_delay_queue() -> None:
    session = amq_session()
    plain = Frame("SEND", {"destination": "/queue/q"}, b"x")
    run(session, plain)
    assert session.quick_send(plain) is not None  # the destination is known now
    scheduled = Frame("SEND", {"destination": "/queue/q", "AMQ_SCHEDULED_DELAY": "1234"}, b"x")
    assert session.quick_send(scheduled) is None
    out = run(session, scheduled)
    kinds = [type(op).__name__ for op in out]
    assert kinds == ["QueueDeclare", "QueueBind", "BasicPublish"]
    publish = out[-1]
    assert isinstance(publish, ops.BasicPublish)
    assert (publish.exchange, publish.routing_key) == ("amq.headers", "q")
    assert "AMQ_SCHEDULED_DELAY" not in (publish.properties.headers or {})


def test_a_scheduled_send_in_a_transaction_declares_its_delay_queue_at_commit() -> None:
    """The delay queue expires when unused (x-expires): it is declared and bound right before
    the publish, at COMMIT, however long the transaction stayed open."""
    session = amq_session()
    run(session, Frame("BEGIN", {"transaction": "t"}))
    sent = run(
        session, Frame("SEND", {"destination": "/topic/t", "AMQ_SCHEDULED_DELAY": "50", "transaction": "t"})
    )
    assert sent == []
    out = run(session, Frame("COMMIT", {"transaction": "t", "receipt": "c"}))
    kinds = [type(op).__name__ for op in out if not isinstance(op, ops.SendFrame | ops.ConfirmSelect)]
    assert kinds == ["QueueDeclare", "QueueBind", "BasicPublish"]
    declare = next(op for op in out if isinstance(op, ops.QueueDeclare))
    assert declare.queue == "activemq.scheduled.50ms.amq.topic"
    assert declare.arguments["x-dead-letter-exchange"] == "amq.topic"


def test_the_default_profile_passes_scheduling_headers_on() -> None:
    session = connected()
    out = run(session, Frame("SEND", {"destination": "/topic/t", "AMQ_SCHEDULED_CRON": "* * * * *"}, b"x"))
    publish = next(op for op in out if isinstance(op, ops.BasicPublish))
    assert publish.exchange == "amq.topic"
    assert publish.properties.headers == {"AMQ_SCHEDULED_CRON": "* * * * *"}
