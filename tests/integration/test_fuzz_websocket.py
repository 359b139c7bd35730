"""Seeded fuzzing of the WebSocket framing of the web_stomp listener (issue #24), with the oracle
of tests/integration/test_fuzz_stomp.py: the adapter stays up, answers and closes every
connection in bounded time with well-formed server frames, logs no ERROR-level record or
traceback, and serves a healthy WebSocket client after every batch.

The cases are written by hand on raw sockets (a WebSocket library refuses to send them):
fragmentation (continuation frames, control frames between fragments), masking (an unmasked
client frame must be refused, RFC 6455 5.1), compression (deflate data that is not, RSV1 without
the extension, compressed control frames, small bombs), control frames (pings over 125 bytes,
Close with bad codes or reasons), invalid UTF-8 in text messages, and random mutations of all
of them.  Each family with a defined answer also checks its close code.

Reproducible: the seed is printed on failure (``WS_FUZZ_SEED`` repeats a run, ``WS_FUZZ_CASES``
runs more).  Bounded: a fixed number of cases, and short idle and login timeouts so that a case
that leaves a frame open ends in about two seconds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import struct
import time
import zlib
from collections.abc import Callable

from tests.integration.test_web_stomp import command, open_ws, recv, ws_adapter
from tests.support import unique

SEED = int(os.environ.get("WS_FUZZ_SEED", str(int(time.time()) % 100_000)))
CASES = int(os.environ.get("WS_FUZZ_CASES", "360"))
BATCH = 60  # connections at a time
ANSWER_WITHIN = 10.0  # seconds: every connection is answered and closed by then

_HANDSHAKE = (
    b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    b"Sec-WebSocket-Protocol: v12.stomp\r\n"
)
_DEFLATE_OFFER = b"Sec-WebSocket-Extensions: permessage-deflate\r\n"

TEXT, BINARY, CONTINUATION, CLOSE, PING, PONG = 0x1, 0x2, 0x0, 0x8, 0x9, 0xA


def frame(
    payload: bytes,
    opcode: int = TEXT,
    *,
    fin: bool = True,
    rsv: int = 0,
    mask: bytes | None = b"\x01\x02\x03\x04",
    length: int | None = None,
) -> bytes:
    """One client frame; ``mask=None`` leaves it unmasked, ``length`` lies about its size."""
    n = len(payload) if length is None else length
    first = (0x80 if fin else 0) | (rsv << 4) | opcode
    bit = 0x80 if mask is not None else 0
    if n < 126:
        header = bytes((first, bit | n))
    elif n < 65536:
        header = bytes((first, bit | 126)) + struct.pack("!H", n)
    else:
        header = bytes((first, bit | 127)) + struct.pack("!Q", n)
    if mask is None:
        return header + payload
    return header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


class Deflater:
    """The client side of permessage-deflate (context takeover, as browsers do)."""

    def __init__(self) -> None:
        self._c = zlib.compressobj(9, zlib.DEFLATED, -15)

    def message(self, data: bytes) -> bytes:
        out = self._c.compress(data) + self._c.flush(zlib.Z_SYNC_FLUSH)
        return out[:-4]


def stomp(command_: str, headers: list[tuple[str, str]], body: bytes = b"") -> bytes:
    return (command_ + "\n" + "".join(f"{k}:{v}\n" for k, v in headers) + "\n").encode() + body + b"\0"


class Case:
    """One connection: whether it offers permessage-deflate, what it sends, and the close code
    the adapter must answer with (None: any well-formed answer)."""

    def __init__(self, family: str, deflate: bool) -> None:
        self.family = family
        self.deflate = deflate
        self.frames: list[bytes] = []
        self.expect: int | None = None

    def data(self) -> bytes:
        return (_HANDSHAKE + (_DEFLATE_OFFER if self.deflate else b"") + b"\r\n") + b"".join(self.frames)

    def __repr__(self) -> str:
        return f"Case({self.family}, deflate={self.deflate}, frames={self.frames!r}, expect={self.expect})"


def conversation(vhost: str, topic: str) -> list[bytes]:
    """STOMP messages of a valid conversation (each one WebSocket message)."""
    return [
        stomp(
            "CONNECT", [("accept-version", "1.2"), ("host", vhost), ("login", "guest"), ("passcode", "guest")]
        ),
        stomp("SUBSCRIBE", [("destination", f"/topic/{topic}"), ("id", "s1")]),
        stomp("SEND", [("destination", f"/topic/{topic}"), ("receipt", "r1")], "héllo ünïcode".encode()),
        b"\n",
        stomp("DISCONNECT", [("receipt", "bye")]),
    ]


def _message_frames(rng: random.Random, message: bytes, deflater: Deflater | None) -> list[bytes]:
    """One message as one frame or several (continuation frames, pings and pongs between)."""
    payload = deflater.message(message) if deflater is not None else message
    rsv = 4 if deflater is not None else 0
    pieces = rng.randrange(1, 4) if len(payload) > 2 else 1
    cuts = sorted(rng.sample(range(1, len(payload)), pieces - 1)) if pieces > 1 else []
    parts = [payload[a:b] for a, b in zip([0, *cuts], [*cuts, len(payload)], strict=True)]
    out = []
    for i, part in enumerate(parts):
        out.append(
            frame(part, TEXT if i == 0 else CONTINUATION, fin=i == len(parts) - 1, rsv=rsv if i == 0 else 0)
        )
        if i < len(parts) - 1 and rng.random() < 0.5:
            out.append(frame(rng.randbytes(rng.randrange(0, 126)), rng.choice((PING, PONG))))
    return out


def valid_prefix(rng: random.Random, case: Case, messages: list[bytes]) -> None:
    deflater = Deflater() if case.deflate and rng.random() < 0.7 else None
    for message in messages[: rng.randrange(0, len(messages))]:
        case.frames += _message_frames(rng, message, deflater)


# families of one violation after a valid prefix, each with the close code RFC 6455 asks for
def _unmasked(rng: random.Random, case: Case) -> None:
    case.frames.append(frame(b"CONNECT\n\n\0", rng.choice((TEXT, BINARY, PING)), mask=None))
    case.expect = 1002


def _big_ping(rng: random.Random, case: Case) -> None:
    case.frames.append(frame(b"p" * rng.randrange(126, 300), rng.choice((PING, PONG))))
    case.expect = 1002


def _fragmented_control(rng: random.Random, case: Case) -> None:
    case.frames.append(frame(b"x", rng.choice((PING, PONG, CLOSE)), fin=False))
    case.expect = 1002


def _bad_close(rng: random.Random, case: Case) -> None:
    choice = rng.randrange(3)
    if choice == 0:  # a code no endpoint may send, or outside the defined ranges
        code = rng.choice((0, 999, 1004, 1005, 1006, 1015, 1016, 2999, 5000, 65535))
        case.frames.append(frame(struct.pack("!H", code) + b"bye", CLOSE))
        case.expect = 1002
    elif choice == 1:  # a reason that is not UTF-8
        case.frames.append(frame(struct.pack("!H", 1000) + b"\xff\xfe", CLOSE))
        case.expect = 1007
    else:  # a one-byte payload
        case.frames.append(frame(b"\x03", CLOSE))
        case.expect = 1002


def _invalid_utf8(rng: random.Random, case: Case) -> None:
    bad = rng.choice((b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf"))
    message = b"SEND\ndestination:/topic/x\n\n" + bad + b"\0"
    cut = rng.randrange(1, len(message))
    if rng.random() < 0.5:
        case.frames.append(frame(message))
    else:  # split over two frames
        case.frames += [frame(message[:cut], fin=False), frame(message[cut:], CONTINUATION)]
    case.expect = 1007


def _rsv_without_extension(rng: random.Random, case: Case) -> None:
    case.deflate = False
    case.frames = []
    case.frames.append(frame(b"CONNECT\n\n\0", rsv=rng.choice((1, 2, 4, 6))))
    case.expect = 1002


def _compressed_control(rng: random.Random, case: Case) -> None:
    case.deflate = True
    case.frames = []
    case.frames.append(frame(Deflater().message(b"ping"), rng.choice((PING, PONG)), rsv=4))
    case.expect = 1002


def _bad_deflate(rng: random.Random, case: Case) -> None:
    case.deflate = True
    case.frames = []
    garbage = rng.choice((b"\xff\xff\xff\xff", b"\x07" + rng.randbytes(20), b"\x03\x00\x00\x00\xff"))
    case.frames.append(frame(garbage, TEXT, rsv=4))
    case.expect = None  # 1007, or a message zlib happens to read: either way answered


def _small_bomb(rng: random.Random, case: Case) -> None:
    case.deflate = True
    case.frames = []
    size = rng.choice((70_000, 200_000, 1_000_000))
    payload = Deflater().message(rng.choice((b"\n", b"\r\n", b"x")) * size)
    case.frames.append(frame(payload, TEXT, rsv=4))
    case.expect = 1009  # over the pre-login bound (64 KiB + 4 KiB)


def _protocol_breaks(rng: random.Random, case: Case) -> None:
    choice = rng.randrange(5)
    if choice == 0:
        case.frames.append(frame(b"x", rng.choice((3, 4, 5, 6, 7, 0xB, 0xC, 0xF))))  # reserved opcode
    elif choice == 1:
        case.frames.append(frame(b"orphan", CONTINUATION))  # continuation of no message
    elif choice == 2:
        case.frames += [frame(b"SEND", fin=False), frame(b"new message", TEXT)]  # no continuation
    elif choice == 3:  # a 2-byte length for a short payload (RFC 6455 5.2: minimal encoding)
        case.frames.append(bytes((0x81, 0x80 | 126)) + struct.pack("!H", 5) + b"\0\0\0\0hello")
    else:  # 8-byte length with its top bit set
        case.frames.append(bytes((0x81, 0x80 | 127)) + struct.pack("!Q", 1 << 63) + b"\0\0\0\0")
    case.expect = 1002


_FAMILIES: list[Callable[[random.Random, Case], None]] = [
    _unmasked,
    _big_ping,
    _fragmented_control,
    _bad_close,
    _invalid_utf8,
    _rsv_without_extension,
    _compressed_control,
    _bad_deflate,
    _small_bomb,
    _protocol_breaks,
]


def _mutate(rng: random.Random, data: bytes) -> bytes:
    if not data:
        return data
    position = rng.randrange(len(data))
    choice = rng.randrange(4)
    if choice == 0:
        return data[:position] + bytes((data[position] ^ (1 << rng.randrange(8)),)) + data[position + 1 :]
    if choice == 1:
        return data[:position]
    if choice == 2:
        return data[:position] + rng.randbytes(rng.randrange(1, 8)) + data[position:]
    return data[:position] + data[position + 1 :]


def make_case(rng: random.Random, vhost: str, topic: str) -> Case:
    messages = conversation(vhost, topic)
    roll = rng.random()
    case = Case("valid", deflate=rng.random() < 0.5)
    valid_prefix(rng, case, messages)
    if roll < 0.6:
        family = rng.choice(_FAMILIES)
        case.family = family.__name__
        family(rng, case)
    elif roll < 0.9:  # random damage to a frame of a valid conversation
        case.family = "mutated"
        if case.frames:
            target = rng.randrange(len(case.frames))
            case.frames[target] = _mutate(rng, case.frames[target])
    if rng.random() < 0.5:  # most clients end with a Close of their own
        case.frames.append(frame(struct.pack("!H", 1000), CLOSE))
    return case


_ALLOWED_CLOSE = {1000, 1002, 1007, 1009, 1011}


def read_server_frames(data: bytes) -> tuple[list[tuple[int, bytes]], bool]:
    """The adapter's frames, and whether they are all whole and well-formed (final, unmasked, a
    known opcode, RSV1 only on data frames)."""
    frames: list[tuple[int, bytes]] = []
    while data:
        if len(data) < 2:
            return frames, False
        first, second = data[0], data[1]
        opcode, rsv = first & 0x0F, first & 0x70
        if not first & 0x80 or second & 0x80 or opcode not in (TEXT, BINARY, CLOSE, PONG):
            return frames, False
        if rsv and (rsv != 0x40 or opcode not in (TEXT, BINARY)):
            return frames, False
        n, offset = second & 0x7F, 2
        if n == 126:
            n, offset = struct.unpack("!H", data[2:4])[0], 4
        elif n == 127:
            n, offset = struct.unpack("!Q", data[2:10])[0], 10
        if len(data) < offset + n:
            return frames, False
        frames.append((opcode, data[offset : offset + n]))
        data = data[offset + n :]
    return frames, True


async def one_case(port: int, data: bytes) -> tuple[bool, bytes]:
    """Send ``data``; read until the adapter closes (answering its Close by closing)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    received = b""
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(ANSWER_WITHIN):
            while chunk := await reader.read(65536):
                received += chunk
                head_end = received.find(b"\r\n\r\n")
                frames, _ = read_server_frames(received[head_end + 4 :]) if head_end >= 0 else ([], False)
                if any(opcode == CLOSE for opcode, _ in frames):
                    break  # the adapter's Close: the client closes the socket, as browsers do
        return True, received
    except TimeoutError:
        return False, received
    except ConnectionError:
        return True, received
    finally:
        writer.close()


def check_answer(case: Case, answer: bytes) -> str | None:
    """None when the answer is right for the case, else what is wrong."""
    head, separator, rest = answer.partition(b"\r\n\r\n")
    if not separator or not head.startswith(b"HTTP/1.1 101"):
        return f"no WebSocket handshake: {answer[:200]!r}"
    frames, whole = read_server_frames(rest)
    if not whole:
        return f"malformed server frames: {rest[:200]!r}"
    closes = [payload for opcode, payload in frames if opcode == CLOSE]
    code = struct.unpack("!H", closes[0][:2])[0] if closes and len(closes[0]) >= 2 else None
    if code is not None and code not in _ALLOWED_CLOSE:
        return f"close code {code}"
    if case.expect is not None and code != case.expect:
        return f"close code {code}, expected {case.expect}"
    return None


def test_fuzzed_websocket_framing_never_hurts_the_adapter(start_adapter, broker, caplog):
    caplog.set_level(logging.WARNING)
    _adapter, port = ws_adapter(start_adapter, web_stomp_idle_timeout=2.0, login_timeout=2.0)
    vhost = broker.scratch_vhost("wsfuzz")
    topic = unique("wsfuzz")
    rng = random.Random(SEED)
    families: dict[str, int] = {}
    with open_ws(port, ping_interval=0.5) as healthy:  # its pings keep it from the idle timeout
        healthy.send(
            stomp("CONNECT", [("accept-version", "1.2"), ("login", "guest"), ("passcode", "guest")]).decode()
        )
        assert command(recv(healthy)) == "CONNECTED"
        check = unique("wsfuzz-check")
        healthy.send(f"SUBSCRIBE\nid:h\ndestination:/topic/{check}\nreceipt:sub\n\n\0")
        assert command(recv(healthy)) == "RECEIPT"
        for batch_start in range(0, CASES, BATCH):
            cases = [make_case(rng, vhost, topic) for _ in range(min(BATCH, CASES - batch_start))]

            async def batch(cases: list[Case] = cases) -> list[tuple[bool, bytes]]:
                return await asyncio.gather(*(one_case(port, case.data()) for case in cases))

            results = asyncio.run(batch())
            for case, (closed, answer) in zip(cases, results, strict=True):
                families[case.family] = families.get(case.family, 0) + 1
                assert closed, f"seed {SEED}: not answered and closed within {ANSWER_WITHIN} s: {case!r}"
                wrong = check_answer(case, answer)
                assert wrong is None, f"seed {SEED}: {wrong} for {case!r}"
            # the server keeps serving everyone else: a round trip through the broker
            healthy.send(f"SEND\ndestination:/topic/{check}\n\nafter {batch_start}\0")
            message = recv(healthy)
            assert command(message) == "MESSAGE" and message.endswith(f"after {batch_start}\0\n"), (
                f"seed {SEED}"
            )
            bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
            assert not bad, f"seed {SEED}: {[r.getMessage() for r in bad][:3]}"
    # every family was drawn (the count is fixed and the draw is uniform)
    assert len(families) == len(_FAMILIES) + 2, families


def test_case_generator_is_deterministic():
    first = [make_case(random.Random(7), "/", "t").data() for _ in range(5)]
    again = [make_case(random.Random(7), "/", "t").data() for _ in range(5)]
    assert first == again
