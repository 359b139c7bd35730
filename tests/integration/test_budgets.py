"""Byte budgets for the buffers a single connection controls (docs/behaviour.md, Limits): the SEND
bodies of open transactions, and (activemq profile) the unacknowledged deliveries the adapter
keeps for a NACK to the dead-letter queue.  Each is bounded per connection and for the whole
process; the connection that would break a bound gets an ERROR naming the setting and is closed,
the others go on, and nothing that was receipted (or committed) is lost.

Each adapter here has small budgets; the bodies are sized so the arithmetic is exact.  The
independent clients are stomp.py and, for the broker's side, aio-pika (BrokerProbe)."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable

from adapter.mapping.budget import Budgets
from tests.support import AdapterProcess, BrokerProbe, StompClient, read_frames, unique

BODY = "x" * 10_000  # every message body: 10,000 bytes


def budgets(adapter: AdapterProcess) -> Budgets:
    return adapter.server.context.session_settings.registries.budgets


def pools_used(adapter: AdapterProcess) -> tuple[int, int]:
    """Bytes held now by all connections: (transactions, kept deliveries), read on the loop."""

    async def read() -> tuple[int, int]:
        return budgets(adapter).transactions.used, budgets(adapter).unacked.used

    return adapter.run(read())


def wait_pools_empty(adapter: AdapterProcess, timeout: float = 5.0) -> tuple[int, int]:
    """The pools once every closed connection has given its bytes back (the close is
    asynchronous: the client sees its socket close before the adapter's loop finishes it)."""
    deadline = time.monotonic() + timeout
    while (used := pools_used(adapter)) != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.02)
    return used


def send(client: StompClient, destination: str, receipt: str | None = None, **headers: str) -> None:
    if receipt is not None:
        headers["receipt"] = receipt
    client.conn.send(destination, BODY, headers=headers)


def receipted(client: StompClient, receipt: str) -> None:
    frame = client.next(("RECEIPT", "ERROR"))
    assert (frame.command, frame.headers.get("receipt-id")) == ("RECEIPT", receipt), frame


def closed_with_error(client: StompClient, setting: str) -> None:
    error = client.next("ERROR")
    assert setting in error.body, error  # the ERROR names the limit and its setting
    assert client.wait_disconnected()


def messages_before_close(client: StompClient) -> int:
    """The MESSAGE frames a closed client received (all recorded before its disconnect)."""
    frames = client._pending + list(client.recorder.frames.queue)
    return sum(frame.command == "MESSAGE" for frame in frames)


def barrier(client: StompClient, name: str) -> None:
    """Wait until the adapter has handled every frame the client sent before (a transactional
    SEND's own receipt only comes at COMMIT): a receipted BEGIN, handled after them."""
    client.conn.begin(name, headers={"receipt": name})
    receipted(client, name)


def bystander_served(port: int, broker: BrokerProbe) -> None:
    """A connection that was never over any bound: its SEND is receipted and arrives."""
    queue = unique("bystander")
    broker.track_queue(queue)
    other = StompClient(port)
    try:
        send(other, f"/queue/{queue}", receipt="b")
        receipted(other, "b")
        assert broker.wait_depth(queue, 1) == 1
    finally:
        other.close()


# ------------------------------------------------------------------------------------ transactions


def test_a_transaction_over_the_connection_bound_is_refused_and_nothing_receipted_is_lost(
    start_adapter: Callable[..., AdapterProcess], broker: BrokerProbe
) -> None:
    adapter = start_adapter(max_transaction_bytes=35_000)
    queue = unique("tx-bytes")
    broker.track_queue(queue)
    destination = f"/queue/{queue}"
    client = StompClient(adapter.port)
    try:
        for n in range(3):  # receipted, outside any transaction: never counted
            send(client, destination, receipt=f"s{n}")
            receipted(client, f"s{n}")
        client.conn.begin("t1")
        for _ in range(3):  # 30,000 bytes: within the bound
            send(client, destination, transaction="t1")
        client.conn.commit("t1", headers={"receipt": "c1"})
        receipted(client, "c1")
        client.conn.begin("t2")  # the committed bytes were given back: t2 starts from zero
        for _ in range(3):
            send(client, destination, transaction="t2")
        send(client, destination, transaction="t2")  # 40,000 bytes: over
        closed_with_error(client, "adapter.max_transaction_bytes")
    finally:
        client.close()
    # the six receipted messages and nothing of the refused transaction
    assert broker.idle_depth(queue) == 6
    bystander_served(adapter.port, broker)
    assert wait_pools_empty(adapter) == (0, 0)


def test_transactions_of_two_connections_over_the_process_budget(
    start_adapter: Callable[..., AdapterProcess], broker: BrokerProbe
) -> None:
    """Each connection stays under its own bound; together they break the process's."""
    adapter = start_adapter(max_transaction_bytes=35_000, transaction_bytes_budget=50_000)
    queue = unique("tx-pool")
    broker.track_queue(queue)
    destination = f"/queue/{queue}"
    first, second = StompClient(adapter.port), StompClient(adapter.port)
    try:
        first.conn.begin("a")
        for _ in range(3):  # 30,000 bytes held by the first connection
            send(first, destination, transaction="a")
        barrier(first, "sync")
        second.conn.begin("b")
        send(second, destination, transaction="b")  # 40,000 in all
        send(second, destination, transaction="b")  # 50,000: still within the budget
        send(second, destination, transaction="b")  # 60,000: over it
        closed_with_error(second, "adapter.transaction_bytes_budget")
        # the first connection is served, and its transaction goes through whole
        first.conn.commit("a", headers={"receipt": "ca"})
        receipted(first, "ca")
        assert broker.wait_depth(queue, 3) == 3
    finally:
        first.close()
        second.close()
    assert broker.idle_depth(queue) == 3
    bystander_served(adapter.port, broker)
    assert wait_pools_empty(adapter) == (0, 0)


def test_bytes_held_by_connections_that_vanish_go_back_to_the_pool(
    start_adapter: Callable[..., AdapterProcess], broker: BrokerProbe
) -> None:
    """Open transactions and kept deliveries of clients that reset their sockets without
    DISCONNECT, or are closed by an error, are given back: the pools return to zero."""
    adapter = start_adapter(profile="activemq")
    queue = unique("vanish")
    fill(adapter.port, queue, 4, broker)
    send_frame = f"SEND\ndestination:/queue/{queue}\ntransaction:t\n\n{BODY}\0"
    socks = []
    for _ in range(3):
        sock = raw_client(adapter.port)
        sock.sendall(f"BEGIN\ntransaction:t\n\n\0{send_frame}BEGIN\ntransaction:s\nreceipt:r\n\n\0".encode())
        assert read_frames(sock, count=1)[0][0].startswith(b"RECEIPT")
        socks.append(sock)
    socks[0].sendall(f"SUBSCRIBE\ndestination:/queue/{queue}\nid:s\nack:client-individual\n\n\0".encode())
    frames: list[bytes] = []
    while len(frames) < 4:
        more, _closed = read_frames(socks[0], count=4 - len(frames))
        assert more, frames
        frames += more
    assert pools_used(adapter) == (30_000, 40_000)
    reset(socks[0])  # gone without a word
    socks[1].sendall(b"COMMIT\ntransaction:nope\n\n\0")  # an ERROR closes it
    assert read_frames(socks[1], count=1)[0][0].startswith(b"ERROR")
    reset(socks[2])
    socks[1].close()
    assert wait_pools_empty(adapter) == (0, 0)
    assert broker.idle_depth(queue) == 4  # the kept deliveries went back to the queue


def raw_client(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0")
    assert read_frames(sock, count=1)[0][0].startswith(b"CONNECTED")
    return sock


def reset(sock: socket.socket) -> None:
    """Close with a TCP reset: no DISCONNECT, no FIN."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


# ------------------------------------------------------------------ kept deliveries (activemq profile)


def fill(port: int, queue: str, count: int, broker: BrokerProbe) -> None:
    broker.track_queue(queue)
    feeder = StompClient(port)
    try:
        for _ in range(count - 1):
            send(feeder, f"/queue/{queue}")
        send(feeder, f"/queue/{queue}", receipt="last")
        receipted(feeder, "last")
    finally:
        feeder.close()
    assert broker.wait_depth(queue, count) == count


def test_kept_deliveries_over_the_connection_bound_close_the_client_and_go_back_to_the_queue(
    start_adapter: Callable[..., AdapterProcess], broker: BrokerProbe
) -> None:
    adapter = start_adapter(profile="activemq", max_unacked_bytes=50_000)
    queue = unique("kept")
    fill(adapter.port, queue, 20, broker)
    client = StompClient(adapter.port)
    try:
        client.conn.subscribe(f"/queue/{queue}", "s", ack="client-individual")  # and never ACKs
        closed_with_error(client, "adapter.max_unacked_bytes")
        # at most the 50,000 bytes kept: the sixth message is not sent (nor any, if they came
        # before the SUBSCRIBE was finished: they wait for it, and the close drops them)
        assert messages_before_close(client) <= 5
    finally:
        client.close()
    assert broker.idle_depth(queue) == 20  # every message is back on its queue
    bystander_served(adapter.port, broker)
    assert wait_pools_empty(adapter) == (0, 0)


def test_acknowledged_deliveries_are_given_back(
    start_adapter: Callable[..., AdapterProcess], broker: BrokerProbe
) -> None:
    """A consumer that acknowledges (or NACKs) what it gets, with a prefetch that fits the
    bound, goes through a queue six times the bound."""
    adapter = start_adapter(profile="activemq", max_unacked_bytes=30_000)
    queue = unique("acked")
    fill(adapter.port, queue, 18, broker)
    client = StompClient(adapter.port)
    try:
        client.conn.subscribe(
            f"/queue/{queue}", "s", ack="client-individual", headers={"activemq.prefetchSize": "3"}
        )
        for n in range(18):
            message = client.next("MESSAGE")
            if n % 2:
                client.conn.ack(message.headers["ack"], receipt=f"a{n}")
            else:
                client.conn.nack(message.headers["ack"], receipt=f"a{n}")
            receipted(client, f"a{n}")
        assert pools_used(adapter) == (0, 0)
    finally:
        client.close()
    assert broker.idle_depth(queue) == 0  # non-persistent: NACKed ones are dropped, as ActiveMQ does


def test_kept_deliveries_of_two_connections_over_the_process_budget(
    start_adapter: Callable[..., AdapterProcess], broker: BrokerProbe
) -> None:
    adapter = start_adapter(profile="activemq", max_unacked_bytes=50_000, unacked_bytes_budget=70_000)
    first_queue, second_queue = unique("kept-a"), unique("kept-b")
    fill(adapter.port, first_queue, 4, broker)
    fill(adapter.port, second_queue, 4, broker)
    first, second = StompClient(adapter.port), StompClient(adapter.port)
    try:
        first.conn.subscribe(f"/queue/{first_queue}", "s", ack="client")
        held = first.messages(4)  # 40,000 bytes
        second.conn.subscribe(f"/queue/{second_queue}", "s", ack="client")
        # 70,000 bytes in all after its third message: the budget; the fourth breaks it
        closed_with_error(second, "adapter.unacked_bytes_budget")
        assert messages_before_close(second) <= 3
        assert broker.idle_depth(second_queue) == 4
        # the first connection is served: its cumulative ACK settles its four messages
        first.conn.ack(held[-1].headers["ack"], receipt="acked")
        receipted(first, "acked")
        assert pools_used(adapter) == (0, 0)
    finally:
        first.close()
        second.close()
    bystander_served(adapter.port, broker)
    assert wait_pools_empty(adapter) == (0, 0)


def test_a_client_ack_subscription_without_a_prefetch_gets_activemq_s_default_of_1000(
    start_adapter: Callable[..., AdapterProcess], broker: BrokerProbe
) -> None:
    """ActiveMQ's default queue prefetch applies: a client that never ACKs holds 1,000 messages,
    not the whole queue (nor does the adapter keep more than those for a NACK)."""
    adapter = start_adapter(profile="activemq")
    queue = unique("prefetch")
    broker.track_queue(queue)
    feeder = StompClient(adapter.port)
    for _ in range(1_499):
        feeder.conn.send(f"/queue/{queue}", "m")
    feeder.conn.send(f"/queue/{queue}", "m", headers={"receipt": "last"})
    receipted(feeder, "last")
    feeder.close()
    client = StompClient(adapter.port)
    try:
        client.conn.subscribe(f"/queue/{queue}", "s", ack="client")
        assert len(client.messages(1_000, timeout=10)) == 1_000
        assert broker.wait_depth(queue, 500) == 500  # the rest stays on the queue
        assert client.nothing_more(wait=0.5)
    finally:
        client.close()
    assert broker.idle_depth(queue) == 1_500
