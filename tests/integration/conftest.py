"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import BrokerProbe, RawSession


@pytest.fixture
def broker(amqp_url: str) -> Iterator[BrokerProbe]:
    """aio-pika and management-API access to the broker; tracked queues are deleted afterwards."""
    probe = BrokerProbe(amqp_url)
    yield probe
    probe.close()


@pytest.fixture(autouse=True)
def close_raw_sessions() -> Iterator[None]:
    """No RawSession outlives its test: the sockets they opened are closed after it."""
    yield
    RawSession.close_opened()
