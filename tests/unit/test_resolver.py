"""BrokerAddress: the broker's address that last worked is reused for a while, never longer."""

from __future__ import annotations

from adapter.amqp.resolver import BrokerAddress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_name_is_used_until_a_lookup_by_name_worked():
    host = BrokerAddress("rabbit.example", ttl=30, clock=Clock())
    assert host.target() == "rabbit.example"
    host.connected("rabbit.example", "10.0.0.5")
    assert host.target() == "10.0.0.5"


def test_the_cached_address_expires_and_reuse_does_not_extend_it():
    clock = Clock()
    host = BrokerAddress("rabbit.example", ttl=30, clock=clock)
    host.connected("rabbit.example", "10.0.0.5")
    clock.now += 20
    host.connected(host.target(), "10.0.0.5")  # a connect through the cached address
    clock.now += 11
    assert host.target() == "rabbit.example"  # 31 s after the lookup: resolve again
    host.connected("rabbit.example", "10.0.0.6")  # DNS moved
    assert host.target() == "10.0.0.6"


def test_a_failed_connect_forgets_the_address():
    host = BrokerAddress("rabbit.example", clock=Clock())
    host.connected("rabbit.example", "10.0.0.5")
    host.failed()
    assert host.target() == "rabbit.example"


def test_ip_literals_are_used_as_given():
    for literal in ("127.0.0.1", "::1"):
        host = BrokerAddress(literal, clock=Clock())
        host.connected(literal, literal)
        assert host.target() == literal


def test_unknown_peer_address_caches_nothing():
    host = BrokerAddress("rabbit.example", clock=Clock())
    host.connected("rabbit.example", None)
    assert host.target() == "rabbit.example"
