"""The log says how a broker node failed a login, so that an operator can tell a broker that is
down (nothing listens: refused) from one that is up but cannot take more connections (it
resets or closes them during the handshake, or never answers) and from one that closed with a
reason.  The failures are played by the AMQP proxy (tests/amqp_proxy.py) in front of the real
broker, or by a port nothing listens on; the client gets the same ERROR in every case
(docs/behaviour.md, "Broker nodes"), and a client through a working node is served meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.amqp_proxy import CONNECTION_START, Frame, Hook, Link, ProxyThread
from tests.support import StompClient, free_port, read_frames, unique

GENERIC = b"The broker is unreachable, try again later"
CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0"


class ResetOnHeader(Hook):
    """The node takes the TCP connection and resets it when the protocol header comes."""

    async def client_connected(self, link: Link) -> None:
        link.reset()


class CloseOnHeader(Hook):
    """The node takes the TCP connection and closes it (FIN) without a word."""

    async def client_connected(self, link: Link) -> None:
        link.close()


class Silent(Hook):
    """The node takes the TCP connection and never answers (as a broker out of file
    descriptors leaves connections in its accept queue)."""

    async def client_connected(self, link: Link) -> None:
        await asyncio.Event().wait()


class ForcedClose(Hook):
    """connection.start is replaced with connection.close 320 and a reason."""

    async def server_frame(self, link: Link, frame: Frame) -> list[Frame]:
        if frame.method_index == CONNECTION_START:
            link.close_connection(
                320, "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"
            )
            return []
        return [frame]


@contextmanager
def another_protocol(answer: bytes) -> Iterator[str]:
    """A port where something other than an AMQP broker listens (a STOMP server, an HTTP one, an
    AMQP 1.0 broker ...): it answers every connection with ``answer`` and hangs up.  Yields an
    ``amqp://`` URL to it."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # closed: the test is over
            with conn:
                conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"amqp://guest:guest@127.0.0.1:{listener.getsockname()[1]}/"
    finally:
        listener.close()
        thread.join(5)


def login_fails(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(CONNECT)
        frames, _ = read_frames(sock, timeout=10, count=1)
    assert frames and frames[0].startswith(b"ERROR") and GENERIC in frames[0], frames


HANDSHAKE = "closed the connection during the AMQP handshake"
CASES = {
    "refused": (None, "refused the connection (nothing listens on the port"),
    "reset": (ResetOnHeader, "reset the connection during the AMQP handshake"),
    "closed": (CloseOnHeader, f"{HANDSHAKE} (the node closed the connection before connection.start)"),
    "silent": (
        Silent,
        "did not answer the AMQP handshake (TCP connected, but no connection.start within 1 s)",
    ),
    "forced": (
        ForcedClose,
        f"{HANDSHAKE} (the node closed the connection: CONNECTION_FORCED - broker forced connection"
        " closure with reason 'shutdown')",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_log_says_how_the_node_failed(case, amqp_url, start_adapter, caplog):
    make, expected = CASES[case]
    proxy = ProxyThread(amqp_url, [make()]).__enter__() if make is not None else None
    try:
        url = proxy.url if proxy is not None else f"amqp://guest:guest@127.0.0.1:{free_port()}/"
        adapter = start_adapter(amqp_url=url, amqp_connect_timeout=1)
        with caplog.at_level(logging.WARNING, "adapter.connection"):
            login_fails(adapter.port)
        lines = [r.getMessage() for r in caplog.records if ": broker node " in r.getMessage()]
        assert lines, caplog.text
        assert expected in lines[0], lines
        assert "unreachable" not in lines[0], lines
    finally:
        if proxy is not None:
            proxy.__exit__(None, None, None)


def test_a_failing_node_leaves_the_next_one_serving(amqp_url, start_adapter, broker, caplog):
    """The reset node is skipped: the login goes on to the real broker and the client is
    served; the log says the first node reset the connection."""
    proxy = ProxyThread(amqp_url, [ResetOnHeader()]).__enter__()
    try:
        adapter = start_adapter(amqp_url=f"{proxy.url},{amqp_url}", amqp_connect_timeout=1)
        queue = unique("failover")
        broker.track_queue(queue)
        with caplog.at_level(logging.WARNING, "adapter.connection"):
            client = StompClient(adapter.port)
            client.conn.send(f"/queue/{queue}", "kept", headers={"receipt": "r"})
            assert client.next("RECEIPT").headers["receipt-id"] == "r"
            client.close()
        assert broker.wait_depth(queue, 1) == 1
        assert "reset the connection during the AMQP handshake" in caplog.text
    finally:
        proxy.__exit__(None, None, None)


# what the node answered, as a STOMP server (the plugin) or an HTTP one (the management API) does
# on a port given by mistake, and as an AMQP 1.0-only broker does (its protocol header)
OTHER_PROTOCOLS = {
    "stomp": b"ERROR\nmessage:Processing error\ncontent-type:text/plain\n\nbad frame\0",
    "http": b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n",
    "amqp-1.0": b"AMQP\x00\x01\x00\x00",
}


@pytest.mark.parametrize("protocol", list(OTHER_PROTOCOLS))
def test_a_node_that_speaks_another_protocol_is_named_so_and_the_next_node_serves(
    protocol, amqp_url, start_adapter, broker, caplog
):
    """A URL whose port is another server's (a STOMP plugin, a management API): its first bytes
    are not AMQP.  Before, "ERROR\nm" read as a frame of 1.3 GB ended the login with the plugin's
    "Processing error" and no other node was tried; now the node is skipped as a failed one,
    the log names what it answered, and a client goes on to the next node."""
    answer = OTHER_PROTOCOLS[protocol]
    with another_protocol(answer) as url:
        alone = start_adapter(amqp_url=url, amqp_connect_timeout=1)
        with caplog.at_level(logging.WARNING, "adapter.connection"):
            login_fails(alone.port)
        lines = [r.getMessage() for r in caplog.records if ": broker node " in r.getMessage()]
        assert lines, caplog.text
        assert "answered in another protocol than AMQP 0-9-1" in lines[0], lines
        assert repr(answer[:8])[2:-1] in lines[0], lines
        caplog.clear()

        both = start_adapter(amqp_url=f"{url},{amqp_url}", amqp_connect_timeout=1)
        queue = unique("not-amqp")
        broker.track_queue(queue)
        client = StompClient(both.port)
        client.conn.send(f"/queue/{queue}", "kept", headers={"receipt": "r"})
        assert client.next("RECEIPT").headers["receipt-id"] == "r"
        client.close()
        assert broker.wait_depth(queue, 1) == 1
