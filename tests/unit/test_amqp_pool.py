"""The pure rules of AMQP connection reuse (adapter/amqp/pool.py): keying, the passcode check,
expiry (``Lifetime``, shared with multiplexing's idle connections) and the cap, with an injected
clock and plain strings standing in for connections."""

from __future__ import annotations

import pytest

from adapter.amqp import wire
from adapter.amqp.connection import client_properties_table, server_properties
from adapter.amqp.pool import ConnectionPool, Lifetime, PasscodeCheck, Pooled, may_return

NODE = "amqp://127.0.0.1:5672"
SECRET = b"k" * 32


def pool(idle: float = 5.0, max_age: float = 60.0, size: int = 10) -> ConnectionPool[str]:
    return ConnectionPool(idle_seconds=idle, max_age_seconds=max_age, max_size=size)


def entry(
    name: str, user: str = "alice", passcode: str = "secret", *, vhost: str = "/", at: float = 0.0
) -> Pooled[str]:
    digest = PasscodeCheck(SECRET).digest(passcode)
    return Pooled(name, (NODE, vhost, user), digest, authenticated_at=at, idle_since=at)


def digest(passcode: str) -> bytes:
    return PasscodeCheck(SECRET).digest(passcode)


def test_passcode_digest_is_keyed_and_never_the_passcode() -> None:
    one, other = PasscodeCheck(b"a" * 32), PasscodeCheck(b"b" * 32)
    assert one.digest("secret") == one.digest("secret")
    assert one.digest("secret") != one.digest("Secret")
    assert one.digest("secret") != other.digest("secret")  # per-process key: digests differ
    assert b"secret" not in one.digest("secret")
    assert PasscodeCheck().digest("x") != PasscodeCheck().digest("x")  # a random key each time


def test_same_user_vhost_node_and_passcode_takes_the_connection() -> None:
    connections = pool()
    connections.put(entry("c1"))
    taken = connections.take((NODE, "/", "alice"), digest("secret"), now=1.0)
    assert taken is not None and taken.connection == "c1"
    assert len(connections) == 0
    assert connections.take((NODE, "/", "alice"), digest("secret"), now=1.0) is None


@pytest.mark.parametrize(
    ("key", "passcode"),
    [
        ((NODE, "/", "bob"), "secret"),  # another user, even with the same passcode
        ((NODE, "other", "alice"), "secret"),  # another vhost
        (("amqp://10.0.0.2:5672", "/", "alice"), "secret"),  # another node
        ((NODE, "/", "alice"), "wrong"),  # a passcode that does not match: log in afresh
        ((NODE, "/", "alice"), ""),
    ],
)
def test_anything_else_gets_nothing(key: tuple[str, str, str], passcode: str) -> None:
    connections = pool()
    connections.put(entry("c1"))
    assert connections.take(key, digest(passcode), now=1.0) is None
    assert len(connections) == 1  # still there for its own user


def test_the_most_recently_returned_matching_one_is_taken() -> None:
    connections = pool()
    connections.put(entry("old", at=1.0))
    connections.put(entry("new", at=2.0))
    taken = connections.take((NODE, "/", "alice"), digest("secret"), now=3.0)
    assert taken is not None and taken.connection == "new"


def test_lifetime_ends_at_the_first_of_its_two_clocks() -> None:
    life = Lifetime(idle_seconds=5.0, max_age_seconds=20.0)
    # idle clock first: authenticated at 0, idle since 10, so 15 < 20
    assert life.expiry(authenticated_at=0.0, idle_since=10.0) == 15.0
    assert not life.expired(0.0, 10.0, now=14.9)
    assert life.expired(0.0, 10.0, now=15.0)  # at the deadline itself, not after it
    # age clock first: idle since 18, but authenticated at 0, so 20 < 23
    assert life.expiry(authenticated_at=0.0, idle_since=18.0) == 20.0
    assert not life.expired(0.0, 18.0, now=19.9)
    assert life.expired(0.0, 18.0, now=20.0)


def test_lifetime_too_old_counts_from_the_login_only() -> None:
    life = Lifetime(idle_seconds=5.0, max_age_seconds=20.0)
    assert not life.too_old(authenticated_at=3.0, now=22.9)
    assert life.too_old(authenticated_at=3.0, now=23.0)
    assert life.too_old(authenticated_at=3.0, now=100.0)


def test_idle_connections_expire() -> None:
    connections = pool(idle=5.0)
    connections.put(entry("c1", at=10.0))
    assert connections.next_expiry() == 15.0
    assert connections.expired(14.9) == []
    assert connections.take((NODE, "/", "alice"), digest("secret"), now=15.0) is None  # expired on take too
    assert connections.expired(15.0) == ["c1"]
    assert len(connections) == 0 and connections.next_expiry() is None


def test_max_age_counts_from_the_login_not_from_the_last_return() -> None:
    # a connection kept busy is still re-authenticated after max_age (password changes, deleted users)
    connections = pool(idle=5.0, max_age=20.0)
    connections.put(
        Pooled("c1", (NODE, "/", "alice"), digest("secret"), authenticated_at=0.0, idle_since=18.0)
    )
    assert connections.next_expiry() == 20.0
    assert connections.take((NODE, "/", "alice"), digest("secret"), now=20.0) is None
    assert connections.expired(20.0) == ["c1"]


def test_the_cap_closes_the_oldest_idle_connection() -> None:
    connections = pool(size=2)
    assert connections.put(entry("a", at=1.0)) == []
    assert connections.put(entry("b", "bob", at=2.0)) == []
    assert connections.put(entry("c", "carol", at=3.0)) == ["a"]
    assert len(connections) == 2


def test_a_new_passcode_accepted_by_the_broker_drops_the_old_ones() -> None:
    connections = pool()
    connections.put(entry("old-password"))
    connections.put(entry("other-user", "bob"))
    assert connections.other_passcodes((NODE, "/", "alice"), digest("new")) == ["old-password"]
    assert len(connections) == 1


def test_discard_and_drain() -> None:
    connections = pool()
    connections.put(entry("a"))
    connections.put(entry("b", "bob"))
    assert connections.discard("a") is True
    assert connections.discard("a") is False
    assert connections.drain() == ["b"]
    assert len(connections) == 0


@pytest.mark.parametrize(
    ("reusable", "shutting_down", "queues_to_delete", "session_failed", "pooled"),
    [
        (True, False, False, False, True),
        (False, False, False, False, False),  # error, blocked, exclusive or auto-delete queue declared
        (True, True, False, False, False),
        (True, False, True, False, False),  # subscription queues still to delete
        (True, False, False, True, False),  # the session got an ERROR frame
    ],
)
def test_may_return(
    reusable: bool, shutting_down: bool, queues_to_delete: bool, session_failed: bool, pooled: bool
) -> None:
    verdict = may_return(
        reusable=reusable,
        shutting_down=shutting_down,
        queues_to_delete=queues_to_delete,
        session_failed=session_failed,
    )
    assert (verdict is None) == pooled


def test_cached_start_ok_properties_equal_the_encoded_mapping() -> None:
    table = client_properties_table("STOMP 127.0.0.1:1234")
    decoded, end = wire.decode_table(table, 0)
    assert end == len(table)
    assert decoded == {
        "product": "stomp-amqp-adapter",
        "information": "STOMP client",
        "capabilities": {
            "publisher_confirms": True,
            "consumer_cancel_notify": True,
            "basic.nack": True,
            "connection.blocked": True,
            "authentication_failure_close": True,
        },
        "connection_name": "STOMP 127.0.0.1:1234",
    }


def test_server_properties_are_decoded_once_per_payload() -> None:
    # class and method id, version 0-9, server properties, mechanisms
    head = b"\x00\x0a\x00\x0a\x00\x09"
    payload = head + wire.table({"product": "RabbitMQ", "version": "3.10.8"}) + wire.longstr("PLAIN")
    first = server_properties(payload)
    assert first == {"product": "RabbitMQ", "version": "3.10.8"}
    assert server_properties(bytes(payload)) is first
