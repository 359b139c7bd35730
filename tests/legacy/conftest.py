"""Fixtures of the legacy-client tests: the broker probe (queues the clients leave are deleted)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import BrokerProbe


@pytest.fixture
def broker(amqp_url: str) -> Iterator[BrokerProbe]:
    probe = BrokerProbe(amqp_url)
    yield probe
    probe.close()
