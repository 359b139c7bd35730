"""The session's parts, each on its own and in memory (adapter/session/): login -> identity, the
ack-id parser, transactions, confirms, frames out, and the profile extension's hooks; plus the
shape of the router itself (no method swapped on an instance, no profile state on it)."""

from __future__ import annotations

from collections.abc import Generator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapter.caps import ConnectionCap
from adapter.errors import StompError
from adapter.mapping import operations as ops
from adapter.mapping.budget import BudgetExceeded, Budgets
from adapter.mapping.destinations import DestinationError, ProcessingError, plugin_integer
from adapter.mapping.profile import ClientIds, rules_for
from adapter.mapping.properties import MessageProperties
from adapter.session import Identity, Session, SessionRegistries, SessionSettings, State
from adapter.session.activemq import ActiveMQExtension
from adapter.session.confirms import Confirms
from adapter.session.extension import ProfileExtension
from adapter.session.frames import Frames
from adapter.session.login import Admitted, Login, Refused
from adapter.session.settings import MAX_TRANSACTION_ACTIONS, MAX_TRANSACTIONS
from adapter.session.subscription import Subscription
from adapter.session.subscriptions import parse_ack_id
from adapter.session.transactions import Transactions
from adapter.stomp.frame import Frame
from tests.unit.test_session import SESSION_ID, command_of, header, run


# --- login: an established identity or a refusal --------------------------------------------------
def drive(steps: Generator[ops.Operation, object, Admitted | Refused], result: ops.LoginResult):
    """Run a login generator, answering OpenConnection with ``result``: (operations, outcome)."""
    out: list[ops.Operation] = []
    answer: object = None
    while True:
        try:
            op = steps.send(answer)
        except StopIteration as stop:
            return out, stop.value
        out.append(op)
        answer = result if isinstance(op, ops.OpenConnection) else None


OK = ops.LoginResult(True, server_version="RabbitMQ/3.10.8")


def login(profile: str = "rabbitmq", **settings: object) -> Login:
    session_settings = SessionSettings(profile=profile, **settings)  # type: ignore[arg-type]
    return Login(session_settings, rules_for(profile), owner=object(), peer_is_loopback=True)


def test_login_returns_an_identity_whose_fields_are_all_set():
    ops_out, outcome = drive(
        login().connect(Frame("CONNECT", {"accept-version": "1.1,1.2", "host": "vh", "login": "u"})), OK
    )
    assert ops_out == [ops.OpenConnection("u", "guest", "vh")]
    assert isinstance(outcome, Admitted)
    assert outcome.identity == Identity("u", "vh", "1.2", None)
    assert outcome.server_version == "RabbitMQ/3.10.8"


@pytest.mark.parametrize(
    ("headers", "settings", "loopback", "refusal", "failure"),
    [
        (
            {"accept-version": "9.9"},
            {},
            True,
            Refused("Version mismatch", "Supported versions are 1.0,1.1,1.2\n"),
            None,
        ),
        (
            {},
            {"default_user": None},
            True,
            Refused("Bad CONNECT", "Missing login or passcode header(s)"),
            "missing_credentials",
        ),
        ({}, {}, False, Refused("Bad CONNECT", "non-loopback access denied"), "loopback_only"),
    ],
)
def test_login_refusals_before_the_broker_is_asked(headers, settings, loopback, refusal, failure):
    part = login(**settings)
    part.peer_is_loopback = loopback
    ops_out, outcome = drive(part.connect(Frame("CONNECT", headers)), OK)
    assert (ops_out, outcome, part.failure) == ([], refusal, failure)


@pytest.mark.parametrize(
    ("result", "refusal", "failure"),
    [
        (
            ops.LoginResult(False, "auth"),
            Refused("Bad CONNECT", "Access refused for user 'guest'\n"),
            "access_refused",
        ),
        (ops.LoginResult(False, "vhost"), Refused("Bad CONNECT", "Virtual host '/' access denied"), "vhost"),
        (ops.LoginResult(False, None, "down"), Refused("Processing error", "down"), "broker_unavailable"),
    ],
)
def test_login_refusals_by_the_broker(result, refusal, failure):
    part = login()
    _, outcome = drive(part.connect(Frame("CONNECT", {})), result)
    assert (outcome, part.failure, part.requested_user, part.requested_vhost) == (
        refusal,
        failure,
        "guest",
        "/",
    )


def test_login_takes_and_gives_back_the_connection_slot_and_the_client_id():
    cap, ids = ConnectionCap(1), ClientIds()
    registries = SessionRegistries(client_ids=ids, connection_cap=cap)
    first = login("activemq", registries=registries)
    _, outcome = drive(first.connect(Frame("CONNECT", {"client-id": "app"})), OK)
    assert isinstance(outcome, Admitted) and outcome.identity.client_id == "app"
    second = login("activemq", registries=registries)
    assert drive(second.connect(Frame("CONNECT", {})), OK) == (
        [],
        Refused("Bad CONNECT", "Connection refused: node connection limit reached"),
    )
    assert second.failure == "max_connections"
    first.close()
    assert cap.in_use == 0 and "app" not in ids


def test_implicit_login_is_a_1_0_login_without_headers():
    _, outcome = drive(login().implicit(), OK)
    assert isinstance(outcome, Admitted) and outcome.identity == Identity("guest", "/", "1.0")


def test_a_session_has_no_identity_until_it_logs_in():
    session = Session(SessionSettings(), session_id=SESSION_ID, peer_is_loopback=True)
    assert (session.user, session.vhost, session.version) == (None, None, "1.0")
    with pytest.raises(AssertionError):
        session.identity  # noqa: B018
    run(session, Frame("CONNECT", {"accept-version": "1.1", "login": "u", "host": "v"}))
    assert session.identity == Identity("u", "v", "1.1")
    assert (session.user, session.vhost, session.version) == ("u", "v", "1.1")


# --- the one ack-id parser --------------------------------------------------------------------------
SUBSCRIPTIONS = {"T_s": Subscription("T_s", "s", "/queue/q", None, "client")}


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        ("T_s@@x", DestinationError, "Invalid header"),
        ("T_s@@x@@1@@2", DestinationError, "Invalid header"),
        ("T_nope@@x@@1", DestinationError, "Subscription not found"),
        ("T_s@@x@@1_0", ProcessingError, "Processing error"),
        ("T_s@@x@@ 1", ProcessingError, "Processing error"),
        ("T_s@@x@@١", ProcessingError, "Processing error"),  # a digit, not an ASCII one
        ("T_s@@x@@-1", ProcessingError, "Processing error"),
        (f"T_s@@x@@{2**64}", ProcessingError, "Processing error"),
    ],
)
def test_ack_ids_are_refused_in_the_plugins_order(value, error, message):
    with pytest.raises(error) as refused:
        parse_ack_id(value, SUBSCRIPTIONS, "NACK", "id")
    assert refused.value.message == message


def test_an_ack_id_names_its_subscription_and_delivery_tag():
    assert parse_ack_id("T_s@@anything@@+7", SUBSCRIPTIONS, "ACK", "id") == (SUBSCRIPTIONS["T_s"], 7)
    assert parse_ack_id(f"T_s@@x@@{2**64 - 1}", SUBSCRIPTIONS, "ACK", "id")[1] == 2**64 - 1


@given(st.text(alphabet="0123456789+-_ ١x", max_size=6))
def test_the_ack_id_parsers_fast_digits_follow_the_plugin_integer_rule(number):
    try:
        _, tag = parse_ack_id(f"T_s@@x@@{number}", SUBSCRIPTIONS, "ACK", "id")
    except StompError:
        expected = plugin_integer(number)
        assert expected is None or not 0 <= expected < 2**64
    else:
        assert tag == plugin_integer(number)


# --- transactions -----------------------------------------------------------------------------------
def test_transactions_hold_their_bytes_until_they_end():
    budgets = Budgets(max_transaction_bytes=10)
    transactions = Transactions(budgets.transaction_account())
    transactions.begin("t")
    with pytest.raises(DestinationError, match="already open"):
        transactions.begin("t")
    transactions.buffer("t", ops.BasicPublish("", "q", MessageProperties(), b"12345"), "r")
    transactions.buffer("t", ops.BasicAck(1, False), None)
    with pytest.raises(BudgetExceeded):
        transactions.buffer("t", ops.BasicPublish("", "q", MessageProperties(), b"123456"), None)
    assert transactions.held_bytes == budgets.transactions.used == 5
    assert transactions.of({"transaction": "t"}) == "t" and transactions.of({}) is None
    assert [op for op, _ in transactions.end("t")] == [
        ops.BasicPublish("", "q", MessageProperties(), b"12345"),
        ops.BasicAck(1, False),
    ]
    assert budgets.transactions.used == 0
    with pytest.raises(DestinationError, match="Invalid transaction identifier"):
        transactions.of({"transaction": "t"})


def test_transaction_limits():
    transactions = Transactions(Budgets().transaction_account())
    for n in range(MAX_TRANSACTIONS):
        transactions.begin(str(n))
    with pytest.raises(DestinationError, match="Transaction limit exceeded"):
        transactions.begin("one more")
    for _ in range(MAX_TRANSACTION_ACTIONS):
        transactions.buffer("0", ops.BasicAck(1, False), None)
    with pytest.raises(DestinationError, match="Transaction too large"):
        transactions.buffer("0", ops.BasicAck(1, False), None)
    with pytest.raises(DestinationError, match="Missing transaction"):
        Transactions.name(Frame("COMMIT", {}))


def test_disconnect_and_close_give_every_transaction_byte_back():
    budgets = Budgets()
    transactions = Transactions(budgets.transaction_account())
    transactions.begin("t")
    transactions.buffer("t", ops.BasicPublish("", "q", MessageProperties(), b"x" * 100), None)
    transactions.clear()
    assert budgets.transactions.used == 0 and transactions.of({}) is None
    transactions.begin("t")
    transactions.buffer("t", ops.BasicPublish("", "q", MessageProperties(), b"x" * 100), None)
    transactions.close()
    assert budgets.transactions.used == 0


# --- confirms and receipts --------------------------------------------------------------------------
def test_publishes_are_numbered_only_once_confirms_are_on():
    confirms = Confirms()
    confirms.count("early")
    assert (confirms.seq, confirms.outstanding) == (0, False)
    confirms.on = True
    for receipt in ("r1", None, "r3"):
        confirms.count(receipt)
    assert confirms.settle(2, True, True) == ["r1"]
    assert confirms.settle(3, False, True) == ["r3"]
    assert not confirms.outstanding


def test_a_commit_receipt_waits_for_all_and_a_nack_completes_it_at_once():
    confirms = Confirms()
    confirms.on = True
    confirms.count(None)
    first = confirms.seq + 1
    for _ in range(3):
        confirms.count(None)
    confirms.wait_for_all("c", first)
    assert confirms.settle(2, False, True) == []
    assert confirms.settle(3, False, False) == ["c"]  # touched by a nack: an ERROR, now
    assert not confirms.outstanding


def test_an_own_copy_is_outstanding_until_its_confirm_and_refusals_and_returns_are_counted():
    """A NACK's copy (retries.py) has no receipt, yet AwaitConfirms must wait for it."""
    confirms = Confirms()
    confirms.on = True
    confirms.count(None)  # a client's SEND without a receipt: nobody waits for it
    assert not confirms.outstanding
    confirms.count_copy()
    confirms.count_copy()
    assert confirms.outstanding
    assert confirms.settle(2, False, True) == [] and confirms.outstanding
    assert confirms.settle(3, True, False) == [] and not confirms.outstanding
    assert (confirms.refused, confirms.returned) == (1, 0)  # returns: the session core counts them


# --- frames out ---------------------------------------------------------------------------------------
class Watch:
    """A DeliveryHook that withholds deliveries with odd tags and keeps within a bound."""

    def __init__(self) -> None:
        self.kept: list[tuple[int, bool]] = []

    def withholds(self, subscription: Subscription, delivery: ops.Delivery) -> bool:
        return delivery.delivery_tag % 2 == 1

    def rendered(self, subscription: Subscription, delivery: ops.Delivery, dispatched: bool) -> None:
        if delivery.delivery_tag > 4:
            raise BudgetExceeded("Unacknowledged bytes exceeded", "too much\n")
        self.kept.append((delivery.delivery_tag, dispatched))


def delivery(tag: int, consumer: str = "T_s") -> ops.Delivery:
    return ops.Delivery(consumer, tag, False, "", "q", MessageProperties(), b"body")


def test_frames_render_a_message_and_count_it():
    subscriptions = {"T_s": Subscription("T_s", "s", "/queue/q", None, "client")}
    frames = Frames(subscriptions, SESSION_ID, trailing_lf=False)
    frames.ack_lines = True
    data = frames.render_message(delivery(5))
    assert (
        data
        == (
            f"MESSAGE\nsubscription:s\ndestination:/queue/q\nmessage-id:T_s@@{SESSION_ID}@@5\n"
            f"redelivered:false\nack:T_s@@{SESSION_ID}@@5\ncontent-length:4\n\nbody\0"
        ).encode()
    )
    assert frames.messages_sent == 1 and frames.frames_sent == {}
    missing = frames.render_message(delivery(1, "T_gone"))
    assert header(missing, "message") == "Subscription not found"
    assert frames.errors_sent == {"Subscription not found": 1}


def test_a_hook_withholds_deliveries_keeps_rendered_ones_and_uncounts_what_it_cannot_keep():
    hook = Watch()
    subscriptions = {"T_s": Subscription("T_s", "s", "/queue/q", None, "client", hook=hook)}
    frames = Frames(subscriptions, SESSION_ID, trailing_lf=True)
    assert frames.render_message(delivery(1)) == b""  # withheld
    assert frames.render_message(delivery(1), dispatched=True).endswith(
        b"body\0\n"
    )  # a dispatcher's: never withheld
    assert frames.render_message(delivery(2))
    with pytest.raises(BudgetExceeded):
        frames.render_message(delivery(6))
    assert hook.kept == [(1, True), (2, False)]
    assert frames.messages_sent == 2


def test_receipts_of_a_broker_nack_are_errors_and_each_receipt_is_told():
    told: list[str] = []
    frames = Frames({}, SESSION_ID, trailing_lf=True)
    frames.on_receipt = told.append
    assert [command_of(f) for f in frames.confirmed(["a", "c"], True)] == ["RECEIPT", "RECEIPT"]
    (error,) = frames.confirmed(["b"], False)
    assert (command_of(error), header(error, "receipt-id")) == ("ERROR", "b")
    assert told == ["a", "c"] and frames.frames_sent == {"RECEIPT": 2, "ERROR": 1}


# --- the profile extension -----------------------------------------------------------------------
def test_the_null_extension_has_no_per_message_hooks():
    null = ProfileExtension()
    assert null.quick_settle_hook() is None and null.confirm_hook() is None
    assert null.delivery_hook("client", None) is None
    assert not null.confirms_outstanding
    assert null.cancelled(Subscription("T_s", "s", "/queue/q", None, "client")) == []


def test_the_activemq_extension_watches_only_the_subscriptions_that_need_it():
    session = Session(SessionSettings(profile="activemq"), session_id=SESSION_ID, peer_is_loopback=True)
    extension = session.parts.extension
    assert isinstance(extension, ActiveMQExtension)
    assert extension.delivery_hook("auto", None) is None  # nothing to keep, nothing to filter
    assert extension.delivery_hook("client", None) is extension
    dispatched = Subscription("T_d", "d", "/queue/q", None, "client", dispatched=True, hook=extension)
    plain = Subscription("T_p", "p", "/queue/q", None, "client", hook=extension)
    quick = extension.quick_settle_hook()
    assert quick is not None and not quick(dispatched, 1, False) and quick(plain, 1, False)
    assert extension.withholds(dispatched, delivery(1, "T_d"))


@pytest.mark.parametrize("profile", ["rabbitmq", "activemq"])
def test_the_router_swaps_no_method_and_keeps_no_profile_state(profile):
    session = Session(SessionSettings(profile=profile), session_id=SESSION_ID, peer_is_loopback=True)
    run(session, Frame("CONNECT", {"accept-version": "1.2", "host": "/"}))
    run(
        session,
        Frame("SUBSCRIBE", {"destination": "/queue/q", "id": "s", "ack": "client", "selector": "a = 1"}),
    )
    assert session.state is State.CONNECTED
    for name, value in vars(session).items():
        # an instance attribute never shadows a method of the class
        assert not callable(Session.__dict__.get(name)), name
        if callable(value):
            # a part's own method, bound once (Session's annotations say whose): no state here
            assert getattr(value, "__self__", session) is not session, name
            continue
        # and no state is named after the ActiveMQ profile's features
        for word in ("dead_letter", "dispatched", "unsettled", "temp_topic", "kept", "client_id"):
            assert word not in name, name


# --- targets, subscriptions, publishing ------------------------------------------------------------
def test_targets_parse_once_and_declare_a_queue_once():
    from adapter.mapping.destinations import QueueParams
    from adapter.session.targets import Targets

    targets = Targets(rules_for("rabbitmq"))
    first = targets.parse("/queue/a")
    assert targets.parse("/queue/a") is first
    params = QueueParams(durable=True, auto_delete=False, exclusive=False, arguments={})
    assert list(targets.declare_queue_once(first, params)) == [
        ops.QueueDeclare("a", durable=True, exclusive=False, auto_delete=False, arguments={}, nowait=True)
    ]
    assert "a" in targets.declared


def test_a_duplicate_subscription_is_refused_before_any_step_with_error_then_receipt():
    from adapter.session.settings import RefusedWithReceipt

    session = Session(SessionSettings(), session_id=SESSION_ID, peer_is_loopback=True)
    run(session, Frame("CONNECT", {"accept-version": "1.2", "host": "/"}))
    frame = Frame("SUBSCRIBE", {"destination": "/topic/t", "id": "s", "receipt": "r"})
    run(session, frame)
    with pytest.raises(RefusedWithReceipt):
        next(session.parts.subscriptions.subscribe(frame))
    out = run(session, frame)
    assert [command_of(op.data) for op in out if isinstance(op, ops.SendFrame)] == ["ERROR", "RECEIPT"]
    assert isinstance(out[-1], ops.CloseClient)


def test_publishing_turns_confirms_on_once_for_receipts():
    session = Session(SessionSettings(), session_id=SESSION_ID, peer_is_loopback=True)
    run(session, Frame("CONNECT", {"accept-version": "1.2", "host": "/"}))
    publishing = session.parts.publishing
    publish = ops.BasicPublish("", "q", MessageProperties(), b"")
    assert list(publishing.publish(publish, "r1")) == [ops.ConfirmSelect(), publish]
    assert list(publishing.publish(publish, "r2")) == [publish]
    assert session.publish_seq == 2 and session.confirms_outstanding
