"""Seeded mutational fuzzing of the STOMP side: thousands of broken frames of every command and
version, and the adapter stays up, answers each connection (a frame or a close, never a hang),
logs no ERROR-level record or traceback, and serves a healthy client after every batch.  The
``activemq`` profile gets its own corpus: selectors on topics and queues, composite
destinations, client ids and durable subscriptions, prefetch headers, temporary destinations
and transactions, with small byte budgets so that their limits are crossed too.

Reproducible: the seed is printed on failure (``STOMP_FUZZ_SEED`` repeats a run, and
``STOMP_FUZZ_CASES`` runs more).  The adapter under test has small limits, so that inputs at and
over every limit are cheap to produce, and a short ``frame_timeout``, so that a frame whose
content-length promises more than was sent ends in bounded time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time

import pytest

from tests.support import unique

SEED = int(os.environ.get("STOMP_FUZZ_SEED", str(int(time.time()) % 100_000)))
CASES = int(os.environ.get("STOMP_FUZZ_CASES", "2000"))
ACTIVEMQ_CASES = CASES // 2  # the activemq profile's share (its conversations are longer)
BATCH = 100  # connections at a time
ANSWER_WITHIN = 10.0  # seconds: every connection is answered and closed by then

LIMITS = {"max_frame_size": 8192, "max_headers": 10, "max_header_length": 256}


def _frame(command: str, headers: list[tuple[str, str]], body: bytes = b"") -> bytes:
    head = command + "\n" + "".join(f"{k}:{v}\n" for k, v in headers) + "\n"
    return head.encode() + body + b"\0"


def corpus(queue: str, vhost: str = "/") -> list[tuple[bytes, list[bytes]]]:
    """(CONNECT frame, frames after it) pairs: valid conversations to mutate."""
    conversations = []
    for version in ("1.0", "1.1", "1.2"):
        for command in ("CONNECT", "STOMP"):
            connect = _frame(
                command,
                [("accept-version", version), ("host", vhost), ("login", "guest"), ("passcode", "guest")]
                + ([("heart-beat", "0,0")] if version != "1.0" else []),
            )
            frames = [
                _frame("SEND", [("destination", f"/queue/{queue}"), ("receipt", "r1")], b"hello"),
                _frame(
                    "SEND",
                    [("destination", f"/topic/{queue}"), ("content-length", "5"), ("x-h", "v\\cw")],
                    b"a\0b\0c",
                ),
                _frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "s1"), ("ack", "client")]),
                _frame("ACK", [("id" if version == "1.2" else "message-id", "T_s1@@x@@1")]),
                _frame("NACK", [("id", "T_s1@@x@@1"), ("requeue", "false")]),
                _frame("UNSUBSCRIBE", [("id", "s1"), ("receipt", "u")]),
                _frame("BEGIN", [("transaction", "tx")]),
                _frame("SEND", [("destination", f"/queue/{queue}"), ("transaction", "tx")], b"in tx"),
                _frame("COMMIT", [("transaction", "tx"), ("receipt", "c")]),
                _frame("BEGIN", [("transaction", "ty")]),
                _frame("ABORT", [("transaction", "ty")]),
                _frame(
                    "SEND", [("destination", "/exchange/amq.direct/k"), ("reply-to", "/temp-queue/r")], b"q"
                ),
            ]
            conversations.append((connect, frames))
    return conversations


def activemq_corpus(queue: str, vhost: str = "/") -> list[tuple[bytes, list[bytes]]]:
    """Conversations of ActiveMQ applications (docs/migration-activemq.md) to mutate.  Many
    client ids, so that few of the concurrent connections of a batch are refused as the second
    holder of one (some are).  Some elements are several frames, so that a transaction, or a
    backlog and its client-ack subscriber, cross the fuzzed adapter's byte budgets unmutated."""
    conversations = []
    big = b"z" * 2500  # two of these are over the fuzzed adapter's per-connection budgets
    for version in ("1.0", "1.1", "1.2"):
        ack = "id" if version == "1.2" else "message-id"
        for client in [None] * 10 + [f"c{n}" for n in range(30)]:
            connect = _frame(
                "CONNECT",
                [("accept-version", version), ("host", vhost), ("login", "guest"), ("passcode", "guest")]
                + ([("client-id", f"{queue}-{client}")] if client else []),
            )
            frames = [
                _frame(
                    "SEND",
                    [
                        ("destination", f"/queue/{queue}"),
                        ("persistent", "true"),
                        ("color", "red"),
                        ("n", "5"),
                        ("priority", "7"),
                        ("receipt", "r1"),
                    ],
                    b"hello",
                ),
                _frame(
                    "SEND",
                    [
                        ("destination", f"/queue/{queue},/topic/{queue}.a"),
                        ("expires", "1"),
                        ("receipt", "r2"),
                    ],
                    b"both",
                ),
                _frame("SEND", [("destination", f"/topic/{queue}.a.b"), ("JMSType", "t")], b"t" * 300),
                _frame(
                    "SUBSCRIBE",
                    [
                        ("destination", f"/queue/{queue}"),
                        ("id", "s1"),
                        ("ack", "client"),
                        ("selector", "color = 'red' AND n > 3 OR JMSPriority BETWEEN 5 AND 9"),
                        ("activemq.prefetchSize", "2"),
                        ("receipt", "sub"),
                    ],
                ),
                _frame(
                    "SUBSCRIBE",
                    [
                        ("destination", f"/topic/{queue}.>"),
                        ("id", "s2"),
                        ("selector", "n IN ('1', '5') AND color LIKE 'r%' ESCAPE '!'"),
                    ],
                ),
                _frame(
                    "SUBSCRIBE",
                    [
                        ("destination", f"/topic/{queue}.*"),
                        ("id", "s3"),
                        ("ack", "client-individual"),
                        ("activemq.subscriptionName", "d1"),
                        ("prefetch-count", "5"),
                    ],
                ),
                _frame("SUBSCRIBE", [("destination", f"/queue/{queue}"), ("id", "s4"), ("ack", "client")]),
                _frame("SUBSCRIBE", [("destination", "/temp-queue/t"), ("id", "s5")]),
                _frame("ACK", [(ack, "T_s1@@x@@1")]),
                _frame("NACK", [(ack, "T_s4@@x@@1"), ("receipt", "n")]),
                _frame("UNSUBSCRIBE", [("id", "s3"), ("activemq.subscriptionName", "d1"), ("receipt", "u")]),
                _frame("BEGIN", [("transaction", "tx")]),
                _frame("SEND", [("destination", f"/queue/{queue}"), ("transaction", "tx")], b"x" * 3000),
                _frame(
                    "SEND", [("destination", f"/queue/{queue},/topic/{queue}.t"), ("transaction", "tx")], b"y"
                ),
                _frame("ACK", [(ack, "T_s4@@x@@2"), ("transaction", "tx")]),
                _frame("COMMIT", [("transaction", "tx"), ("receipt", "c")]),
                _frame("ABORT", [("transaction", "tx")]),
                _frame("SEND", [("destination", f"/queue/{queue}"), ("reply-to", "/temp-topic/r")], b"q"),
                _frame("BEGIN", [("transaction", "big")])
                + _frame("SEND", [("destination", f"/topic/{queue}.b"), ("transaction", "big")], big)
                + _frame("SEND", [("destination", f"/queue/{queue}"), ("transaction", "big")], big)
                + _frame("COMMIT", [("transaction", "big"), ("receipt", "cb")]),
                _frame("SEND", [("destination", f"/queue/{queue}.b"), ("persistent", "true")], big)
                + _frame("SEND", [("destination", f"/queue/{queue}.b"), ("receipt", "rb")], big)
                + _frame(
                    "SUBSCRIBE", [("destination", f"/queue/{queue}.b"), ("id", "s6"), ("ack", "client")]
                ),
            ]
            conversations.append((connect, frames))
    return conversations


_INTERESTING = [b"\0", b"\r", b"\n", b":", b"\\", b"\xff", b"\xed\xa0\x80", b"\xc3", b"\r\n", b"\n\n"]


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One random mutation of ``data``."""
    choice = rng.randrange(9)
    if not data:
        return rng.choice(_INTERESTING)
    position = rng.randrange(len(data))
    if choice == 0:  # bit flip
        flipped = data[position] ^ (1 << rng.randrange(8))
        return data[:position] + bytes((flipped,)) + data[position + 1 :]
    if choice == 1:  # truncation
        return data[:position]
    if choice == 2:  # an interesting byte sequence inserted
        return data[:position] + rng.choice(_INTERESTING) + data[position:]
    if choice == 3:  # a byte deleted
        return data[:position] + data[position + 1 :]
    if choice == 4:  # many headers, around and over max_headers
        lines = b"".join(b"h%d:v\n" % i for i in range(rng.randrange(5, 30)))
        newline = data.find(b"\n")
        return data[: newline + 1] + lines + data[newline + 1 :] if newline >= 0 else data + lines
    if choice == 5:  # a header line around max_header_length
        length = LIMITS["max_header_length"] + rng.randrange(-3, 4)
        newline = data.find(b"\n")
        line = b"long:" + b"x" * max(0, length - 5) + b"\n"
        return data[: newline + 1] + line + data[newline + 1 :] if newline >= 0 else data + line
    if choice == 6:  # a content-length that lies
        newline = data.find(b"\n")
        lie = b"content-length:%d\n" % rng.choice([0, 1, 3, 4, 5, 6, 100, 8191, 8192, 10**6, -1])
        return data[: newline + 1] + lie + data[newline + 1 :] if newline >= 0 else data
    if choice == 7:  # a body around max_frame_size
        size = LIMITS["max_frame_size"] + rng.randrange(-40, 40)
        return data.rstrip(b"\0") + b"b" * max(0, size - len(data)) + b"\0"
    # random bytes spliced in
    return data[:position] + rng.randbytes(rng.randrange(1, 16)) + data[position:]


def make_case(rng: random.Random, conversations: list[tuple[bytes, list[bytes]]]) -> bytes:
    connect, frames = rng.choice(conversations)
    chosen = [rng.choice(frames) for _ in range(rng.randrange(1, 4))]
    if rng.random() < 0.2:  # break the CONNECT itself
        connect = mutate(rng, connect)
    else:
        target = rng.randrange(len(chosen))
        for _ in range(rng.randrange(1, 4)):
            chosen[target] = mutate(rng, chosen[target])
    # a final NUL and DISCONNECT end any frame left open, so most cases answer at once.  Four
    # of them: a lying content-length of at most 100 (the largest a mutation gives that fits
    # max_frame_size) can make a frame's body take in some, never all four (to end on the last
    # NUL, a body would hold the rest of them: more than 100 bytes), so no case becomes a valid
    # session that never disconnects (seed 66628: a CONNECT with content-length:100 whose body
    # was the rest of the case, answered CONNECTED and left open, rightly)
    return connect + b"".join(chosen) + _TAIL * _TAILS


_TAIL = b"\0\0\nDISCONNECT\nreceipt:end\n\n\0"
_TAILS = 4
assert len(_TAIL) * _TAILS - 1 > 100


async def one_case(port: int, data: bytes) -> tuple[bool, bytes]:
    """Send ``data``; return (closed by the adapter in time, what came back)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    received = b""
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(ANSWER_WITHIN):
            while chunk := await reader.read(65536):
                received += chunk
        return True, received
    except TimeoutError:
        return False, received
    except ConnectionError:
        return True, received
    finally:
        writer.close()


def well_formed(answer: bytes) -> bool:
    """Every byte the adapter sent is whole frames of a known command (or heart-beat EOLs)."""
    if not answer:
        return True  # a close without a frame (e.g. the client went quiet after a NUL flood)
    rest = answer
    while rest:
        rest = rest.lstrip(b"\r\n")
        if not rest:
            break
        command = rest.split(b"\n", 1)[0]
        if command not in (b"CONNECTED", b"MESSAGE", b"RECEIPT", b"ERROR"):
            return False
        head, separator, after = rest.partition(b"\n\n")
        if not separator:
            return False
        length = None
        for line in head.split(b"\n")[1:]:
            if line.startswith(b"content-length:"):
                length = int(line[15:])
                break
        if length is not None:
            if after[length : length + 1] != b"\0":
                return False
            rest = after[length + 1 :]
        else:
            end = after.find(b"\0")
            if end < 0:
                return False
            rest = after[end + 1 :]
    return True


def test_fuzzed_stomp_input_never_hurts_the_adapter(start_adapter, stomp_client, broker, caplog):
    caplog.set_level(logging.WARNING)
    adapter = start_adapter(frame_timeout=1.0, login_timeout=2.0, **LIMITS)
    # mutated destinations create queues nobody can name in advance: all of them live in a
    # scratch virtual host that is deleted afterwards
    vhost = broker.scratch_vhost("fuzz")
    base = unique("fuzz")
    # a mutated CONNECT without its host header logs into the default vhost: the queue the
    # corpus names can then appear there, so it is deleted there too
    broker.track_queue(base)
    fuzz(adapter, corpus(base, vhost), CASES, stomp_client, caplog)


def test_fuzzed_activemq_input_never_hurts_the_adapter(start_adapter, stomp_client, broker, caplog):
    """The activemq profile's corpus, with byte budgets small enough for its transactions and
    kept deliveries to cross them: the pools are empty again once every connection is gone."""
    caplog.set_level(logging.WARNING)
    adapter = start_adapter(
        profile="activemq",
        frame_timeout=1.0,
        login_timeout=2.0,
        max_transaction_bytes=4096,
        transaction_bytes_budget=64 * 1024,
        max_unacked_bytes=4096,
        unacked_bytes_budget=64 * 1024,
        **LIMITS,
    )
    vhost = broker.scratch_vhost("fuzzamq")
    base = unique("fuzzamq")
    broker.track_queue(base, f"{base}.b")  # as above: a CONNECT whose host header was broken
    try:
        fuzz(adapter, activemq_corpus(base, vhost), ACTIVEMQ_CASES, stomp_client, caplog)
    finally:
        # durable subscriptions of those connections: their queues are named after the client id
        broker.track_queue(*(q["name"] for q in broker.management("/api/queues/%2F") if base in q["name"]))
    budgets = adapter.server.context.session_settings.registries.budgets
    deadline = time.monotonic() + ANSWER_WITHIN
    while adapter.run(_pools(budgets)) != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert adapter.run(_pools(budgets)) == (0, 0), f"seed {SEED}"


def fuzz(adapter, conversations, cases, stomp_client, caplog) -> None:  # type: ignore[no-untyped-def]
    """Run ``cases`` mutated conversations, ``BATCH`` connections at a time, checking the
    oracle after every batch."""
    rng = random.Random(SEED)
    healthy = stomp_client("1.2", port=adapter.port)
    check = unique("fuzz-check")
    healthy.conn.subscribe(f"/topic/{check}", id="h")
    answered = 0
    for batch_start in range(0, cases, BATCH):
        batch_cases = [make_case(rng, conversations) for _ in range(min(BATCH, cases - batch_start))]

        async def batch(batch_cases: list[bytes] = batch_cases) -> list[tuple[bool, bytes]]:
            return await asyncio.gather(*(one_case(adapter.port, case) for case in batch_cases))

        results = asyncio.run(batch())
        for case, (closed, answer) in zip(batch_cases, results, strict=True):
            assert closed, (
                f"seed {SEED}: connection not answered and closed within {ANSWER_WITHIN} s: {case!r}"
            )
            assert well_formed(answer), f"seed {SEED}: malformed answer {answer[:200]!r} to {case!r}"
            answered += 1
        # the server keeps serving everyone else
        healthy.conn.send(f"/topic/{check}", f"after {batch_start}")
        assert healthy.next("MESSAGE").body == f"after {batch_start}", f"seed {SEED}"
        bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
        assert not bad, f"seed {SEED}: {[r.getMessage() for r in bad][:3]}"
    assert answered == cases
    assert adapter.run(_incomplete(adapter)) == 0  # nothing left held for closed connections


async def _pools(budgets) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    return budgets.transactions.used, budgets.unacked.used


async def _incomplete(adapter) -> int:  # type: ignore[no-untyped-def]
    return adapter.server.context.incomplete_input


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("make_corpus", [corpus, activemq_corpus])
def test_mutator_is_deterministic(seed, make_corpus):
    conversations = make_corpus("q")
    first = [make_case(random.Random(seed), conversations) for _ in range(3)]
    again = [make_case(random.Random(seed), conversations) for _ in range(3)]
    assert first == again
