"""OAuth 2.0 token logins against a broker with the oauth2 backend (tests/oauth2/oauth2_node.py).

Hostile input first: forged tokens with local validation on never reach the broker, while a
bystander keeps being served.  Then: a token logs in, the broker's scopes decide what it may do,
an expired token is refused with words that say so.  The clients are raw sockets with the
tests' own framing (tests/support.py), never the adapter's codec.
"""

from __future__ import annotations

from collections.abc import Callable

from cryptography.hazmat.primitives.asymmetric import rsa

from tests.cluster.rabbit import RabbitNode
from tests.oauth2.oauth2_node import NO_WRITE, TokenIssuer, connection_users
from tests.support import AdapterProcess, RawSession, unique, wait_until


def test_forged_tokens_never_reach_the_broker(
    oauth2_adapter: Callable[..., AdapterProcess], oauth2_node: RabbitNode, issuer: TokenIssuer, key_file: str
) -> None:
    adapter = oauth2_adapter(oauth2_signing_key_file=key_file, oauth2_audience="rabbitmq")
    bystander = RawSession(adapter.port, "", issuer.mint("bystander"))
    assert bystander.command == "CONNECTED", (bystander.headers, bystander.body)
    assert wait_until(lambda: connection_users(oauth2_node).count("bystander") == 1, 10)
    before = connection_users(oauth2_node)
    forger = rsa.generate_private_key(65537, 2048)
    refusals = []
    for number in range(40):
        forged = issuer.mint(f"mallory{number}", key=forger)
        session = RawSession(adapter.port, "", forged)
        refusals.append((session.command, session.headers.get("message"), session.body, session.closed))
        if number % 10 == 0:
            bystander.round_trip(unique("bystander"))
    assert all(r[0] == "ERROR" and r[1] == "Bad CONNECT" and r[3] for r in refusals), refusals[:3]
    assert all(b"signature is invalid" in r[2] for r in refusals), refusals[:3]
    # never opened on the broker: its connections are what they were (the bystander's)
    assert connection_users(oauth2_node) == before
    bystander.round_trip(unique("bystander"))
    # an expired token and one for another audience are refused locally too, saying why
    expired = RawSession(adapter.port, "", issuer.mint("late", ttl=-5))
    assert (expired.command, expired.closed) == ("ERROR", True)
    assert b"expired" in expired.body
    other = RawSession(adapter.port, "", issuer.mint("elsewhere", audience="another-server"))
    assert other.command == "ERROR" and b"audience" in other.body.lower(), other.body
    assert connection_users(oauth2_node) == before
    bystander.disconnect()


def test_a_token_logs_in_and_the_broker_enforces_its_scopes(
    oauth2_adapter: Callable[..., AdapterProcess], oauth2_node: RabbitNode, issuer: TokenIssuer
) -> None:
    adapter = oauth2_adapter()
    # the login header is ignored by the broker's oauth2 backend: empty, absent or any value
    session = RawSession(adapter.port, "", issuer.mint("alice"))
    assert session.command == "CONNECTED", session.body
    session.round_trip(unique("alice"))
    assert "alice" in connection_users(oauth2_node)  # the broker's user is the token's sub
    # no write scope: the broker refuses the publish, and the client gets the plugin's ERROR
    reader = RawSession(adapter.port, "whoever", issuer.mint("reader", NO_WRITE))
    assert reader.command == "CONNECTED", reader.body
    got = reader.send(f"SEND\ndestination:/queue/{unique('ro')}\nreceipt:r\n\nno")
    assert got[-1][0] == "ERROR", got
    assert got[-1][1]["message"] == "access_refused", got[-1]
    # without local validation, an expired token still gets words saying so (the broker's
    # refusal is the same for every bad token: the adapter reads exp itself)
    late = RawSession(adapter.port, "", issuer.mint("late", ttl=-5))
    assert late.command == "ERROR" and b"expired" in late.body, late.body
    session.disconnect()
