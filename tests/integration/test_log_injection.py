"""Log injection: what a client sends (its login over STOMP or HTTP Basic, its vhost ...) can
hold line breaks and terminal escapes; in the text log format each record stays one line, with
such characters escaped (adapter/logs.py), so a client cannot forge log lines."""

from __future__ import annotations

import base64
import io
import logging
import re
import socket
from collections.abc import Iterator

import pytest
from websockets.sync.client import connect

from adapter.logs import TEXT_FORMAT, TextFormatter
from tests.support import read_frames

# a whole forged line after the break, as a log reader (or a grep) would take it
FORGED = "2030-01-01 00:00:00,000 INFO adapter.connection: connection logged in peer=10.0.0.1:1 user=admin"
LINE_START = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ adapter\.")


@pytest.fixture
def text_log(caplog: pytest.LogCaptureFixture) -> Iterator[io.StringIO]:
    """What the adapter's loggers write in the text format (the --log-format text handler)."""
    caplog.set_level(logging.INFO, logger="adapter")
    output = io.StringIO()
    handler = logging.StreamHandler(output)
    handler.setFormatter(TextFormatter(TEXT_FORMAT))
    logger = logging.getLogger("adapter")
    logger.addHandler(handler)
    yield output
    logger.removeHandler(handler)


def assert_one_line_per_record(text: str, escaped: str) -> None:
    lines = text.splitlines()
    assert lines, "nothing was logged"
    assert all(LINE_START.match(line) for line in lines), lines
    assert not any(line.startswith("2030-") for line in lines)
    assert any(escaped in line for line in lines), lines


def test_a_stomp_login_with_line_breaks_stays_on_its_line(start_adapter, text_log):
    """CONNECT's headers are never unescaped (STOMP 1.2) and a bare CR in a header is refused
    ("Bad header"), but a vertical tab, form feed, NEL or U+2028 (line breaks to
    str.splitlines and many log viewers) and terminal escapes pass into the login: the refused
    login is logged with them escaped, and a bystander is served meanwhile."""
    adapter = start_adapter()
    login = "evil\x0b" + FORGED + "\x0c\u0085\u2028" + FORGED + "\x1b[2J"
    with socket.create_connection(("127.0.0.1", adapter.port), timeout=5) as bystander:
        bystander.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0")
        assert read_frames(bystander, count=1)[0][0].startswith(b"CONNECTED")
        with socket.create_connection(("127.0.0.1", adapter.port), timeout=5) as sock:
            sock.sendall(f"CONNECT\naccept-version:1.2\nhost:/\nlogin:{login}\npasscode:x\n\n\0".encode())
            frames, _closed = read_frames(sock, timeout=5, count=1)
        assert frames and frames[0].startswith(b"ERROR"), frames
        bystander.sendall(b"SUBSCRIBE\nid:0\ndestination:/topic/t\nreceipt:r\n\n\0")
        assert read_frames(bystander, count=1)[0][0].startswith(b"RECEIPT")
    adapter.stop()  # the close lines are written
    assert_one_line_per_record(text_log.getvalue(), "user=evil\\x0b2030-01-01")
    assert "\\x0c\\x85\\u20282030" in text_log.getvalue()
    assert "\\x1b[2J" in text_log.getvalue() and "\x1b" not in text_log.getvalue()


def test_an_http_basic_login_with_a_line_break_stays_on_its_line(start_adapter, text_log):
    """web_stomp.use_http_auth: the user of the Authorization header is the login; a newline in
    it is escaped in the log."""
    adapter = start_adapter(web_stomp_listeners=["127.0.0.1:0"], web_stomp_use_http_auth=True)
    port = adapter.server.web_addresses[0][1]
    user = "evil\n" + FORGED.replace(":", "")  # the user name ends at the first colon
    authorization = "Basic " + base64.b64encode(f"{user}:x".encode()).decode()
    with connect(
        f"ws://127.0.0.1:{port}/ws",
        subprotocols=["v12.stomp"],
        additional_headers={"Authorization": authorization},
        open_timeout=5,
    ) as ws:
        ws.send("CONNECT\naccept-version:1.2\n\n\0")
        assert str(ws.recv(timeout=5)).startswith("ERROR")
    adapter.stop()
    assert_one_line_per_record(text_log.getvalue(), "user=evil\\n2030-01-01")
