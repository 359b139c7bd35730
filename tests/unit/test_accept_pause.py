"""adapter/server/accept_pause.py: a paused listener leaves new connections in the kernel's
accept queue (connected, not accepted: nothing reads or answers them), keeps the ones it has,
and accepts the queued ones when it resumes.  Real sockets on 127.0.0.1, no broker."""

from __future__ import annotations

import asyncio
import gc
import socket
import warnings
from collections.abc import Callable, Coroutine

from adapter.server.accept_pause import AcceptPause


class Greeter(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(b"hi")  # type: ignore[attr-defined]  # uvloop's are not asyncio's classes


async def greeting(reader: asyncio.StreamReader) -> bytes | None:
    try:
        return await asyncio.wait_for(reader.readexactly(2), 0.3)
    except TimeoutError:
        return None


async def test_paused_connections_wait_in_the_queue_and_are_accepted_on_resume() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Greeter, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pause = AcceptPause()
    pause.add(server, Greeter, 100)
    before, before_writer = await asyncio.open_connection("127.0.0.1", port)
    assert await greeting(before) == b"hi"

    pause.crowded(True)
    assert not pause.accepting.is_set() and pause.pauses == 1
    queued, queued_writer = await asyncio.open_connection("127.0.0.1", port)  # TCP: the kernel's
    assert await greeting(queued) is None  # not accepted: no protocol, no greeting
    assert not before_writer.is_closing()  # the established connection is untouched

    pause.crowded(False)
    assert await asyncio.wait_for(queued.readexactly(2), 5) == b"hi"  # accepted now, not reset
    after, after_writer = await asyncio.open_connection("127.0.0.1", port)
    assert await asyncio.wait_for(after.readexactly(2), 5) == b"hi"

    await pause.close()
    for writer in (before_writer, queued_writer, after_writer):
        writer.close()
    refused = False
    try:
        await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        refused = True
    assert refused  # closed for good: the kept socket went too


async def test_a_pause_twice_and_a_resume_twice_count_once() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Greeter, "127.0.0.1", 0)
    pause = AcceptPause()
    pause.add(server, Greeter, 100)
    pause.crowded(True)
    pause.crowded(True)
    pause.crowded(False)
    pause.crowded(False)
    await asyncio.sleep(0.05)
    assert pause.pauses == 1 and len(pause.servers) == 1
    await pause.close()


async def test_a_resume_that_finds_no_free_descriptor_tries_again() -> None:
    """Resuming needs a descriptor (a duplicate of the listening socket): in a connect storm the
    process may be at its file limit just then (EMFILE).  The listener must accept again once a
    descriptor is free, never stay closed for good while the adapter otherwise runs."""
    import errno
    import os

    from adapter.server import accept_pause

    loop = asyncio.get_running_loop()
    server = await loop.create_server(Greeter, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pause = AcceptPause()
    pause.add(server, Greeter, 100)
    pause.crowded(True)
    queued, queued_writer = await asyncio.open_connection("127.0.0.1", port)
    real_dup = os.dup
    failures = [1]

    def dup(fd: int) -> int:
        if failures:
            failures.pop()
            raise OSError(errno.EMFILE, "Too many open files")
        return real_dup(fd)

    accept_pause.os.dup = dup  # type: ignore[assignment]
    try:
        pause.crowded(False)
        assert await asyncio.wait_for(queued.readexactly(2), 5) == b"hi"  # accepted once it could
    finally:
        accept_pause.os.dup = real_dup
        queued_writer.close()
        await pause.close()


class _PausingGreeter(Greeter):
    """The first connection's protocol pauses the listener while it is being set up, as a login
    that crowds the queue does: the connections the loop accepted in the same batch are then
    accepted but not yet attached to the listener's server."""

    pause: AcceptPause
    pauses_left = 1

    def __init__(self) -> None:
        if _PausingGreeter.pauses_left:
            _PausingGreeter.pauses_left -= 1
            self.pause.crowded(True)


def _storm_paused_mid_batch(run: Callable[[Coroutine[object, object, int]], int]) -> None:
    """Connections accepted in the batch during which the listener pauses are served, none
    reset or left unclosed: closing the asyncio Server at once made the rest of the batch fail
    to attach to it (their sockets dropped unclosed, the clients never answered)."""

    async def storm() -> int:
        loop = asyncio.get_running_loop()
        pause = AcceptPause()
        _PausingGreeter.pause = pause
        _PausingGreeter.pauses_left = 1
        server = await loop.create_server(_PausingGreeter, "127.0.0.1", 0, backlog=64)
        pause.add(server, _PausingGreeter, 64)
        port = server.sockets[0].getsockname()[1]
        # completed by the kernel before the loop runs again: one accept batch
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
        await asyncio.sleep(0.2)
        assert not pause.accepting.is_set()
        pause.crowded(False)
        greeted = 0
        for client in clients:
            reader, writer = await asyncio.open_connection(sock=client)
            if await asyncio.wait_for(reader.read(2), 5) == b"hi":
                greeted += 1
            writer.close()
        await pause.close()
        return greeted

    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        assert run(storm()) == 8
        gc.collect()


def test_a_pause_in_the_middle_of_an_accept_batch_loses_no_connection_asyncio() -> None:
    _storm_paused_mid_batch(asyncio.run)


def test_a_pause_in_the_middle_of_an_accept_batch_loses_no_connection_uvloop() -> None:
    import uvloop

    _storm_paused_mid_batch(uvloop.run)


async def _refused(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return True
    writer.close()
    return False


async def _listening() -> tuple[AcceptPause, int]:
    """A Greeter server on a free port, under an AcceptPause."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Greeter, "127.0.0.1", 0)
    pause = AcceptPause()
    pause.add(server, Greeter, 100)
    return pause, server.sockets[0].getsockname()[1]


async def test_two_resumes_in_flight_leave_no_server_behind() -> None:
    """Pause, resume, pause, resume within one loop turn (the login queue crossing its marks
    back and forth): two resumes run at once.  asyncio's create_server yields a loop turn after
    it starts serving, so both started a server for the same listener and the first was
    overwritten: never closed, it went on accepting after shutdown (#27)."""
    pause, port = await _listening()
    for _ in range(3):
        pause.crowded(True)
        pause.crowded(False)
    await asyncio.sleep(0.05)
    assert pause.accepting.is_set() and len(pause.servers) == 1
    await pause.close()
    await asyncio.sleep(0.05)
    assert await _refused(port)  # no server left listening on a duplicate


async def test_a_shutdown_during_a_resume_leaves_no_server_behind() -> None:
    """close() while a resume is inside create_server: cancelling it there left the server it
    had just started serving, untracked, accepting after shutdown (#27)."""
    pause, port = await _listening()
    pause.crowded(True)
    pause.crowded(False)
    await asyncio.sleep(0)  # the resume starts, and waits inside create_server
    await pause.close()
    await asyncio.sleep(0.05)
    assert await _refused(port)


async def test_a_pause_during_a_resume_pauses_every_listener() -> None:
    """A pause that comes while a resume is inside create_server: the server that resume then
    kept must stop accepting too, not serve for the whole pause (#27)."""
    pause, port = await _listening()
    pause.crowded(True)
    pause.crowded(False)
    await asyncio.sleep(0)  # the resume starts, and waits inside create_server
    pause.crowded(True)
    await asyncio.sleep(0.05)
    assert not pause.accepting.is_set()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        assert await greeting(reader) is None  # paused: left in the kernel's queue
    finally:
        writer.close()
        await pause.close()


async def test_an_accept_that_ran_out_of_descriptors_does_not_undo_a_pause() -> None:
    """asyncio's selector loop meets EMFILE in accept() by dropping its reader and adding it
    back a second later (BaseSelectorEventLoop._accept_connection).  A pause that comes in that
    second must still hold once the retry fires: the retry must not make the paused listener
    accept again (it did while the paused server was only unregistered, kept open until the
    resume) (#27)."""
    import os
    import resource

    loop = asyncio.get_running_loop()
    assert isinstance(loop, asyncio.SelectorEventLoop)
    server = await loop.create_server(Greeter, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pause = AcceptPause()
    pause.add(server, Greeter, 100)
    client = socket.create_connection(("127.0.0.1", port))  # in the kernel's queue
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fillers: list[int] = []
    loop.set_exception_handler(lambda loop, context: None)  # asyncio's "out of resources" log
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
        try:
            while True:
                fillers.append(os.dup(0))
        except OSError:
            pass
        await asyncio.sleep(0.05)  # the loop's accept meets EMFILE: retried in a second
        pause.crowded(True)
        for fd in fillers:
            os.close(fd)
        fillers.clear()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        await asyncio.sleep(1.5)  # the loop's retry has come
        reader, writer = await asyncio.open_connection(sock=client)
        assert await greeting(reader) is None  # still paused: not accepted
        pause.crowded(False)
        assert await asyncio.wait_for(reader.readexactly(2), 5) == b"hi"
        writer.close()
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        loop.set_exception_handler(None)
        await pause.close()
