"""Fixtures of tests/cluster: one private three-node RabbitMQ cluster for all of tests/cluster
(tests/cluster/rabbit.py; package scope, so it is stopped and removed as soon as the last test
here has run, not at the end of a whole-suite session), back to three running, clustered nodes
before each test, and the adapter settings every test runs under.

The cluster costs about 20 s to start (the three nodes boot in parallel, then two joins) and a
few seconds per node to bring back after a test killed or stopped one.  It needs RabbitMQ
installed and the tests run as root (or as the rabbitmq user); without them every test here
fails and says what is missing, as the other broker tests do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.cluster.rabbit import ClusterUnavailable, RabbitCluster
from tests.support import AdapterProcess

# The adapter settings every test of tests/cluster runs with, one test run per entry.  The
# scale-out settings of issue 27 go here as they come, e.g.
#   pytest.param({"amqp_sessions_per_connection": 8, "shared_subscriptions": True}, id="both"),
# (setting names as adapter/config/settings.py declares them; in-process adapters take them as overrides
# and real adapter processes as ini lines, see tests/cluster/clients.py ``ini_text``).
ADAPTER_VARIANTS = [
    pytest.param({}, id="defaults"),
    pytest.param({"amqp_sessions_per_connection": 8}, id="multiplexed"),
    pytest.param({"shared_subscriptions": True}, id="shared-subscriptions"),
]


@pytest.fixture(scope="package")
def rabbit_cluster() -> Iterator[RabbitCluster]:
    try:
        cluster = RabbitCluster()
    except ClusterUnavailable as error:
        pytest.fail(str(error), pytrace=False)
    try:
        try:
            cluster.start()
        except ClusterUnavailable as error:
            pytest.fail(str(error), pytrace=False)
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def cluster(rabbit_cluster: RabbitCluster) -> RabbitCluster:
    """The package's cluster with every node running and clustered (what an earlier test killed
    or stopped is brought back first)."""
    try:
        rabbit_cluster.ensure_running()
    except ClusterUnavailable as error:
        pytest.fail(str(error), pytrace=False)
    return rabbit_cluster


@pytest.fixture(params=ADAPTER_VARIANTS)
def adapter_settings(request: pytest.FixtureRequest) -> dict[str, Any]:
    return dict(request.param)


@pytest.fixture
def cluster_adapter(adapter_settings: dict[str, Any]) -> Iterator[Callable[..., AdapterProcess]]:
    """Factory of in-process adapters with the variant's settings: ``cluster_adapter(urls,
    **more_settings)``; all are stopped at teardown."""
    started: list[AdapterProcess] = []

    def start(amqp_url: str, **settings: Any) -> AdapterProcess:
        server = AdapterProcess(amqp_url, **{**adapter_settings, **settings})
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
