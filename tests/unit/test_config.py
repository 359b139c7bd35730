"""Tests of adapter.config: defaults, the rabbitmq.conf-style ini file, environment, overrides, errors."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from adapter.config import ConfigError, Settings, load_settings, parse_listener, redact_url

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("STOMP_ADAPTER_"):
            monkeypatch.delenv(name)


def write_ini(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "adapter.ini"
    path.write_text(text, encoding="utf-8")
    return path


def config_error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_settings(write_ini(tmp_path, text))
    return str(info.value)


# ----------------------------------------------------------------------------------------------- defaults


def test_defaults() -> None:
    s = load_settings()
    assert s.listeners == ("0.0.0.0:61613",)
    assert s.amqp_url == "amqp://guest:guest@localhost:5672/"
    assert (s.default_user, s.default_pass, s.default_vhost) == ("guest", "guest", "/")
    assert s.implicit_connect is False
    assert s.hide_server_info is False
    assert s.default_nack_requeue is True
    assert s.proxy_protocol is False
    assert s.default_topic_exchange == "amq.topic"
    assert s.max_frame_size == 4 * 1024 * 1024
    assert s.max_frame_size_unauthenticated == 65536
    assert (s.max_headers, s.max_header_length) == (100, 102400)
    assert s.login_timeout == 10.0
    assert s.heartbeat_tolerance == 1.5
    assert (s.shutdown_timeout, s.amqp_connect_timeout, s.amqp_heartbeat) == (10.0, 10.0, 60)
    assert s.loopback_users == ("guest",)
    assert (s.tcp_backlog, s.tcp_nodelay, s.tcp_keepalive) == (128, True, False)
    assert (s.tcp_sndbuf, s.tcp_recbuf) == (None, None)
    assert s.log_level == "INFO"
    assert s.trailing_lf is True
    assert s == Settings()


def test_settings_are_frozen_and_hide_the_password() -> None:
    s = load_settings()
    with pytest.raises(ValidationError, match="frozen"):
        s.max_headers = 5  # type: ignore[misc]
    assert "default_pass" not in repr(s)


def test_example_config_loads_to_defaults() -> None:
    assert load_settings(REPO / "config" / "adapter.ini") == Settings()


def test_example_config_web_stomp_defaults_are_the_defaults(tmp_path: Path) -> None:
    """The commented web_stomp.* defaults in config/adapter.ini, uncommented, give the same settings
    as the listener started with nothing else set (they cannot be left uncommented there: any
    web_stomp.* key starts the listener)."""
    text = (REPO / "config" / "adapter.ini").read_text()
    block = text[text.index("# Defaults (ws://") : text.index("# Examples, not defaults:")]
    keys = [line[2:] for line in block.splitlines() if line.startswith("# web_stomp.") and " = " in line]
    assert len(keys) >= 20
    listed = load_settings(write_ini(tmp_path, "\n".join(keys) + "\n"))
    plain = load_settings(write_ini(tmp_path, "web_stomp.tcp.port = 15674\n"))
    assert listed.web_stomp_ssl_versions == ("tlsv1.2", "tlsv1.3")  # what () means
    assert listed.model_copy(update={"web_stomp_ssl_versions": ()}) == plain


# ------------------------------------------------------------------------------------------- ini file


def test_rabbitmq_keys(tmp_path: Path) -> None:
    path = write_ini(
        tmp_path,
        """
        # a comment
        stomp.listeners.tcp.1 = 12345
        stomp.listeners.tcp.2 = 127.0.0.1:61613
        stomp.listeners.tcp.local6 = ::1:61613
        stomp.listeners.tcp.bracketed = [::1]:61614   # trailing comment

        stomp.default_user = alice
        stomp.default_pass = s3cr#t
        stomp.default_vhost = /prod
        stomp.implicit_connect = TRUE
        stomp.max_frame_size = 1024
        stomp.default_topic_exchange = my.topic
        stomp.hide_server_info = true
        stomp.default_nack_requeue = False
        stomp.proxy_protocol = true
        stomp.login_timeout = 2500
        stomp.tcp_listen_options.backlog = 4096
        stomp.tcp_listen_options.nodelay = false
        stomp.tcp_listen_options.keepalive = true
        stomp.tcp_listen_options.sndbuf = 131072
        stomp.tcp_listen_options.recbuf = 65536
        """,
    )
    s = load_settings(path)
    assert s.listeners == ("0.0.0.0:12345", "127.0.0.1:61613", "[::1]:61613", "[::1]:61614")
    assert (s.default_user, s.default_pass, s.default_vhost) == ("alice", "s3cr#t", "/prod")
    assert s.implicit_connect is True
    assert s.max_frame_size == 1024
    assert s.default_topic_exchange == "my.topic"
    assert s.hide_server_info is True
    assert s.default_nack_requeue is False
    assert s.proxy_protocol is True
    assert s.login_timeout == 2.5  # milliseconds in the file, seconds in the settings
    assert (s.tcp_backlog, s.tcp_nodelay, s.tcp_keepalive) == (4096, False, True)
    assert (s.tcp_sndbuf, s.tcp_recbuf) == (131072, 65536)


def test_repeated_listener_name_replaces(tmp_path: Path) -> None:
    s = load_settings(
        write_ini(
            tmp_path, "stomp.listeners.tcp.a = 1\nstomp.listeners.tcp.b = 2\nstomp.listeners.tcp.a = 3\n"
        )
    )
    assert s.listeners == ("0.0.0.0:3", "0.0.0.0:2")


def test_listeners_none(tmp_path: Path) -> None:
    assert load_settings(write_ini(tmp_path, "stomp.listeners.tcp = none\n")).listeners == ()


def test_listeners_none_wins_over_named_listeners(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write_ini(tmp_path, "stomp.listeners.tcp.1 = 61613\nstomp.listeners.tcp = none\n")
    with caplog.at_level(logging.WARNING, logger="adapter.config"):
        assert load_settings(path).listeners == ()
    assert "stomp.listeners.tcp.1 is ignored" in caplog.text


def test_ssl_listeners_none_wins_over_named_ones(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write_ini(tmp_path, "stomp.listeners.ssl.default = 61614\nstomp.listeners.ssl = none\n")
    with caplog.at_level(logging.WARNING, logger="adapter.config"):
        assert load_settings(path).ssl_listeners == ()
    assert "stomp.listeners.ssl.default is ignored because of stomp.listeners.ssl = none" in caplog.text
    message = config_error(tmp_path, "stomp.listeners.ssl = 61614\n")
    assert "only 'none' is allowed here; add listeners as stomp.listeners.ssl.<name> = PORT" in message


def test_empty_default_user_disables_it(tmp_path: Path) -> None:
    s = load_settings(write_ini(tmp_path, "stomp.default_user =\nstomp.default_pass =\n"))
    assert (s.default_user, s.default_pass) == (None, None)


def test_adapter_keys(tmp_path: Path) -> None:
    path = write_ini(
        tmp_path,
        """\
adapter.listeners = 127.0.0.1:0, [::1]:0
adapter.amqp_url = amqps://u:p@rabbit.example:5671/vh
adapter.max_frame_size_unauthenticated = 4096
adapter.max_headers = 10
adapter.max_header_length = 2048
adapter.login_timeout = 0.5
adapter.heartbeat_tolerance = 2
adapter.shutdown_timeout = 0
adapter.amqp_connect_timeout = 3.5
adapter.amqp_heartbeat = 0
adapter.loopback_users = guest, admin
adapter.log_level = debug
adapter.trailing_lf = false
""",
    )
    s = load_settings(path)
    assert s.listeners == ("127.0.0.1:0", "[::1]:0")
    assert s.amqp_url == "amqps://u:p@rabbit.example:5671/vh"
    assert (s.max_frame_size_unauthenticated, s.max_headers, s.max_header_length) == (4096, 10, 2048)
    assert s.login_timeout == 0.5
    assert s.heartbeat_tolerance == 2.0
    assert (s.shutdown_timeout, s.amqp_connect_timeout, s.amqp_heartbeat) == (0.0, 3.5, 0)
    assert s.loopback_users == ("guest", "admin")
    assert s.log_level == "DEBUG"
    assert s.trailing_lf is False


def test_loopback_users_none(tmp_path: Path) -> None:
    assert load_settings(write_ini(tmp_path, "adapter.loopback_users = none\n")).loopback_users == ()


def test_proxy_protocol_trusted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().proxy_protocol_trusted == ()  # every peer, as in the plugin
    path = write_ini(tmp_path, "adapter.proxy_protocol_trusted = 10.0.0.0/8, 192.0.2.7, 2001:db8::/32\n")
    assert load_settings(path).proxy_protocol_trusted == ("10.0.0.0/8", "192.0.2.7/32", "2001:db8::/32")
    monkeypatch.setenv("STOMP_ADAPTER_PROXY_PROTOCOL_TRUSTED", "127.0.0.2")
    assert load_settings(path).proxy_protocol_trusted == ("127.0.0.2/32",)
    monkeypatch.setenv("STOMP_ADAPTER_PROXY_PROTOCOL_TRUSTED", "none")
    assert load_settings(path).proxy_protocol_trusted == ()


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("10.0.0.0/33", "is not an address or network"),
        ("lb.example", "is not an address or network"),
        ("10.1.2.3/8", "is not an address or network (host bits set"),
    ],
)
def test_a_bad_trusted_proxy_stops_start_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, problem: str
) -> None:
    message = config_error(tmp_path, f"adapter.proxy_protocol_trusted = 192.0.2.1, {value}\n")
    assert f"adapter.proxy_protocol_trusted = '192.0.2.1, {value}': '{value}' {problem}" in message
    monkeypatch.setenv("STOMP_ADAPTER_PROXY_PROTOCOL_TRUSTED", value)
    with pytest.raises(ConfigError, match=f"environment: STOMP_ADAPTER_PROXY_PROTOCOL_TRUSTED = '{value}'"):
        load_settings()


def test_num_acceptors_is_ignored_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write_ini(tmp_path, "stomp.num_acceptors.tcp = 10\n")
    with caplog.at_level(logging.WARNING, logger="adapter.config"):
        assert load_settings(path) == Settings()
    assert "stomp.num_acceptors.tcp" in caplog.text


def test_ssl_listeners_none_and_cert_login_false_are_accepted(tmp_path: Path) -> None:
    path = write_ini(tmp_path, "stomp.listeners.ssl = none\nstomp.ssl_cert_login = false\n")
    assert load_settings(path) == Settings()


# ---------------------------------------------------------------------------------------- precedence


def test_environment_beats_ini(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_ini(
        tmp_path,
        "stomp.max_frame_size = 1000\nadapter.amqp_url = amqp://ini-host/\nstomp.implicit_connect = true\n",
    )
    monkeypatch.setenv("STOMP_ADAPTER_AMQP_URL", "amqp://env-host/")
    monkeypatch.setenv("STOMP_ADAPTER_IMPLICIT_CONNECT", "false")
    monkeypatch.setenv("STOMP_ADAPTER_LISTENERS", "127.0.0.1:1, 2")
    monkeypatch.setenv("STOMP_ADAPTER_LOOPBACK_USERS", '["a", "b"]')
    s = load_settings(path)
    assert s.amqp_url == "amqp://env-host/"
    assert s.implicit_connect is False
    assert s.listeners == ("127.0.0.1:1", "0.0.0.0:2")
    assert s.loopback_users == ("a", "b")
    assert s.max_frame_size == 1000  # from the file, not overridden


def test_environment_json_list_and_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOMP_ADAPTER_LISTENERS", '["[::1]:5", "6"]')
    monkeypatch.setenv("STOMP_ADAPTER_LOOPBACK_USERS", "none")
    s = load_settings()
    assert s.listeners == ("[::1]:5", "0.0.0.0:6")
    assert s.loopback_users == ()


def test_overrides_beat_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_ini(tmp_path, "adapter.log_level = ERROR\nstomp.listeners.tcp.1 = 1\n")
    monkeypatch.setenv("STOMP_ADAPTER_AMQP_URL", "amqp://env-host/")
    monkeypatch.setenv("STOMP_ADAPTER_LOG_LEVEL", "WARNING")
    s = load_settings(
        path,
        overrides={"listeners": ["127.0.0.1:0"], "amqp_url": "amqp://cli-host/", "log_level": None},
    )
    assert s.listeners == ("127.0.0.1:0",)
    assert s.amqp_url == "amqp://cli-host/"
    assert s.log_level == "WARNING"  # None overrides are ignored: the environment wins over the file


def test_unknown_environment_variable_is_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("STOMP_ADAPTER_AMQP_ULR", "x")
    with caplog.at_level(logging.WARNING, logger="adapter.config"):
        assert load_settings() == Settings()
    assert "STOMP_ADAPTER_AMQP_ULR" in caplog.text
    assert "STOMP_ADAPTER_AMQP_URL" in caplog.text


# -------------------------------------------------------------------------------------------- errors


def test_unknown_key_names_line_and_suggests(tmp_path: Path) -> None:
    message = config_error(tmp_path, "# header\n\nstomp.default_usr = bob\n")
    assert message.endswith("line 3: unknown key 'stomp.default_usr' (did you mean 'stomp.default_user'?)")
    assert str(tmp_path / "adapter.ini") in message


def test_misspelt_listener_key_suggests_the_same_name(tmp_path: Path) -> None:
    message = config_error(tmp_path, "stomp.listners.tcp.default = 61613\n")
    assert "(did you mean 'stomp.listeners.tcp.default'?)" in message


def test_unknown_key_without_close_match(tmp_path: Path) -> None:
    message = config_error(tmp_path, "management.tcp.port = 15672\n")
    assert "unknown key 'management.tcp.port'" in message
    assert "only stomp.*, web_stomp.*, ssl_options.* and adapter.* keys are read" in message


def test_unknown_ssl_option_lists_the_ones_read(tmp_path: Path) -> None:
    message = config_error(tmp_path, "ssl_options.honor_cipher_order = true\n")
    assert "unknown key 'ssl_options.honor_cipher_order'" in message
    assert "cacertfile, certfile, keyfile, password, verify, fail_if_no_peer_cert and versions.<n>" in message


def test_bad_bool(tmp_path: Path) -> None:
    message = config_error(tmp_path, "stomp.implicit_connect = yes\n")
    assert "line 1: stomp.implicit_connect = 'yes': must be true or false" in message


def test_bad_int(tmp_path: Path) -> None:
    message = config_error(tmp_path, "stomp.max_frame_size = abc\n")
    assert "stomp.max_frame_size = 'abc': must be a positive integer" in message
    assert "must be a positive integer" in config_error(tmp_path, "stomp.max_frame_size = 0\n")
    assert "must be a positive integer" in config_error(tmp_path, "stomp.max_frame_size = 4 * 1024\n")


def test_bad_login_timeout_mentions_milliseconds(tmp_path: Path) -> None:
    message = config_error(tmp_path, "stomp.login_timeout = 1.5\n")
    assert "stomp.login_timeout = '1.5': must be a positive integer (milliseconds)" in message


def test_bad_float(tmp_path: Path) -> None:
    message = config_error(tmp_path, "adapter.heartbeat_tolerance = 0.5\n")
    assert "adapter.heartbeat_tolerance = '0.5': must be a number >= 1" in message


@pytest.mark.parametrize("value", ["localhost", "1.2.3.4:99999", "host:", "[::1]", "[nothost]:1", "a b:1"])
def test_bad_listener(tmp_path: Path, value: str) -> None:
    message = config_error(tmp_path, f"stomp.listeners.tcp.x = {value}\n")
    assert f"stomp.listeners.tcp.x = {value!r}: must be PORT, HOST:PORT or [IPV6]:PORT" in message


def test_listeners_tcp_accepts_only_none(tmp_path: Path) -> None:
    message = config_error(tmp_path, "stomp.listeners.tcp = 61613\n")
    assert "stomp.listeners.tcp = '61613': only 'none' is allowed here" in message


@pytest.mark.parametrize("url", ["http://localhost/", "amqp://", "localhost:5672", "amqp://h:notaport/"])
def test_bad_url(tmp_path: Path, url: str) -> None:
    message = config_error(tmp_path, f"adapter.amqp_url = {url}\n")
    assert f"adapter.amqp_url = {url!r}: must be amqp:// or amqps:// URLs" in message


def test_bad_url_does_not_show_the_password(tmp_path: Path) -> None:
    message = config_error(tmp_path, "adapter.amqp_url = https://user:hunter2@host/\n")
    assert "hunter2" not in message
    assert "'https://user:***@host/'" in message


@pytest.mark.parametrize("password", ["hunter2/x", "hunter2?x", "hunter2#x", "12345/hunter2"])
def test_a_password_that_breaks_the_url_is_not_shown(tmp_path: Path, password: str) -> None:
    """An unencoded / ? # ends the user part early: the URL does not parse as one with a
    password, and every piece of it up to the last @ must still be hidden."""
    url = f"amqp://user:{password}@host:5672/"
    assert "hunter2" not in redact_url(url)
    message = config_error(tmp_path, f"adapter.amqp_url = {url}\n")
    assert "hunter2" not in message and "'amqp://user:***@host:5672/'" in message


def test_bad_log_level(tmp_path: Path) -> None:
    message = config_error(tmp_path, "adapter.log_level = verbose\n")
    assert "adapter.log_level = 'verbose': must be one of DEBUG, INFO, WARNING, ERROR" in message


def test_tls_listener_keys_as_in_rabbitmq_conf(tmp_path: Path) -> None:
    path = tmp_path / "tls.ini"
    path.write_text(
        "stomp.listeners.ssl.default = 127.0.0.1:61614\n"
        "ssl_options.cacertfile = /etc/ca.pem\n"
        "ssl_options.certfile = /etc/server.pem\n"
        "ssl_options.keyfile = /etc/server.key\n"
        "ssl_options.verify = verify_peer\n"
        "ssl_options.fail_if_no_peer_cert = true\n"
        "ssl_options.versions.1 = tlsv1.3\n"
        "ssl_options.versions.2 = tlsv1.2\n"
    )
    s = load_settings(path, {})
    assert s.ssl_listeners == ("127.0.0.1:61614",)
    assert (s.ssl_cacertfile, s.ssl_certfile, s.ssl_keyfile) == (
        "/etc/ca.pem",
        "/etc/server.pem",
        "/etc/server.key",
    )
    assert (s.ssl_verify, s.ssl_fail_if_no_peer_cert, s.ssl_versions) == (
        "verify_peer",
        True,
        ("tlsv1.3", "tlsv1.2"),
    )
    message = config_error(tmp_path, "ssl_options.versions.1 = sslv3\n")
    assert "TLS versions must be among tlsv1.2, tlsv1.3" in message


def test_ssl_cert_login_is_refused_with_the_reason(tmp_path: Path) -> None:
    message = config_error(tmp_path, "stomp.ssl_cert_login = true\n")
    assert "key 'stomp.ssl_cert_login' is not supported: the plugin logs a client in" in message
    assert "runs inside the broker" in message
    assert "docs/compatibility.md" in message


def test_two_keys_for_one_setting(tmp_path: Path) -> None:
    message = config_error(tmp_path, "stomp.login_timeout = 1000\nadapter.login_timeout = 2\n")
    assert "line 2: adapter.login_timeout sets the same setting as stomp.login_timeout" in message
    message = config_error(tmp_path, "stomp.listeners.tcp.1 = 1\nadapter.listeners = 2\n")
    assert "adapter.listeners and stomp.listeners.tcp.1" in message


def test_malformed_lines(tmp_path: Path) -> None:
    assert "expected 'key = value'" in config_error(tmp_path, "stomp.default_user\n")
    assert "section headers" in config_error(tmp_path, "[stomp]\n")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="configuration file .*nope.ini.* not found"):
        load_settings(tmp_path / "nope.ini")


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read configuration file"):
        load_settings(tmp_path)  # a directory


def test_bad_environment_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOMP_ADAPTER_MAX_FRAME_SIZE", "big")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert str(info.value) == "environment: STOMP_ADAPTER_MAX_FRAME_SIZE = 'big': must be a positive integer"


def test_bad_environment_bool_and_listener(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOMP_ADAPTER_TRAILING_LF", "1")
    monkeypatch.setenv("STOMP_ADAPTER_LISTENERS", "1, nohost:x")
    with pytest.raises(ConfigError) as info:
        load_settings()
    message = str(info.value)
    assert "STOMP_ADAPTER_TRAILING_LF = '1': must be true or false" in message
    assert "STOMP_ADAPTER_LISTENERS = '1, nohost:x': 'nohost:x': must be PORT" in message


def test_bad_override_names_the_flag() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(overrides={"listeners": ["127.0.0.1:70000"]})
    assert str(info.value).startswith("command line: --listen = ['127.0.0.1:70000']: '127.0.0.1:70000'")
    with pytest.raises(ConfigError, match="override: max_headers = 0: must be a positive integer"):
        load_settings(overrides={"max_headers": 0})


def test_unknown_override() -> None:
    with pytest.raises(ConfigError, match="unknown setting 'amqp_uri' \\(did you mean 'amqp_url'\\?\\)"):
        load_settings(overrides={"amqp_uri": "amqp://x/"})


# ------------------------------------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("61613", ("0.0.0.0", 61613)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("localhost:1234", ("localhost", 1234)),
        ("[::1]:61613", ("::1", 61613)),
        ("::1:61613", ("::1", 61613)),
        ("[0:0:0:0:0:0:0:1]:5", ("::1", 5)),
        (" 0.0.0.0:61613 ", ("0.0.0.0", 61613)),
    ],
)
def test_parse_listener(value: str, expected: tuple[str, int]) -> None:
    assert parse_listener(value) == expected


@pytest.mark.parametrize("value", ["", "x", "-1", "65536", "1.2.3.4.5:1", "999.1.1.1:1", "[::1]5", ":1"])
def test_parse_listener_rejects(value: str) -> None:
    with pytest.raises(ValueError):
        parse_listener(value)


def test_redact_url() -> None:
    assert redact_url("amqp://guest:guest@localhost:5672/") == "amqp://guest:***@localhost:5672/"
    assert redact_url("amqp://localhost/") == "amqp://localhost/"


def test_several_broker_nodes_comma_separated_or_one_key_each(tmp_path: Path) -> None:
    s = load_settings(None, {"amqp_url": "amqp://a:1/, amqps://b/"})
    assert s.amqp_url == "amqp://a:1/,amqps://b/"
    path = tmp_path / "nodes.ini"
    path.write_text(
        "adapter.amqp_url.one = amqps://u:p@r1:5671/\nadapter.amqp_url.two = amqps://u:p@r2:5671/\n"
    )
    assert load_settings(path, {}).amqp_url == "amqps://u:p@r1:5671/,amqps://u:p@r2:5671/"
    message = config_error(tmp_path, "adapter.amqp_url.one = amqp://a/\nadapter.amqp_url = amqp://b/\n")
    assert "both name the broker" in message
    message = config_error(tmp_path, "adapter.amqp_url.one = http://u:secret@a/\n")
    assert "must be amqp:// or amqps:// URLs" in message and "secret" not in message


def test_broker_tls_settings(tmp_path: Path) -> None:
    s = load_settings(None, {})
    assert (s.amqp_tls_verify, s.amqp_tls_cafile, s.amqp_tls_min_version, s.amqp_node_order) == (
        True,
        None,
        "tlsv1.2",
        "round_robin",
    )
    message = config_error(tmp_path, "adapter.amqp_tls_min_version = sslv3\n")
    assert "must be one of tlsv1.2, tlsv1.3" in message
    message = config_error(tmp_path, "adapter.amqp_node_order = random\n")
    assert "must be one of round_robin, shuffle" in message


# ----------------------------------------------------------------------------------------------- web_stomp


def test_no_web_stomp_key_no_websocket_listener(tmp_path: Path) -> None:
    assert load_settings(write_ini(tmp_path, "stomp.default_vhost = /\n")).web_stomp_listeners == ()


def test_any_web_stomp_key_starts_the_listener_on_the_plugin_port(tmp_path: Path) -> None:
    s = load_settings(write_ini(tmp_path, "web_stomp.ws_frame = binary\n"))
    assert s.web_stomp_listeners == ("0.0.0.0:15674",)
    assert s.web_stomp_ws_frame == "binary"


def test_web_stomp_keys(tmp_path: Path) -> None:
    s = load_settings(
        write_ini(
            tmp_path,
            "web_stomp.tcp.port = 15999\n"
            "web_stomp.tcp.ip = 127.0.0.1\n"
            "web_stomp.ws_path = /stomp\n"
            "web_stomp.use_http_auth = true\n"
            "web_stomp.proxy_protocol = true\n"
            "web_stomp.ws_opts.compress = false\n"
            "web_stomp.ws_opts.max_frame_size = 50000\n"
            "web_stomp.ws_opts.idle_timeout = 30000\n"
            "web_stomp.cowboy_opts.idle_timeout = 5000\n"
            "web_stomp.allow_origins.1 = https://a.example\n"
            "web_stomp.allow_origins.2 = https://b.example\n"
            "web_stomp.ssl.port = 15673\n"
            "web_stomp.ssl.certfile = /etc/cert.pem\n"
            "web_stomp.ssl.versions.1 = tlsv1.3\n"
            "web_stomp.num_acceptors.tcp = 10\n",
        )
    )
    assert s.web_stomp_listeners == ("127.0.0.1:15999",)
    assert s.web_stomp_ssl_listeners == ("0.0.0.0:15673",)
    assert s.web_stomp_ws_path == "/stomp"
    assert s.web_stomp_use_http_auth and s.web_stomp_proxy_protocol and not s.web_stomp_compress
    assert s.web_stomp_max_frame_size == 50000
    # cowboy_opts.idle_timeout is checked and ignored: the plugin's request timeout stays 5 s
    assert (s.web_stomp_idle_timeout, s.web_stomp_request_timeout) == (30.0, 5.0)
    assert s.web_stomp_allow_origins == ("https://a.example", "https://b.example")
    assert s.web_stomp_ssl_versions == ("tlsv1.3",)


def test_web_stomp_listener_key_wins_and_ipv6(tmp_path: Path) -> None:
    s = load_settings(write_ini(tmp_path, "web_stomp.tcp.listener = [::1]:15700\nweb_stomp.tcp.port = 1\n"))
    assert s.web_stomp_listeners == ("[::1]:15700",)


def test_web_stomp_allow_origins_none_allows_every_origin_and_wins(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    none = write_ini(tmp_path, "web_stomp.allow_origins = none\n")
    assert load_settings(none).web_stomp_allow_origins == ()
    path = write_ini(
        tmp_path, "web_stomp.allow_origins.1 = https://a.example\nweb_stomp.allow_origins = none\n"
    )
    with caplog.at_level(logging.WARNING, logger="adapter.config"):
        assert load_settings(path).web_stomp_allow_origins == ()
    assert "allow_origins.<n> keys are ignored because of web_stomp.allow_origins = none" in caplog.text
    both = "web_stomp.allow_origins = https://b.example\nweb_stomp.allow_origins.1 = https://a.example\n"
    assert "keep one form" in config_error(tmp_path, both)


def test_web_stomp_allow_origins_none_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOMP_ADAPTER_WEB_STOMP_ALLOW_ORIGINS", "none")
    assert load_settings().web_stomp_allow_origins == ()


def test_web_stomp_listener_none(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # wss:// only, as the plugin's guide writes it
    path = write_ini(
        tmp_path,
        "web_stomp.tcp.listener = none\nweb_stomp.tcp.port = 15999\n"
        "web_stomp.ssl.port = 15673\nweb_stomp.ssl.certfile = /etc/cert.pem\n",
    )
    with caplog.at_level(logging.WARNING, logger="adapter.config"):
        s = load_settings(path)
    assert (s.web_stomp_listeners, s.web_stomp_ssl_listeners) == ((), ("0.0.0.0:15673",))
    assert "web_stomp.tcp.port is ignored because of web_stomp.tcp.listener = none" in caplog.text
    s = load_settings(write_ini(tmp_path, "web_stomp.ssl.listener = none\nweb_stomp.ssl.port = 15673\n"))
    assert (s.web_stomp_listeners, s.web_stomp_ssl_listeners) == (("0.0.0.0:15674",), ())


def test_web_stomp_values_the_plugin_schema_allows(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write_ini(
        tmp_path,
        "web_stomp.max_connections = infinity\n"
        "web_stomp.ws_opts.max_frame_size = 0\n"
        "web_stomp.ws_opts.idle_timeout = 0\n"
        "web_stomp.cowboy_opts.timeout = 0\n"
        "web_stomp.cowboy_opts.idle_timeout = 0\n",
    )
    with caplog.at_level(logging.WARNING, logger="adapter.config"):
        s = load_settings(path)
    assert (s.web_stomp_max_frame_size, s.web_stomp_idle_timeout) == (0, 0.0)
    assert s.web_stomp_request_timeout == 5.0  # cowboy's request_timeout, not the keys above
    assert "max_connections" not in caplog.text  # the default: accepted silently
    assert caplog.text.count("has no effect on WebSocket connections") == 2


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("web_stomp.max_connections = -1\n", "must be a non-negative integer or infinity"),
        ("web_stomp.cowboy_opts.timeout = -1\n", "an integer >= 0 (milliseconds)"),
        ("web_stomp.ssl.password = encrypted:abc\n", "web_stomp.ssl.password = 'encrypted:…'"),
        ("web_stomp.ws_frame = json\n", "must be one of text, binary"),
        ("web_stomp.ws_path = ws\n", "must be a path starting with /"),
        ("web_stomp.tcp.port = http\n", "must be a port"),
        ("web_stomp.max_connections = many\n", "must be a non-negative integer or infinity"),
        ("web_stomp.ssl.ciphers.1 = ECDHE-ECDSA-AES256-GCM-SHA384\n", "not supported"),
        ("web_stomp.ws_opts.idle_timeout = -1\n", "milliseconds"),
        ("web_stomp.ws_pth = /ws\n", "did you mean 'web_stomp.ws_path'"),
    ],
)
def test_web_stomp_errors_name_the_key(tmp_path: Path, text: str, problem: str) -> None:
    assert problem in config_error(tmp_path, text)


def test_web_stomp_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOMP_ADAPTER_WEB_STOMP_LISTENERS", "127.0.0.1:15674")
    monkeypatch.setenv("STOMP_ADAPTER_WEB_STOMP_ALLOW_ORIGINS", "https://a.example, https://b.example")
    s = load_settings()
    assert s.web_stomp_listeners == ("127.0.0.1:15674",)
    assert s.web_stomp_allow_origins == ("https://a.example", "https://b.example")


# ----------------------------------------------------------------------------------------------- caps


@pytest.mark.parametrize(
    ("text", "field", "value"),
    [
        ("stomp.max_connections = 10\n", "max_connections", 10),
        ("stomp.max_connections = 0\n", "max_connections", 0),
        ("stomp.max_connections = infinity\n", "max_connections", None),
        ("web_stomp.max_connections = 2\n", "web_stomp_max_connections", 2),
        ("web_stomp.max_connections = infinity\n", "web_stomp_max_connections", None),
    ],
)
def test_connection_caps_from_the_ini_file(tmp_path: Path, text: str, field: str, value: int | None) -> None:
    assert getattr(load_settings(write_ini(tmp_path, text)), field) == value


def test_connection_caps_default_to_no_limit() -> None:
    s = load_settings()
    assert (s.max_connections, s.web_stomp_max_connections) == (None, None)


@pytest.mark.parametrize("text", ["stomp.max_connections = -1\n", "stomp.max_connections = lots\n"])
def test_connection_cap_errors_name_the_key(tmp_path: Path, text: str) -> None:
    message = config_error(tmp_path, text)
    assert "line 1: stomp.max_connections = " in message
    assert "must be a non-negative integer or infinity" in message


def test_connection_caps_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOMP_ADAPTER_MAX_CONNECTIONS", "5")
    monkeypatch.setenv("STOMP_ADAPTER_WEB_STOMP_MAX_CONNECTIONS", "infinity")
    s = load_settings()
    assert (s.max_connections, s.web_stomp_max_connections) == (5, None)
    monkeypatch.setenv("STOMP_ADAPTER_MAX_CONNECTIONS", "-3")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "STOMP_ADAPTER_MAX_CONNECTIONS = '-3': must be a non-negative integer or infinity" in str(
        info.value
    )


@pytest.mark.parametrize("key", ["web_stomp.ssl.crl_check", "ssl_options.crl_check"])
@pytest.mark.parametrize("value", ["true", "peer", "best_effort"])
def test_crl_check_is_refused_naming_the_alternative(tmp_path: Path, key: str, value: str) -> None:
    message = config_error(tmp_path, f"{key} = {value}\n")
    assert f"key {key!r} is not supported" in message
    assert "proxy" in message and "CRL" in message


@pytest.mark.parametrize("key", ["web_stomp.ssl.crl_check", "ssl_options.crl_check"])
def test_crl_check_false_is_the_default_and_accepted(tmp_path: Path, key: str) -> None:
    load_settings(write_ini(tmp_path, f"{key} = false\n"))
    assert "must be one of" in config_error(tmp_path, f"{key} = maybe\n")


def test_web_stomp_compress_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().web_stomp_compress_budget == 256 * 1024 * 1024
    path = write_ini(tmp_path, "adapter.web_stomp_compress_budget = 0\n")
    assert load_settings(path).web_stomp_compress_budget == 0  # no WebSocket is compressed
    monkeypatch.setenv("STOMP_ADAPTER_WEB_STOMP_COMPRESS_BUDGET", "1048576")
    assert load_settings().web_stomp_compress_budget == 1048576
    assert "adapter.web_stomp_compress_budget" in config_error(
        tmp_path, "adapter.web_stomp_compress_budget = -1\n"
    )


@pytest.mark.parametrize(
    "url",
    [
        "amqp://user:sec,ret@localhost:5672/",
        "amqp://user:sec,ret@localhost:5672/,amqp://user:sec,ret@other:5672/",
        "amqp://user:,secret@localhost/",
        "amqp://user:secret,@localhost/",
        "amqps://node1/, amqp://user:sec,,ret@node2:5672/",
    ],
)
def test_a_comma_in_a_password_is_not_shown(
    tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A comma separates broker nodes, so the list used to be split before it was redacted: a
    password with an unencoded comma came out in two halves, each in clear (issue 33, item 7).
    Redacting happens before splitting, on every path an operator writes the URL: the ini
    file, the variable and the flag."""
    assert "sec" not in redact_url(url).replace("amqps://node1/", "")
    message = config_error(tmp_path, f"adapter.amqp_url = {url}\n")
    assert "secret" not in message and "sec,ret" not in message and "ret@" not in message
    monkeypatch.setenv("STOMP_ADAPTER_AMQP_URL", url)
    with pytest.raises(ConfigError) as info:
        load_settings(None)
    assert "secret" not in str(info.value) and "ret@" not in str(info.value)
    monkeypatch.delenv("STOMP_ADAPTER_AMQP_URL")
    from adapter import cli

    assert cli.main(["--check-config", "--amqp-url", url]) != 0
    printed = capsys.readouterr()
    assert "secret" not in printed.err + printed.out and "ret@" not in printed.err + printed.out
    assert "percent-encode" in printed.err


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("amqps://u:p,amqp://x@h", "p,amqp://x"),  # a comma and a scheme inside the password
        ("amqp://user:s3@cr/et@127.0.0.1:5672/", "s3@cr/et"),  # an @ that would make a host of it
    ],
)
def test_a_password_that_looks_like_more_urls_or_hosts_is_refused_and_not_shown(
    tmp_path: Path, url: str, secret: str
) -> None:
    message = config_error(tmp_path, f"adapter.amqp_url = {url}\n")
    assert secret not in message and "cr/et" not in message and ",amqp://x" not in message
    assert "percent-encode" in message or "must be amqp://" in message
