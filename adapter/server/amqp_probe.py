"""The probe connections of one process: the asyncio side of adapter/amqp/probe.py.

With session multiplexing, a call the broker may answer with a connection error (an exchange
type it has no plugin for, a basic.get on a stream) runs on a short-lived AMQP connection of
the session's own instead of the shared one.  ``Probes`` opens them (a login of the adapter's
own with the session's credentials, which takes its turn among the logins:
adapter.max_logins_in_flight) and closes them in the background.

Bounded: at most ``PROBES_AT_ONCE`` probes per process are open at once, from the start of
their login to the end of their close; a session that needs one more waits its turn (first
come, first served, adapter/server/admission.py), while its client is not read, as for any
call the broker has yet to answer.  Each probe is short: one call, or one browse (at most
``BROWSE_LIMIT`` basic.gets, adapter/mapping/profile.py), so the wait is too.  A probe costs
the broker what a login costs it, which is why only those calls take one: a plain SEND, and an
exchange of a built-in type, never do.

Which calls take a probe, and why a probe rather than finding out first: adapter/amqp/probe.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Final, Protocol, cast

from ..amqp.connection import AmqpConnection, AmqpError
from ..mapping import operations as ops
from .admission import Gate, enter, leave
from .login import OwnLoginServices, login_refused, own_login

# probe connections open at once per process (logging in, carrying their call, closing)
PROBES_AT_ONCE: Final = 16
# how long a probe's close waits for the broker's close-ok before it drops the socket
_CLOSE_TIMEOUT: Final = 5.0


class ProbeServices(OwnLoginServices, Protocol):
    """What probes use of the server (the listener's ``Server`` has all of these)."""

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]: ...


class _Unheard:
    """A probe's broker events: its calls' replies go to the calls; it has no consumer, publishes
    nothing, and a failure between calls leaves nothing to tell (the broker requeues what it
    held as it closes)."""

    __slots__ = ()

    def on_deliver(self, delivery: ops.Delivery) -> None:
        pass

    def on_confirm(self, delivery_tag: int, multiple: bool, ack: bool) -> None:
        pass

    def on_server_cancel(self, consumer_tag: str) -> None:
        pass

    def on_amqp_closed(self, error: AmqpError) -> None:
        pass

    def on_broker_backpressure(self, paused: bool) -> None:
        pass

    def on_read_done(self) -> None:
        pass


class Probes:
    """The ``ProbeOpener`` of adapter/amqp/probe.py for one process."""

    def __init__(self, services: ProbeServices, limit: int = PROBES_AT_ONCE) -> None:
        self._services = services
        self.gate = Gate(limit)
        self.opened = 0  # probes logged in (for tests and the curious)

    async def open(self, user: str, password: str, vhost: str, ended: Callable[[], bool]) -> AmqpConnection:
        await enter(self.gate)
        try:
            result = await own_login(self._services, asyncio.get_running_loop()).open(
                ops.OpenConnection(user, password, vhost), _Unheard(), "probe", ended
            )
        except BaseException:
            leave(self.gate)
            raise
        if isinstance(result, ops.LoginResult):
            leave(self.gate)
            raise login_refused(result)
        self.opened += 1
        return cast(AmqpConnection, result)  # a login of its own: never a shared channel

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
