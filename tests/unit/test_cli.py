"""The command line (adapter/cli.py): --version, and --check-config, which loads and checks the
configuration as start-up does (ini file, variables, flags, the TLS files they name) and exits 0,
or 2 with exactly the messages start-up would stop with."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trustme

from adapter import cli

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("STOMP_ADAPTER_"):
            monkeypatch.delenv(name)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def check_and_start(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """--check-config and start-up on the same bad configuration: both exit 2 with the same
    message (start-up stops before it binds anything)."""
    checked = run(capsys, "--check-config", *argv)
    started = run(capsys, *argv)
    assert checked == started
    code, out, err = checked
    assert (code, out) == (2, "")
    assert err.startswith("stomp-amqp-adapter: configuration error:\n")
    return err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"stomp-amqp-adapter {cli.version()}\n"
    assert cli.version() != "unknown"  # the test environment has the package installed


def test_check_config_ok(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, "--check-config", "--config", str(REPO / "config" / "adapter.ini"))
    assert (code, err) == (0, "")
    assert out.startswith("stomp-amqp-adapter: configuration OK (")
    assert str(REPO / "config" / "adapter.ini") in out
    assert run(capsys, "--check-config", "--listen", "127.0.0.1:1", "--workers", "4")[0] == 0


def test_check_config_with_tls_files_that_load(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    ini = tmp_path / "tls.ini"
    ini.write_text(
        f"stomp.listeners.ssl.default = 127.0.0.1:0\nssl_options.certfile = {tmp_path / 'cert.pem'}\n"
        f"ssl_options.keyfile = {tmp_path / 'key.pem'}\n"
    )
    assert run(capsys, "--check-config", "--config", str(ini))[0] == 0


def test_check_config_bad_ini(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    ini = tmp_path / "bad.ini"
    ini.write_text("stomp.max_frame_size = abc\n")
    err = check_and_start(capsys, "--config", str(ini))
    assert err.endswith(f"{ini} line 1: stomp.max_frame_size = 'abc': must be a positive integer\n")


def test_check_config_bad_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STOMP_ADAPTER_TRAILING_LF", "1")
    monkeypatch.setenv("STOMP_ADAPTER_MAX_CONNECTIONS", "-3")
    err = check_and_start(capsys)
    assert "environment: STOMP_ADAPTER_TRAILING_LF = '1': must be true or false" in err
    assert "STOMP_ADAPTER_MAX_CONNECTIONS = '-3': must be a non-negative integer or infinity" in err


def test_check_config_bad_flag(capsys: pytest.CaptureFixture[str]) -> None:
    err = check_and_start(capsys, "--listen", "127.0.0.1:70000")
    assert "command line: --listen = ['127.0.0.1:70000']" in err


def test_check_config_missing_tls_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    ini = tmp_path / "tls.ini"
    missing = tmp_path / "no-such-cert.pem"
    ini.write_text(f"stomp.listeners.ssl.default = 127.0.0.1:0\nssl_options.certfile = {missing}\n")
    err = check_and_start(capsys, "--config", str(ini))
    assert err.endswith(f"ssl_options.certfile = {missing}: no such file\n")


def test_check_config_missing_broker_ca_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    err = check_and_start(
        capsys,
        "--amqp-url",
        "amqps://broker.example/",
        "--config",
        str(_ini(tmp_path, "/nonexistent/ca.pem")),
    )
    assert err.endswith("adapter.amqp_tls_cafile = /nonexistent/ca.pem: no such file\n")


def _ini(tmp_path: Path, cafile: str) -> Path:
    path = tmp_path / "broker.ini"
    path.write_text(f"adapter.amqp_tls_cafile = {cafile}\n")
    return path


def test_check_config_as_a_process(tmp_path: Path) -> None:
    """The exit codes an operator's script sees."""
    environment = {k: v for k, v in os.environ.items() if not k.upper().startswith("STOMP_ADAPTER_")}
    good = subprocess.run(
        [sys.executable, "-m", "adapter", "--check-config"], capture_output=True, text=True, env=environment
    )
    assert (good.returncode, good.stderr) == (0, "")
    environment["STOMP_ADAPTER_WORKERS"] = "0"
    bad = subprocess.run(
        [sys.executable, "-m", "adapter", "--check-config"], capture_output=True, text=True, env=environment
    )
    assert bad.returncode == 2
    assert "environment: STOMP_ADAPTER_WORKERS = '0': must be an integer from 1 to 256" in bad.stderr
