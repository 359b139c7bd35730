"""The pipeline's datasets: the streaming table ``readings`` (every message of a RabbitMQ
stream, read through the ``stomp`` data source) and the materialized view ``sensor_averages``
(the average reading per sensor).  ``spark`` is the pipeline's Spark Connect session; the data
source is registered from here, the client side."""

from pyspark import pipelines as dp
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from adapter.spark import register

register(spark)  # noqa: F821 - spark-pipelines defines ``spark`` for this file

URL = spark.conf.get("stomp.example.url")  # noqa: F821
STREAM = spark.conf.get("stomp.example.stream")  # noqa: F821


@dp.table
def readings() -> DataFrame:
    return (
        spark.readStream.format("stomp")  # noqa: F821
        .option("url", URL)
        .option("destination", f"/amq/queue/{STREAM}")
        .option("startingOffsets", "earliest")
        .load()
        .select(
            F.col("headers")["sensor"].alias("sensor"),
            F.col("body").cast("string").cast("double").alias("value"),
            "offset",
        )
    )


@dp.materialized_view
def sensor_averages() -> DataFrame:
    return (
        spark.read.table("readings")  # noqa: F821
        .groupBy("sensor")
        .agg(F.avg("value").alias("average"), F.count("*").alias("readings"))
    )
