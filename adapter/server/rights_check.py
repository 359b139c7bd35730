"""Whether a user may still read what a shared subscription delivers, asked of the broker
(``RightsCheck``, one per shared group: adapter/server/sharing.py).

A shared group is opened with its first member's credentials; later members of the same user
and passcode join it without a broker call of their own, and RabbitMQ caches each permission it
has checked per channel, so neither the group's connection nor a member's channel can tell
whether the user's rights changed since (a revoked read permission, cleared vhost access, a
changed password).  The check asks on an AMQP connection of its own with the member's
credentials: the login checks the password and the vhost access; then a queue.bind of the
group's queue to its exchange with its routing key meets the checks a plain SUBSCRIBE's bind
meets (write on the queue, read on the exchange, topic read on the key), all of which RabbitMQ
makes before it looks at the queue.  The binding exists already, so the bind changes nothing
(bind-ok); an exclusive queue, owned by the group's connection, answers 405 RESOURCE_LOCKED and
a queue deleted meanwhile 404 NOT_FOUND, both after every check passed.  A refused login, or 403
ACCESS_REFUSED: the user may no longer read it (``Refused``).

Checks are shared: a join waits for a check that *started after it arrived*, so it never gets a
stale answer; the joins that arrive while a check runs wait for the next one, so a burst of
thousands of joins costs a few logins.  The group also asks again when its last answer is older
than ``Registry.reauthorise_seconds`` (``adapter.amqp_connection_max_age_seconds``).

Imports: the AMQP link, the login of the adapter's own connections, the operations.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, Protocol

from ..amqp.connection import AmqpError
from ..mapping import operations as ops
from .login import OwnLoginServices, login_refused, own_login

log = logging.getLogger("adapter.sharing")

# what a bind may answer once the broker's permission checks have passed
_AUTHORISED_CODES = frozenset({404, 405})  # the queue is gone, or exclusive to the group's connection
# the answers that say the user may not read the group's messages (a refused login, access
# refused, vhost access refused); any other failure refuses the join but leaves the group
REFUSED_CODES = frozenset({403, 530})


class CheckServices(OwnLoginServices, Protocol):
    """What a check uses of the server: its logins, and its tasks (which shutdown waits for,
    so a check in flight closes its connection)."""

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]: ...


class _NoSession:
    """The check's connection carries no session: nothing it reports needs an answer (a
    ``BrokerEvents`` that drops everything)."""

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


class RightsCheck:
    """The broker's answer, for one shared group, to "may this user still read it?" (see the
    module docstring).  ``confirm()`` returns when a check that started after the call says
    yes, and raises the AmqpError of the refusal otherwise."""

    __slots__ = (
        "_bind",
        "_credentials",
        "_label",
        "_loop",
        "_next",
        "_running",
        "_services",
        "checks",
        "started_at",
    )

    def __init__(
        self,
        services: CheckServices,
        loop: asyncio.AbstractEventLoop,
        credentials: tuple[str, str, str],
        bind: ops.QueueBind,
        label: str,
    ) -> None:
        self._services = services
        self._loop = loop
        self._credentials = credentials  # (user, password, vhost): in memory only, never logged
        self._bind = bind
        self._label = label
        self._running: asyncio.Future[None] | None = None
        self._next: asyncio.Future[None] | None = None  # the round the late arrivals wait for
        self.checks = 0  # checks made (the tests' and the metrics' count)
        self.started_at = loop.time()  # when the last check began (the group's open, at first)

    async def confirm(self) -> None:
        if self._running is None:
            round_ = self._start(self._loop.create_future())
        else:
            if self._next is None:
                self._next = self._loop.create_future()
            round_ = self._next
        # a waiter that goes away must not cancel the round the others wait for
        await asyncio.shield(round_)

    def _start(self, round_: asyncio.Future[None]) -> asyncio.Future[None]:
        self._running = round_
        self.checks += 1
        self.started_at = self._loop.time()
        self._services.spawn(self._run(round_))
        return round_

    async def _run(self, round_: asyncio.Future[None]) -> None:
        try:
            await self._ask()
        except AmqpError as error:
            round_.set_exception(error)
            round_.exception()  # a round nobody waits for any more must not be logged as lost
        except (OSError, TimeoutError) as error:
            round_.set_exception(AmqpError(0, f"the broker could not be asked: {error}"))
            round_.exception()
        except Exception as error:  # a bug must not leave the joins waiting forever
            log.exception("shared subscription %r: checking rights failed", self._label)
            round_.set_exception(AmqpError(0, f"checking rights failed: {error!r}"))
            round_.exception()
        else:
            round_.set_result(None)
        finally:
            self._running = None
            waiting, self._next = self._next, None
            if waiting is not None:
                self._start(waiting)

    async def _ask(self) -> None:
        user, password, vhost = self._credentials
        login = own_login(self._services, self._loop)
        result = await login.open(
            ops.OpenConnection(user, password, vhost), _NoSession(), f"rights {self._label}", lambda: False
        )
        if isinstance(result, ops.LoginResult):
            raise login_refused(result)
        try:
            await result.execute(self._bind)
        except AmqpError as error:
            if error.code not in _AUTHORISED_CODES:
                raise
        finally:
            await result.close()
