"""The session state machine, driven without any I/O: frames in, operations out.

A tiny driver plays the shell: it answers synchronous operations with canned results and
collects everything else, so each test reads as the exact sequence of AMQP methods and frames
the session asks for.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from adapter.caps import ConnectionCap
from adapter.mapping import operations as ops
from adapter.mapping.properties import MessageProperties
from adapter.session import Session, SessionRegistries, SessionSettings, State, new_session_id
from adapter.stomp.frame import Frame

SESSION_ID = new_session_id(bytes(16))


def make_session(**settings: object) -> Session:
    return Session(SessionSettings(**settings), session_id=SESSION_ID, peer_is_loopback=True)  # type: ignore[arg-type]


def run(
    session: Session, frame: Frame, answer: Callable[[ops.Operation], object] | None = None
) -> list[ops.Operation]:
    """Drive one frame's generator to the end; synchronous ops get ``answer(op)``."""

    def default(op: ops.Operation) -> object:
        if isinstance(op, ops.OpenConnection):
            return ops.LoginResult(True, server_version="RabbitMQ/3.10.8")
        if isinstance(op, ops.QueueDeclare):
            return op.queue or "amq.gen-test"
        return None

    answer = answer or default
    steps = session.handle_frame(frame)
    out: list[ops.Operation] = []
    result: object = None
    while True:
        try:
            op = steps.send(result)
        except StopIteration:
            return out
        out.append(op)
        result = answer(op) if isinstance(op, ops.SYNCHRONOUS_OPS) else None


def frames_of(operations: list[ops.Operation]) -> list[bytes]:
    return [op.data for op in operations if isinstance(op, ops.SendFrame)]


def command_of(data: bytes) -> str:
    return data.split(b"\n", 1)[0].decode()


def header(data: bytes, name: str) -> str | None:
    head = data.split(b"\n\n", 1)[0].decode()
    for line in head.split("\n")[1:]:
        key, _, value = line.partition(":")
        if key == name:
            return value
    return None


def connected(version: str = "1.2", **settings: object) -> Session:
    session = make_session(**settings)
    out = run(session, Frame("CONNECT", {"accept-version": version, "host": "/"}))
    assert command_of(frames_of(out)[-1]) == "CONNECTED"
    return session


# --- CONNECT --------------------------------------------------------------------------------------
def test_connect_opens_amqp_with_credentials_and_answers_connected():
    session = make_session()
    out = run(
        session,
        Frame(
            "CONNECT",
            {"accept-version": "1.2", "host": "vh", "login": "u", "passcode": "p", "heart-beat": "1000,2000"},
        ),
    )
    assert out[0] == ops.OpenConnection("u", "p", "vh")
    assert out[1] == ops.Established("1.2", 2000, 1000)
    connected_frame = frames_of(out)[0]
    assert connected_frame.startswith(
        b"CONNECTED\nserver:RabbitMQ/3.10.8\nsession:"
        + SESSION_ID.encode()
        + b"\nheart-beat:2000,1000\nversion:1.2\n\n\0"
    )
    assert session.state is State.CONNECTED


def test_hide_server_info_omits_server_header():
    session = make_session(hide_server_info=True)
    out = run(session, Frame("CONNECT", {"accept-version": "1.2"}))
    assert header(frames_of(out)[0], "server") is None


def test_login_failure_is_bad_connect_then_close():
    session = make_session()
    out = run(
        session,
        Frame("CONNECT", {"accept-version": "1.2", "login": "bob"}),
        lambda op: ops.LoginResult(False, "auth"),
    )
    error = frames_of(out)[0]
    assert header(error, "message") == "Bad CONNECT"
    assert error.split(b"\n\n", 1)[1].startswith(b"Access refused for user 'bob'\n")
    assert isinstance(out[-1], ops.CloseClient)
    assert session.state is State.CLOSED


def test_missing_default_user_means_missing_login():
    session = make_session(default_user=None)
    out = run(session, Frame("CONNECT", {"accept-version": "1.2"}))
    assert header(frames_of(out)[0], "message") == "Bad CONNECT"
    assert not any(isinstance(op, ops.OpenConnection) for op in out)


def test_loopback_only_user_refused_from_remote_peer():
    session = Session(SessionSettings(), session_id=SESSION_ID, peer_is_loopback=False)
    out = run(session, Frame("CONNECT", {"accept-version": "1.2"}))
    assert frames_of(out)[0].endswith(b"non-loopback access denied\0\n")


def test_bad_heart_beat_is_processing_error():
    out = run(make_session(), Frame("CONNECT", {"heart-beat": "abc"}))
    assert header(frames_of(out)[0], "message") == "Processing error"


def test_frames_before_connect_are_refused():
    out = run(make_session(), Frame("SEND", {"destination": "/queue/a", "receipt": "r"}))
    error = frames_of(out)[0]
    assert header(error, "message") == "Illegal command"
    assert header(error, "receipt-id") == "r"
    assert isinstance(out[-1], ops.CloseClient)


def test_implicit_connect_logs_in_as_default_user_without_connected():
    session = make_session(implicit_connect=True)
    out = run(session, Frame("SEND", {"destination": "/topic/t", "receipt": "r"}))
    assert out[0] == ops.OpenConnection("guest", "guest", "/")
    assert not any(command_of(f) == "CONNECTED" for f in frames_of(out))
    assert any(isinstance(op, ops.BasicPublish) for op in out)


def test_second_connect_is_an_error():
    session = connected()
    out = run(session, Frame("CONNECT", {"accept-version": "1.2"}))
    assert header(frames_of(out)[0], "message") == "Already connected"


# --- SEND -----------------------------------------------------------------------------------------
def test_send_to_queue_declares_once_then_publishes():
    session = connected()
    first = run(session, Frame("SEND", {"destination": "/queue/q"}, b"x"))
    second = run(session, Frame("SEND", {"destination": "/queue/q"}, b"y"))
    assert first[0] == ops.QueueDeclare("q", durable=True, nowait=True)
    assert isinstance(first[1], ops.BasicPublish) and first[1].routing_key == "q" and first[1].exchange == ""
    assert [type(op) for op in second] == [ops.BasicPublish]


def test_receipted_send_turns_on_confirms_and_receipt_waits_for_the_confirm():
    session = connected()
    out = run(session, Frame("SEND", {"destination": "/topic/t", "receipt": "r1"}, b"x"))
    assert [type(op) for op in out] == [ops.ConfirmSelect, ops.BasicPublish]
    run(session, Frame("SEND", {"destination": "/topic/t"}, b"no receipt"))
    run(session, Frame("SEND", {"destination": "/topic/t", "receipt": "r3"}, b"z"))
    assert session.on_confirm(1, False, True) == [b"RECEIPT\nreceipt-id:r1\n\n\0\n"]
    # a multiple ack up to 3 releases r3; sequence 2 had no receipt
    assert session.on_confirm(3, True, True) == [b"RECEIPT\nreceipt-id:r3\n\n\0\n"]
    assert not session.confirms_outstanding


def test_broker_nack_is_an_error_never_a_receipt():
    session = connected()
    run(session, Frame("SEND", {"destination": "/topic/t", "receipt": "r1"}, b"x"))
    (data,) = session.on_confirm(1, False, False)
    assert command_of(data) == "ERROR" and header(data, "receipt-id") == "r1"


def test_send_headers_become_properties():
    session = connected()
    out = run(
        session,
        Frame(
            "SEND",
            {
                "destination": "/exchange/amq.direct/k",
                "persistent": "true",
                "content-type": "text/plain",
                "priority": "5",
                "custom": "v",
                "receipt": "r",
            },
            b"x",
        ),
    )
    publish = next(op for op in out if isinstance(op, ops.BasicPublish))
    assert (publish.exchange, publish.routing_key) == ("amq.direct", "k")
    p = publish.properties
    assert (p.delivery_mode, p.content_type, p.priority) == (2, "text/plain", 5)
    assert p.headers == {"custom": "v"}  # receipt is frame control, not message data


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({}, "Missing destination"),
        ({"destination": "/queue/q", "message-id": "m"}, "Invalid header"),
        ({"destination": "/foo/bar"}, "Unknown destination"),
        ({"destination": "/temp-queue/x"}, "Invalid destination"),
        ({"destination": "/queue/q", "transaction": "nope"}, "Bad transaction"),
        ({"destination": "/queue/q", "priority": "high"}, "Processing error"),
    ],
)
def test_send_errors(headers, message):
    session = connected()
    out = run(session, Frame("SEND", {**headers, "receipt": "r"}, b"x"))
    error = frames_of(out)[0]
    assert header(error, "message") == message
    assert header(error, "receipt-id") == "r"
    assert isinstance(out[-1], ops.CloseClient)
    assert not any(isinstance(op, ops.BasicPublish) for op in out)


def test_temp_queue_reply_to_declares_consumes_and_rewrites():
    session = connected()
    out = run(session, Frame("SEND", {"destination": "/queue/q", "reply-to": "/temp-queue/r"}, b"x"))
    declare = [op for op in out if isinstance(op, ops.QueueDeclare) and op.queue == ""][0]
    assert declare.exclusive and declare.auto_delete
    assert ops.BasicConsume("amq.gen-test", "T_/temp-queue/r", no_ack=True) in out
    publish = next(op for op in out if isinstance(op, ops.BasicPublish))
    assert publish.properties.reply_to == "amq.gen-test"
    again = run(session, Frame("SEND", {"destination": "/queue/q", "reply-to": "/temp-queue/r"}, b"y"))
    assert [type(op) for op in again] == [ops.BasicPublish]
    message = session.on_delivery(
        ops.Delivery("T_/temp-queue/r", 1, False, "", "amq.gen-test", MessageProperties(), b"reply")
    )
    assert header(message, "subscription") == "/temp-queue/r"


# --- SUBSCRIBE, deliveries, ACK -------------------------------------------------------------------
def test_subscribe_topic_declares_consumes_binds_then_receipts():
    session = connected()
    out = run(
        session,
        Frame("SUBSCRIBE", {"destination": "/topic/a.*", "id": "s1", "ack": "client", "receipt": "r"}),
    )
    declare, consume, bind = [op for op in out if not isinstance(op, ops.SendFrame)]
    assert isinstance(declare, ops.QueueDeclare) and declare.queue.startswith("stomp-subscription-")
    assert (declare.durable, declare.auto_delete, declare.exclusive) == (False, True, False)
    assert consume == ops.BasicConsume(declare.queue, "T_s1", no_ack=False)
    assert bind == ops.QueueBind(declare.queue, "amq.topic", "a.*")
    assert frames_of(out) == [b"RECEIPT\nreceipt-id:r\n\n\0\n"]


def test_delivery_becomes_message_with_plugin_header_order():
    session = connected()
    run(session, Frame("SUBSCRIBE", {"destination": "/queue/q", "id": "s1", "ack": "client-individual"}))
    props = MessageProperties(content_type="text/plain", delivery_mode=2, headers={"n": 7, "flag": True})
    data = session.on_delivery(ops.Delivery("T_s1", 9, True, "", "q", props, b"hi"))
    message_id = f"T_s1@@{SESSION_ID}@@9"
    assert (
        data
        == (
            f"MESSAGE\nsubscription:s1\ndestination:/queue/q\nmessage-id:{message_id}\nredelivered:true\n"
            f"ack:{message_id}\nn:7\nflag:true\npersistent:true\ncontent-type:text/plain\ncontent-length:2\n\n"
        ).encode()
        + b"hi\0\n"
    )


def test_client_ack_is_cumulative_client_individual_is_not():
    session = connected()
    run(session, Frame("SUBSCRIBE", {"destination": "/queue/a", "id": "c", "ack": "client"}))
    run(session, Frame("SUBSCRIBE", {"destination": "/queue/b", "id": "i", "ack": "client-individual"}))
    assert run(session, Frame("ACK", {"id": "T_c@@x@@5"})) == [ops.BasicAck(5, True)]
    assert run(session, Frame("ACK", {"id": "T_i@@x@@6"})) == [ops.BasicAck(6, False)]
    assert run(session, Frame("NACK", {"id": "T_i@@x@@7", "requeue": "false"})) == [
        ops.BasicNack(7, False, False)
    ]
    assert run(session, Frame("NACK", {"id": "T_i@@x@@8"})) == [ops.BasicNack(8, False, True)]


def test_ack_header_name_depends_on_version():
    session = connected("1.1")
    run(session, Frame("SUBSCRIBE", {"destination": "/queue/a", "id": "c", "ack": "client"}))
    assert run(session, Frame("ACK", {"message-id": "T_c@@x@@1"})) == [ops.BasicAck(1, True)]
    out = run(session, Frame("ACK", {"id": "T_c@@x@@2"}))
    assert header(frames_of(out)[0], "message") == "Missing header"


def test_duplicate_subscription_id_declares_nothing():
    session = connected()
    run(session, Frame("SUBSCRIBE", {"destination": "/topic/a", "id": "s"}))
    out = run(session, Frame("SUBSCRIBE", {"destination": "/topic/b", "id": "s", "receipt": "r"}))
    assert not any(isinstance(op, ops.QueueDeclare) for op in out)
    assert [command_of(f) for f in frames_of(out)] == ["ERROR", "RECEIPT"]


def test_unsubscribe_durable_topic_deletes_its_queue():
    session = connected()
    sub = run(
        session,
        Frame("SUBSCRIBE", {"destination": "/topic/d", "id": "x", "durable": "true", "auto-delete": "false"}),
    )
    queue = next(op for op in sub if isinstance(op, ops.QueueDeclare)).queue
    out = run(session, Frame("UNSUBSCRIBE", {"id": "x", "durable": "true"}))
    assert out == [ops.BasicCancel("T_x"), ops.QueueDelete(queue)]


def test_server_cancel_keeps_connection_open():
    session = connected()
    run(session, Frame("SUBSCRIBE", {"destination": "/queue/a", "id": "s"}))
    data = session.on_server_cancel("T_s")
    assert header(data, "message") == "Server cancelled subscription"
    assert header(data, "subscription") == "s"
    assert session.state is State.CONNECTED


# --- transactions, DISCONNECT, broker errors -----------------------------------------------------------
def test_transaction_buffers_until_commit():
    session = connected()
    run(session, Frame("SUBSCRIBE", {"destination": "/queue/a", "id": "c", "ack": "client-individual"}))
    assert run(session, Frame("BEGIN", {"transaction": "t"})) == []
    assert run(session, Frame("SEND", {"destination": "/topic/x", "transaction": "t"}, b"1")) == []
    assert run(session, Frame("ACK", {"id": "T_c@@x@@1", "transaction": "t"})) == []
    out = run(session, Frame("COMMIT", {"transaction": "t", "receipt": "c"}))
    # the RECEIPT waits for the publish's confirm (test_commit_receipt_waits_for_every_confirm...)
    assert [type(op) for op in out] == [ops.ConfirmSelect, ops.BasicPublish, ops.BasicAck]
    assert session.on_confirm(1, False, True) == [b"RECEIPT\nreceipt-id:c\n\n\0\n"]
    assert run(session, Frame("BEGIN", {"transaction": "u"})) == []
    run(session, Frame("SEND", {"destination": "/topic/x", "transaction": "u"}, b"2"))
    assert run(session, Frame("ABORT", {"transaction": "u"})) == []
    out = run(session, Frame("COMMIT", {"transaction": "u"}))
    assert header(frames_of(out)[0], "message") == "Bad transaction"


def test_begin_of_open_transaction_is_an_error():
    session = connected()
    run(session, Frame("BEGIN", {"transaction": "t"}))
    out = run(session, Frame("BEGIN", {"transaction": "t"}))
    assert header(frames_of(out)[0], "message") == "Bad transaction"


def test_disconnect_waits_for_confirms_then_closes_amqp_then_receipts():
    session = connected()
    run(session, Frame("SEND", {"destination": "/topic/t", "receipt": "r1"}, b"x"))
    out = run(session, Frame("DISCONNECT", {"receipt": "bye"}))
    assert [type(op) for op in out] == [ops.AwaitConfirms, ops.CloseAmqp, ops.SendFrame, ops.CloseClient]


def test_broker_error_during_a_synchronous_call_sends_error_receipt_close():
    session = connected()
    frame = Frame("SUBSCRIBE", {"destination": "/amq/queue/missing", "id": "s", "receipt": "r"})
    out = session.on_broker_error("not_found", "NOT_FOUND - no queue 'missing' in vhost '/'", frame)
    assert [command_of(f) for f in frames_of(out)] == ["ERROR", "RECEIPT"]
    assert header(frames_of(out)[0], "message") == "not_found"
    assert isinstance(out[-1], ops.CloseClient)


# --- property: whatever the frame, the session never raises and always ends in a known state -------
COMMANDS = [
    "CONNECT",
    "SEND",
    "SUBSCRIBE",
    "UNSUBSCRIBE",
    "ACK",
    "NACK",
    "BEGIN",
    "COMMIT",
    "ABORT",
    "DISCONNECT",
    "FOO",
]
HEADER_NAMES = [
    "destination",
    "id",
    "ack",
    "receipt",
    "transaction",
    "durable",
    "persistent",
    "prefetch-count",
    "message-id",
    "reply-to",
    "x-max-length",
    "accept-version",
    "heart-beat",
    "requeue",
]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(COMMANDS),
            st.dictionaries(st.sampled_from(HEADER_NAMES), st.text(max_size=12), max_size=5),
        ),
        max_size=8,
    )
)
def test_any_frame_sequence_is_handled_without_exceptions(frames):
    session = connected()
    for command, headers in frames:
        out = run(session, Frame(command, headers, b"body"))
        if session.state is State.CLOSED:
            assert isinstance(out[-1], ops.CloseClient)
            break


def test_failed_bind_asks_to_delete_the_subscription_queue():
    session = connected()
    steps = session.handle_frame(
        Frame("SUBSCRIBE", {"destination": "/exchange/missing/k", "id": "s", "receipt": "r"})
    )
    declare = next(steps)
    assert isinstance(declare, ops.QueueDeclare)
    consume = steps.send(declare.queue)
    assert isinstance(consume, ops.BasicConsume)
    bind = steps.send(None)
    assert isinstance(bind, ops.QueueBind)
    # the broker closes the channel instead of answering the bind
    frame = Frame("SUBSCRIBE", {"destination": "/exchange/missing/k", "id": "s", "receipt": "r"})
    out = session.on_broker_error("not_found", "NOT_FOUND - no exchange 'missing' in vhost '/'", frame)
    assert out[0] == ops.DeleteQueueOnClose(declare.queue)
    assert [command_of(f) for f in frames_of(out)] == ["ERROR", "RECEIPT"]


# --- quick_send: the shell's fast path for a plain SEND ----------------------------------------
def shell_run(session: Session, frame: Frame) -> list[ops.Operation]:
    """What the shell does: quick_send first, the general path when it declines."""
    if frame.command == "SEND":
        publish = session.quick_send(frame)
        if publish is not None:
            return [publish]
    elif frame.command == "ACK":
        ack = session.quick_ack(frame)
        if ack is not None:
            return [ack]
    return run(session, frame)


def receipts_of(session: Session, tags: range) -> list[bytes]:
    return [b"".join(session.on_confirm(tag, False, True)) for tag in tags]


SEND_HEADERS = st.fixed_dictionaries(
    {
        "destination": st.sampled_from(
            ["/queue/a", "/topic/t", "/exchange/x/k", "/reply-queue/q", "/temp-queue/r"]
        )
    },
    optional={
        "receipt": st.sampled_from(["r1", "r2"]),
        "reply-to": st.sampled_from(["/temp-queue/r", "/temp-queue/other", "/queue/b", "", "bad"]),
        "transaction": st.sampled_from(["t1", "t2"]),
        "message-id": st.just("m"),
        "persistent": st.sampled_from(["true", "false"]),
        "priority": st.sampled_from(["7", "300", "x"]),
        "correlation-id": st.sampled_from(["c", "c" * 300]),
        "custom": st.just("v"),
    },
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("SEND"), SEND_HEADERS),
            st.tuples(st.sampled_from(["BEGIN", "COMMIT"]), st.just({"transaction": "t1"})),
        ),
        max_size=10,
    )
)
# each reason to decline, after a first plain SEND has made /queue/a known
@example(
    [
        ("SEND", {"destination": "/queue/a"}),
        ("BEGIN", {"transaction": "t1"}),
        ("SEND", {"destination": "/queue/a", "transaction": "t1"}),
        ("COMMIT", {"transaction": "t1"}),
    ]
)
@example([("SEND", {"destination": "/queue/a"}), ("SEND", {"destination": "/queue/a", "reply-to": "bad"})])
@example(
    [
        ("SEND", {"destination": "/queue/a"}),
        ("SEND", {"destination": "/queue/a", "reply-to": "/temp-queue/r"}),
        ("SEND", {"destination": "/queue/a", "reply-to": "/temp-queue/r"}),
    ]
)
@example([("SEND", {"destination": "/queue/a"}), ("SEND", {"destination": "/queue/a", "message-id": "m"})])
@example([("SEND", {"destination": "/queue/a"}), ("SEND", {"destination": "/queue/a", "priority": "x"})])
@example(
    [
        ("SEND", {"destination": "/queue/a"}),
        ("SEND", {"destination": "/queue/a", "receipt": "r1"}),
        ("SEND", {"destination": "/queue/a", "receipt": "r2"}),
    ]
)
def test_quick_send_gives_exactly_what_the_general_path_gives(frames):
    general, shell = connected(), connected()
    for command, headers in frames:
        frame = Frame(command, headers, b"body")
        assert shell_run(shell, frame) == run(general, frame)
        assert shell.state is general.state
        if general.state is State.CLOSED:
            break
    # the same receipts wait for the same confirms
    assert receipts_of(shell, range(1, 12)) == receipts_of(general, range(1, 12))


def test_quick_send_takes_a_repeated_plain_send_and_declines_the_first():
    session = connected()
    frame = Frame("SEND", {"destination": "/queue/a", "correlation-id": "c"}, b"x")
    assert session.quick_send(frame) is None  # not yet declared: the general path declares it
    run(session, frame)
    publish = session.quick_send(frame)
    assert publish == ops.BasicPublish("", "a", MessageProperties(correlation_id="c", headers={}), b"x")


ACK_IDS = st.sampled_from(
    [
        f"T_s1@@{SESSION_ID}@@5",
        f"T_s2@@{SESSION_ID}@@6",
        f"T_s3@@{SESSION_ID}@@7",
        "T_s1@@x@@-1",
        "T_s1@@x@@1_0",
        "T_s1@@x@@ 9",
        f"T_s1@@x@@{2**64}",
        "T_s1@@x",
        "nonsense",
        "",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(
                st.just("ACK"),
                st.fixed_dictionaries(
                    {"id": ACK_IDS},
                    optional={"receipt": st.just("r"), "transaction": st.sampled_from(["t1", "t2"])},
                ),
            ),
            st.tuples(st.sampled_from(["BEGIN", "COMMIT"]), st.just({"transaction": "t1"})),
        ),
        max_size=8,
    ),
    st.sampled_from(["1.2", "1.1"]),
)
@example([("ACK", {"id": f"T_s1@@{SESSION_ID}@@5", "receipt": "r"})], "1.2")
@example(
    [("BEGIN", {"transaction": "t1"}), ("ACK", {"id": f"T_s2@@{SESSION_ID}@@6", "transaction": "t1"})], "1.2"
)
def test_quick_ack_gives_exactly_what_the_general_path_gives(frames, version):
    general, shell = connected(version), connected(version)
    for session in (general, shell):
        for sub, mode in (("s1", "client"), ("s2", "client-individual")):
            run(session, Frame("SUBSCRIBE", {"destination": f"/queue/{sub}", "id": sub, "ack": mode}))
    id_header = "id" if version == "1.2" else "message-id"
    for command, headers in frames:
        if "id" in headers:
            headers = {id_header: headers["id"], **{k: v for k, v in headers.items() if k != "id"}}
            if version == "1.1":
                headers["subscription"] = "s1"
        frame = Frame(command, headers)
        assert shell_run(shell, frame) == run(general, frame)
        assert shell.state is general.state
        if general.state is State.CLOSED:
            break


# --- COMMIT receipts mean "the broker has every message of the transaction" -----------------------
def commit_transaction(
    session: Session, sends: int, commit_receipt: str | None = "c1"
) -> list[ops.Operation]:
    run(session, Frame("BEGIN", {"transaction": "tx"}))
    for n in range(sends):
        run(session, Frame("SEND", {"destination": "/topic/t", "transaction": "tx"}, b"m%d" % n))
    headers = {"transaction": "tx"} | ({"receipt": commit_receipt} if commit_receipt else {})
    return run(session, Frame("COMMIT", headers))


def test_commit_receipt_waits_for_every_confirm_of_the_transaction():
    session = connected()
    out = commit_transaction(session, 3)
    assert isinstance(out[0], ops.ConfirmSelect)  # confirms on before the first publish
    assert sum(isinstance(op, ops.BasicPublish) for op in out) == 3
    assert frames_of(out) == []  # no RECEIPT yet
    assert session.confirms_outstanding
    assert session.on_confirm(2, False, True) == []
    assert session.on_confirm(1, False, True) == []
    assert session.on_confirm(3, False, True) == [b"RECEIPT\nreceipt-id:c1\n\n\0\n"]
    assert not session.confirms_outstanding


def test_commit_receipt_with_a_multiple_confirm_and_earlier_publishes():
    session = connected()
    run(session, Frame("SEND", {"destination": "/topic/t", "receipt": "s1"}, b"x"))  # seq 1
    commit_transaction(session, 2)  # seqs 2, 3
    assert session.on_confirm(2, True, True) == [b"RECEIPT\nreceipt-id:s1\n\n\0\n"]
    assert session.on_confirm(3, True, True) == [b"RECEIPT\nreceipt-id:c1\n\n\0\n"]


def test_a_nack_in_a_transaction_turns_its_commit_receipt_into_an_error():
    session = connected()
    commit_transaction(session, 2)
    (data,) = session.on_confirm(1, False, False)
    assert command_of(data) == "ERROR" and header(data, "receipt-id") == "c1"
    assert session.on_confirm(2, False, True) == []  # answered once, never a RECEIPT after it
    assert not session.confirms_outstanding


def test_commit_without_publishes_or_receipt_answers_at_once():
    session = connected()
    run(session, Frame("BEGIN", {"transaction": "tx"}))
    out = run(session, Frame("COMMIT", {"transaction": "tx", "receipt": "c0"}))
    assert [command_of(f) for f in frames_of(out)] == ["RECEIPT"]
    out = commit_transaction(session, 2, commit_receipt=None)
    assert not any(isinstance(op, ops.ConfirmSelect) for op in out)  # no receipt: no confirms needed
    assert not session.confirms_outstanding


def test_disconnect_waits_for_a_commit_receipt():
    session = connected()
    commit_transaction(session, 1)
    out = run(session, Frame("DISCONNECT", {"receipt": "d"}))
    assert isinstance(out[0], ops.AwaitConfirms)


# --- the session calls the mapping rules (they had drifted apart: docs/architecture.md) -----------
def send_through_shell(session: Session, frame: Frame) -> list[ops.Operation]:
    """Like the shell: the quick path first, the generator when it declines."""
    publish = session.quick_send(frame)
    return [publish] if publish is not None else run(session, frame)


def test_bad_queue_argument_refuses_a_send_to_any_destination_kind():
    session = connected()
    assert any(
        isinstance(op, ops.BasicPublish)
        for op in send_through_shell(session, Frame("SEND", {"destination": "/topic/k"}, b"ok"))
    )
    # the destination is now known to the quick path: the x- header must still be checked
    out = send_through_shell(session, Frame("SEND", {"destination": "/topic/k", "x-max-length": "abc"}, b"x"))
    assert not any(isinstance(op, ops.BasicPublish) for op in out)
    assert header(frames_of(out)[0], "message") == "Processing error"


@pytest.mark.parametrize("reply_to", ["/temp-queue/", "/temp-queue/a/b"])
def test_reply_to_that_is_not_one_temp_queue_name_declares_nothing(reply_to):
    session = connected()
    out = run(session, Frame("SEND", {"destination": "/topic/t", "reply-to": reply_to}, b"x"))
    assert not any(isinstance(op, ops.QueueDeclare | ops.BasicConsume | ops.BasicPublish) for op in out)
    assert header(frames_of(out)[0], "message") == "Processing error"


@pytest.mark.parametrize(
    ("command", "headers"),
    [
        ("SEND", {"destination": "/topic/t", "priority": "1_0"}),
        ("SEND", {"destination": "/topic/t", "timestamp": "\u0665"}),  # an Arabic-Indic digit
        ("SUBSCRIBE", {"destination": "/topic/t", "id": "s", "prefetch-count": "1_0"}),
    ],
)
def test_integers_follow_the_plugins_rule_everywhere(command, headers):
    """One parser (mapping.destinations.plugin_integer): Python's int() would take these."""
    session = connected()
    out = run(session, Frame(command, headers, b""))
    assert header(frames_of(out)[0], "message") == "Processing error"


def test_ack_with_a_delivery_tag_python_would_read_is_refused():
    session = connected()
    run(session, Frame("SUBSCRIBE", {"destination": "/queue/q", "id": "s", "ack": "client-individual"}))
    out = run(session, Frame("ACK", {"id": "T_s@@x@@1_0", "receipt": "r"}))
    assert not any(isinstance(op, ops.BasicAck) for op in out)
    assert header(frames_of(out)[0], "message") == "Processing error"


@pytest.mark.parametrize(
    "first", [Frame("CONNECT", {"accept-version": "9.9"}), Frame("SEND", {"destination": "/topic/t"})]
)
def test_a_connect_over_stomp_max_connections_is_refused_before_anything_else(first: Frame):
    """stomp.max_connections: checked first (before the version, as the plugin does), also for
    implicit connect; the slot of a session is given back when its connection closes."""
    cap = ConnectionCap(1)
    settings = SessionSettings(registries=SessionRegistries(connection_cap=cap), implicit_connect=True)
    holder = Session(settings, session_id=SESSION_ID, peer_is_loopback=True)
    run(holder, Frame("CONNECT", {"accept-version": "1.2"}))
    assert holder.state is State.CONNECTED and cap.in_use == 1
    refused = Session(settings, session_id=SESSION_ID, peer_is_loopback=True)
    out = run(refused, first)
    error = frames_of(out)[0]
    assert (header(error, "message"), error.split(b"\n\n", 1)[1]) == (
        "Bad CONNECT",
        b"Connection refused: node connection limit reached\0\n",
    )
    assert not any(isinstance(op, ops.OpenConnection) for op in out)
    assert isinstance(out[-1], ops.CloseClient) and refused.login.failure == "max_connections"
    refused.on_closed()
    assert cap.in_use == 1  # the refused session had no slot to give back
    holder.on_closed()
    holder.on_closed()
    assert cap.in_use == 0
    again = Session(settings, session_id=SESSION_ID, peer_is_loopback=True)
    run(again, Frame("CONNECT", {"accept-version": "1.2"}))
    assert again.state is State.CONNECTED


def test_a_failed_login_gives_its_slot_back_when_the_connection_closes():
    cap = ConnectionCap(1)
    session = make_session(registries=SessionRegistries(connection_cap=cap))
    out = run(
        session, Frame("CONNECT", {"accept-version": "1.2"}), lambda _op: ops.LoginResult(False, "auth")
    )
    assert header(frames_of(out)[0], "message") == "Bad CONNECT" and cap.in_use == 1
    session.on_closed()
    assert cap.in_use == 0
