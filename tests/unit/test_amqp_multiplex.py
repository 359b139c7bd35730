"""adapter/amqp/multiplex.py: which shared AMQP connection a login joins, with a clock the test
owns and plain strings for connections (no sockets, no broker)."""

from __future__ import annotations

import pytest

from adapter.amqp.multiplex import SharedConnections
from adapter.amqp.pool import PasscodeCheck

KEY = ("node-a", "/", "alice")
CHECK = PasscodeCheck(b"k" * 32)
RIGHT = CHECK.digest("secret")
WRONG = CHECK.digest("guess")


def shared(per_connection: int = 3, **options: float) -> SharedConnections[str]:
    settings = {"max_age_seconds": 60.0, "idle_seconds": 5.0, "max_idle": 2, **options}
    return SharedConnections(per_connection=per_connection, **settings)  # type: ignore[arg-type]


def test_one_session_per_connection_is_not_multiplexing() -> None:
    with pytest.raises(ValueError):
        shared(per_connection=1)


def test_a_login_joins_a_connection_of_its_key_and_passcode_up_to_the_setting() -> None:
    table = shared(per_connection=3)
    assert table.admit(KEY, RIGHT, 0.0) is None  # nothing to join: log in afresh
    table.opened("c1", KEY, RIGHT, channel_max=2047, now=0.0)
    assert table.admit(KEY, RIGHT, 1.0) == "c1"
    assert table.admit(KEY, RIGHT, 1.0) == "c1"
    assert table.admit(KEY, RIGHT, 1.0) is None  # three sessions: full
    assert table.sessions == 3


def test_never_beyond_the_negotiated_channel_max() -> None:
    table = shared(per_connection=100)
    table.opened("c1", KEY, RIGHT, channel_max=2, now=0.0)
    assert table.admit(KEY, RIGHT, 0.0) == "c1"
    assert table.admit(KEY, RIGHT, 0.0) is None


@pytest.mark.parametrize(
    "key", [("node-b", "/", "alice"), ("node-a", "/other", "alice"), ("node-a", "/", "bob")]
)
def test_another_node_vhost_or_user_never_joins(key: tuple[str, str, str]) -> None:
    table = shared()
    table.opened("c1", KEY, RIGHT, channel_max=0, now=0.0)
    assert table.admit(key, RIGHT, 0.0) is None


def test_a_wrong_passcode_never_joins_it_logs_in_afresh() -> None:
    table = shared()
    table.opened("c1", KEY, RIGHT, channel_max=0, now=0.0)
    assert table.admit(KEY, WRONG, 0.0) is None
    assert table.entry("c1").sessions == 1  # type: ignore[union-attr]


def test_a_new_passcode_accepted_by_the_broker_retires_the_old_ones() -> None:
    table = shared()
    table.opened("busy", KEY, WRONG, channel_max=0, now=0.0)
    table.opened("idle", KEY, WRONG, channel_max=0, now=0.0)
    assert table.left("idle", 1.0) == []  # kept for the next login
    # the password changed: the broker accepted another passcode
    assert table.opened("new", KEY, RIGHT, channel_max=0, now=2.0) == ["idle"]
    assert table.admit(KEY, WRONG, 2.0) is None  # the busy one takes no new session
    assert table.left("busy", 3.0) == ["busy"]  # and closes with its last


def test_joins_fill_the_fullest_connection_with_room() -> None:
    table = shared(per_connection=3)
    table.opened("c1", KEY, RIGHT, channel_max=0, now=0.0)
    table.opened("c2", KEY, RIGHT, channel_max=0, now=0.0)
    assert table.admit(KEY, RIGHT, 0.0) in ("c1", "c2")
    fuller = "c1" if table.entry("c1").sessions == 2 else "c2"  # type: ignore[union-attr]
    assert table.admit(KEY, RIGHT, 0.0) == fuller


def test_no_join_past_max_age_so_the_broker_checks_the_password_again() -> None:
    table = shared(max_age_seconds=10.0)
    table.opened("c1", KEY, RIGHT, channel_max=0, now=0.0)
    assert table.admit(KEY, RIGHT, 9.0) == "c1"
    assert table.admit(KEY, RIGHT, 10.0) is None  # retired on the way
    assert table.left("c1", 11.0) == []
    assert table.left("c1", 11.0) == ["c1"]  # retired: closes with its last session


def test_an_empty_connection_waits_idle_seconds_then_closes() -> None:
    table = shared(idle_seconds=5.0)
    table.opened("c1", KEY, RIGHT, channel_max=0, now=0.0)
    assert table.left("c1", 1.0) == []
    assert table.expiry_of("c1") == 6.0 and table.next_expiry() == 6.0
    assert table.expired(5.9) == []
    assert table.admit(KEY, RIGHT, 5.9) == "c1"  # a login within the time takes it
    assert table.expiry_of("c1") is None
    assert table.left("c1", 7.0) == []
    assert table.expired(12.0) == ["c1"] and len(table) == 0


def test_at_most_max_idle_empty_connections_the_oldest_goes_first() -> None:
    table = shared(max_idle=1)
    table.opened("old", KEY, RIGHT, channel_max=0, now=0.0)
    table.opened("new", KEY, RIGHT, channel_max=0, now=0.0)
    assert table.left("old", 1.0) == []
    assert table.left("new", 2.0) == ["old"]


def test_a_retired_connection_closes_with_its_last_session() -> None:
    table = shared()
    table.opened("c1", KEY, RIGHT, channel_max=0, now=0.0)
    assert table.admit(KEY, RIGHT, 0.0) == "c1"
    assert table.retire("c1") == []  # blocked, or a session left a connection-bound queue
    assert table.admit(KEY, RIGHT, 0.0) is None
    assert table.left("c1", 1.0) == []
    assert table.left("c1", 1.0) == ["c1"]
    assert table.retire("c1") == []  # gone already


def test_a_failed_connection_is_forgotten_with_its_sessions() -> None:
    table = shared()
    table.opened("c1", KEY, RIGHT, channel_max=0, now=0.0)
    assert table.forget("c1") and not table.forget("c1")
    assert table.left("c1", 1.0) == []  # a session leaving afterwards changes nothing
    assert table.admit(KEY, RIGHT, 1.0) is None


def test_shutdown_closes_the_idle_and_retires_the_busy() -> None:
    table = shared()
    table.opened("busy", KEY, RIGHT, channel_max=0, now=0.0)
    table.opened("idle", KEY, RIGHT, channel_max=0, now=0.0)
    table.left("idle", 1.0)
    assert table.shutdown() == ["idle"]
    assert table.admit(KEY, RIGHT, 1.0) is None
    assert table.left("busy", 2.0) == ["busy"]
    assert table.drain() == []


def test_a_user_whose_channel_open_was_refused_gets_a_connection_per_session_from_then_on() -> None:
    """Issue 33 item 2: over a user's max-channels the broker refuses channel.open with a
    connection error (530), ending every session on the shared connection.  From then on the
    user's sessions are not multiplexed: the next refusal ends only its own session."""
    table = shared(per_connection=3)
    table.opened("c1", KEY, RIGHT, channel_max=0, now=0.0)
    assert table.admit(KEY, RIGHT, 0.0) == "c1"
    table.opened("c2", ("node-b", "/", "alice"), RIGHT, channel_max=0, now=0.0)  # another node
    table.left("c2", 0.0)  # idle now
    table.opened("bob", ("node-a", "/", "bob"), RIGHT, channel_max=0, now=0.0)
    assert table.channels_refused("c1") == ["c2"]  # alice's idle connection closes too
    table.forget("c1")
    assert table.channels_refused("c1") is None  # told once
    assert table.admit(KEY, RIGHT, 1.0) is None
    table.opened("c3", KEY, RIGHT, channel_max=0, now=1.0)
    assert table.admit(KEY, RIGHT, 1.0) is None  # c3 carries its own session only
    assert table.left("c3", 2.0) == ["c3"]  # and closes with it
    assert table.admit(("node-a", "/", "bob"), RIGHT, 2.0) == "bob"  # other users still share
