"""Fixtures for the Spark data source tests: one local SparkSession for the whole run, a
blocking broker connection, and stream queues that are deleted afterwards.

The SparkSession is local[2] with the UI off and two shuffle partitions, so the whole module
takes well under a few minutes; its Python workers run this interpreter (PYSPARK_PYTHON),
which has the project and pyarrow installed.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from adapter.mapping.properties import MessageProperties
from adapter.spark.broker import BlockingBroker, BrokerError, parse_broker_url
from tests.support import unique


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from adapter.spark import register

    session = (
        SparkSession.builder.master("local[2]")
        .appName("stomp-amqp-adapter tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.pollingDelay", "100ms")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.fixture
def broker(amqp_url: str) -> Iterator[BlockingBroker]:
    with BlockingBroker(parse_broker_url(amqp_url), connection_name="spark tests") as connection:
        yield connection


@pytest.fixture
def queues(amqp_url: str) -> Iterator[Callable[..., str]]:
    """``queues(prefix, stream=True)`` declares a unique queue (a stream by default) and
    returns its name; every queue named through it is deleted at teardown."""
    names: list[str] = []
    url = parse_broker_url(amqp_url)

    def make(prefix: str = "spark", *, stream: bool = True, declare: bool = True) -> str:
        name = unique(prefix)
        names.append(name)
        if declare:
            with BlockingBroker(url, connection_name="spark tests setup") as connection:
                arguments: dict[str, object] = {"x-queue-type": "stream"} if stream else {}
                connection.queue_declare(name, durable=True, arguments=arguments)
        return name

    yield make
    for name in names:
        # one connection each: a failed delete closes the channel
        with (
            contextlib.suppress(BrokerError),
            BlockingBroker(url, connection_name="spark tests cleanup") as c,
        ):
            c.queue_delete(name)


def publish(
    broker: BlockingBroker, queue: str, bodies: list[bytes], headers: dict[str, object] | None = None
) -> None:
    """Publish to ``queue`` through the default exchange and wait for the confirms."""
    broker.confirm_select()
    for body in bodies:
        broker.publish(
            "", queue, MessageProperties(headers=dict(headers or {}), delivery_mode=2), body, mandatory=True
        )
    broker.drain_confirms()
