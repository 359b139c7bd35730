"""Each setting is declared once (adapter/config/settings.py): the declarations are complete and consistent,
everything derived from them (ini keys, environment variables, flags, the server's option groups)
agrees with them, and read_ini's table of key families has one handler per key."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

from adapter import cli, config
from adapter.config import DECLARED, ConfigError, Group, Settings, load_settings
from adapter.server import options
from adapter.server.connection import ServerState

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("STOMP_ADAPTER_"):
            monkeypatch.delenv(name)


def test_every_field_is_declared_once_with_a_default_its_converter_keeps() -> None:
    assert list(DECLARED) == list(Settings.model_fields)
    for name, declared in DECLARED.items():
        assert declared.setting.convert(declared.default) == declared.default, name
        assert getattr(Settings(), name) == declared.default


def test_a_field_without_a_declaration_is_refused() -> None:
    class Bare(Settings):
        extra_setting: int = 1

    with pytest.raises(TypeError, match="setting extra_setting: declare it as Annotated"):
        config._declarations(Bare)  # noqa: SLF001


def test_every_group_has_settings_and_every_setting_a_group() -> None:
    groups = {declared.setting.group for declared in DECLARED.values()}
    assert groups == set(Group)


@pytest.mark.parametrize(
    "name",
    [
        # the settings the hardening work added (issue #24): all declared, with their keys
        "max_connections",
        "web_stomp_max_connections",
        "proxy_protocol_trusted",
        "max_transaction_bytes",
        "transaction_bytes_budget",
        "max_unacked_bytes",
        "unacked_bytes_budget",
        "web_stomp_compress_budget",
    ],
)
def test_the_hardening_settings_are_declared(name: str) -> None:
    declared = DECLARED[name]
    assert declared.setting.keys, name
    assert declared.setting.group is Group.LIMITS or name == "proxy_protocol_trusted"


def test_crl_check_refusals_are_a_key_family() -> None:
    for key in ("ssl_options.crl_check", "web_stomp.ssl.crl_check"):
        assert config._handler(key) is config._IniReader.unsupported  # noqa: SLF001


def test_ini_keys_are_unique_and_each_is_shown_in_the_example_file() -> None:
    example = (REPO / "config" / "adapter.ini").read_text()
    seen: dict[str, str] = {}
    for name, declared in DECLARED.items():
        for key in declared.setting.keys:
            assert key.name not in seen, (key.name, seen.get(key.name), name)
            seen[key.name] = name
        if declared.setting.keys:  # the first spelling is the one config/adapter.ini shows
            assert declared.setting.keys[0].name in example, name
        else:  # set by a key family, or by its variable only
            assert declared.setting.family or name == "web_stomp_request_timeout", name


def _written(name: str, value: object) -> str:
    """``value`` as an operator writes it in the ini file or a variable."""
    if isinstance(value, tuple):
        # an empty list of TLS versions is written as nothing (all the platform offers)
        return ",".join(value) if value else "" if name.endswith("_versions") else "none"
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "infinity" if name.endswith("max_connections") else "none"
    return str(value)


@pytest.mark.parametrize("name", list(DECLARED))
def test_each_setting_is_read_from_its_variable(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The variable is STOMP_ADAPTER_<NAME>; its value written as the default is read back as
    the default, and a value the converter refuses names the variable."""
    declared = DECLARED[name]
    assert declared.env == f"STOMP_ADAPTER_{name.upper()}"
    default = declared.default
    monkeypatch.setenv(declared.env.lower(), _written(name, default))  # names are not case-sensitive
    assert getattr(load_settings(), name) == default
    try:
        declared.setting.convert("!bad value!")
    except ValueError as error:
        monkeypatch.setenv(declared.env, "!bad value!")
        monkeypatch.delenv(declared.env.lower(), raising=False)
        with pytest.raises(ConfigError) as info:
            load_settings()
        assert str(info.value).startswith(f"environment: {declared.env} = ")
        assert str(error) in str(info.value)


@pytest.mark.parametrize("name", [name for name, d in DECLARED.items() if d.setting.keys])
def test_each_ini_key_sets_its_setting(name: str, tmp_path: Path) -> None:
    declared = DECLARED[name]
    for key in declared.setting.keys:
        value = getattr(Settings(), name)
        if key.name in ("stomp.login_timeout", "web_stomp.ws_opts.idle_timeout"):
            written = str(int(value * 1000))  # milliseconds, as in the plugin
        else:
            written = _written(name, value)
        path = tmp_path / "one.ini"
        path.write_text(f"{key.name} = {written}\n")
        assert getattr(load_settings(path), name) == value, key.name


def test_secrets_are_never_shown() -> None:
    secret = {name for name, declared in DECLARED.items() if declared.secret}
    assert secret == {"default_pass", "ssl_password", "web_stomp_ssl_password"}
    assert DECLARED["default_pass"].shown("hunter2") == "'***'"
    assert DECLARED["amqp_url"].shown("amqp://u:hunter2@h/") == "'amqp://u:***@h/'"


def test_every_flag_is_in_the_help_and_sets_its_setting() -> None:
    parser = cli.build_parser()
    help_text = parser.format_help()
    flagged = {name: d.setting.flag for name, d in DECLARED.items() if d.setting.flag is not None}
    assert set(flagged) >= {"listeners", "amqp_url", "log_level", "profile", "workers"}
    for name, flag in flagged.items():
        assert flag is not None and flag.option in help_text
        assert name in vars(parser.parse_args([]))
    for option in ("--config", "--check-config", "--version"):
        assert option in help_text
    args = parser.parse_args(["--listen", "1", "--listen", "2", "--amqp-connection-reuse", "--workers", "3"])
    given = cli.command_line_settings(args)
    assert (given["listeners"], given["amqp_connection_reuse"], given["workers"]) == (["1", "2"], True, "3")
    assert given["log_level"] is None


def test_a_bad_flag_value_names_the_flag() -> None:
    with pytest.raises(
        ConfigError, match="^command line: --workers = '0': must be an integer from 1 to 256$"
    ):
        load_settings(None, {"workers": "0"})


def _field_names(cls: type[Any]) -> set[str]:
    return {item.name for item in dataclasses.fields(cls)}


def test_the_server_groups_filled_by_name_are_settings() -> None:
    """cli.group fills Limits, Operations and SocketOptions from the settings of the same name."""
    for cls in (options.Limits, options.SocketOptions):
        assert _field_names(cls) <= set(DECLARED), cls
    assert _field_names(options.Operations) - set(DECLARED) == set()
    with pytest.raises(TypeError, match="neither given nor a setting"):
        cli.group(options.AmqpOptions, Settings())


def test_the_server_built_from_the_groups_has_what_a_connection_reads() -> None:
    settings = load_settings(None, {"listeners": ["127.0.0.1:0"], "metrics_destinations": 3})
    server = cli.build_server(settings)
    context = server.context  # what the server hands each connection
    for name in [*ServerState.__annotations__, "spawn", "tune_socket", "add_finished"]:
        assert hasattr(context, name), name
    assert context.login_timeout == settings.login_timeout
    assert context.limits.frame_timeout == settings.frame_timeout  # the group, passed whole
    assert context.heartbeat_tolerance == settings.heartbeat_tolerance
    assert context.incomplete_input_budget == settings.incomplete_frames_budget
    assert server.operations.shutdown_timeout == settings.shutdown_timeout
    assert list(server.listening.stomp) == [("127.0.0.1", 0)]
    assert context.stats.destinations is not None


def test_ini_key_families_have_one_handler_each() -> None:
    reader = config._IniReader  # noqa: SLF001
    assert config._handler("stomp.listeners.tcp.default") is reader.tcp_listener  # noqa: SLF001
    assert config._handler("stomp.listeners.tcp.") is reader.unknown  # noqa: SLF001
    assert config._handler("adapter.amqp_url.one") is reader.amqp_node  # noqa: SLF001
    assert config._handler("adapter.amqp_url") is reader.declared  # noqa: SLF001
    assert config._handler("web_stomp.ssl.password") is reader.web_password  # noqa: SLF001
    assert config._handler("stomp.num_acceptors.ssl") is reader.ignored  # noqa: SLF001
    for key in config._KEYS:  # noqa: SLF001
        assert config._handler(key) in (reader.declared, reader.web_password), key  # noqa: SLF001
