"""stomp.tcp_listen_options and adapter.client_receive_buffer on an accepted client socket
(adapter/server/options.py): a real socket pair, read back with getsockopt."""

from __future__ import annotations

import socket

import pytest

from adapter.config import load_settings
from adapter.server.options import SocketOptions


def options(recbuf: int | None, client_receive_buffer: int) -> SocketOptions:
    return SocketOptions(128, True, False, None, recbuf, client_receive_buffer)


def receive_buffer(applied: SocketOptions) -> tuple[int, int]:
    """SO_RCVBUF of an accepted socket before and after ``applied``."""
    listener = socket.create_server(("127.0.0.1", 0))
    with listener, socket.create_connection(listener.getsockname()) as client:
        accepted, _ = listener.accept()
        with accepted:
            default = accepted.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
            applied.apply(accepted)
            size = accepted.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
            client.sendall(b"x")
            assert accepted.recv(1) == b"x"
            return default, size


@pytest.mark.parametrize(
    ("recbuf", "bound", "expected"),
    [
        (None, 262144, 262144),  # the adapter's bound by default
        (65536, 262144, 65536),  # stomp.tcp_listen_options.recbuf wins
        (None, 0, 0),  # 0: the OS's autotuning, the socket left as it was
    ],
)
def test_the_receive_buffer_of_an_accepted_socket(recbuf: int | None, bound: int, expected: int) -> None:
    default, size = receive_buffer(options(recbuf, bound))
    # Linux doubles what it is given (its bookkeeping)
    assert size in (expected, 2 * expected) if expected else size == default


def test_the_default_bound_and_its_spelling() -> None:
    assert load_settings(None, {}).client_receive_buffer == 262144
    assert load_settings(None, {"client_receive_buffer": 0}).client_receive_buffer == 0
