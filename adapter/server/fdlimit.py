"""The process's file-descriptor limit: raising it at start-up, and telling the operator when
connections run into it.

Why this exists: at the limit the operating system refuses ``accept()`` with EMFILE/ENFILE.
uvloop (libuv) then accepts and drops the waiting connections itself and reports nothing, and
asyncio's own loop logs a traceback; either way the operator learns nothing useful.  File
descriptors are handed out lowest first, so the number of a freshly accepted socket tells how
close the process is to its limit, at no cost per connection beyond one comparison.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Callable
from typing import Any

from ..amqp.login import EXHAUSTED

log = logging.getLogger("adapter.server")

# a warning at most this often, however many connections hit the limit meanwhile
_WARN_EVERY_SECONDS = 10.0


def raise_soft_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one (each STOMP client needs two descriptors:
    its socket and its AMQP connection) and return the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft >= hard:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as error:  # pragma: no cover - depends on the platform
        log.debug("could not raise the file-descriptor limit from %d to %d: %s", soft, hard, error)
        return soft
    return hard


def report_accept_exhaustion(loop: asyncio.AbstractEventLoop, descriptors: DescriptorWatch) -> None:
    """asyncio's own loop (uvloop stays silent) reports an accept() that failed for lack of file
    descriptors through the loop's exception handler, as an ERROR with a traceback; it is a
    resource limit, not a bug: make it ``descriptors``' rate-limited warning instead.  The loop
    retries the accept by itself."""
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        if isinstance(error, OSError) and error.errno in EXHAUSTED and "accept" in context.get("message", ""):
            descriptors.exhausted(f"accept() failed: {error.strerror}")
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


class DescriptorWatch:
    """Rate-limited warnings about the file-descriptor limit, in two kinds an operator must tell
    apart: *near* the limit (an accepted socket is in its last 5%: connections still succeed)
    and *at* the limit (an accept or an AMQP connect failed with EMFILE/ENFILE, or a socket was
    accepted as the last descriptor there is: the operating system refuses new connections).
    Each kind has its own rate limit, so a burst of "near" warnings never hides the first "at
    the limit" one."""

    __slots__ = ("_clock", "_last", "_limit", "_warn_from")

    def __init__(self, limit: int | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0] if limit is None else limit
        # warn once accepted sockets reach the last 5% of the limit (at least 8 descriptors)
        self._warn_from = self._limit - max(8, self._limit // 20)
        self._clock = clock
        self._last = {"near": float("-inf"), "at": float("-inf")}

    def accepted(self, fd: int) -> None:
        """A client socket was accepted as descriptor ``fd``."""
        if fd >= self._limit - 1:
            # the last descriptor there is (they are handed out lowest first, so every one is
            # taken): the next accept fails, and uvloop drops those connections without a word
            self.exhausted(
                f"accepted a connection as the last file descriptor, {fd} of a limit of {self._limit}"
            )
        elif fd >= self._warn_from and self._due("near"):
            log.warning(
                "file descriptors running low: accepted a connection as file descriptor %d of a"
                " limit of %d; connections are still accepted, but at the limit the operating"
                " system will refuse new ones. Raise the limit (ulimit -n, systemd LimitNOFILE)",
                fd,
                self._limit,
            )

    def exhausted(self, what: str) -> None:
        """An operation failed with EMFILE/ENFILE."""
        if self._due("at"):
            log.warning(
                "out of file descriptors (%s): the operating system refuses new connections until"
                " some close; existing clients are served. Raise the limit (ulimit -n, systemd"
                " LimitNOFILE)",
                what,
            )

    def _due(self, kind: str) -> bool:
        now = self._clock()
        if now - self._last[kind] < _WARN_EVERY_SECONDS:
            return False
        self._last[kind] = now
        return True
