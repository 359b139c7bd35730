"""@stomp/stompjs in Debian's Chromium logging in with an OAuth 2.0 token from the WebSocket
handshake (no token in the URL nor in CONNECT) and refreshing it through ``/auth/token``, against
the private oauth2 node; driven by tests/browser/drive.mjs (``token`` mode)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from tests.browser.test_browser import Driver, node  # noqa: F401 - node is a fixture
from tests.oauth2.oauth2_node import TokenIssuer
from tests.support import AdapterProcess, unique


def test_stompjs_logs_in_with_a_handshake_token_and_refreshes_it(
    node: str,  # noqa: F811 - the fixture imported above
    oauth2_adapter: Callable[..., AdapterProcess],
    issuer: TokenIssuer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    adapter = oauth2_adapter(web_stomp_listeners=["127.0.0.1:0"])
    port = adapter.server.web_addresses[0][1]
    subject = unique("browser")
    queue = "/queue/" + unique("browser")
    driver = Driver(
        node, "token", f"ws://127.0.0.1:{port}/ws", queue, issuer.mint(subject), issuer.mint(subject)
    )
    try:
        seen = driver.until("token")["seen"]
    finally:
        driver.finish()
    assert seen["errors"] == []
    assert seen["connects"] == [{"user": "ok", "protocol": "v12.stomp"}]
    assert seen["receipts"] == ["subscribed", "refreshed"]
    assert seen["messages"] == ["before the refresh", "after the refresh"]
    # the session logged in as the token's subject
    assert any(f"user={subject} " in record.getMessage() for record in caplog.records)
