"""The recording tap (``python -m adapter tap``) as a real process: transparency (stomp.py through
the tap to RabbitMQ's STOMP plugin gets what it gets direct; every byte both ways, byte-exact,
against a scripted upstream), the recording it leaves, and faults (upstream down, upstream
closing mid-frame, a client vanishing, a full disk).  Nothing may hang: every wait is bounded."""

from __future__ import annotations

import base64
import contextlib
import gzip
import os
import resource
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.support import StompClient, unique
from tests.tap_support import ScriptedUpstream, TapProcess, can_mount_tmpfs, recv_all

PLUGIN_PORT = int(os.environ.get("STOMP_PLUGIN_PORT", "61613"))


@pytest.fixture
def plugin() -> str:
    try:
        socket.create_connection(("127.0.0.1", PLUGIN_PORT), timeout=2).close()
    except OSError as error:
        pytest.fail(
            f"RabbitMQ's STOMP plugin is not reachable on 127.0.0.1:{PLUGIN_PORT} ({error}): "
            "rabbitmq-plugins enable rabbitmq_stomp",
            pytrace=False,
        )
    return f"127.0.0.1:{PLUGIN_PORT}"


@pytest.fixture
def taps():
    started: list[TapProcess] = []

    def start(upstream: str, record: Path, *extra: str, **kwargs) -> TapProcess:
        tap = TapProcess(upstream, record, *extra, **kwargs)
        started.append(tap)
        return tap

    yield start
    for tap in started:
        with contextlib.suppress(AssertionError):
            tap.stop()


def conversation(port: int, topic: str) -> list[tuple[str, ...]]:
    """CONNECT, SUBSCRIBE (client-individual), three SENDs with receipts, ACKs, DISCONNECT: what
    the client got, in an order that does not depend on how MESSAGEs and RECEIPTs interleave."""
    client = StompClient(port, vhost="/", heartbeats=(0, 0))
    connected = client.next("CONNECTED")
    got: list[tuple[str, ...]] = [("CONNECTED", connected.headers["version"])]
    try:
        client.conn.subscribe(f"/topic/{topic}", id="s1", ack="client-individual", headers={"receipt": "sub"})
        got.append(("RECEIPT", client.next("RECEIPT").headers["receipt-id"]))
        for n in range(3):
            client.conn.send(f"/topic/{topic}", f"body {n}", receipt=f"r{n}", headers={"x-n": str(n)})
        receipts = sorted(client.next("RECEIPT").headers["receipt-id"] for _ in range(3))
        got += [("RECEIPT", r) for r in receipts]
        for message in client.messages(3):
            got.append(("MESSAGE", message.headers["destination"], message.headers["x-n"], str(message.body)))
            client.conn.ack(message.headers["ack"])
        client.conn.disconnect(receipt="bye")
        got.append(("no ERROR", str(client.nothing_more("ERROR", wait=0.2))))
        got.append(("DISCONNECTED",))
    finally:
        client.close()
    return got


def test_stomp_py_through_the_tap_gets_what_it_gets_direct_and_the_session_is_recorded(
    tmp_path, plugin, taps
):
    topic = unique("tap")
    direct = conversation(PLUGIN_PORT, topic)
    tap = taps(plugin, tmp_path / "rec")
    tapped = conversation(tap.port, topic)
    assert tapped == direct
    assert tap.stop() == 0
    records = tap.records()
    conns = {r["conn"] for r in records}
    assert len(conns) == 1
    frames = [(r["dir"], r["command"]) for r in records if r["kind"] == "frame"]
    assert [c for d, c in frames if d == "in"] == ["STOMP", "SUBSCRIBE"] + ["SEND"] * 3 + ["ACK"] * 3 + [
        "DISCONNECT"
    ]
    out = [c for d, c in frames if d == "out"]
    assert out[0] == "CONNECTED" and sorted(out[1:]) == ["MESSAGE"] * 3 + ["RECEIPT"] * 5
    connect = next(r for r in records if r["kind"] == "frame")
    assert ["login", "guest"] in connect["headers"] and ["passcode", "***"] in connect["headers"]
    assert "guest" not in [v for n, v in connect["headers"] if n == "passcode"]
    assert all("body" not in r for r in records)
    kinds = [r["kind"] for r in records]
    assert kinds[0] == "open" and kinds[-1] == "close"
    assert records[0]["upstream"] == plugin and records[0]["tls"] is False
    assert records[-1]["bytes_in"] > 0 and records[-1]["bytes_out"] > 0


CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:app\npasscode:hunter2\nheart-beat:5000,0\n\n\0"
BODY = bytes(range(256)) * 4  # NULs and every other byte
SEND = b"SEND\ndestination:/queue/a\\cb\ncontent-length:1024\nx:1\nx:2\n\n" + BODY + b"\0\n"


def test_every_byte_passes_unchanged_both_ways_with_heartbeats_and_half_closes(tmp_path, taps):
    message = (
        b"MESSAGE\nsubscription:0\nmessage-id:1\ndestination:/queue/a\ncontent-length:1024\n\n"
        + BODY
        + b"\0\n"
    )

    def script(conn: socket.socket, up: ScriptedUpstream) -> None:
        up.read_until(conn, b"\0")
        up.send(conn, b"CONNECTED\nversion:1.2\nheart-beat:0,5000\n\n\0\n")
        up.send(conn, b"\n\r\n")  # heart-beats, LF and CR LF
        for piece in (message[:7], message[7:90], message[90:]):  # cut inside the head and the body
            up.send(conn, piece)
            time.sleep(0.02)
        up.read_to_end(conn)  # until the client's end of stream, passed on by the tap ...
        up.send(conn, b"RECEIPT\nreceipt-id:bye\n\n\0\n")  # ... which still carries this back
        conn.shutdown(socket.SHUT_WR)

    upstream = ScriptedUpstream(script)
    tap = taps(upstream.address, tmp_path / "rec")
    # the first LF ends CONNECT (as the adapter ends its frames), the next two are heart-beats
    chunks = [CONNECT, b"\n", b"\n", b"\r\n", SEND[:30], SEND[30:500], SEND[500:]]
    chunks.append(b"DISCONNECT\nreceipt:bye\n\n\0")
    with socket.create_connection(("127.0.0.1", tap.port), timeout=30) as client:
        for chunk in chunks:
            client.sendall(chunk)
            time.sleep(0.02)
        client.shutdown(socket.SHUT_WR)  # half-close: the answer must still arrive
        got = recv_all(client)
    upstream.join()
    assert bytes(upstream.received) == b"".join(chunks)
    assert got == bytes(upstream.sent)
    assert tap.stop() == 0

    records = tap.records()
    frames = [r for r in records if r["kind"] == "frame"]
    assert [(r["dir"], r["command"]) for r in frames] == [
        ("in", "CONNECT"),
        ("out", "CONNECTED"),
        ("out", "MESSAGE"),
        ("in", "SEND"),
        ("in", "DISCONNECT"),
        ("out", "RECEIPT"),
    ]
    send = frames[3]
    assert send["headers"] == [
        ["destination", "/queue/a\\cb"],
        ["content-length", "1024"],
        ["x", "1"],
        ["x", "2"],
    ]
    assert send["body_len"] == 1024 == frames[2]["body_len"]
    beats = {
        d: sum(r["count"] for r in records if r["kind"] == "heartbeats" and r["dir"] == d)
        for d in ("in", "out")
    }
    assert beats == {"in": 2, "out": 2}
    close = records[-1]
    assert close["kind"] == "close" and close["by"] == "client"
    assert (close["bytes_in"], close["bytes_out"]) == (len(upstream.received), len(got))
    assert "hunter2" not in (tmp_path / "rec").joinpath(
        next(iter(os.listdir(tmp_path / "rec")))
    ).read_bytes().decode("latin-1")


def test_bodies_are_recorded_only_with_record_bodies(tmp_path, taps):
    def script(conn: socket.socket, up: ScriptedUpstream) -> None:
        up.read_to_end(conn)

    upstream = ScriptedUpstream(script)
    tap = taps(upstream.address, tmp_path / "rec", "--record-bodies")
    with socket.create_connection(("127.0.0.1", tap.port), timeout=30) as client:
        client.sendall(CONNECT + SEND)
        client.shutdown(socket.SHUT_WR)
        assert recv_all(client) == b""
    upstream.join()
    assert tap.stop() == 0
    connect, send = [r for r in tap.records() if r["kind"] == "frame"]
    assert base64.b64decode(send["body"]) == BODY
    assert connect["body"] == "" and ["passcode", "***"] in connect["headers"]


def test_an_upstream_that_is_down_is_refused_to_the_client(tmp_path, taps):
    # a port held bound but not listening refuses connections, and no other test (another
    # pytest-xdist worker) can take it meanwhile, as it could take a port merely found free
    with socket.socket() as down:
        down.bind(("127.0.0.1", 0))
        tap = taps(f"127.0.0.1:{down.getsockname()[1]}", tmp_path / "rec")
        for _ in range(2):
            # the reset can come before the client's connect has read its own outcome (a connect
            # with a timeout polls, then reads SO_ERROR): then the connect itself raises it
            with (
                pytest.raises(ConnectionResetError),
                socket.create_connection(("127.0.0.1", tap.port), timeout=30) as client,
            ):
                client.recv(100)
        assert tap.metric("upstream_failures_total") == 2
        assert tap.get("/healthz").startswith("ok")
        assert tap.stop() == 0
    records = tap.records()
    assert [r["kind"] for r in records] == ["open", "close"] * 2
    assert records[1]["by"] == "upstream" and "upstream connect failed" in records[1]["reason"]
    assert records[1]["bytes_in"] == records[1]["bytes_out"] == 0


def test_an_upstream_closing_mid_frame_passes_the_cut_frame_and_the_close_on(tmp_path, taps):
    cut = b"CONNECTED\nversion:1.2\n\n\0\nMESSAGE\ndestination:/queue/a\ncontent-length:100\n\nabc"

    def script(conn: socket.socket, up: ScriptedUpstream) -> None:
        up.read_until(conn, b"\0")
        up.send(conn, cut)

    upstream = ScriptedUpstream(script)
    tap = taps(upstream.address, tmp_path / "rec")
    with socket.create_connection(("127.0.0.1", tap.port), timeout=30) as client:
        client.sendall(CONNECT)
        assert recv_all(client) == cut  # then the end of stream, as from the upstream itself
    upstream.join()
    assert tap.stop() == 0
    records = tap.records()
    out = [r for r in records if r["kind"] == "frame" and r["dir"] == "out"]
    assert [r["command"] for r in out] == ["CONNECTED", None]
    assert "middle of a frame" in out[1]["error"]
    assert records[-1]["kind"] == "close" and records[-1]["by"] == "upstream"


def test_a_client_that_vanishes_closes_its_upstream_and_the_tap_serves_the_others(tmp_path, plugin, taps):
    tap = taps(plugin, tmp_path / "rec")
    vanishing = socket.create_connection(("127.0.0.1", tap.port), timeout=30)
    vanishing.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0")
    vanishing.settimeout(30)
    assert vanishing.recv(4096).startswith(b"CONNECTED")
    vanishing.sendall(b"SEND\ndestination:/queue/never\ncontent-length:100\n\nhalf")
    vanishing.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    vanishing.close()  # a reset, in the middle of a frame
    deadline = time.monotonic() + 30
    while tap.metric("open_connections") != 0:  # both sides closed: the upstream's too
        assert time.monotonic() < deadline, "the vanished client's connection stayed open"
        time.sleep(0.05)
    bystander = conversation(tap.port, unique("tap"))
    assert bystander[-1] == ("DISCONNECTED",) and len([g for g in bystander if g[0] == "MESSAGE"]) == 3
    assert tap.stop() == 0
    records = tap.records()
    first = [r for r in records if r["conn"] == records[0]["conn"]]
    assert first[-1]["by"] == "client" and "ConnectionResetError" in first[-1]["reason"]
    assert [r.get("command") for r in first if r["kind"] == "frame" and r["dir"] == "in"] == ["CONNECT", None]


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))


def test_a_full_disk_drops_records_with_a_warning_and_the_proxy_goes_on(tmp_path, taps):
    """A real full disk: a 64 KiB tmpfs (or, where mounting is not allowed, a 64 KiB file-size
    limit on the tap, which fails its writes with EFBIG the same way)."""
    record = tmp_path / "small"
    mounted = can_mount_tmpfs(record, "64k")

    def echo(conn: socket.socket, up: ScriptedUpstream) -> None:
        while data := conn.recv(65536):
            up.received += data
            up.send(conn, data)
        conn.shutdown(socket.SHUT_WR)

    try:
        upstream = ScriptedUpstream(echo)
        tap = taps(
            upstream.address,
            record,
            *([] if mounted else []),
            preexec_fn=None if mounted else _limit_file_size,
        )
        # 3000 frames whose headers gzip cannot shrink: about 1 MB of records for 64 KiB of disk
        frames = b"".join(
            b"SEND\ndestination:/queue/a\nx-noise:" + os.urandom(150).hex().encode() + b"\n\n\0\n"
            for _ in range(3000)
        )
        got = bytearray()
        with socket.create_connection(("127.0.0.1", tap.port), timeout=30) as client:
            sender = threading.Thread(target=client.sendall, args=(frames,), daemon=True)
            sender.start()
            client.settimeout(30)
            while len(got) < len(frames):
                data = client.recv(65536)
                assert data, "the tap closed the connection"
                got += data
            sender.join(30)
        assert bytes(got) == frames  # the proxy went on, byte for byte
        deadline = time.monotonic() + 30
        while tap.metric("records_dropped_total") == 0 or tap.metric("records_queued") != 0:
            assert time.monotonic() < deadline, "no records were dropped"
            time.sleep(0.05)
        assert tap.metric("frames_total", '{dir="in"}') == 3000
        assert tap.stop() == 0
        upstream.join()
        warnings = [line for line in tap.log().splitlines() if "cannot write the recording" in line]
        assert len(warnings) == 1, tap.log()
        assert "No space left on device" in warnings[0] or "File too large" in warnings[0]
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(record)], check=False)


def _peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _wait_for_metric(tap: TapProcess, name: str, labels: str, at_least: float) -> None:
    deadline = time.monotonic() + 60
    while tap.metric(name, labels) < at_least:
        assert time.monotonic() < deadline, f"{name}{labels} stayed below {at_least}"
        time.sleep(0.05)


def test_one_huge_connect_of_control_characters_costs_the_tap_its_size_and_the_others_stay_served(
    tmp_path, plugin, taps
):
    """Issue 33 item 5: a 24 MiB CONNECT of control-character header lines (RabbitMQ's plugin
    accepts it) cost the tap about 16x its size, before any login: the JSON of its head was made
    before its size was looked at, six characters per control character.  Now the record is
    bounded before it is made: the tap's peak RSS grows by about twice the frame (the incomplete
    head it holds, one copy while the head is checked), the frame is recorded without its
    headers, and a client already connected through the tap goes on being served."""
    tap = taps(plugin, tmp_path / "rec")
    queue = f"/queue/{unique('tap-hostile')}"
    bystander = StompClient(tap.port)
    try:
        bystander.conn.subscribe(queue, id="s1", headers={"receipt": "sub"})
        bystander.next("RECEIPT")
        before = _peak_rss(tap.process.pid)
        frames_in = tap.metric("frames_total", '{dir="in"}')
        line = b"x:" + b"\x01" * 3000 + b"\n"
        head = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n" + line * 8000 + b"\n\0"
        with socket.create_connection(("127.0.0.1", tap.port), timeout=60) as hostile:
            hostile.sendall(head)
            hostile.settimeout(60)
            assert hostile.recv(4096).startswith(b"CONNECTED")  # every byte went through
            _wait_for_metric(tap, "frames_total", '{dir="in"}', frames_in + 1)  # and was recorded
            growth = _peak_rss(tap.process.pid) - before
            bystander.conn.send(queue, "still served")
            assert str(bystander.next("MESSAGE").body) == "still served"
        assert growth < 3 * len(head), (
            f"the tap's peak RSS grew by {growth >> 20} MiB for a {len(head) >> 20} MiB frame"
        )
    finally:
        bystander.close()
    assert tap.stop() == 0
    records = tap.records()
    [connect] = [
        r for r in records if r["kind"] == "frame" and r["command"] == "CONNECT" and r["headers"] == []
    ]
    assert connect["omitted"] == ["headers"]
    assert not [r for r in records if r["kind"] == "dropped"]
    assert tap.log().count("WARNING") == 0


def test_a_client_that_never_reads_holds_its_upstream_back_and_the_tap_stays_small(tmp_path, plugin, taps):
    """A client subscribed through the tap stops reading while 64 MiB are published to it: the
    tap stops reading from the upstream once what it has for the client passes its write
    buffer's high-water mark, so the rest stays in the broker, not in the tap (its peak RSS
    grows by far less than the flood), and a bystander through the same tap is served."""
    flood, size = 64 << 20, 64 << 10
    tap = taps(plugin, tmp_path / "rec")
    topic = f"/topic/{unique('tap-stalled')}"
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)  # before connect: a small window
    stalled.settimeout(30)
    stalled.connect(("127.0.0.1", tap.port))
    publisher = bystander = None
    try:
        stalled.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0")
        stalled.sendall(b"SUBSCRIBE\nid:0\ndestination:" + topic.encode() + b"\nreceipt:sub\n\n\0")
        got = b""
        while b"receipt-id:sub" not in got:
            chunk = stalled.recv(4096)
            assert chunk, "the tap closed the stalled client before its RECEIPT"
            got += chunk
        # from here on the stalled client reads nothing
        before = _peak_rss(tap.process.pid)
        publisher = StompClient(int(plugin.rpartition(":")[2]))
        body = b"x" * size
        for n in range(flood // size):
            publisher.conn.send(topic, body, headers={"receipt": "all"} if n == flood // size - 1 else {})
        assert publisher.next("RECEIPT", timeout=60).headers["receipt-id"] == "all"
        forwarded = -1.0
        deadline = time.monotonic() + 30
        while (now := tap.metric("bytes_total", '{dir="out"}')) != forwarded:  # until it stops
            assert time.monotonic() < deadline, "the tap kept forwarding to a client that reads nothing"
            forwarded = now
            time.sleep(1.0)
        growth = _peak_rss(tap.process.pid) - before
        bystander = StompClient(tap.port)
        queue = f"/queue/{unique('tap-bystander')}"
        bystander.conn.subscribe(queue, id="s1", headers={"receipt": "sub"})
        bystander.next("RECEIPT")
        bystander.conn.send(queue, "still served")
        assert str(bystander.next("MESSAGE", timeout=10).body) == "still served"
        assert forwarded < flood / 4, (
            f"the tap forwarded {int(forwarded) >> 20} MiB to a client that reads nothing"
        )
        assert growth < flood / 8, (
            f"the tap's peak RSS grew by {growth >> 20} MiB holding a {flood >> 20} MiB flood"
        )
    finally:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        stalled.close()  # a reset: the broker drops the subscription's queue and what it holds
        for client in (publisher, bystander):
            if client is not None:
                client.close()
    assert tap.stop() == 0
    assert not [r for r in tap.records() if r["kind"] == "dropped"]


def test_a_passcode_line_with_a_bare_cr_reaches_no_recording_even_quoted_back_by_the_upstream(tmp_path, taps):
    """Issue 33 item 6: a passcode line holding a bare CR and a quote, which the scanner
    refuses, and an upstream that quotes the whole line back in its ERROR (in a header and in
    the body, as the adapter did), recorded with --record-bodies: no part of the passcode is in
    the recording's files."""
    secret = b"Zq7'Xj8\"Wv9"
    connect = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:" + secret + b"\rX\n\n\0"
    detail = b"CR not followed by LF in header line " + repr(b"passcode:" + secret + b"\rX").encode()
    error = (
        b"ERROR\nmessage:Bad header passcode:" + secret.replace(b"\\", b"\\\\") + b"\\rX\n"
        b"content-type:text/plain\ncontent-length:%d\n\n" % len(detail) + detail + b"\0\n"
    )

    def script(conn: socket.socket, up: ScriptedUpstream) -> None:
        up.read_until(conn, b"\0")
        up.send(conn, error)
        conn.shutdown(socket.SHUT_WR)
        up.read_to_end(conn)

    upstream = ScriptedUpstream(script)
    tap = taps(upstream.address, tmp_path / "rec", "--record-bodies")
    with socket.create_connection(("127.0.0.1", tap.port), timeout=30) as client:
        client.sendall(connect)
        assert recv_all(client) == error  # passed on as it came
    upstream.join()
    assert tap.stop() == 0
    records = tap.records()
    refused, answer = [r for r in records if r["kind"] == "frame"]
    assert refused["dir"] == "in" and refused["command"] is None and "passcode:***" in refused["error"]
    assert answer["command"] == "ERROR" and answer["headers"][0] == ["message", "Bad header passcode:***"]
    stored = b"".join(gzip.decompress(path.read_bytes()) for path in (tmp_path / "rec").iterdir())
    bodies = [base64.b64decode(r["body"]) for r in records if r.get("body")]
    for part in (b"Zq7", b"Xj8", b"Wv9"):
        assert part not in stored and not any(part in body for body in bodies), part


@pytest.mark.parametrize("nodelay", [False, True])
def test_tcp_nodelay_is_set_as_asked_on_both_sockets_of_a_connection(nodelay):
    """--tcp-nodelay: on by default (each read goes out at once); off, the kernel coalesces
    small writes both ways (Nagle), as the sockets of a plain relay do.  asyncio sets it on every
    TCP socket, so the tap sets it either way, on both sockets of a connection."""
    import asyncio

    from adapter.tap.proxy import Tap, TapSettings

    async def run() -> list[int]:
        accepted: list[asyncio.StreamWriter] = []
        upstream = await asyncio.start_server(lambda _, writer: accepted.append(writer), "127.0.0.1", 0)
        upstream_port = upstream.sockets[0].getsockname()[1]
        settings = TapSettings(
            listeners=[("127.0.0.1", 0)], upstream=("127.0.0.1", upstream_port), tcp_nodelay=nodelay
        )
        tap = Tap(settings, None)
        await tap.start()
        port = int(tap.addresses[0].rpartition(":")[2])
        _, client = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(500):  # until the tap has connected upstream (each turn lets it go on)
            if tap.links and next(iter(tap.links)).upstream is not None:
                break
            await asyncio.sleep(0.01)
        [link] = tap.links
        assert link.upstream is not None
        options = [
            transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            for transport in (link.client, link.upstream)
        ]
        await tap.stop()
        for writer in (client, *accepted):
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        upstream.close()
        await upstream.wait_closed()
        return options

    assert asyncio.run(run()) == [int(nodelay)] * 2


@pytest.mark.parametrize("microseconds", [0, 50])
def test_the_tap_polls_after_reads_while_it_runs_and_not_after(microseconds):
    """--busy-poll-microseconds (adapter/busy_poll.py): the tap's loop has a poller from start()
    to stop() (none with 0), and both sides of a connection touch it: a round trip through the
    tap crosses it twice.  The bytes go through unchanged either way."""
    import asyncio

    from adapter.busy_poll import NO_POLL, BusyPoller, poller_of
    from adapter.tap.proxy import Tap, TapSettings

    async def run() -> None:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while data := await reader.read(65536):
                writer.write(data)
            writer.close()

        upstream = await asyncio.start_server(echo, "127.0.0.1", 0)
        upstream_port = upstream.sockets[0].getsockname()[1]
        settings = TapSettings(
            listeners=[("127.0.0.1", 0)],
            upstream=("127.0.0.1", upstream_port),
            busy_poll_microseconds=microseconds,
        )
        tap = Tap(settings, None)
        await tap.start()
        loop = asyncio.get_running_loop()
        if microseconds:
            assert isinstance(poller_of(loop), BusyPoller) and tap.busy_poll is poller_of(loop)
        else:
            assert poller_of(loop) is NO_POLL and tap.busy_poll is NO_POLL
        port = int(tap.addresses[0].rpartition(":")[2])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for number in range(20):
            frame = f"SEND\ndestination:/queue/q\n\nbody {number}\0".encode()
            writer.write(frame)
            assert await asyncio.wait_for(reader.readexactly(len(frame)), 5) == frame
        writer.close()
        await tap.stop()
        assert poller_of(loop) is NO_POLL and tap.busy_poll is NO_POLL
        upstream.close()
        await upstream.wait_closed()

    asyncio.run(run())
