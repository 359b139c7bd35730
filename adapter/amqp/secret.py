"""A session's token refresh on its AMQP connection: ``connection.update-secret``, awaited.

Owns the asyncio half of a refresh (the pure half, the method and its answer, is the connection
core's: ``ConnectionCore.update_secret``): which AMQP connection a session's link rides on,
and waiting for ``update-secret-ok`` within a deadline.  RabbitMQ answers a secret it refuses
with ``530 NOT_ALLOWED``, which closes the whole connection: the error then reaches the session
through its link's ``on_amqp_closed`` too, and this call raises it.

Token logins never share a connection (adapter/amqp/login.py), so a session's refresh
concerns its own connection only; a ``ChannelLink`` is refused rather than refreshed, since
``update-secret`` would change the rights of every session on the shared connection.
"""

from __future__ import annotations

import asyncio

from .connection import AmqpConnection, AmqpSocket
from .errors import AmqpError
from .link import SessionLink

# how long a broker may take to answer update-secret before the session is told it failed
UPDATE_SECRET_TIMEOUT = 10.0


def socket_of(link: SessionLink) -> AmqpSocket[AmqpConnection]:
    """The AMQP connection a token session's link is: a connection of its own."""
    if not isinstance(link, AmqpConnection):
        raise AmqpError(0, "a token session's link must be a connection of its own")
    return link.socket


async def update_secret(link: SessionLink, token: str, timeout: float = UPDATE_SECRET_TIMEOUT) -> None:
    """Send ``token`` as the connection's new secret and wait for the broker to take it.
    Raises AmqpError (the broker refused it and closed the connection, or the connection
    ended) or TimeoutError."""
    socket = socket_of(link)
    answer: asyncio.Future[AmqpError | None] = socket.loop.create_future()

    def answered(error: AmqpError | None) -> None:
        if not answer.done():
            answer.set_result(error)

    socket.core.update_secret(
        token.encode("utf-8", "surrogateescape"), "token refreshed by the STOMP client", answered
    )
    socket.flush()
    async with asyncio.timeout(timeout):
        error = await answer
    if error is not None:
        raise error
