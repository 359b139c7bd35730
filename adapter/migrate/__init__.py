"""The migration toolkit's analysis side (issue #28): what moving a recorded fleet of ActiveMQ
STOMP applications onto RabbitMQ through the ``activemq`` profile takes.

Optional, like adapter/spark: ``report`` needs PySpark (the ``spark`` extra); nothing in the
server imports this package.  Layout:

* ``idioms.py``: the ActiveMQ idioms, the profile's support of each, and the pure detection of
  the idioms of one recorded frame (run inside Spark's workers; standard library only);
* ``report.py``: the Spark job (read the recording, aggregate, collect only aggregates);
* ``topology.py``: the queues, exchanges and bindings the profile will create, and the frames it
  would refuse, from the profile's own rules (adapter/mapping/profile.py);
* ``page.py``: the report as one self-contained page (inline SVG charts, no external files);
* ``recording.py``: reading a recording's records in order, without Spark (for ``replay``);
* ``replay.py``: the client side of a recording replayed against an adapter, and the
  differences between its answers and the recorded upstream's;
* ``related.py``: which recorded connections are related (a destination, a ``reply-to``, a
  ``client-id`` they share), the groups the replay keeps in order, all else concurrent (pure);
* ``progress.py``: what the replay writes as it goes (a result per connection as it ends, the
  progress line on a terminal) and its summary;
* ``wordings.py``: the ERROR wordings of ActiveMQ and of the profile that mean the same outcome
  (the replay reports them as equivalent, not as differences);
* ``cli.py``: ``python -m adapter.migrate report|replay``; ``job.py`` is the same entry point as
  a file for ``spark-submit``.

The recording format: docs/recording-format.md.
"""
