"""No password in the repr of the objects that carry one (issue #24 item 7, review): a repr ends
up in tracebacks, debuggers and log lines that print an object whole."""

from __future__ import annotations

from adapter.cli import build_server
from adapter.config import load_settings


def test_settings_and_session_settings_reprs_hide_passwords() -> None:
    settings = load_settings(
        None,
        {
            "listeners": [],
            "amqp_url": "amqp://bob:url-secret@127.0.0.1:1/,amqp://bob:other-secret@127.0.0.2:1/",
            "default_pass": "default-secret",
        },
    )
    server = build_server(settings)
    for shown in (repr(settings), str(settings), repr(server.context.session_settings)):
        for secret in ("url-secret", "other-secret", "default-secret"):
            assert secret not in shown, (secret, shown[:200])
    assert "amqp://bob:***@127.0.0.1:1/" in repr(settings)  # the URL itself still shows
    assert settings.amqp_url.startswith("amqp://bob:url-secret@")  # the value is untouched
