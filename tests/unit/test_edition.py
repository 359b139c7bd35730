"""The plugin editions (adapter/session/edition.py) and ``adapter.plugin_behaviour``."""

from __future__ import annotations

import pytest

from adapter.config import ConfigError, load_settings
from adapter.session.edition import CURRENT, LEGACY, edition_for

TIMEOUT_TEXT = (
    "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. Timeout value used: "
    "1800000 ms. This timeout value can be configured, see consumers doc guide to learn more"
)


def test_access_refused_texts() -> None:
    assert LEGACY.access_refused("gust") == "Access refused for user 'gust'\n"
    assert CURRENT.access_refused("gust") == "Access refused for user 'gust'"


def test_broker_error_texts() -> None:
    text = "NOT_FOUND - no exchange 'nope' in vhost '/'"
    assert LEGACY.broker_error("not_found", text) == ("not_found", text)
    assert CURRENT.broker_error("not_found", text) == ("not_found", "no exchange 'nope' in vhost '/'")
    # a text without the prefix is left alone
    assert CURRENT.broker_error("access_refused", "access to x refused") == (
        "access_refused",
        "access to x refused",
    )


def test_consumer_timeout_is_the_connections_own_error_on_current_only() -> None:
    assert LEGACY.broker_error("precondition_failed", TIMEOUT_TEXT) == ("precondition_failed", TIMEOUT_TEXT)
    message, detail = CURRENT.broker_error("precondition_failed", TIMEOUT_TEXT)
    assert message == "consumer_timeout"
    assert "consumer timeout" in detail
    assert detail.endswith(TIMEOUT_TEXT.removeprefix("PRECONDITION_FAILED - "))
    # another precondition failure is not a timeout
    assert CURRENT.broker_error("precondition_failed", "PRECONDITION_FAILED - inequivalent arg") == (
        "precondition_failed",
        "inequivalent arg",
    )


def test_the_setting_chooses_the_edition(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STOMP_ADAPTER_PLUGIN_BEHAVIOUR", raising=False)
    assert load_settings().plugin_behaviour == "3.10"
    monkeypatch.setenv("STOMP_ADAPTER_PLUGIN_BEHAVIOUR", "current")
    assert edition_for(load_settings().plugin_behaviour) is CURRENT
    monkeypatch.setenv("STOMP_ADAPTER_PLUGIN_BEHAVIOUR", "4.0")
    with pytest.raises(ConfigError, match="PLUGIN_BEHAVIOUR"):
        load_settings()
