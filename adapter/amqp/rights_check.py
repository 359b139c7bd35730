"""Whether a user may still read what a shared subscription delivers, asked of the broker
(``RightsCheck``, one per shared group: adapter/sharing/runtime.py).

A shared group is opened with its first member's credentials; later members of the same user
and passcode join it without a broker call of their own, and RabbitMQ caches each permission it
has checked per channel, so neither the group's connection nor a member's channel can tell
whether the user's rights changed since (a revoked permission, cleared vhost access, a changed
password).  The check asks on an AMQP connection of its own with the member's credentials, and
does there what the member's own plain SUBSCRIBE would: the login (password, vhost access), then,
on a queue of its own named as a plain subscription's would be (``stomp-subscription-`` and a
random part, exclusive, auto-delete), ``queue.declare`` (configure on the queue),
``basic.consume`` (read on the queue) and ``queue.bind`` to the group's exchange with its routing
key (write on the queue, read on the exchange, topic read on the key).  The connection closes
after it, and its queue with it; the group's own queue and consumer are never touched.

What an answer means (``revokes``): a refused login (403), access refused (403)
and vhost access refused (530 without "limit" in its text) say the user may no longer read the
group's messages: the group ends for every member (they are all that user).  Anything else (a
connection or channel limit, a broker that does not answer within the login timeout, a lost
connection) says nothing about the user's rights: the join that asked is refused with it, the
group goes on, and the next check asks again.

Checks are shared: a join waits for a check that *started after it arrived*, so it never gets a
stale answer; the joins that arrive while a check runs wait for the next one, so a burst of
thousands of joins costs a few logins.  A group starts a check at most every
``MIN_CHECK_INTERVAL`` seconds (a client that subscribes and unsubscribes in a loop makes the
broker log in at most that often per group), and also asks when its last answer is older than
``Registry.reauthorise_seconds`` (``adapter.amqp_connection_max_age_seconds``).

Imports: the AMQP link, the login of the adapter's own connections, the operations.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, Protocol

from ..mapping import operations as ops
from ..mapping.destinations import subscription_queue_name
from .connection import AmqpError
from .login import OwnLoginServices, login_refused, own_login
from .probe_runtime import Unheard

log = logging.getLogger("adapter.sharing")

# seconds between the starts of two checks of one group
MIN_CHECK_INTERVAL = 0.5
_CHECK_TAG = "stomp-adapter-rights"


def revokes(error: AmqpError) -> bool:
    """Whether a check's failure says the user may no longer read: access refused (403), or a
    vhost refused for access (530), not for a connection or channel limit (530 too, but "limit"
    or "channels" in its text: nothing about the user's rights)."""
    if error.code == 403:
        return True
    text = error.text.lower()
    return error.code == 530 and "limit" not in text and "channels" not in text


class CheckServices(OwnLoginServices, Protocol):
    """What a check uses of the server: its logins, and its tasks (which shutdown waits for,
    so a check in flight closes its connection)."""

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]: ...


class RightsCheck:
    """The broker's answer, for one shared group, to "may this user still read it?" (see the
    module docstring).  ``confirm()`` returns when a check that started after the call says
    yes, and raises the AmqpError of the refusal otherwise."""

    __slots__ = (
        "_arguments",
        "_bind",
        "_credentials",
        "_label",
        "_loop",
        "_min_interval",
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
        declare: ops.QueueDeclare | None = None,
        min_interval: float = MIN_CHECK_INTERVAL,
    ) -> None:
        self._services = services
        self._loop = loop
        self._credentials = credentials  # (user, password, vhost): in memory only, never logged
        self._bind = bind  # the group's bind: its exchange and routing key
        self._arguments = dict(declare.arguments) if declare is not None else {}
        self._label = label
        self._min_interval = min_interval
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
        # at most one start per MIN_CHECK_INTERVAL: the round waits out the rest of it first
        wait = max(0.0, self.started_at + self._min_interval - self._loop.time()) if self.checks > 1 else 0.0
        self.started_at = self._loop.time() + wait
        self._services.spawn(self._run(round_, wait))
        return round_

    async def _run(self, round_: asyncio.Future[None], wait: float = 0.0) -> None:
        try:
            if wait:
                await asyncio.sleep(wait)
            # a check that never answers must not keep its joins (and the next checks) waiting
            async with asyncio.timeout(self._services.login_timeout * 3):
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
            ops.OpenConnection(user, password, vhost), Unheard(), f"rights {self._label}", lambda: False
        )
        if isinstance(result, ops.LoginResult):
            raise login_refused(result)
        queue = subscription_queue_name(self._bind.routing_key, None)  # a plain one's name, random
        try:
            await result.execute(
                ops.QueueDeclare(queue, exclusive=True, auto_delete=True, arguments=dict(self._arguments))
            )
            await result.execute(ops.BasicConsume(queue, _CHECK_TAG, no_ack=True))
            await result.execute(ops.QueueBind(queue, self._bind.exchange, self._bind.routing_key))
        finally:
            await result.close()  # its exclusive queue goes with it
