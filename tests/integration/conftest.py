"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import BrokerProbe


@pytest.fixture
def broker(amqp_url: str) -> Iterator[BrokerProbe]:
    """aio-pika and management-API access to the broker; tracked queues are deleted afterwards."""
    probe = BrokerProbe(amqp_url)
    yield probe
    probe.close()
