"""A token refreshed inside a live STOMP session (SEND to /auth/token), and its expiry.

Against the private oauth2 node (tests/oauth2/oauth2_node.py), with raw-socket clients and the
tests' own framing.  What is compared before and after refreshes comes from the broker itself
(``rabbitmqctl list_connections`` / ``list_queues`` on the node) and from the frames: the same
connection, the same subscription, delivery tags that keep counting on the same channel.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path

import jwt
import pytest

from tests.cluster.rabbit import RabbitNode
from tests.oauth2.oauth2_node import ALL_RIGHTS, RESOURCE, TokenIssuer, connection_users
from tests.support import AdapterProcess, RawSession, read_frames, unique, wait_until
from tests.tap_support import TapProcess

NO_READ = (f"{RESOURCE}.configure:*/*", f"{RESOURCE}.write:*/*")


def refresh(
    session: RawSession, token: str, receipt: str = "token"
) -> list[tuple[str, dict[str, str], bytes]]:
    return session.send(f"SEND\ndestination:/auth/token\nreceipt:{receipt}\n\n{token}")


def queue_depth(node: RabbitNode, queue: str) -> int:
    out = node.ctl("list_queues", "name", "messages", "--no-table-headers", "--quiet").stdout
    for line in out.splitlines():
        name, _, count = line.partition("\t")
        if name == queue:
            return int(count)
    raise AssertionError(f"no queue {queue}: {out}")


def test_ten_refreshes_lose_nothing_and_resubscribe_nothing(
    oauth2_adapter: Callable[..., AdapterProcess], oauth2_node: RabbitNode, issuer: TokenIssuer
) -> None:
    adapter = oauth2_adapter()
    subject = unique("refresher")
    session = RawSession(adapter.port, "", issuer.mint(subject, ttl=60))
    assert session.command == "CONNECTED", session.body
    queue = unique("refreshed")
    got = session.send(
        f"SUBSCRIBE\nid:s1\ndestination:/queue/{queue}\nack:client-individual\nreceipt:sub\n\n"
    )
    assert got[-1][0] == "RECEIPT", got
    messages: list[tuple[str, dict[str, str], bytes]] = []
    unacked: list[str] = []
    sent = 0
    for round_ in range(10):
        for number in range(3):
            got = session.send(
                f"SEND\ndestination:/queue/{queue}\nreceipt:p{round_}-{number}\n\n{round_}-{number}"
            )
            assert got[-1] == ("RECEIPT", {"receipt-id": f"p{round_}-{number}"}, b""), got
            messages += [frame for frame in got if frame[0] == "MESSAGE"]
            sent += 1
        # the previous round's messages are acknowledged after the refresh in between
        for ack in unacked:
            session.sock.sendall(f"ACK\nid:{ack}\n\n\0".encode())
        unacked = []
        got = refresh(session, issuer.mint(subject, ttl=60), f"token-{round_}")
        assert got[-1][0] == "RECEIPT" and got[-1][1]["receipt-id"] == f"token-{round_}", got
        messages += [frame for frame in got if frame[0] == "MESSAGE"]
        while len(messages) < sent:
            messages += [frame for frame in session.frames_until(("MESSAGE",)) if frame[0] == "MESSAGE"]
        unacked = [frame[1]["ack"] for frame in messages[-3:]]
    for ack in unacked:
        session.sock.sendall(f"ACK\nid:{ack}\n\n\0".encode())
    got = session.send("SEND\ndestination:/auth/token\nreceipt:last\n\n" + issuer.mint(subject, ttl=60))
    assert got[-1][0] == "RECEIPT", got
    bodies = [frame[2] for frame in messages]
    assert sorted(bodies) == sorted(f"{r}-{n}".encode() for r in range(10) for n in range(3))
    # one subscription throughout, one channel: its delivery tags count on without a gap
    assert {frame[1]["subscription"] for frame in messages} == {"s1"}
    tags = [int(frame[1]["ack"].rsplit("@@", 1)[-1]) for frame in messages]
    assert tags == list(range(tags[0], tags[0] + 30)), tags
    # the same AMQP connection all along, and nothing left unacknowledged on the broker
    assert connection_users(oauth2_node).count(subject) == 1
    assert wait_until(lambda: queue_depth(oauth2_node, queue) == 0, 10)
    session.disconnect()


def test_a_refresh_with_fewer_scopes_loses_the_dropped_rights(
    oauth2_adapter: Callable[..., AdapterProcess], issuer: TokenIssuer
) -> None:
    adapter = oauth2_adapter()
    session = RawSession(adapter.port, "", issuer.mint("shrinking", ALL_RIGHTS))
    session.round_trip(unique("before"))
    got = refresh(session, issuer.mint("shrinking", NO_READ))
    assert got[-1][0] == "RECEIPT", got
    got = session.send(f"SUBSCRIBE\nid:late\ndestination:/queue/{unique('after')}\nreceipt:s\n\n")
    assert got[0][0] == "ERROR" and got[0][1]["message"] == "access_refused", got


def test_a_token_session_never_shares_a_topic_subscription_so_a_refresh_rules_its_subscribes(
    oauth2_adapter: Callable[..., AdapterProcess], issuer: TokenIssuer
) -> None:
    # adapter.shared_subscriptions: a shared group is opened with its first member's
    # credentials; a token session must subscribe with the token it holds now
    adapter = oauth2_adapter(shared_subscriptions=True)
    topic = unique("shared")
    topic_rights = (f"{RESOURCE}.read:*/*/*", f"{RESOURCE}.write:*/*/*")  # topic permissions
    session = RawSession(adapter.port, "", issuer.mint("sharer", ALL_RIGHTS + topic_rights))
    got = session.send(f"SUBSCRIBE\nid:first\ndestination:/topic/{topic}\nreceipt:s1\n\n")
    assert got[-1][0] == "RECEIPT", got
    got = refresh(session, issuer.mint("sharer", NO_READ))
    assert got[-1][0] == "RECEIPT", got
    got = session.send(f"SUBSCRIBE\nid:late\ndestination:/topic/{topic}\nreceipt:s2\n\n")
    assert got[0][0] == "ERROR" and got[0][1]["message"] == "access_refused", got


def test_refused_refreshes_end_that_session_only(
    oauth2_adapter: Callable[..., AdapterProcess], issuer: TokenIssuer
) -> None:
    adapter = oauth2_adapter()
    bystander = RawSession(adapter.port, "", issuer.mint("bystander"))
    cases = [
        ("another subject", issuer.mint("eve"), b"another subject"),
        ("expired", issuer.mint("victim", ttl=-1), b"expired"),
        ("not a token", "hunter2", b"must be a JWT"),
    ]
    for what, token, words in cases:
        victim = RawSession(adapter.port, "", issuer.mint("victim"))
        got = refresh(victim, token)
        assert got[-1][0] == "ERROR", (what, got)
        assert got[-1][1]["message"] == "Token refused" and words in got[-1][2], (what, got)
        assert got[-1][1].get("receipt-id") == "token"
        bystander.round_trip(unique("bystander"))
    # a session that logged in with a password cannot switch to a token
    guest = RawSession(adapter.port, "guest", "guest")
    got = refresh(guest, issuer.mint("guest"))
    assert got[-1][0] == "ERROR" and b"did not log in with a token" in got[-1][2], got
    bystander.round_trip(unique("bystander"))
    bystander.disconnect()


def test_a_forged_refresh_is_refused_by_the_broker_when_not_validated_locally(
    oauth2_adapter: Callable[..., AdapterProcess], issuer: TokenIssuer
) -> None:
    from cryptography.hazmat.primitives.asymmetric import rsa

    adapter = oauth2_adapter()
    bystander = RawSession(adapter.port, "", issuer.mint("bystander"))
    victim = RawSession(adapter.port, "", issuer.mint("victim"))
    forged = issuer.mint("victim", key=rsa.generate_private_key(65537, 2048))
    got = refresh(victim, forged)
    # RabbitMQ answers 530 and closes the connection: the ERROR names its reason
    assert got[-1][0] == "ERROR", got
    assert b"refused" in got[-1][2].lower() or "refused" in got[-1][1]["message"].lower(), got
    bystander.round_trip(unique("bystander"))
    bystander.disconnect()


def test_expiry_ends_the_session_with_an_error_and_a_refresh_postpones_it(
    oauth2_adapter: Callable[..., AdapterProcess], issuer: TokenIssuer
) -> None:
    adapter = oauth2_adapter()
    token = issuer.mint("expiring", ttl=3)
    exp = jwt.decode(token, options={"verify_signature": False})["exp"]
    expiring = RawSession(adapter.port, "", token)
    first = issuer.mint("refreshed", ttl=3)
    first_exp = jwt.decode(first, options={"verify_signature": False})["exp"]
    refreshed = RawSession(adapter.port, "", first)
    got = refresh(refreshed, issuer.mint("refreshed", ttl=300))
    assert got[-1][0] == "RECEIPT", got
    queue = unique("expiry")
    got = expiring.send(f"SUBSCRIBE\nid:e\ndestination:/queue/{queue}\nreceipt:s\n\n")
    assert got[-1][0] == "RECEIPT", got
    got = expiring.frames_until(("ERROR",), timeout=15)
    assert time.time() >= exp  # not before the token's exp
    assert got[-1][0] == "ERROR" and got[-1][1]["message"] == "Token expired", got
    assert expiring.frames_until(("RECEIPT",), timeout=3) == []  # and the socket closed
    # the other session, whose token was refreshed before its first one ran out, goes on
    # past that first token's exp
    time.sleep(max(0.0, first_exp + 0.5 - time.time()))
    refreshed.round_trip(unique("refreshed"))
    refreshed.disconnect()


def test_sessions_of_one_subject_on_a_multiplexing_adapter_keep_their_own_expiries(
    oauth2_adapter: Callable[..., AdapterProcess], oauth2_node: RabbitNode, issuer: TokenIssuer
) -> None:
    adapter = oauth2_adapter(amqp_sessions_per_connection=8, amqp_connection_reuse=False)
    subject = unique("twin")
    short = RawSession(adapter.port, "", issuer.mint(subject, ttl=8))  # time for rabbitmqctl under load
    long = RawSession(adapter.port, "", issuer.mint(subject, ttl=300))
    # a connection per token login: update-secret could not change one session's rights alone
    assert wait_until(lambda: connection_users(oauth2_node).count(subject) == 2, 10)
    got = refresh(long, issuer.mint(subject, ttl=300))
    assert got[-1][0] == "RECEIPT", got
    got = short.frames_until(("ERROR",), timeout=15)
    assert got[-1][1]["message"] == "Token expired", got
    long.round_trip(unique("twin"))
    assert wait_until(lambda: connection_users(oauth2_node).count(subject) == 1, 10)
    long.disconnect()


def test_no_token_in_any_log_line(
    oauth2_adapter: Callable[..., AdapterProcess],
    issuer: TokenIssuer,
    key_file: str,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    """Nowhere: log messages, the tracebacks of log records, the tap's recording (bodies
    recorded) and its log; a STOMP 1.0 refresh (leading white space in the destination) too."""
    caplog.set_level(logging.DEBUG)
    adapter = oauth2_adapter(oauth2_signing_key_file=key_file)
    tap = TapProcess(f"127.0.0.1:{adapter.port}", tmp_path / "recording", "--record-bodies")
    try:
        first, second, third, fourth = (issuer.mint("quiet") for _ in range(4))
        session = RawSession(tap.port, "", first)
        session.round_trip(unique("quiet"))
        assert refresh(session, second)[-1][0] == "RECEIPT"
        refused = RawSession(tap.port, "", issuer.mint("quiet", ttl=-1))
        assert refused.command == "ERROR"
        old = socket.create_connection(("127.0.0.1", tap.port), timeout=5)  # STOMP 1.0
        old.sendall(f"CONNECT\nlogin:\npasscode:{third}\n\n\0".encode())
        assert read_frames(old, count=1)[0][0].startswith(b"CONNECTED")
        old.sendall(f"SEND\ndestination: /auth/token\nreceipt:r\n\n{fourth}\0".encode())
        assert read_frames(old, count=1)[0][0].startswith(b"RECEIPT")
        old.close()
        session.disconnect()
        assert wait_until(lambda: adapter.connection_count == 0, 10)
    finally:
        tap.stop()
    formatter = logging.Formatter()
    text = "\n".join(formatter.format(record) for record in caplog.records)  # with any traceback
    assert caplog.records, "nothing was logged at all"
    records = tap.records()
    assert any("body" in record for record in records)  # the bodies were recorded
    bodies = [
        base64.b64decode(record["body"]).decode(errors="replace") for record in records if "body" in record
    ]
    recording = json.dumps(records) + "\n".join(bodies)
    for token in (first, second, third, fourth):
        for part in token.split("."):
            assert part not in text
            assert part not in recording
            assert part not in tap.log()


def test_a_refresh_keeps_open_transactions_and_temp_queues(
    oauth2_adapter: Callable[..., AdapterProcess], issuer: TokenIssuer
) -> None:
    adapter = oauth2_adapter()
    session = RawSession(adapter.port, "", issuer.mint("keeper"))
    queue = unique("kept")
    got = session.send(f"SUBSCRIBE\nid:k\ndestination:/queue/{queue}\nreceipt:s\n\n")
    assert got[-1][0] == "RECEIPT", got
    # a temp queue made before the refresh (its reply-to), and a transaction open across it
    got = session.send(
        f"SEND\ndestination:/queue/{queue}\nreply-to:/temp-queue/answers\nreceipt:q\n\nquestion"
    )
    if not any(frame[0] == "MESSAGE" for frame in got):
        got += session.frames_until(("MESSAGE",))
    question = next(frame for frame in got if frame[0] == "MESSAGE")
    reply_to = question[1]["reply-to"]
    session.sock.sendall(b"BEGIN\ntransaction:tx\n\n\0")
    session.sock.sendall(f"SEND\ndestination:/queue/{queue}\ntransaction:tx\n\nin the transaction\0".encode())
    assert refresh(session, issuer.mint("keeper"))[-1][0] == "RECEIPT"
    got = session.send("COMMIT\ntransaction:tx\nreceipt:c\n\n")
    assert got[-1][0] == "RECEIPT", got
    bodies = [frame[2] for frame in got if frame[0] == "MESSAGE"]
    while b"in the transaction" not in bodies:
        bodies += [frame[2] for frame in session.frames_until(("MESSAGE",)) if frame[0] == "MESSAGE"]
    # an answer to the temp queue named before the refresh still reaches the session
    got = session.send(f"SEND\ndestination:{reply_to}\nreceipt:a\n\nanswer")
    frames = got + ([] if any(f[2] == b"answer" for f in got) else session.frames_until(("MESSAGE",)))
    answer = next(frame for frame in frames if frame[0] == "MESSAGE" and frame[2] == b"answer")
    assert answer[1]["subscription"] == "/temp-queue/answers"  # the temp queue made before the refresh
    session.disconnect()


def test_a_flood_of_refreshes_is_answered_in_order_on_one_connection_and_a_bystander_is_served(
    oauth2_adapter: Callable[..., AdapterProcess], oauth2_node: RabbitNode, issuer: TokenIssuer
) -> None:
    adapter = oauth2_adapter()
    bystander = RawSession(adapter.port, "", issuer.mint("bystander"))
    subject = unique("flooder")
    flooder = RawSession(adapter.port, "", issuer.mint(subject))
    tokens = [issuer.mint(subject) for _ in range(100)]
    flooder.sock.sendall(
        b"".join(
            f"SEND\ndestination:/auth/token\nreceipt:f{n}\n\n{t}\0".encode() for n, t in enumerate(tokens)
        )
    )
    bystander.round_trip(unique("bystander"))  # served while the flood is handled
    receipts: list[str] = []
    while len(receipts) < len(tokens):
        got = flooder.frames_until(("RECEIPT", "ERROR"), timeout=30)
        assert got and got[-1][0] == "RECEIPT", got
        receipts.append(got[-1][1]["receipt-id"])
    assert receipts == [f"f{n}" for n in range(len(tokens))]
    assert connection_users(oauth2_node).count(subject) == 1
    flooder.round_trip(unique("flooder"))
    bystander.disconnect()
    flooder.disconnect()
