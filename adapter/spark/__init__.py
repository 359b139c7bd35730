"""PySpark data source ``stomp``: RabbitMQ streams read, and rows published, with the adapter's
own STOMP <-> AMQP rules (docs/spark.md).

Optional: needs PySpark 4 (``pip install '.[spark]'``); nothing else in ``adapter`` imports this
package, so the adapter itself runs without PySpark.  Layout:

* ``broker.py``: a small blocking AMQP 0-9-1 client on the adapter's own frame codec;
* ``messages.py``: deliveries -> rows (MESSAGE headers) and rows -> publishes (SEND rules);
* ``streams.py``: stream queues, their offsets and reading an offset range;
* ``options.py``: the option checks the reader and the writer share;
* ``source.py`` / ``sink.py``: the Spark classes and options (source.py picks the reader or the
  writer, so it imports sink.py; never the other way round).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["FORMAT_NAME", "register"]

FORMAT_NAME = "stomp"


def register(spark: SparkSession) -> None:
    """Register the data source under the format name ``stomp`` in ``spark``."""
    from .source import StompDataSource

    spark.dataSource.register(StompDataSource)
