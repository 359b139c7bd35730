"""Fixtures for the Spark data source tests: one local SparkSession for the whole run, a
blocking broker connection, stream queues that are deleted afterwards, and (for the tests that
ask for them) a standalone cluster and a Spark Connect server on it, started once.

The SparkSession is local[2] with the UI off and two shuffle partitions, so the whole module
takes well under a few minutes; its Python workers run this interpreter (PYSPARK_PYTHON),
which has the project and pyarrow installed.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from adapter.mapping.properties import MessageProperties
from adapter.spark.broker import BlockingBroker, BrokerError, parse_broker_url
from tests.spark.standalone import ConnectServer, StandaloneCluster
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


class SteadyPublisher:
    """A thread publishing to a queue every ``interval`` seconds (confirmed, one at a time)
    until stopped; ``confirmed`` counts the messages the broker has confirmed.  The stream
    then never pauses long enough for a "wait until it is quiet" end probe."""

    def __init__(self, amqp_url: str, queue: str, interval: float) -> None:
        self._url = parse_broker_url(amqp_url)
        self._queue = queue
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"publisher {queue}", daemon=True)
        self.confirmed = 0
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            with BlockingBroker(self._url, connection_name="spark tests steady publisher") as connection:
                while not self._stop.is_set():
                    publish(connection, self._queue, [b"steady %d" % self.confirmed])
                    self.confirmed += 1
                    self._stop.wait(self._interval)
        except BaseException as error:  # reported by stop(), the test's own thread
            self.error = error

    def wait_for(self, count: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.confirmed < count and self.error is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.error is None, self.error
        assert self.confirmed >= count, f"only {self.confirmed} of {count} messages published"

    def __enter__(self) -> SteadyPublisher:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> int:
        """Stop publishing; the number of messages the broker confirmed."""
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the publisher thread did not stop"
        assert self.error is None, self.error
        return self.confirmed


# ------------------------------------------------------------------- a standalone cluster
@pytest.fixture(scope="package")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A standalone master and two workers on 127.0.0.1, started once for tests/spark (about
    20 s) and stopped after its last test (tests/spark/standalone.py)."""
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"))
    yield cluster
    cluster.stop()


@pytest.fixture(scope="package")
def connect_server(
    spark_cluster: StandaloneCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ConnectServer]:
    """A Spark Connect server whose application runs on ``spark_cluster`` (two executors)."""
    server = ConnectServer(spark_cluster, tmp_path_factory.mktemp("spark-connect"))
    yield server
    server.stop()


@pytest.fixture(scope="package")
def remote_spark(connect_server: ConnectServer) -> Iterator[Any]:
    """A Spark Connect session with the ``stomp`` source registered from this (client) side.

    Made with the Connect session class itself rather than ``SparkSession.builder.remote``,
    which would mark the whole process as a Connect client (SPARK_CONNECT_MODE_ENABLED) under
    the local ``spark`` session of the other tests; the tests that use it take their column
    functions from ``pyspark.sql.connect.functions`` for the same reason."""
    from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

    from adapter.spark import register

    session = RemoteSparkSession.builder.remote(connect_server.url).getOrCreate()
    register(session)
    yield session
    session.stop()
