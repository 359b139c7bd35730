"""The byte budgets (adapter/mapping/budget.py), pure, and the session's use of them: what a
transaction or a kept delivery reserves, what gives it back, and that every way out of a session
leaves the process's pools as they were."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapter.mapping import operations as ops
from adapter.mapping.budget import Account, BudgetExceeded, Budgets, KeptDeliveries, Pool
from adapter.mapping.properties import MessageProperties
from adapter.session import Session, SessionRegistries, SessionSettings
from adapter.stomp.frame import Frame
from tests.unit.test_session import SESSION_ID, command_of, frames_of, header, run


def test_an_account_holds_up_to_its_own_bound() -> None:
    pool = Pool(100, "adapter.pool_setting", "Things")
    account = pool.account(10, "adapter.own_setting", "Too many things")
    account.reserve(6)
    account.reserve(4)
    assert (account.held, pool.used) == (10, 10)
    with pytest.raises(BudgetExceeded) as refused:
        account.reserve(1)
    assert refused.value.message == "Too many things"
    assert refused.value.detail == (
        "Things of this connection would hold more than 10 bytes (adapter.own_setting)\n"
    )
    assert (account.held, pool.used) == (10, 10)  # a refused reservation holds nothing
    account.release(4)
    account.reserve(4)
    assert pool.used == 10


def test_accounts_together_are_bounded_by_the_pool() -> None:
    pool = Pool(15, "adapter.pool_setting", "Things")
    first = pool.account(10, "adapter.own_setting", "Too many things")
    second = pool.account(10, "adapter.own_setting", "Too many things")
    first.reserve(10)
    second.reserve(5)
    with pytest.raises(
        BudgetExceeded, match=r"of all connections would hold more than 15 bytes \(adapter.pool_setting\)"
    ):
        second.reserve(1)
    first.close()  # a connection that goes gives back all it held
    second.reserve(5)
    assert pool.used == 10


def test_a_closed_account_charges_and_releases_nothing() -> None:
    pool = Pool(100, "p", "Things")
    account = pool.account(50, "a", "m")
    account.reserve(30)
    account.close()
    account.close()
    account.reserve(40)
    account.release(30)
    assert (pool.used, account.held) == (0, 0)


@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.sampled_from(["reserve", "release", "close"]), st.integers(0, 40))
    )
)
def test_the_pool_is_the_sum_of_its_accounts_and_returns_to_zero(steps: list[tuple[int, str, int]]) -> None:
    pool = Pool(100, "p", "Things")
    accounts = [pool.account(50, "a", "m") for _ in range(4)]
    for index, action, size in steps:
        account = accounts[index]
        if action == "reserve":
            with contextlib.suppress(BudgetExceeded):
                account.reserve(size)
        elif action == "release":
            account.release(size)
        else:
            account.close()
        assert pool.used == sum(a.held for a in accounts)
        assert 0 <= pool.used <= pool.limit and all(a.held <= a.limit for a in accounts)
    for account in accounts:
        account.close()
    assert pool.used == 0


def _delivery(tag: int, body: bytes) -> ops.Delivery:
    return ops.Delivery("T_s", tag, False, "", "q", MessageProperties(), body)


def test_kept_deliveries_charge_their_bodies_while_they_are_kept() -> None:
    pool = Pool(1000, "p", "Kept")
    account = pool.account(10, "a", "m")
    kept: KeptDeliveries[int] = KeptDeliveries(account)
    kept[1] = _delivery(1, b"abcd")
    kept[2] = _delivery(2, b"ef")
    kept[1] = _delivery(1, b"abcdef")  # replaced: the old body is given back
    assert (len(kept), 1 in kept, sorted(kept), pool.used) == (2, True, [1, 2], 8)
    with pytest.raises(BudgetExceeded):
        kept[3] = _delivery(3, b"xyz")
    assert 3 not in kept and pool.used == 8
    assert kept.pop(2).body == b"ef"
    del kept[1]
    assert pool.used == 0 and not kept


# ------------------------------------------------------------------------------ in the session


def _session(profile: str = "rabbitmq", **bounds: int) -> tuple[Session, Budgets]:
    budgets = Budgets(**bounds)
    session = Session(
        SessionSettings(profile=profile, registries=SessionRegistries(budgets=budgets)),
        session_id=SESSION_ID,
        peer_is_loopback=True,
    )
    run(session, Frame("CONNECT", {"accept-version": "1.2", "host": "/"}))
    return session, budgets


def _send(transaction: str, body: bytes) -> Frame:
    return Frame("SEND", {"destination": "/topic/t", "transaction": transaction}, body)


def test_transaction_bytes_are_given_back_at_commit_abort_and_disconnect() -> None:
    session, budgets = _session(max_transaction_bytes=100)
    pool = budgets.transactions
    for name in ("a", "b", "c"):
        run(session, Frame("BEGIN", {"transaction": name}))
        run(session, _send(name, b"x" * 30))
    assert pool.used == 90
    run(session, _send("a", b"x" * 10))
    assert pool.used == 100
    out = run(session, Frame("COMMIT", {"transaction": "a"}))
    assert [op.body for op in out if isinstance(op, ops.BasicPublish)] == [b"x" * 30, b"x" * 10]
    assert pool.used == 60
    run(session, Frame("ABORT", {"transaction": "b"}))
    assert pool.used == 30
    run(session, Frame("DISCONNECT", {}))
    assert pool.used == 0
    session.on_closed()
    assert pool.used == 0


def test_a_send_over_the_bound_is_an_error_and_nothing_of_the_transaction_is_published() -> None:
    session, budgets = _session(max_transaction_bytes=100, transaction_bytes_budget=1000)
    run(session, Frame("BEGIN", {"transaction": "t"}))
    run(session, _send("t", b"x" * 60))
    out = run(session, _send("t", b"x" * 41))
    assert not any(isinstance(op, ops.BasicPublish) for op in out)
    (error,) = frames_of(out)
    assert command_of(error) == "ERROR"
    assert header(error, "message") == "Transaction bytes exceeded"
    assert b"more than 100 bytes (adapter.max_transaction_bytes)" in error
    assert isinstance(out[-1], ops.CloseClient)
    session.on_closed()  # the shell's close: the 60 bytes still held go back
    assert budgets.transactions.used == 0


def test_a_composite_send_counts_each_copy() -> None:
    session, budgets = _session("activemq", max_transaction_bytes=100)
    run(session, Frame("BEGIN", {"transaction": "t"}))
    run(session, Frame("SEND", {"destination": "/topic/a,/topic/b", "transaction": "t"}, b"x" * 40))
    assert budgets.transactions.used == 80
    run(session, Frame("ABORT", {"transaction": "t"}))
    assert budgets.transactions.used == 0


def test_acks_nacks_unsubscribe_and_close_give_kept_bytes_back() -> None:
    session, budgets = _session("activemq")
    pool = budgets.unacked
    run(session, Frame("SUBSCRIBE", {"destination": "/queue/q", "id": "s", "ack": "client"}))
    for tag in (1, 2, 3, 4):
        assert session.on_delivery(_delivery(tag, b"y" * 10))
    assert pool.used == 40
    assert session.quick_ack(Frame("ACK", {"id": f"T_s@@{SESSION_ID}@@2"})) == ops.BasicAck(2, True)
    assert pool.used == 20  # a client-mode ACK settles every earlier delivery too
    out = run(session, Frame("NACK", {"id": f"T_s@@{SESSION_ID}@@3"}))
    assert out[-1] == ops.BasicAck(3, True)  # non-persistent: dropped, as ActiveMQ does
    assert pool.used == 10
    session.on_closed()
    assert pool.used == 0


def test_an_ended_subscription_gives_its_kept_bytes_back() -> None:
    session, budgets = _session("activemq")
    for sub in ("a", "b", "c"):
        run(session, Frame("SUBSCRIBE", {"destination": f"/queue/{sub}", "id": sub, "ack": "client"}))
    for tag, sub in ((1, "a"), (2, "b"), (3, "a"), (4, "c")):
        session.on_delivery(ops.Delivery(f"T_{sub}", tag, False, "", sub, MessageProperties(), b"y" * 10))
    assert budgets.unacked.used == 40
    run(session, Frame("UNSUBSCRIBE", {"id": "a"}))
    assert budgets.unacked.used == 20
    session.on_server_cancel("T_b")
    assert budgets.unacked.used == 10
    # the others are untouched: a NACK of c's message still goes to the dead-letter queue path
    assert run(session, Frame("NACK", {"id": f"T_c@@{SESSION_ID}@@4"}))[-1] == ops.BasicAck(4, True)
    assert budgets.unacked.used == 0


def test_a_delivery_over_the_kept_bound_is_refused_and_not_rendered() -> None:
    session, budgets = _session("activemq", max_unacked_bytes=25)
    run(session, Frame("SUBSCRIBE", {"destination": "/queue/q", "id": "s", "ack": "client-individual"}))
    session.on_delivery(_delivery(1, b"y" * 10))
    session.on_delivery(_delivery(2, b"y" * 10))
    with pytest.raises(BudgetExceeded, match=r"more than 25 bytes \(adapter.max_unacked_bytes\)"):
        session.on_delivery(_delivery(3, b"y" * 10))
    assert session.frames.messages_sent == 2
    assert budgets.unacked.used == 20
    # the shell answers it with the session's ERROR and close
    out = session.close_with_error("Unacknowledged bytes exceeded", "...")
    assert command_of(frames_of(out)[0]) == "ERROR" and isinstance(out[-1], ops.CloseClient)
    session.on_closed()
    assert budgets.unacked.used == 0


def test_auto_ack_deliveries_are_not_kept() -> None:
    session, budgets = _session("activemq", max_unacked_bytes=5)
    run(session, Frame("SUBSCRIBE", {"destination": "/queue/q", "id": "s"}))
    assert session.on_delivery(_delivery(1, b"y" * 10))
    assert budgets.unacked.used == 0


# ------------------------------------------------ a pool that evicts (shared connections' paused bytes)
def evicting_pool(limit: int) -> tuple[Pool, list[str]]:
    evicted: list[str] = []
    return Pool(limit, "adapter.pool", "Bytes", evicts=True), evicted


def member(pool: Pool, evicted: list[str], owner: str, name: str, limit: int = 1000) -> Account:
    return pool.account(
        limit, "adapter.one", "Slow consumer", owner=owner, on_evicted=lambda _: evicted.append(name)
    )


def test_a_full_pool_evicts_the_heaviest_owner_s_largest_account_not_the_one_reserving() -> None:
    """Issue 33 item 3: one user's idle sessions, each just under its own bound, filled the pool;
    another user's briefly slow session was the one ended.  Now the owner holding the most
    gives up its largest account, and the reservation goes through."""
    pool, evicted = evicting_pool(3000)
    idle = [member(pool, evicted, "alice", f"idle{n}") for n in range(3)]
    for account in idle:
        account.reserve(990)
    slow = member(pool, evicted, "bob", "slow")
    slow.reserve(100)  # crosses the pool: one of alice's goes
    assert len(evicted) == 1 and evicted[0].startswith("idle") and slow.held == 100
    gone = idle[int(evicted[0][4:])]
    assert gone.held == 0 and pool.used == 2 * 990 + 100
    gone.reserve(500)  # an evicted account charges nothing more
    assert gone.held == 0


def test_the_owner_holding_the_most_in_total_pays_first() -> None:
    pool, evicted = evicting_pool(1000)
    many = [member(pool, evicted, "many", f"m{n}") for n in range(4)]
    for account in many:
        account.reserve(150)  # 600 together, each small
    big = member(pool, evicted, "one", "big")
    big.reserve(300)  # the largest account, but its owner holds less
    big.reserve(200)  # 1100: "many" pays with one of its own
    assert len(evicted) == 1 and evicted[0].startswith("m") and big.held == 500


def test_the_reserving_account_is_refused_when_it_is_the_heaviest() -> None:
    pool, evicted = evicting_pool(1000)
    other = member(pool, evicted, "a", "other")
    other.reserve(100)
    greedy = member(pool, evicted, "b", "greedy")
    greedy.reserve(800)
    with pytest.raises(BudgetExceeded) as error:
        greedy.reserve(200)
    assert "adapter.pool" in error.value.detail and evicted == [] and greedy.held == 800


def test_a_pool_that_does_not_evict_refuses_as_before() -> None:
    pool = Pool(1000, "adapter.pool", "Bytes")
    first = pool.account(1000, "adapter.one", "m")
    first.reserve(900)
    with pytest.raises(BudgetExceeded):
        pool.account(1000, "adapter.one", "m").reserve(200)
    assert first.held == 900


@given(
    st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["r", "f", "c"]), st.integers(0, 400)), max_size=60)
)
def test_an_evicting_pool_stays_within_its_limit_and_the_sum_of_its_accounts(
    steps: list[tuple[int, str, int]],
) -> None:
    pool, evicted = evicting_pool(1000)
    accounts = [member(pool, evicted, f"u{n % 3}", f"a{n}", limit=600) for n in range(6)]
    for index, action, size in steps:
        account = accounts[index]
        if action == "r":
            with contextlib.suppress(BudgetExceeded):
                account.reserve(size)
        elif action == "f":
            account.release(size)
        else:
            account.close()
        assert pool.used == sum(a.held for a in accounts) <= pool.limit


def test_one_reservation_evicts_at_most_one_account() -> None:
    """A large delivery to a light user must not end hundreds of the heavy user's small
    sessions: when the heaviest owner's largest account would not make room, the reservation is
    refused instead (review of issue 33)."""
    pool, evicted = evicting_pool(1000)
    small = [member(pool, evicted, "web", f"w{n}") for n in range(10)]
    for account in small:
        account.reserve(90)
    big = member(pool, evicted, "m", "big")
    with pytest.raises(BudgetExceeded):
        big.reserve(300)  # 200 over: no single web session holds that much
    assert evicted == [] and pool.used == 900
    big.reserve(80)  # 0 over... fits as is
    big.reserve(60)  # 40 over: one web session (90) makes room
    assert len(evicted) == 1 and pool.used == 900 - 90 + 140


def test_a_cumulative_ack_gives_back_what_retry_subscriptions_keep_on_either_path() -> None:
    """A ``client``-mode ACK settles every earlier delivery of the channel, a retry
    subscription's kept ones too (x-retry-delays, adapter/session/retries.py): the quick path
    declines while any is kept, so the general path's sweep gives their bytes back."""
    session, budgets = _session()
    run(
        session,
        Frame(
            "SUBSCRIBE",
            {"destination": "/amq/queue/r", "id": "r", "ack": "client-individual", "x-retry-delays": "100"},
        ),
    )
    run(session, Frame("SUBSCRIBE", {"destination": "/amq/queue/c", "id": "s", "ack": "client"}))
    assert session.on_delivery(ops.Delivery("T_r", 1, False, "", "r", MessageProperties(), b"k" * 10))
    assert session.on_delivery(_delivery(2, b"y"))
    assert budgets.unacked.used == 10
    ack = Frame("ACK", {"id": f"T_s@@{SESSION_ID}@@2"})
    assert session.quick_ack(ack) is None
    assert ops.BasicAck(2, True) in run(session, ack)
    assert budgets.unacked.used == 0
    assert session.quick_ack(ack) == ops.BasicAck(2, True)  # nothing kept: the quick path again
