"""Pure STOMP <-> AMQP 0-9-1 mapping rules (no I/O).

This package owns the translation rules that the RabbitMQ STOMP plugin (3.10.8) applies between
STOMP frames and AMQP 0-9-1 methods: destination parsing, queue declaration parameters,
subscription queue names, consumer tags and the rendering of MESSAGE destinations.

Everything here is plain standard-library Python.  It must not import asyncio, aio-pika,
aiormq, pamqp or pydantic, so that it can be unit- and property-tested in isolation.
"""
