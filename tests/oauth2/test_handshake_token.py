"""Web STOMP clients handing their token over in the WebSocket handshake, never in a URL.

Against the private oauth2 node, with the ``websockets`` library as the independent client: a
Bearer Authorization header (as a reverse proxy sets it), a cookie of the configured name, a
``Sec-WebSocket-Protocol`` entry; the origin check comes first; a CONNECT's own passcode wins;
the refresh through ``/auth/token`` works on a WebSocket as on TCP.
"""

from __future__ import annotations

import base64
from collections.abc import Callable

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from adapter.server.handshake_token import SUBPROTOCOL_PREFIX
from tests.cluster.rabbit import RabbitNode
from tests.oauth2.oauth2_node import TokenIssuer, connection_users
from tests.support import AdapterProcess, unique, wait_until

ORIGIN = "https://app.example.com"


def open_ws(
    port: int, headers: dict[str, str] | None = None, protocols: tuple[str, ...] = ()
) -> ClientConnection:
    return connect(
        f"ws://127.0.0.1:{port}/ws",
        subprotocols=["v12.stomp", *protocols],  # type: ignore[list-item]
        additional_headers={"Origin": ORIGIN, **(headers or {})},
        open_timeout=5,
        compression=None,
    )


def stomp(ws: ClientConnection, frame: str) -> str:
    ws.send(frame + "\0")
    answer = ws.recv(timeout=5)
    return answer.decode() if isinstance(answer, bytes) else answer


CONNECT = "CONNECT\naccept-version:1.2\nhost:/\n\n"


@pytest.fixture
def web_adapter(oauth2_adapter: Callable[..., AdapterProcess]) -> int:
    adapter = oauth2_adapter(
        web_stomp_listeners=["127.0.0.1:0"],
        web_stomp_allow_origins=(ORIGIN,),
        web_stomp_token_cookie="stomp_token",
    )
    return adapter.server.web_addresses[0][1]


def test_a_forged_origin_is_refused_before_its_token_is_read(web_adapter: int, issuer: TokenIssuer) -> None:
    with pytest.raises(InvalidStatus) as refused:
        connect(
            f"ws://127.0.0.1:{web_adapter}/ws",
            additional_headers={
                "Origin": "https://evil.example",
                "Authorization": f"Bearer {issuer.mint('x')}",
            },
            open_timeout=5,
        )
    assert refused.value.response.status_code == 403


@pytest.mark.parametrize("carrier", ["authorization", "cookie", "subprotocol"])
def test_the_handshake_token_logs_in_and_refreshes(
    web_adapter: int, oauth2_node: RabbitNode, issuer: TokenIssuer, carrier: str
) -> None:
    subject = unique(f"web-{carrier}")
    token = issuer.mint(subject)
    headers: dict[str, str] = {}
    protocols: tuple[str, ...] = ()
    if carrier == "authorization":
        headers["Authorization"] = f"Bearer {token}"
    elif carrier == "cookie":
        headers["Cookie"] = f"theme=dark; stomp_token={token}"
    else:
        protocols = (SUBPROTOCOL_PREFIX + base64.urlsafe_b64encode(token.encode()).rstrip(b"=").decode(),)
    with open_ws(web_adapter, headers, protocols) as ws:
        assert ws.subprotocol == "v12.stomp"  # the token entry is never echoed
        connected = stomp(ws, CONNECT)
        assert connected.startswith("CONNECTED\n"), connected
        assert wait_until(lambda: subject in connection_users(oauth2_node), 10)
        queue = unique("web")
        assert stomp(ws, f"SUBSCRIBE\nid:1\ndestination:/queue/{queue}\nreceipt:s\n\n").startswith("RECEIPT")
        refreshed = stomp(ws, f"SEND\ndestination:/auth/token\nreceipt:t\n\n{issuer.mint(subject)}")
        assert refreshed.startswith("RECEIPT\nreceipt-id:t\n"), refreshed
        ws.send(f"SEND\ndestination:/queue/{queue}\n\nafter the refresh\0")
        message = ws.recv(timeout=5)
        assert "after the refresh" in (message.decode() if isinstance(message, bytes) else message)


def test_a_connect_passcode_wins_over_the_handshake_token(web_adapter: int, issuer: TokenIssuer) -> None:
    with open_ws(web_adapter, {"Authorization": f"Bearer {issuer.mint('web')}"}) as ws:
        answer = stomp(ws, "CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:wrong\n\n")
        assert answer.startswith("ERROR\n"), answer
    # and without any token or passcode, the default user (guest/guest) as before
    with open_ws(web_adapter) as ws:
        assert stomp(ws, CONNECT).startswith("CONNECTED\n")


def _hostile(payload_json: str) -> str:
    """A JWT-shaped token with these claims as they are (unsigned: refused before any check)."""
    header = base64.urlsafe_b64encode(b'{"alg":"RS256"}').rstrip(b"=").decode()
    payload = base64.urlsafe_b64encode(payload_json.encode()).rstrip(b"=").decode()
    return f"{header}.{payload}.c2ln"


HOSTILE = {
    "exp too big for a float": _hostile('{"sub":"x","exp":1' + "0" * 400 + "}"),
    "claims nested too deeply": _hostile('{"sub":"x","a":' + "[" * 5000 + "]" * 5000 + "}"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_claims_in_the_handshake_or_connect_get_an_error_and_a_bystander_is_served(
    web_adapter: int, issuer: TokenIssuer, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    token = HOSTILE[name]
    bystander_token = issuer.mint(unique("bystander"))
    with open_ws(web_adapter, {"Authorization": f"Bearer {bystander_token}"}) as bystander:
        assert stomp(bystander, CONNECT).startswith("CONNECTED\n")
        queue = unique("bystander")
        assert stomp(bystander, f"SUBSCRIBE\nid:1\ndestination:/queue/{queue}\nreceipt:s\n\n").startswith(
            "RECEIPT"
        )
        # in the handshake (read before any STOMP frame), then as a CONNECT's passcode
        for headers, connect_frame in (
            ({"Authorization": f"Bearer {token}"}, CONNECT),
            ({}, f"CONNECT\naccept-version:1.2\nhost:/\nlogin:\npasscode:{token}\n\n"),
        ):
            with open_ws(web_adapter, headers) as ws:
                answer = stomp(ws, connect_frame)
            assert answer.startswith("ERROR\n") and "Internal error" not in answer, answer
            assert "The token's" in answer, answer
            bystander.send(f"SEND\ndestination:/queue/{queue}\n\nstill served\0")
            message = bystander.recv(timeout=5)
            assert "still served" in (message.decode() if isinstance(message, bytes) else message)
    tracebacks = [record for record in caplog.records if record.exc_info or record.exc_text]
    assert tracebacks == [], [record.getMessage() for record in tracebacks]
