"""The pure helpers of adapter/server/websocket.py: sub-protocol choice, HTTP Basic credentials,
and the server frames it writes itself, read back by wsproto (the oracle) as a client would."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, BytesMessage, Request, TextMessage
from wsproto.extensions import PerMessageDeflate

from adapter.server.websocket import (
    BadAuthorization,
    _Deflater,
    basic_credentials,
    choose_subprotocol,
    frame_header,
)


@pytest.mark.parametrize(
    ("offered", "chosen"),
    [
        (["v10.stomp", "v12.stomp", "v11.stomp"], "v12.stomp"),
        (["v10.stomp"], "v10.stomp"),
        (["stomp", "v11.stomp"], "v11.stomp"),
        (["stomp"], None),
        (["v13.stomp", "V12.STOMP"], None),
        ([], None),
    ],
)
def test_choose_subprotocol(offered: list[str], chosen: str | None) -> None:
    assert choose_subprotocol(offered) == chosen


def test_basic_credentials() -> None:
    token = base64.b64encode("gü:pa:ss".encode()).decode()
    assert basic_credentials(f"Basic {token}") == ("gü", "pa:ss")
    assert basic_credentials(f"basic  {token} ") == ("gü", "pa:ss")
    assert basic_credentials(None) is None
    for unreadable in ("Bearer abc", "Basic !!!", "Basic " + base64.b64encode(b"no-colon").decode(), ""):
        with pytest.raises(BadAuthorization):
            basic_credentials(unreadable)


def _client_after_handshake(
    extensions: list[PerMessageDeflate],
) -> tuple[WSConnection, PerMessageDeflate | None]:
    """A wsproto client and server that completed a handshake in memory."""
    client = WSConnection(ConnectionType.CLIENT)
    server = WSConnection(ConnectionType.SERVER)
    server.receive_data(client.send(Request(host="x", target="/ws", extensions=[PerMessageDeflate()])))
    next(server.events())
    server_deflate = extensions[0] if extensions else None
    client.receive_data(server.send(AcceptConnection(extensions=list(extensions))))
    list(client.events())
    return client, server_deflate


@given(st.binary(max_size=70000), st.booleans())
def test_frames_written_by_hand_are_read_by_wsproto(payload: bytes, text: bool) -> None:
    client, _ = _client_after_handshake([])
    opcode = 0x1 if text else 0x2
    data = payload.decode("latin-1").encode("utf-8") if text else payload
    client.receive_data(frame_header(opcode, len(data)) + data)
    events = list(client.events())
    got = b"".join(e.data.encode() if isinstance(e, TextMessage) else e.data for e in events)
    assert got == data
    assert all(isinstance(e, TextMessage if text else BytesMessage) for e in events)


@given(st.lists(st.binary(max_size=3000), min_size=1, max_size=5), st.booleans())
def test_deflated_frames_are_read_by_wsproto(payloads: list[bytes], takeover: bool) -> None:
    extension = PerMessageDeflate(server_no_context_takeover=not takeover)
    client, negotiated = _client_after_handshake([extension])
    assert negotiated is not None and negotiated.enabled()
    deflater = _Deflater(negotiated)
    for payload in payloads:
        compressed = deflater.compress(payload)
        client.receive_data(frame_header(0x2, len(compressed), rsv1=True) + compressed)
        events = list(client.events())
        assert b"".join(e.data for e in events) == payload
