"""The tap's recorder (adapter/tap/recorder.py): bytes in, the records of docs/recording-format.md
out, without sockets."""

from __future__ import annotations

import base64
import json
import random

from adapter.stomp.codec import FrameLimits
from adapter.tap.recorder import Batches, ConnectionRecorder, DirectionRecorder, ParseBudget, headers_json
from tests.support import peak_allocated

CONNECT = b"CONNECT\naccept-version:1.2\nlogin:app\npasscode:s3cret\nclient-id:legacy-7\n\n\0"
SEND = b"SEND\ndestination:/queue/a\ncontent-length:5\n\nhello\0\n"
SUBSCRIBE_ESCAPED = b"SUBSCRIBE\r\nid:1\r\ndestination:/topic/a\\cb\r\nselector:x = 'a\\nb'\r\nid:2\r\n\r\n\0"
STREAM = CONNECT + SEND + b"\n\n" + SUBSCRIBE_ESCAPED + b"\r\n" + SEND


class Sink:
    """What the writer gets: per read, one connection's records as JSON Lines text."""

    def __init__(self) -> None:
        self.records: list[dict] = []

    def __call__(self, conn: str, lines: str, count: int) -> None:
        assert lines.isascii() and lines.endswith("\n") and lines.count("\n") == count
        records = [json.loads(line) for line in lines.splitlines()]
        assert {record["conn"] for record in records} == {conn}
        self.records.extend(records)

    def kinds(self) -> list[str]:
        return [r["kind"] for r in self.records]

    def frames(self) -> list[dict]:
        return [r for r in self.records if r["kind"] == "frame"]


def batches() -> Batches:
    return Batches(lambda: None, limit=1 << 30, direction_limit=1 << 30)


def direction(sink: Sink, *, bodies: bool = False, limits: FrameLimits | None = None, budget=None):
    recorder = DirectionRecorder(
        "c-1",
        "10.0.0.5:51234",
        "in",
        sink,
        bodies=bodies,
        limits=limits or FrameLimits(),
        budget=budget or ParseBudget(1 << 30),
        batches=batches(),
    )
    return Feeding(recorder)


class Feeding:
    """A recorder fed one read at a time, each flushed at once (as a flush of one read)."""

    def __init__(self, recorder: DirectionRecorder) -> None:
        self.recorder = recorder

    def feed(self, data: bytes, seconds: float) -> None:
        self.recorder.feed(data, int(seconds * 1e9))
        self.recorder.flush()

    def finish(self, seconds: float) -> None:
        self.recorder.finish(seconds)

    def __getattr__(self, name: str):
        return getattr(self.recorder, name)


def without_time(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "ts"} for r in records]


def test_a_whole_buffer_gives_every_frame_with_its_wire_headers():
    sink = Sink()
    recorder = direction(sink)
    recorder.feed(STREAM, 100.0)
    frames = sink.frames()
    assert [f["command"] for f in frames] == ["CONNECT", "SEND", "SUBSCRIBE", "SEND"]
    assert frames[0] == {
        "v": 1,
        "ts": 100.0,
        "conn": "c-1",
        "kind": "frame",
        "client": "10.0.0.5:51234",
        "dir": "in",
        "command": "CONNECT",
        "headers": [
            ["accept-version", "1.2"],
            ["login", "app"],
            ["passcode", "***"],
            ["client-id", "legacy-7"],
        ],
        "body_len": 0,
    }
    # escapes as they were, CR LF line ends not part of values, the repeated id kept in order
    assert frames[2]["headers"] == [
        ["id", "1"],
        ["destination", "/topic/a\\cb"],
        ["selector", "x = 'a\\nb'"],
        ["id", "2"],
    ]
    assert frames[1]["body_len"] == 5 and "body" not in frames[1]
    assert recorder.frames == 4


def test_byte_at_a_time_gives_the_same_records():
    whole, trickle = Sink(), Sink()
    all_at_once = direction(whole)
    all_at_once.feed(STREAM, 1.0)
    all_at_once.finish(2.0)
    one = direction(trickle)
    for i in range(len(STREAM)):
        one.feed(STREAM[i : i + 1], 1.0)
    one.finish(2.0)
    assert without_time(trickle.frames()) == without_time(whole.frames())

    def beats(sink: Sink) -> int:  # how they are grouped into records depends on the reads
        return sum(r["count"] for r in sink.records if r["kind"] == "heartbeats")

    # the two LFs after SEND's own; the LF ending SEND and the CR LF ending SUBSCRIBE end frames
    assert beats(trickle) == beats(whole) == 2


def test_the_passcode_is_never_recorded_and_bodies_only_when_asked():
    sink = Sink()
    recorder = direction(sink, bodies=True)
    recorder.feed(CONNECT + SEND, 1.0)
    recorder.finish(2.0)
    text = json.dumps(sink.records)
    assert "s3cret" not in text
    connect, send = sink.frames()
    assert ["passcode", "***"] in connect["headers"]
    assert base64.b64decode(send["body"]) == b"hello"
    repeated = Sink()
    direction(repeated).feed(b"STOMP\npasscode:x\npasscode:y\n\n\0", 1.0)
    assert repeated.frames()[0]["headers"] == [["passcode", "***"], ["passcode", "***"]]


def test_bytes_that_are_not_utf8_survive_as_escapes():
    sink = Sink()
    direction(sink).feed(b"SEND\ndestination:/queue/\xff\xfe\n\n\0", 1.0)
    (frame,) = sink.frames()
    line = json.dumps(frame)
    assert line.isascii() and "\\udcff\\udcfe" in line
    assert frame["headers"][0][1].encode("utf-8", "surrogateescape") == b"/queue/\xff\xfe"


def test_an_incomplete_frame_at_the_close_is_recorded_as_unparsed():
    sink = Sink()
    recorder = direction(sink)
    recorder.feed(SEND + b"SEND\ndestination:/queue/a\ncontent-le", 1.0)
    assert [f["command"] for f in sink.frames()] == ["SEND"]
    recorder.finish(2.0)
    last = sink.records[-1]
    assert last["command"] is None and "middle of a frame (36 bytes" in last["error"]


def test_only_heartbeats_after_the_last_frame_are_no_frame():
    sink = Sink()
    recorder = direction(sink)
    recorder.feed(SEND + b"\n\n", 1.0)
    recorder.finish(1.5)
    assert sink.kinds() == ["frame", "heartbeats"]
    assert sink.records[-1]["count"] == 2  # the frame's own trailing LF is not a heart-beat


def test_a_parse_failure_stops_that_direction_once_and_for_all():
    sink = Sink()
    recorder = direction(sink, limits=FrameLimits(max_frame_size=64))
    recorder.feed(SEND + b"SEND\ndestination:/queue/a\n\n" + b"x" * 100 + b"\0" + SEND, 1.0)
    recorder.feed(SEND * 3, 2.0)
    recorder.finish(3.0)
    frames = sink.frames()
    assert [f["command"] for f in frames] == ["SEND", None]
    assert "Frame too big" in frames[1]["error"] and frames[1]["dir"] == "in"
    assert recorder.stopped


def test_heartbeats_are_aggregated_to_one_record_per_second():
    sink = Sink()
    recorder = direction(sink)
    recorder.feed(CONNECT + b"\n", 0.0)  # that LF ends the frame: not a heart-beat
    # 50 heart-beats within the first second, then 30 within the next, LF and CR LF alike
    for i in range(50):
        recorder.feed(b"\n" if i % 2 else b"\r\n", 0.1 + i * 0.01)
    for i in range(30):
        recorder.feed(b"\n", 1.2 + i * 0.01)
    recorder.finish(2.0)
    beats = [r for r in sink.records if r["kind"] == "heartbeats"]
    assert sum(r["count"] for r in beats) == 80
    seconds = [r["ts"] for r in beats[:-1]]  # the last one is the remainder, at the close
    assert all(b - a >= 1.0 for a, b in zip(seconds, seconds[1:], strict=False))
    assert len(beats) <= 3


def test_the_process_wide_parse_budget_stops_the_direction_that_exceeds_it():
    budget = ParseBudget(1000)
    sink = Sink()
    one, two = direction(sink, budget=budget), direction(sink, budget=budget, bodies=True)
    one.feed(b"SEND\ndestination:/q\nx-pad:" + b"x" * 300, 1.0)  # an incomplete head: held
    assert budget.held > 0 and not one.stopped
    two.feed(b"SEND\ndestination:/q\n\n" + b"y" * 700, 1.0)  # a body being recorded: held
    assert two.stopped and not one.stopped
    assert "parse-buffer-bytes" in sink.records[-1]["error"]
    one.feed(b"\n\n\0", 1.0)
    assert budget.held == 0  # the complete frame let go of its bytes, the stopped side of its own


def test_a_body_in_flight_is_counted_not_held_unless_bodies_are_recorded():
    budget = ParseBudget(1000)
    sink = Sink()
    plain = direction(sink, budget=budget)
    plain.feed(b"SEND\ndestination:/q\n\n" + b"x" * 5000, 1.0)  # no content-length: up to the NUL
    plain.feed(b"x" * 5000, 1.0)
    plain.feed(b"x" * 5000 + b"\0\nSEND\ncontent-length:4000\n\n" + b"y" * 2000, 1.0)
    assert budget.held == 0 and not plain.stopped
    plain.feed(b"y" * 2000 + b"\0", 1.0)
    assert [(f["command"], f["body_len"]) for f in sink.frames()] == [("SEND", 15000), ("SEND", 4000)]
    recorded = Sink()
    bodies = direction(recorded, bodies=True)
    frame = b"SEND\ncontent-length:7\n\nab\0cdef\0"
    for i in range(len(frame)):
        bodies.feed(frame[i : i + 1], 1.0)
    assert base64.b64decode(recorded.frames()[0]["body"]) == b"ab\0cdef"


def test_a_connection_records_open_both_directions_and_close():
    sink = Sink()
    conn = ConnectionRecorder(
        "abc-1",
        client="10.0.0.5:51234",
        listen="0.0.0.0:61613",
        upstream="broker:61613",
        tls=False,
        emit=sink,
        bodies=False,
        limits=FrameLimits(),
        budget=ParseBudget(1 << 20),
        batches=batches(),
        now=1.0,
    )
    conn.inbound.feed(CONNECT, 1_100_000_000)
    conn.outbound.feed(b"CONNECTED\nversion:1.2\n\n\0\n", 1_200_000_000)
    conn.close(2.0, by="client", reason="eof", bytes_in=len(CONNECT), bytes_out=24)
    conn.close(3.0, by="tap", reason="again", bytes_in=0, bytes_out=0)  # once only
    assert sink.kinds() == ["open", "frame", "frame", "close"]
    assert without_time([sink.records[0], sink.records[-1]]) == [
        {
            "v": 1,
            "conn": "abc-1",
            "kind": "open",
            "client": "10.0.0.5:51234",
            "listen": "0.0.0.0:61613",
            "upstream": "broker:61613",
            "tls": False,
        },
        {
            "v": 1,
            "conn": "abc-1",
            "kind": "close",
            "by": "client",
            "reason": "eof",
            "bytes_in": len(CONNECT),
            "bytes_out": 24,
        },
    ]
    assert [r["dir"] for r in sink.frames()] == ["in", "out"]


def test_headers_json_is_what_the_json_encoder_gives_fast_path_or_not():
    rng = random.Random(7)
    alphabet = ["a", "b", ":", " ", '"', "\\", "\u00e9", "\udcff", "\x7f", "\t", "~", "passcode"]
    for _ in range(500):
        lines = []
        for _ in range(rng.randrange(1, 6)):
            name = rng.choice(["destination", "id", "passcode", "x" + rng.choice(alphabet)])
            lines.append(name + ":" + "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 6))))
        pairs = [[n, "***" if n == "passcode" else v] for n, v in (line.split(":", 1) for line in lines)]
        assert headers_json(lines) == json.dumps(pairs, separators=(",", ":"))
    assert headers_json([]) == "[]"


def test_a_malformed_connect_does_not_put_its_passcode_in_the_error_record():
    """The scanner's error quotes the header line it could not read; a passcode line is
    recorded as ``passcode:***`` there too (found by the #24 review)."""
    sink = Sink()
    recorder = direction(sink)
    recorder.feed(b"CONNECT\nlogin:guest\npasscode:hunter2\rX\n\n\0", 1.0)
    recorder.finish(2.0)
    [frame] = sink.frames()
    assert frame["command"] is None and frame["error"]
    assert "hunter2" not in json.dumps(sink.records)


def test_reads_recorded_together_give_the_records_of_reads_recorded_one_by_one():
    """A flush scans every read kept since the last one: same frames, each with the time of the
    read that completed it."""
    one_by_one, together = Sink(), Sink()
    single = direction(one_by_one)
    batched = direction(together).recorder
    reads = [STREAM[i : i + 7] for i in range(0, len(STREAM), 7)]
    for index, read in enumerate(reads):
        single.feed(read, 1795650000 + index)
        batched.feed(read, (1795650000 + index) * 1_000_000_000)
    assert together.records == []  # kept until the flush
    batched.flush()
    single.finish(1795660000.0)
    batched.finish(1795660000.0)
    assert one_by_one.frames() == together.frames()
    assert [f["ts"] for f in together.frames()] == sorted({f["ts"] for f in together.frames()})


def test_a_flush_is_forced_per_direction_and_process_wide():
    sink = Sink()
    woken = []
    shared = Batches(lambda: woken.append(1), limit=100, direction_limit=60)
    recorders = [
        DirectionRecorder(
            f"c-{n}",
            "10.0.0.5:1",
            "in",
            sink,
            bodies=False,
            limits=FrameLimits(),
            budget=ParseBudget(1 << 20),
            batches=shared,
        )
        for n in range(3)
    ]
    recorders[0].feed(SEND, 1_000_000_000)
    assert woken == [1] and sink.records == [] and shared.held == len(SEND)
    recorders[0].feed(SEND * 2, 1_000_000_001)  # past its own bound: recorded at once
    assert len(sink.frames()) == 3 and shared.held == 0
    recorders[1].feed(SEND, 1_000_000_002)
    assert len(sink.frames()) == 3 and shared.held == len(SEND)
    recorders[2].feed(SEND, 1_000_000_003)  # all of them past the process-wide bound
    assert len(sink.frames()) == 5 and shared.held == 0
    recorders[2].feed(b"\n" * 30, 1_000_000_004)
    assert shared.held == 30
    shared.flush()  # what the tap's timer does
    assert shared.held == 0 and sink.records[-1]["kind"] == "heartbeats"


def hostile_connect(size: int, filler: bytes = b"\x01") -> bytes:
    """A CONNECT whose header lines are ``size`` bytes of control characters (each one six
    characters of JSON), in lines the tap's limits accept."""
    line = b"x:" + filler * 4000 + b"\n"
    return b"CONNECT\naccept-version:1.2\nlogin:app\npasscode:s3cret\n" + line * (size // len(line)) + b"\n\0"


def test_a_head_too_big_to_record_is_never_made_into_json():
    """Issue 33 item 5: the JSON of a frame head was made before its size was looked at, and a
    control character is six characters of JSON, so one large CONNECT cost the tap about 16x
    its size.  Now a record that could pass ``max_record_bytes`` is not made: its frame is
    recorded with its command, no headers and ``omitted``; what the recorder allocates while it
    scans and records the frame stays within a small multiple of the frame (tracemalloc's peak:
    allocations, not time)."""
    head = hostile_connect(4 * 1024 * 1024)
    sink = Sink()
    recorder = DirectionRecorder(
        "c-1",
        "10.0.0.5:51234",
        "in",
        sink,
        bodies=False,
        limits=FrameLimits(64 * 1024 * 1024, 10_000, 1024 * 1024),
        budget=ParseBudget(256 * 1024 * 1024),
        batches=Batches(lambda: None, limit=32 * 1024 * 1024, direction_limit=256 * 1024),
        max_record_bytes=1024 * 1024,
    )
    reads = [head[i : i + 65536] for i in range(0, len(head), 65536)]

    def record() -> None:
        for n, read in enumerate(reads):
            recorder.feed(read, 1_795_650_000_000_000_000 + n)
        recorder.flush()

    peak, _ = peak_allocated(record)
    [frame] = sink.frames()
    assert frame["command"] == "CONNECT" and frame["headers"] == [] and frame["omitted"] == ["headers"]
    assert frame["body_len"] == 0
    assert len(json.dumps(frame)) < 1024
    assert peak < 3 * len(head), f"peak {peak} bytes for a frame of {len(head)}"


def test_head_json_bound_is_never_below_the_json_made():
    """The bound decides which records are not made: it must hold for every head, whatever its
    bytes (control characters, quotes, UTF-8, bytes that are not UTF-8, CR LF line ends, empty
    passcodes redacted to ``***``, ERROR texts redacted)."""
    from adapter.stomp.scanner import OTHER
    from adapter.tap.recorder import head_json_bound, heads_json

    rng = random.Random(5)
    pieces = [
        b"a",
        b":",
        b"\x01",
        b'"',
        b"\\",
        b"\xff",
        "é".encode(),
        "😀".encode(),
        b"\t",
        b"\x7f",
        b"passcode:",
    ]
    for _ in range(3000):
        command = rng.choice([b"SEND", b"CONNECT", b"ERROR", b"X\x01\xff"])
        lines = [command]
        for _ in range(rng.randrange(0, 6)):
            name = rng.choice([b"passcode", b"message", b"x", b""])
            value = b"".join(rng.choice(pieces) for _ in range(rng.randrange(0, 8)))
            lines.append(name + b":" + value)
        head = (b"\r\n" if rng.random() < 0.2 else b"\n").join(lines)
        [made] = heads_json([head], OTHER)
        assert len(made) <= head_json_bound(head), head


def record_bounded(max_record_bytes: int, *, bodies: bool = False) -> tuple[Sink, DirectionRecorder]:
    sink = Sink()
    recorder = DirectionRecorder(
        "c-1",
        "10.0.0.5:51234",
        "in",
        sink,
        bodies=bodies,
        limits=FrameLimits(64 * 1024 * 1024, 10_000, 1024 * 1024),
        budget=ParseBudget(1 << 30),
        batches=batches(),
        max_record_bytes=max_record_bytes,
    )
    return sink, recorder


def test_a_body_too_big_for_its_record_is_left_out_and_the_headers_kept():
    sink, recorder = record_bounded(64 * 1024, bodies=True)
    small = b"SEND\ndestination:/queue/a\ncontent-length:5\n\nhello\0"
    big = b"SEND\ndestination:/queue/a\ncontent-length:60000\n\n" + b"b" * 60_000 + b"\0"
    recorder.feed(small + big + small, 1_795_650_000_000_000_000)
    recorder.flush()
    first, second, third = sink.frames()
    assert first["body"] == third["body"] == base64.b64encode(b"hello").decode() and "omitted" not in first
    assert second["omitted"] == ["body"] and "body" not in second and second["body_len"] == 60_000
    assert second["headers"] == [["destination", "/queue/a"], ["content-length", "60000"]]
    assert all(len(json.dumps(frame)) <= 64 * 1024 for frame in sink.frames())


def test_a_command_line_too_long_for_its_record_is_cut():
    sink, recorder = record_bounded(64 * 1024)
    recorder.feed(b"\x02" * 200_000 + b"\nx:1\n\n\0", 1_795_650_000_000_000_000)
    recorder.flush()
    [frame] = sink.frames()
    assert frame["omitted"] == ["command", "headers"] and frame["command"] == "\x02" * 1024
    assert frame["headers"] == []


SECRET = b"Zq7'Xj8\"Wv9"  # a passcode with both quotes: each part must stay out of a recording


def leaks(records: list[dict]) -> list[str]:
    """The parts of ``SECRET`` found in the records (their JSON, and their bodies decoded)."""
    texts = [json.dumps(records)]
    texts += [base64.b64decode(r["body"]).decode("latin-1") for r in records if r.get("body")]
    return [part for part in ("Zq7", "Xj8", "Wv9") if any(part in text for text in texts)]


def test_a_passcode_line_the_scanner_refuses_never_reaches_the_error_record_whatever_it_holds():
    """Issue 33 item 6: the error record quotes the line the scanner refused, and its passcode
    was redacted only up to the first quote.  Now nothing after the word passcode is kept, with
    a bare CR, quotes, no ':' at all, or another case."""
    for line in (
        b"passcode:" + SECRET + b"\rX",
        b"passcode:\r" + SECRET,
        b"login:guest\rpasscode:" + SECRET,
        b"passcode " + SECRET,
        b"PASSCODE " + SECRET,
    ):
        sink = Sink()
        recorder = direction(sink)
        recorder.feed(b"CONNECT\naccept-version:1.2\nlogin:guest\n" + line + b"\n\n\0", 1.0)
        recorder.finish(2.0)
        [frame] = sink.frames()
        assert frame["command"] is None and "passcode" in frame["error"].lower(), frame
        assert leaks(sink.records) == [], (line, frame["error"])


def test_an_upstream_error_that_quotes_a_passcode_line_is_redacted_in_its_headers_and_body():
    """The upstream's ERROR may quote the CONNECT's passcode line (the adapter did, in its body,
    and a header may too): with --record-bodies the body was recorded as it came.  In an ERROR,
    whatever follows the word passcode is redacted, in every header and in the body; other
    frames' bodies are the application's and stay as they are."""
    detail = b"CR not followed by LF in header line b'passcode:Zq7\\'Xj8\"Wv9\\rX'\nbye"
    error = (
        b"ERROR\nmessage:Bad header passcode:"
        + SECRET
        + b"\\r\nx-passcode-echo:"
        + SECRET
        + b"\ncontent-type:text/plain\ncontent-length:%d\n\n" % len(detail)
        + detail
        + b"\0\n"
    )
    message = b"MESSAGE\ndestination:/queue/a\nmessage-id:1\nsubscription:0\n\npasscode:kept\0\n"
    sink = Sink()
    recorder = DirectionRecorder(
        "c-1",
        "10.0.0.5:51234",
        "out",
        sink,
        bodies=True,
        limits=FrameLimits(),
        budget=ParseBudget(1 << 30),
        batches=batches(),
    )
    recorder.feed(message + error, 1_795_650_000_000_000_000)
    recorder.flush()
    kept, redacted = sink.frames()
    assert base64.b64decode(kept["body"]) == b"passcode:kept"
    assert redacted["command"] == "ERROR" and redacted["body_len"] == len(detail)
    assert redacted["headers"][0] == ["message", "Bad header passcode:***"]
    assert redacted["headers"][1] == ["x-passcode", "***"]
    assert base64.b64decode(redacted["body"]) == b"CR not followed by LF in header line b'passcode:***"
    assert leaks(sink.records) == []
