"""The probe connections of one process at run time, beside their rules (adapter/amqp/probe.py).

With session multiplexing, a call the broker may answer with a connection error (an exchange
type it has no plugin for, a basic.get on a stream) runs on a short-lived AMQP connection of
the session's own instead of the shared one.  ``Probes`` opens them (with the ``ProbeLogin`` the
server hands it: a login of the adapter's own with the session's credentials, which takes its
turn among the logins, adapter.max_logins_in_flight: adapter/amqp/login.py ``probe_login``)
and closes them in the background.

Bounded: at most ``PROBES_AT_ONCE`` probes per process are open at once, from the start of
their login to the end of their close; a session that needs one more waits its turn (first
come, first served, adapter/amqp/admission.py), while its client is not read, as for any
call the broker has yet to answer.  Each probe is short: one call, or one browse (at most
``BROWSE_LIMIT`` basic.gets, adapter/mapping/profile.py), so the wait is too.  A probe costs
the broker what a login costs it, which is why only those calls take one: a plain SEND, and an
exchange of a built-in type, never do.

Which calls take a probe, and why a probe rather than finding out first: adapter/amqp/probe.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, Protocol

from ..mapping import operations as ops
from .admission import Gate, enter, leave
from .connection import AmqpConnection, AmqpError

# probe connections open at once per process (logging in, carrying their call, closing)
PROBES_AT_ONCE: Final = 16
# how long a probe's close waits for the broker's close-ok before it drops the socket
_CLOSE_TIMEOUT: Final = 5.0


class ProbeServices(Protocol):
    """What probes use of the server (a server's ``ServerContext`` has it)."""

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]: ...


# a login of the adapter's own with a session's credentials: (user, password, vhost, ended) ->
# the connection, or AmqpError (a refused login too); ``ended``: the session is over, stop
ProbeLogin = Callable[[str, str, str, Callable[[], bool]], Awaitable[AmqpConnection]]


class Unheard:
    """The broker events of a connection no session reads (a probe's; a shared subscription's
    rights check, adapter/amqp/rights_check.py): its calls' replies go to the calls; it has no
    consumer of its own to hear from, publishes nothing, and a failure between calls leaves
    nothing to tell (the broker requeues what it held as it closes)."""

    __slots__ = ()

    def on_deliver(self, delivery: ops.Delivery) -> None:
        pass

    def on_confirm(self, delivery_tag: int, multiple: bool, ack: bool) -> None:
        pass

    def on_server_cancel(self, consumer_tag: str) -> None:
        pass

    def on_return(self, code: int, text: str, exchange: str, routing_key: str) -> None:
        pass

    def on_amqp_closed(self, error: AmqpError) -> None:
        pass

    def on_broker_backpressure(self, paused: bool) -> None:
        pass

    def on_read_done(self) -> None:
        pass


class Probes:
    """The ``ProbeOpener`` of adapter/amqp/probe.py for one process."""

    def __init__(self, services: ProbeServices, login: ProbeLogin, limit: int = PROBES_AT_ONCE) -> None:
        self._services = services
        self._login = login
        self.gate = Gate(limit)
        self.opened = 0  # probes logged in (for tests and the curious)

    async def open(self, user: str, password: str, vhost: str, ended: Callable[[], bool]) -> AmqpConnection:
        await enter(self.gate)
        try:
            connection = await self._login(user, password, vhost, ended)
        except BaseException:
            leave(self.gate)
            raise
        self.opened += 1
        return connection

    def done(self, connection: AmqpConnection) -> asyncio.Task[None]:
        return self._services.spawn(self._close(connection))

    async def _close(self, connection: AmqpConnection) -> None:
        try:
            await connection.close(_CLOSE_TIMEOUT)
        except BaseException:
            connection.drop()  # the shutdown's deadline cancelled it
            raise
        finally:
            leave(self.gate)
