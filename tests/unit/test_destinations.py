"""Unit tests for adapter.mapping.destinations: the plugin's destination, queue-parameter,
consumer-tag and MESSAGE-header rules as docs/destinations.md describes them."""

import ast
import base64
import hashlib
import re
import struct
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapter.mapping.destinations import (
    ADAPTER_EXTRA_QUEUE_ARGUMENTS,
    PLUGIN_QUEUE_ARGUMENTS,
    AmqpFieldType,
    Destination,
    DestinationError,
    DestinationKind,
    ProcessingError,
    QueueParams,
    SubscribeTarget,
    check_not_temp_queue,
    consumer_tag,
    durable_unsubscribe_queue,
    is_durable,
    message_destination,
    message_reply_to,
    parse_destination,
    parse_reply_to,
    publish_target,
    queue_arguments,
    queue_params,
    reply_consumer_tag,
    reply_to_temp_queue,
    require_destination,
    require_id_for_durable,
    send_queue_declare,
    stream_offset_argument,
    subscribe_target,
    subscription_description,
    subscription_queue,
    subscription_queue_name,
    unsubscribe_consumer_tag,
)

K = DestinationKind
UNKNOWN_TAIL = (
    "Valid destination types are: /temp-queue, /exchange, /topic, /queue, /amq/queue, /reply-queue/.\n"
)
SUB_NAME = re.compile(r"stomp-subscription-[A-Za-z0-9_-]{22}")


def _raises(exc_info: pytest.ExceptionInfo[DestinationError]) -> tuple[str, str]:
    return exc_info.value.message, exc_info.value.detail


# ---------------------------------------------------------------------------------------------
# Purity
# ---------------------------------------------------------------------------------------------


def test_module_imports_only_stdlib() -> None:
    # adapter.mapping must stay pure: no asyncio, aio-pika, aiormq, pamqp, pydantic (stdlib and
    # the pure roots adapter/errors.py and adapter/numbers.py only).
    import adapter.mapping
    import adapter.mapping.destinations as module

    for path in (Path(module.__file__), Path(adapter.mapping.__file__)):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level > 0:
                # within the project only the pure roots: errors and bounded integers
                assert node.module in ("errors", "numbers"), node.module
            elif isinstance(node, ast.ImportFrom):
                assert node.module is not None
                imported.add(node.module.split(".")[0])
        assert imported <= sys.stdlib_module_names, imported - sys.stdlib_module_names
        assert not imported & {"asyncio", "aio_pika", "aiormq", "pamqp", "pydantic"}


# ---------------------------------------------------------------------------------------------
# docs/destinations.md#parsing parsing
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "kind", "name", "routing_key"),
    [
        ("foo", K.QUEUE, "foo", None),
        ("/queue/foo", K.QUEUE, "foo", None),
        ("/topic/foo", K.TOPIC, "foo", None),
        ("/topic/a.b.*", K.TOPIC, "a.b.*", None),
        ("/exchange/x", K.EXCHANGE, "x", None),
        ("/exchange/x/k", K.EXCHANGE, "x", "k"),
        ("/exchange/amq.direct/", K.EXCHANGE, "amq.direct", ""),
        ("/amq/queue/q", K.AMQ_QUEUE, "q", None),
        ("/temp-queue/t1", K.TEMP_QUEUE, "t1", None),
        ("/reply-queue/q", K.REPLY_QUEUE, "q", None),
        ("/reply-queue/a/b/c", K.REPLY_QUEUE, "a/b/c", None),
        ("/reply-queue//x", K.REPLY_QUEUE, "/x", None),
        ("/reply-queue/amq.gen-abc", K.REPLY_QUEUE, "amq.gen-abc", None),
        # %2F (upper-case F only) is decoded after splitting
        ("/queue/a%2Fb", K.QUEUE, "a/b", None),
        ("a%2Fb", K.QUEUE, "a/b", None),
        ("/queue/a%2fb", K.QUEUE, "a%2fb", None),
        ("/queue/a%25b%20c", K.QUEUE, "a%25b%20c", None),
        ("/topic/x%2Fy%2F", K.TOPIC, "x/y/", None),
        ("/exchange/e%2Fx/k%2Fy", K.EXCHANGE, "e/x", "k/y"),
        ("/exchange/%2F", K.EXCHANGE, "/", None),
        ("/amq/queue/a%2Fb", K.AMQ_QUEUE, "a/b", None),
        ("/temp-queue/a%2Fb", K.TEMP_QUEUE, "a/b", None),
        ("/queue/%%2F2F", K.QUEUE, "%/2F", None),
        # non-ASCII bytes survive (surrogateescape)
        ("/queue/caf\u00e9", K.QUEUE, "caf\u00e9", None),
        ("/queue/\udcff\udcfe", K.QUEUE, "\udcff\udcfe", None),
        ("/queue/ spaced name ", K.QUEUE, " spaced name ", None),
    ],
)
def test_parse_destination(raw: str, kind: DestinationKind, name: str, routing_key: str | None) -> None:
    assert parse_destination(raw) == Destination(kind, name, routing_key, raw)


def test_reply_queue_name_goes_through_percent_2f_decoding() -> None:
    # Deliberate deviation from the reference's prose ("no unescaping"): routing_util.erl at
    # v3.10.8 parses /reply-queue/<rest> as one segment and applies the same %2F decoding.
    assert parse_destination("/reply-queue/a%2Fb").name == "a/b"


def test_destination_kind_values_are_plugin_atoms() -> None:
    plugin = ["queue", "amqqueue", "topic", "exchange", "temp_queue", "reply_queue"]
    assert [str(k) for k in K] == [*plugin, "temp_topic"]  # the last: the activemq profile's own


def test_routing_name() -> None:
    assert parse_destination("/topic/k").routing_name == "k"
    assert parse_destination("/exchange/x/k").routing_name == "k"
    assert parse_destination("/exchange/x").routing_name == ""
    assert parse_destination("/queue/q").routing_name == "q"


# ---------------------------------------------------------------------------------------------
# docs/destinations.md#parsing errors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "body"),
    [
        # row 1: nothing after the type
        ("/queue", "'' is not a valid queue destination\n"),
        ("/topic", "'' is not a valid topic destination\n"),
        ("/exchange", "'' is not a valid exchange destination\n"),
        ("/amq/queue", "'' is not a valid amqqueue destination\n"),
        ("/temp-queue", "'' is not a valid temp_queue destination\n"),
        # row 2: an empty segment
        ("/queue/", "'/' is not a valid queue destination\n"),
        ("/topic/", "'/' is not a valid topic destination\n"),
        ("/exchange/", "'/' is not a valid exchange destination\n"),
        ("/amq/queue/", "'/' is not a valid amqqueue destination\n"),
        ("/reply-queue/", "'/' is not a valid reply_queue destination\n"),
        ("/temp-queue/", "'/' is not a valid temp_queue destination\n"),
        # row 3: too many segments (raw, not %2F-decoded)
        ("/queue/a/b", "'/a/b' is not a valid queue destination\n"),
        ("/topic/a/b", "'/a/b' is not a valid topic destination\n"),
        ("/exchange/a/b/c", "'/a/b/c' is not a valid exchange destination\n"),
        ("/exchange//foo", "'//foo' is not a valid exchange destination\n"),
        ("/exchange//", "'//' is not a valid exchange destination\n"),
        ("/amq/queue/a/b", "'/a/b' is not a valid amqqueue destination\n"),
        ("/temp-queue/a/b", "'/a/b' is not a valid temp_queue destination\n"),
        ("/queue/a%2Fb/c", "'/a%2Fb/c' is not a valid queue destination\n"),
        ("/queue//", "'//' is not a valid queue destination\n"),
    ],
)
def test_invalid_destination(raw: str, body: str) -> None:
    with pytest.raises(DestinationError) as exc_info:
        parse_destination(raw)
    assert _raises(exc_info) == ("Invalid destination", body)


@pytest.mark.parametrize(
    "raw",
    ["/reply-queue", "/foo/bar", "a/b", "/Queue/x", "/", "//", "/amq", "/amq/topic/x", "/temp_queue/x", "x/"],
)
def test_unknown_destination(raw: str) -> None:
    with pytest.raises(DestinationError) as exc_info:
        parse_destination(raw)
    assert _raises(exc_info) == (
        "Unknown destination",
        f"'{raw}' is not a valid destination.\n{UNKNOWN_TAIL}",
    )


def test_blank_destination() -> None:
    with pytest.raises(DestinationError) as exc_info:
        parse_destination("")
    assert _raises(exc_info) == ("Invalid destination", "Destination cannot be blank")


@pytest.mark.parametrize("command", ["SEND", "SUBSCRIBE"])
def test_temp_queue_not_a_valid_send_or_subscribe_destination(command: str) -> None:
    dest = parse_destination("/temp-queue/x")
    with pytest.raises(DestinationError) as exc_info:
        check_not_temp_queue(dest, command)
    assert _raises(exc_info) == (
        "Invalid destination",
        f"'/temp-queue/x' is not a valid destination for '{command}'\n",
    )
    check_not_temp_queue(parse_destination("/queue/x"), command)  # no error


@pytest.mark.parametrize("command", ["SEND", "SUBSCRIBE"])
def test_missing_destination(command: str) -> None:
    with pytest.raises(DestinationError) as exc_info:
        require_destination({"id": "1"}, command)
    assert _raises(exc_info) == (
        "Missing destination",
        f"\"{command}\" must include a 'destination' header\n",
    )
    assert require_destination({"destination": "/queue/a"}, command) == "/queue/a"


# ---------------------------------------------------------------------------------------------
# docs/destinations.md#common-steps / docs/destinations.md#topicpattern publish target
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "default", "target"),
    [
        ("/queue/q", "amq.topic", ("", "q")),
        ("q", "amq.topic", ("", "q")),
        ("/amq/queue/q", "amq.topic", ("", "q")),
        ("/reply-queue/amq.gen-1", "amq.topic", ("", "amq.gen-1")),
        ("/topic/k", "amq.topic", ("amq.topic", "k")),
        ("/topic/k", "my.topic", ("my.topic", "k")),
        ("/exchange/x", "amq.topic", ("x", "")),
        ("/exchange/x/", "amq.topic", ("x", "")),
        ("/exchange/x/k", "my.topic", ("x", "k")),
        ("/exchange/amq.topic/k", "amq.topic", ("amq.topic", "k")),
        ("/exchange/amq.topic/k", "my.topic", ("my.topic", "k")),
        ("/exchange/amq.topic", "my.topic", ("my.topic", "")),
        ("/exchange/e%2Fx/a%2Fb", "amq.topic", ("e/x", "a/b")),
    ],
)
def test_publish_target(raw: str, default: str, target: tuple[str, str]) -> None:
    assert publish_target(parse_destination(raw), default) == target


def test_publish_target_temp_queue() -> None:
    with pytest.raises(DestinationError) as exc_info:
        publish_target(parse_destination("/temp-queue/t"), "amq.topic")
    assert exc_info.value.detail == "'/temp-queue/t' is not a valid destination for 'SEND'\n"


def test_send_queue_declare() -> None:
    q = parse_destination("/queue/q")
    assert send_queue_declare(q, {}) == QueueParams(True, False, False, {})
    # cached per connection: never redeclared, even with different (even bad) flags
    assert send_queue_declare(q, {"durable": "yes"}, {"q"}) is None
    assert send_queue_declare(parse_destination("/topic/k"), {"durable": "yes"}) is None
    assert send_queue_declare(parse_destination("/amq/queue/q"), {}) is None
    with pytest.raises(ProcessingError):
        send_queue_declare(q, {"persistent": "yes"})
    # x- arguments are checked for every destination type, before the temp-queue check
    with pytest.raises(ProcessingError):
        send_queue_declare(parse_destination("/topic/k"), {"x-max-length": "abc"})
    with pytest.raises(ProcessingError):
        send_queue_declare(parse_destination("/temp-queue/t"), {"x-expires": "x"})
    with pytest.raises(DestinationError):
        send_queue_declare(parse_destination("/temp-queue/t"), {"x-expires": "1"})


# ---------------------------------------------------------------------------------------------
# docs/destinations.md#queue-flag-headers queue.declare parameters
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "headers", "flags"),
    [
        # docs/destinations.md#queue-flag-headers table rows: (durable, auto_delete, exclusive) as sent in
        # queue.declare
        (K.QUEUE, {}, (True, False, False)),
        (K.QUEUE, {"durable": "false"}, (False, True, True)),
        (K.QUEUE, {"persistent": "false"}, (False, True, True)),
        (K.QUEUE, {"auto-delete": "true"}, (True, True, False)),
        # sent durable=true, exclusive=true; the broker itself makes exclusive queues non-durable
        (K.QUEUE, {"exclusive": "true"}, (True, False, True)),
        (K.QUEUE, {"exclusive": "true", "auto-delete": "true"}, (True, True, True)),
        (K.TOPIC, {}, (False, True, False)),
        (K.TOPIC, {"durable": "true"}, (True, True, False)),
        (K.TOPIC, {"persistent": "true"}, (True, True, False)),
        (K.TOPIC, {"durable": "true", "auto-delete": "false"}, (True, False, False)),
        (K.TOPIC, {"exclusive": "true"}, (False, True, True)),
        (K.EXCHANGE, {}, (False, True, False)),
        (K.EXCHANGE, {"persistent": "true", "auto-delete": "false"}, (True, False, False)),
        # docs/destinations.md#queue-flag-headers value spellings
        (K.QUEUE, {"durable": "False"}, (False, True, True)),
        (K.TOPIC, {"durable": "True"}, (True, True, False)),
        (K.QUEUE, {"durable": "true", "exclusive": "True"}, (True, False, True)),
        # invalid auto-delete/exclusive: "undefined" replaces the default => the durable rule value
        (K.QUEUE, {"auto-delete": "yes"}, (True, False, False)),
        (K.QUEUE, {"durable": "false", "exclusive": "1"}, (False, True, True)),
        (K.TOPIC, {"exclusive": "yes"}, (False, True, True)),
        (K.TOPIC, {"auto-delete": "no", "durable": "true"}, (True, False, False)),
        # durable and persistent both present: the later header in the frame wins
        (K.QUEUE, {"durable": "false", "persistent": "true"}, (True, False, False)),
        (K.QUEUE, {"persistent": "true", "durable": "false"}, (False, True, True)),
        (K.QUEUE, {"durable": "yes", "persistent": "true"}, (True, False, False)),
        # never-declared kinds get the plugin's catch-all default (durable=false)
        (K.AMQ_QUEUE, {}, (False, True, True)),
    ],
)
def test_queue_params_flags(
    kind: DestinationKind, headers: dict[str, str], flags: tuple[bool, bool, bool]
) -> None:
    params = queue_params(kind, headers)
    assert (params.durable, params.auto_delete, params.exclusive) == flags
    assert params.arguments == {}


@pytest.mark.parametrize("header", ["durable", "persistent"])
@pytest.mark.parametrize("value", ["yes", "1", "TRUE", "", " true"])
@pytest.mark.parametrize("kind", [K.QUEUE, K.TOPIC, K.EXCHANGE])
def test_queue_params_bad_durable_is_processing_error(header: str, value: str, kind: DestinationKind) -> None:
    with pytest.raises(ProcessingError) as exc_info:
        queue_params(kind, {header: value})
    assert exc_info.value.message == "Processing error"
    assert exc_info.value.detail


def test_queue_arguments_plugin_set() -> None:
    headers = {
        "x-dead-letter-exchange": " dlx ",
        "x-dead-letter-routing-key": "dl.key",
        "x-expires": " 60000",
        "x-max-length": "10",
        "x-max-length-bytes": "+1024",
        "x-max-priority": "9 ",
        "x-message-ttl": "-1",
        "x-queue-type": "quorum",
        # not passed by the plugin
        "x-queue-mode": "lazy",
        "x-queue-name": "named",
        "x-custom": "1",
        "X-Max-Length": "5",
    }
    assert queue_arguments(headers) == {
        "x-dead-letter-exchange": "dlx",
        "x-dead-letter-routing-key": "dl.key",
        "x-expires": 60000,
        "x-max-length": 10,
        "x-max-length-bytes": 1024,
        "x-max-priority": 9,
        "x-message-ttl": -1,
        "x-queue-type": "quorum",
    }
    assert list(queue_arguments(headers)) == list(PLUGIN_QUEUE_ARGUMENTS)  # frame order kept
    assert queue_params(K.QUEUE, {"x-max-length": "10"}).arguments == {"x-max-length": 10}


def test_queue_arguments_keep_frame_order() -> None:
    headers = {"x-queue-type": "stream", "x-max-length": "1", "x-dead-letter-exchange": "d"}
    assert list(queue_arguments(headers)) == ["x-queue-type", "x-max-length", "x-dead-letter-exchange"]


@pytest.mark.parametrize(
    "value", ["abc", "", " ", "1.5", "1e3", "1_000", "0x10", "\t10", "10\n", "١٢", "--1", "1 2"]
)
@pytest.mark.parametrize("header", [h for h, t in PLUGIN_QUEUE_ARGUMENTS.items() if t is AmqpFieldType.LONG])
def test_queue_arguments_bad_integer(header: str, value: str) -> None:
    with pytest.raises(ProcessingError):
        queue_arguments({header: value})
    with pytest.raises(ProcessingError):
        queue_params(K.QUEUE, {header: value})


def test_queue_arguments_only_spaces_are_stripped() -> None:
    assert queue_arguments({"x-queue-type": "\tclassic "}) == {"x-queue-type": "\tclassic"}


def test_adapter_extra_queue_arguments() -> None:
    assert set(ADAPTER_EXTRA_QUEUE_ARGUMENTS) == {
        "x-overflow",
        "x-max-age",
        "x-single-active-consumer",
        "x-delivery-limit",
        "x-stream-filter-size-bytes",
    }
    assert not set(ADAPTER_EXTRA_QUEUE_ARGUMENTS) & set(PLUGIN_QUEUE_ARGUMENTS)
    assert queue_arguments(
        {"x-overflow": " reject-publish-dlx ", "x-max-age": "7D", "x-single-active-consumer": "true"}
    ) == {"x-overflow": "reject-publish-dlx", "x-max-age": "7D", "x-single-active-consumer": True}
    for value in ("drop-head", "reject-publish", "reject-publish-dlx"):
        assert queue_arguments({"x-overflow": value}) == {"x-overflow": value}
    assert queue_arguments({"x-single-active-consumer": "false"}) == {"x-single-active-consumer": False}
    assert queue_arguments({"x-single-active-consumer": "False"}) == {"x-single-active-consumer": False}


@pytest.mark.parametrize(
    "headers",
    [
        {"x-overflow": "drop-tail"},
        {"x-overflow": "Drop-Head"},
        {"x-overflow": ""},
        {"x-single-active-consumer": "yes"},
        {"x-single-active-consumer": "1"},
    ],
)
def test_adapter_extra_queue_arguments_invalid(headers: dict[str, str]) -> None:
    with pytest.raises(ProcessingError):
        queue_arguments(headers)


def test_queue_params_bad_argument_checked_before_flags() -> None:
    with pytest.raises(ProcessingError) as exc_info:
        queue_params(K.QUEUE, {"durable": "yes", "x-max-length": "x"})
    assert "x-max-length" in exc_info.value.detail


# ---------------------------------------------------------------------------------------------
# docs/destinations.md#durable-subscriptions durable subscriptions
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "durable"),
    [
        ({}, False),
        ({"durable": "true"}, True),
        ({"persistent": "true"}, True),
        ({"durable": "True"}, True),
        ({"persistent": "True"}, True),
        ({"durable": "false", "persistent": "true"}, True),
        ({"durable": "false"}, False),
        ({"durable": "yes"}, False),
        ({"durable": "TRUE"}, False),
        ({"durable": " true"}, False),
    ],
)
def test_is_durable(headers: dict[str, str], durable: bool) -> None:
    assert is_durable(headers) is durable


@pytest.mark.parametrize(
    "headers", [{"durable": "true"}, {"persistent": "true"}, {"durable": "x", "persistent": "true"}]
)
def test_require_id_for_durable_missing(headers: dict[str, str]) -> None:
    with pytest.raises(DestinationError) as exc_info:
        require_id_for_durable(headers)
    assert _raises(exc_info) == ("Missing Header", "Header 'id' is required for durable subscriptions")


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"durable": "true", "id": "1"},
        {"persistent": "true", "id": ""},
        {"durable": "false"},
        # only the literal value "true" triggers the check (processor.erl validate_frame)
        {"durable": "True"},
        {"persistent": "True"},
    ],
)
def test_require_id_for_durable_ok(headers: dict[str, str]) -> None:
    require_id_for_durable(headers)


# ---------------------------------------------------------------------------------------------
# docs/destinations.md#durable-subscriptions subscription queue names
# ---------------------------------------------------------------------------------------------


def test_durable_subscription_name_reference_vector() -> None:
    # Name = "durable" (the routing key of /topic/durable), SubId = "test.subscription".
    assert (
        subscription_queue_name("durable", "test.subscription") == "stomp-subscription-tMbeqL30tjlgaXMmaFM6Ew"
    )
    assert (
        subscription_queue_name("test.subscription", "durable") != "stomp-subscription-tMbeqL30tjlgaXMmaFM6Ew"
    )


def _expected_name(term: bytes) -> str:
    digest = hashlib.md5(term).digest()
    return "stomp-subscription-" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def test_durable_subscription_name_term_encoding() -> None:
    # empty strings are NIL_EXT
    assert subscription_queue_name("", "id") == _expected_name(b"\x83\x68\x02\x6a\x6b\x00\x02id")
    assert subscription_queue_name("k", "") == _expected_name(b"\x83\x68\x02\x6b\x00\x01k\x6a")
    # strings are byte lists: UTF-8 bytes / surrogate-escaped raw bytes
    assert subscription_queue_name("\u00fc", "\udcff") == _expected_name(
        b"\x83\x68\x02\x6b\x00\x02\xc3\xbc\x6b\x00\x01\xff"
    )


def test_durable_subscription_name_long_strings() -> None:
    # up to 65535 bytes: STRING_EXT; longer: LIST_EXT of SMALL_INTEGER_EXT + NIL_EXT tail
    s65535 = "a" * 65535
    assert subscription_queue_name(s65535, "i") == _expected_name(
        b"\x83\x68\x02\x6b\xff\xff" + s65535.encode() + b"\x6b\x00\x01i"
    )
    s65536 = "ab" * 32768
    list_ext = (
        b"\x6c" + struct.pack(">I", 65536) + b"".join(b"\x61" + bytes([c]) for c in s65536.encode()) + b"\x6a"
    )
    assert subscription_queue_name("k", s65536) == _expected_name(b"\x83\x68\x02\x6b\x00\x01k" + list_ext)


def test_reference_main_binary_vector_differs() -> None:
    # [main] hashes binaries (6D + u32 length): a different name for the same input.
    term = b"\x83\x68\x02" + b"\x6d\x00\x00\x00\x07durable" + b"\x6d\x00\x00\x00\x11test.subscription"
    assert _expected_name(term) == "stomp-subscription-mN8EtNJgeewoAWGIePSs-A"
    assert subscription_queue_name("durable", "test.subscription") != _expected_name(term)


def test_non_durable_subscription_names_are_random() -> None:
    names = {subscription_queue_name("k", None) for _ in range(50)}
    assert len(names) == 50
    assert all(SUB_NAME.fullmatch(n) for n in names)


def test_subscription_queue() -> None:
    topic = parse_destination("/topic/durable")
    expected = "stomp-subscription-tMbeqL30tjlgaXMmaFM6Ew"
    assert subscription_queue(topic, {}, "test.subscription", durable=True) == expected
    # the exchange is not part of the hash
    assert subscription_queue(
        parse_destination("/exchange/amq.direct/durable"), {}, "test.subscription", True
    ) == (expected)
    assert subscription_queue(
        parse_destination("/topic/dur%2Fable"), {}, "x", True
    ) == subscription_queue_name("dur/able", "x")
    assert subscription_queue(parse_destination("/exchange/x"), {}, "i", True) == subscription_queue_name(
        "", "i"
    )
    # non-durable: random even with an id
    a = subscription_queue(topic, {}, "test.subscription", durable=False)
    assert a != expected and SUB_NAME.fullmatch(a)
    # x-queue-name overrides, verbatim
    assert subscription_queue(topic, {"x-queue-name": " my q "}, "i", durable=True) == " my q "
    assert subscription_queue(topic, {"x-queue-name": "mine"}, None, durable=False) == "mine"
    # durable without id (durable:True passes the Missing Header check) crashes, before x-queue-name
    with pytest.raises(ProcessingError):
        subscription_queue(topic, {"x-queue-name": "mine"}, None, durable=True)
    with pytest.raises(ValueError):
        subscription_queue(parse_destination("/queue/q"), {}, "i", durable=True)


# ---------------------------------------------------------------------------------------------
# docs/destinations.md#common-steps SUBSCRIBE plan
# ---------------------------------------------------------------------------------------------


def test_subscribe_target_queue() -> None:
    dest = parse_destination("/queue/q")
    assert subscribe_target(dest, {}, "1", "amq.topic") == SubscribeTarget(
        queue="q", declare=QueueParams(True, False, False, {}), bind_exchange=None, bind_key=""
    )
    target = subscribe_target(dest, {"durable": "false", "x-max-length": "3"}, None, "amq.topic")
    assert target.declare == QueueParams(False, True, True, {"x-max-length": 3})
    # already declared on this connection: no declare, no flag validation
    assert subscribe_target(dest, {"durable": "bogus"}, "1", "amq.topic", {"q"}).declare is None
    # x-queue-name is ignored for /queue
    assert subscribe_target(dest, {"x-queue-name": "other"}, "1", "amq.topic").queue == "q"


@pytest.mark.parametrize("raw", ["/amq/queue/q", "/reply-queue/q"])
def test_subscribe_target_existing_queue(raw: str) -> None:
    assert subscribe_target(parse_destination(raw), {"durable": "yes"}, "1", "amq.topic") == SubscribeTarget(
        queue="q", declare=None, bind_exchange=None, bind_key=""
    )


def test_subscribe_target_topic() -> None:
    dest = parse_destination("/topic/durable")
    headers = {"durable": "true", "id": "test.subscription"}
    target = subscribe_target(dest, headers, "test.subscription", "amq.topic")
    assert target == SubscribeTarget(
        queue="stomp-subscription-tMbeqL30tjlgaXMmaFM6Ew",
        declare=QueueParams(True, True, False, {}),
        bind_exchange="amq.topic",
        bind_key="durable",
    )
    plain = subscribe_target(dest, {"id": "1"}, "1", "my.topic")
    assert plain.bind_exchange == "my.topic" and plain.bind_key == "durable"
    assert plain.declare == QueueParams(False, True, False, {})
    assert SUB_NAME.fullmatch(plain.queue)
    named = subscribe_target(dest, {"x-queue-name": "mine", "exclusive": "true"}, None, "amq.topic")
    assert named.queue == "mine" and named.declare == QueueParams(False, True, True, {})
    # empty x-queue-name: the broker names the queue
    assert subscribe_target(dest, {"x-queue-name": ""}, None, "amq.topic").queue == ""


def test_subscribe_target_exchange() -> None:
    target = subscribe_target(
        parse_destination("/exchange/x/k"), {"persistent": "true", "auto-delete": "false"}, "s", "t"
    )
    assert target == SubscribeTarget(
        queue=subscription_queue_name("k", "s"),
        declare=QueueParams(True, False, False, {}),
        bind_exchange="x",
        bind_key="k",
    )
    no_key = subscribe_target(parse_destination("/exchange/amq.fanout"), {}, None, "amq.topic")
    assert no_key.bind_exchange == "amq.fanout" and no_key.bind_key == ""
    assert no_key.declare == QueueParams(False, True, False, {})
    # docs/destinations.md#topicpattern: /exchange/amq.topic is bound to the configured default topic exchange
    assert subscribe_target(
        parse_destination("/exchange/amq.topic/k"), {}, None, "my.topic"
    ).bind_exchange == ("my.topic")


def test_subscribe_target_errors() -> None:
    with pytest.raises(DestinationError) as exc_info:
        subscribe_target(parse_destination("/temp-queue/t"), {}, None, "amq.topic")
    assert exc_info.value.detail == "'/temp-queue/t' is not a valid destination for 'SUBSCRIBE'\n"
    # bad x- argument comes first, for every kind
    for raw in ("/temp-queue/t", "/amq/queue/q", "/topic/k", "/queue/q"):
        with pytest.raises(ProcessingError):
            subscribe_target(parse_destination(raw), {"x-message-ttl": "soon"}, None, "amq.topic", {"q"})
    with pytest.raises(ProcessingError):
        subscribe_target(parse_destination("/topic/k"), {"durable": "maybe"}, "1", "amq.topic")
    # durable:True without id passes the Missing Header check but cannot be named
    with pytest.raises(ProcessingError):
        subscribe_target(parse_destination("/topic/k"), {"durable": "True"}, None, "amq.topic")
    # ... while on /queue it is harmless
    assert subscribe_target(parse_destination("/queue/q"), {"durable": "True"}, None, "amq.topic").declare


# ---------------------------------------------------------------------------------------------
# docs/destinations.md#common-steps consumer tags, docs/destinations.md#durable-subscriptions UNSUBSCRIBE
# identification
# ---------------------------------------------------------------------------------------------


def test_consumer_tag() -> None:
    assert consumer_tag({"id": "sub1"}, "/queue/a") == "T_sub1"
    assert consumer_tag({"id": ""}, "/queue/a") == "T_"
    assert consumer_tag({}, "/exchange/amq.fanout") == "Q_/exchange/amq.fanout"
    assert consumer_tag({"id": "x/temp-queue/"}, "/queue/a") == "T_x/temp-queue/"
    with pytest.raises(ProcessingError):
        consumer_tag({"id": "/temp-queue/x"}, "/queue/a")
    assert reply_consumer_tag("abc") == "T_/temp-queue/abc"


def test_unsubscribe_consumer_tag() -> None:
    assert unsubscribe_consumer_tag({"id": "1", "destination": "/queue/a"}) == "T_1"
    assert unsubscribe_consumer_tag({"destination": "/queue/a"}) == "Q_/queue/a"
    with pytest.raises(DestinationError) as exc_info:
        unsubscribe_consumer_tag({"id": "/temp-queue/x"})
    assert _raises(exc_info) == ("Invalid id", "UNSUBSCRIBE 'id' may not start with /temp-queue/\n")
    with pytest.raises(DestinationError) as exc_info:
        unsubscribe_consumer_tag({})
    assert _raises(exc_info) == (
        "Missing destination or id",
        "UNSUBSCRIBE must include a 'destination' or 'id' header",
    )


def test_subscription_description() -> None:
    assert subscription_description({"id": "x", "destination": "/queue/a"}) == "id='x'"
    assert subscription_description({"destination": "/queue/a"}) == "destination='/queue/a'"


# ---------------------------------------------------------------------------------------------
# docs/destinations.md#amqp--message MESSAGE destination
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exchange", "routing_key", "expected"),
    [
        ("", "q", "/queue/q"),
        ("", "", "/queue/"),
        ("amq.topic", "a.b", "/topic/a.b"),
        ("amq.topic", "", "/topic/"),
        ("my.topic", "a.b", "/exchange/my.topic/a.b"),
        ("amq.fanout", "", "/exchange/amq.fanout"),
        ("amq.direct", "k", "/exchange/amq.direct/k"),
        ("", "amq.gen-x/y", "/queue/amq.gen-x%2Fy"),
        ("", "100%", "/queue/100%25"),
        ("", "a\tb\nc\x00d\x1f", "/queue/a%09b%0Ac%00d%1F"),
        ("", " ~\x7f!:", "/queue/ ~\x7f!:"),
        ("", "\udc80\udcff", "/queue/%80%FF"),
        (b"e/x", b"\xff", "/exchange/e%2Fx/%FF"),
        (b"", b"k", "/queue/k"),
        (b"amq.topic", b"k", "/topic/k"),
        # reference example
        (
            "probe ex/x",
            "rk/with%sl\u00fcsh \x01\x7f~",
            "/exchange/probe ex%2Fx/rk%2Fwith%25sl%C3%BCsh %01\x7f~",
        ),
    ],
)
def test_message_destination(exchange: str | bytes, routing_key: str | bytes, expected: str) -> None:
    assert message_destination(exchange, routing_key) == expected


# ---------------------------------------------------------------------------------------------
# docs/destinations.md#temporary-queues reply-to
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("amqp", "header"),
    [
        (None, None),
        ("", "/reply-queue/"),  # present but empty, as tests/compat observed on the plugin
        ("amq.gen-abc", "/reply-queue/amq.gen-abc"),
        ("/temp-queue/x", "/reply-queue//temp-queue/x"),
        ("/exchange/x/k", "/exchange/x/k"),
        ("/exchangefoo", "/exchangefoo"),
        ("/topic/t", "/topic/t"),
        ("/queue/q", "/queue/q"),
        ("/queuex", "/queuex"),
        ("/amq/queue/q", "/amq/queue/q"),
        ("/reply-queue/q", "/reply-queue/q"),
        ("/reply-queue", "/reply-queue//reply-queue"),
        ("/amq/q", "/reply-queue//amq/q"),
        ("queue/q", "/reply-queue/queue/q"),
        ("/Queue/q", "/reply-queue//Queue/q"),
    ],
)
def test_message_reply_to(amqp: str | None, header: str | None) -> None:
    assert message_reply_to(amqp) == header


def test_reply_to_on_send() -> None:
    assert reply_to_temp_queue("/temp-queue/foo") == "foo"
    assert reply_to_temp_queue("/queue/foo") is None
    assert reply_to_temp_queue("amq.gen-1") is None
    assert reply_to_temp_queue("") is None  # copied unchanged, not "Destination cannot be blank"
    assert parse_reply_to("").kind is K.QUEUE
    for bad in ("/bogus/x", "/queue/a/b", "/temp-queue/", "/reply-queue"):
        with pytest.raises(ProcessingError):
            reply_to_temp_queue(bad)


# ---------------------------------------------------------------------------------------------
# docs/destinations.md#stream-offsets stream offsets
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("first", ("longstr", "first")),
        ("last", ("longstr", "last")),
        ("next", ("longstr", "next")),
        ("offset=0", ("long", 0)),
        ("offset=42", ("long", 42)),
        ("offset=-1", ("long", -1)),
        ("offset=+7", ("long", 7)),
        ("timestamp=1660000000", ("timestamp", 1660000000)),
        ("timestamp=-5", ("timestamp", -5)),
        # anything else: no argument
        ("", None),
        ("First", None),
        (" first", None),
        ("first ", None),
        ("offset", None),
        ("Offset=1", None),
        ("offset:1", None),
        ("10", None),
    ],
)
def test_stream_offset_argument(value: str | None, expected: tuple[str, object] | None) -> None:
    assert stream_offset_argument(value) == expected


@pytest.mark.parametrize(
    "value", ["offset=abc", "offset=", "offset= 1", "offset=1.0", "timestamp=x", "timestamp=1_0"]
)
def test_stream_offset_argument_bad_integer(value: str) -> None:
    with pytest.raises(ProcessingError):
        stream_offset_argument(value)


def test_stream_offset_types_are_str_enums() -> None:
    result = stream_offset_argument("offset=3")
    assert result is not None and result[0] is AmqpFieldType.LONG


# ---------------------------------------------------------------------------------------------
# docs/destinations.md#durable-subscriptions durable UNSUBSCRIBE
# ---------------------------------------------------------------------------------------------


def test_durable_unsubscribe_queue() -> None:
    topic = parse_destination("/topic/durable")
    expected = "stomp-subscription-tMbeqL30tjlgaXMmaFM6Ew"
    assert durable_unsubscribe_queue(
        topic, {"id": "test.subscription", "durable": "true"}, "test.subscription"
    ) == (expected)
    assert durable_unsubscribe_queue(
        topic, {"id": "s", "persistent": "true"}, "s"
    ) == subscription_queue_name("durable", "s")
    # plain UNSUBSCRIBE keeps the queue
    assert durable_unsubscribe_queue(topic, {"id": "test.subscription"}, "test.subscription") is None
    assert durable_unsubscribe_queue(topic, {"id": "s", "durable": "false"}, "s") is None
    # /exchange durable subscriptions are never deleted; nor are /queue ones
    assert (
        durable_unsubscribe_queue(parse_destination("/exchange/x/durable"), {"durable": "true"}, "s") is None
    )
    assert durable_unsubscribe_queue(parse_destination("/queue/q"), {"durable": "true"}, "s") is None
    # the UNSUBSCRIBE's own x-queue-name is used
    assert durable_unsubscribe_queue(topic, {"durable": "true", "x-queue-name": "mine"}, "s") == "mine"
    # durable:True without id (passes the Missing Header check) crashes
    with pytest.raises(ProcessingError):
        durable_unsubscribe_queue(topic, {"durable": "True"}, None)


# ---------------------------------------------------------------------------------------------
# Property tests
# ---------------------------------------------------------------------------------------------

names = st.text(st.characters(codec="utf-8"), max_size=40)
raw_bytes = st.binary(max_size=40)


@given(exchange=raw_bytes, routing_key=raw_bytes)
def test_message_destination_components_never_contain_raw_slash(exchange: bytes, routing_key: bytes) -> None:
    rendered = message_destination(exchange, routing_key)
    assert rendered.isascii()
    parts = rendered.split("/")
    if exchange in (b"", b"amq.topic"):
        assert len(parts) == 3  # "", queue|topic, rk
    elif routing_key == b"":
        assert parts[:2] == ["", "exchange"] and len(parts) == 3
    else:
        assert parts[:2] == ["", "exchange"] and len(parts) == 4
    for part in parts[2:]:
        assert all(0x20 <= ord(c) <= 0x7F for c in part)


def _unescape_all(component: str) -> bytes:
    return re.sub(rb"%([0-9A-F]{2})", lambda m: bytes([int(m.group(1), 16)]), component.encode("ascii"))


@given(exchange=raw_bytes.filter(lambda b: b not in (b"", b"amq.topic")), routing_key=raw_bytes.filter(bool))
def test_message_destination_escaping_is_reversible(exchange: bytes, routing_key: bytes) -> None:
    _, _, x, rk = message_destination(exchange, routing_key).split("/")
    assert _unescape_all(x) == exchange
    assert _unescape_all(rk) == routing_key


@given(names.filter(lambda n: n != ""))
def test_queue_name_with_encoded_slashes_round_trips(name: str) -> None:
    # Every "/" encoded as %2F parses back to the name, as long as the name has no literal
    # "%2F" of its own (which would decode too).
    if "%2F" in name:
        return
    raw = "/queue/" + name.replace("/", "%2F")
    assert parse_destination(raw) == Destination(K.QUEUE, name, None, raw)


@given(name=names.filter(lambda n: n != "" and "/" not in n), key=names.filter(lambda n: "/" not in n))
def test_exchange_destination_round_trip_through_publish_target(name: str, key: str) -> None:
    dest = parse_destination(f"/exchange/{name}/{key}")
    expected_x = "d.t" if name.replace("%2F", "/") == "amq.topic" else name.replace("%2F", "/")
    assert publish_target(dest, "d.t") == (expected_x, key.replace("%2F", "/"))


@given(st.text(max_size=30))
def test_parse_destination_only_raises_destination_errors(value: str) -> None:
    try:
        dest = parse_destination(value)
    except DestinationError as exc:
        assert exc.message in ("Invalid destination", "Unknown destination")
        assert exc.detail.endswith("\n") or exc.detail == "Destination cannot be blank"
    else:
        assert dest.raw == value
        if "%2F" not in value and dest.kind is not K.REPLY_QUEUE:
            assert "/" not in dest.name


@given(routing=names, sub_id=names)
def test_durable_names_are_deterministic_and_valid(routing: str, sub_id: str) -> None:
    a = subscription_queue_name(routing, sub_id)
    assert a == subscription_queue_name(routing, sub_id)
    assert SUB_NAME.fullmatch(a)


@given(
    st.dictionaries(
        st.sampled_from(["durable", "persistent", "auto-delete", "exclusive"]),
        st.sampled_from(["true", "false", "True", "False"]),
    )
)
def test_queue_params_valid_flags_never_fail(headers: dict[str, str]) -> None:
    for kind in (K.QUEUE, K.TOPIC, K.EXCHANGE):
        params = queue_params(kind, headers)
        if not params.durable:
            # non-durable: auto-delete unless explicitly false
            assert params.auto_delete or headers.get("auto-delete") in ("false", "False")


@pytest.mark.parametrize(
    ("text", "strip", "expected"),
    [
        ("5", False, 5),
        ("-5", False, -5),
        ("+5", False, 5),
        (" 5 ", True, 5),
        (" 5", False, None),
        ("\t5", True, None),  # Erlang's string:strip removes spaces only
        ("1_0", False, None),
        ("1_0", True, None),
        ("5.0", False, None),
        ("\u0665", False, None),
        ("", False, None),
    ],
)
def test_plugin_integer(text, strip, expected):
    from adapter.mapping.destinations import plugin_integer

    assert plugin_integer(text, strip=strip) == expected


# ------------------------------------------------------------------ headers-exchange bindings
def test_x_match_makes_the_other_headers_binding_arguments_in_frame_order() -> None:
    from adapter.mapping.destinations import headers_binding

    headers = {
        "destination": "/exchange/hx",
        "id": "s",
        "locationID": "99",
        "ack": "client",
        "x-match": "all-with-x",
        "x-max-length": "10",  # a queue argument: the queue's, not the binding's
        "x-custom": "yes",  # an x- header the adapter does not know: matched by all-with-x
        "activemq.prefetchSize": "1",
        "receipt": "r",
        "colour": "red",
    }
    assert headers_binding(headers) == (
        ("x-match", "all-with-x"),
        ("locationID", "99"),
        ("x-custom", "yes"),
        ("colour", "red"),
    )
    assert headers_binding({"destination": "/exchange/hx", "locationID": "99"}) == ()


def test_a_subscribe_target_carries_the_binding_arguments_only_with_x_match() -> None:
    from adapter.mapping.destinations import ProcessingError, parse_destination, subscribe_target

    dest = parse_destination("/exchange/hx/ignored")
    target = subscribe_target(dest, {"x-match": "any", "k": "v"}, "s", "amq.topic")
    assert target.bind_exchange == "hx" and target.bind_arguments == (("x-match", "any"), ("k", "v"))
    assert subscribe_target(dest, {"k": "v"}, "s", "amq.topic").bind_arguments == ()
    with pytest.raises(ProcessingError, match="x-match"):
        subscribe_target(dest, {"x-match": "most"}, "s", "amq.topic")
