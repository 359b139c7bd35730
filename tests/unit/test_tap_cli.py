"""The tap's command line (adapter/tap/main.py) and its hook in ``stomp-amqp-adapter``."""

from __future__ import annotations

import pytest

from adapter import cli
from adapter.tap.main import UsageError, build_parser, parse_address, upstream_trust


def test_addresses_are_host_port_or_bracketed_ipv6():
    assert parse_address("0.0.0.0:61613", "--listen") == ("0.0.0.0", 61613)
    assert parse_address("[::1]:61613", "--listen") == ("::1", 61613)
    assert parse_address("broker.example:0", "--upstream") == ("broker.example", 0)
    for bad in ("61613", "host:", "host:port", "host:70000"):
        with pytest.raises(UsageError, match="expected HOST:PORT"):
            parse_address(bad, "--upstream")


def test_stomp_amqp_adapter_tap_runs_the_tap_command(tmp_path, capsys):
    common = ["tap", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1", "--record", str(tmp_path)]
    assert cli.main([*common, "--upstream-tls-cafile", "ca.pem"]) == 2
    assert "--upstream-tls-cafile needs --upstream-tls" in capsys.readouterr().err
    assert cli.main([*common[:-2], "--record", str(tmp_path), "--upstream", "nonsense"]) == 2
    assert "expected HOST:PORT" in capsys.readouterr().err
    assert cli.main([*common, "--queue-bytes", "1000000", "--max-record-bytes", "1000001"]) == 2
    assert "--max-record-bytes 1000001 is more than --queue-bytes 1000000" in capsys.readouterr().err
    assert cli.main([*common, "--max-record-bytes", "65535"]) == 2
    assert "--max-record-bytes must be at least 65536" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        cli.main(["tap", "--help"])
    assert exit_.value.code == 0 and "--record-bodies" in capsys.readouterr().out


def test_the_log_names_the_cas_the_upstream_is_checked_against(tmp_path, monkeypatch):
    """--upstream-tls-cafile, or the default trust store where SSL_CERT_FILE / SSL_CERT_DIR point
    (OpenSSL reads them when the default context loads its CAs), or nothing when not checked."""
    common = ["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1", "--record", str(tmp_path)]
    parser = build_parser()
    cafile = tmp_path / "ca.pem"
    cafile.write_text("")
    assert upstream_trust(parser.parse_args(common)) == ""
    assert (
        upstream_trust(parser.parse_args([*common, "--upstream-tls", "--upstream-tls-verify", "false"])) == ""
    )
    assert (
        upstream_trust(parser.parse_args([*common, "--upstream-tls", "--upstream-tls-cafile", str(cafile)]))
        == f"--upstream-tls-cafile {cafile}"
    )
    monkeypatch.setenv("SSL_CERT_FILE", str(cafile))
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path))
    assert upstream_trust(parser.parse_args([*common, "--upstream-tls"])) == (
        f"the default trust store (file {cafile}, directory {tmp_path})"
    )
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "missing.pem"))
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path / "missing"))
    assert upstream_trust(parser.parse_args([*common, "--upstream-tls"])) == (
        "the default trust store (no file or directory found)"
    )


def test_busy_polling_is_on_by_default_and_bounded(tmp_path, capsys):
    """--busy-poll-microseconds: off (0) by default in the tap, where it cost throughput
    (docs/performance.md), on with a window of up to 10,000 µs, nothing negative or above."""
    from adapter.tap.main import settings_from

    common = ["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1", "--record", str(tmp_path)]
    parser = build_parser()
    assert settings_from(parser.parse_args(common)).busy_poll_microseconds == 0
    on = settings_from(parser.parse_args([*common, "--busy-poll-microseconds", "50"]))
    assert on.busy_poll_microseconds == 50
    for bad in ("-1", "10001", "many"):
        with pytest.raises(SystemExit):
            parser.parse_args([*common, "--busy-poll-microseconds", bad])
    assert "--busy-poll-microseconds" in capsys.readouterr().err
