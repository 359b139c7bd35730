"""The tap's command line (adapter/tap/main.py) and its hook in ``stomp-amqp-adapter``."""

from __future__ import annotations

import pytest

from adapter import cli
from adapter.tap.main import UsageError, parse_address


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
    with pytest.raises(SystemExit) as exit_:
        cli.main(["tap", "--help"])
    assert exit_.value.code == 0 and "--record-bodies" in capsys.readouterr().out
