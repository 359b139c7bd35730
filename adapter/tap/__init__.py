"""The recording tap (``stomp-amqp-adapter tap``): a transparent STOMP proxy that records what it
passes on, for planning a migration (docs/recording-format.md, docs/migration-activemq.md).

recorder.py turns bytes into records (pure), writer.py writes them to rotating gzip JSON Lines
files from a thread of its own, proxy.py is the asyncio shell that passes the bytes, http.py the
``--http-listen`` port, main.py the command line.  The tap builds on the codec (adapter/stomp)
and the foundation only: it starts neither the adapter's server nor its sessions.
"""
