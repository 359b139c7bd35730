"""Loading the TLS certificates and keys named by the settings (adapter/cli.py): start-up
errors name the setting and the file, and an encrypted key without a password is refused at
once instead of OpenSSL asking for a pass phrase on the terminal.  Certificates come from
trustme, made for the test run."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme
from cryptography.hazmat.primitives import serialization

from adapter.cli import broker_tls_context, listener_tls_context, web_tls_context
from adapter.config import ConfigError, load_settings


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    cert = ca.issue_cert("localhost")
    paths = {name: directory / f"{name}.pem" for name in ("ca", "cert", "key", "encrypted_key")}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    cert.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    cert.private_key_pem.write_to_path(str(paths["key"]))
    key = serialization.load_pem_private_key(cert.private_key_pem.bytes(), password=None)
    paths["encrypted_key"].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"s3cret"),
        )
    )
    return paths


def listener(**overrides: object) -> object:
    return listener_tls_context(load_settings(None, {"ssl_listeners": ["127.0.0.1:0"], **overrides}))


def error_of(build: object, **overrides: object) -> str:
    with pytest.raises(ConfigError) as info:
        build(**overrides)  # type: ignore[operator]
    return str(info.value)


def test_an_encrypted_key_with_its_password_loads(files: dict[str, Path]) -> None:
    assert listener(
        ssl_certfile=str(files["cert"]), ssl_keyfile=str(files["encrypted_key"]), ssl_password="s3cret"
    )


def test_an_encrypted_key_without_a_password_is_refused_without_a_prompt(files: dict[str, Path]) -> None:
    message = error_of(listener, ssl_certfile=str(files["cert"]), ssl_keyfile=str(files["encrypted_key"]))
    assert message == "ssl_options.keyfile: the private key is encrypted: set ssl_options.password"


def test_a_wrong_password_names_the_files(files: dict[str, Path]) -> None:
    message = error_of(
        listener,
        ssl_certfile=str(files["cert"]),
        ssl_keyfile=str(files["encrypted_key"]),
        ssl_password="nope",
    )
    assert f"ssl_options.keyfile = {files['encrypted_key']}" in message and "wrong password" in message


@pytest.mark.parametrize("setting", ["ssl_certfile", "ssl_keyfile", "ssl_cacertfile"])
def test_a_missing_file_is_named_with_its_setting(files: dict[str, Path], setting: str) -> None:
    settings = {
        "ssl_certfile": str(files["cert"]),
        "ssl_keyfile": str(files["key"]),
        setting: "/nonexistent.pem",
    }
    message = error_of(listener, **settings)
    assert message == f"ssl_options.{setting.removeprefix('ssl_')} = /nonexistent.pem: no such file"


def test_the_wss_listener_names_its_own_settings(files: dict[str, Path]) -> None:
    message = error_of(
        lambda **o: web_tls_context(load_settings(None, o)),
        web_stomp_ssl_listeners=["127.0.0.1:0"],
        web_stomp_ssl_certfile=str(files["cert"]),
        web_stomp_ssl_keyfile=str(files["encrypted_key"]),
    )
    assert message == "web_stomp.ssl.keyfile: the private key is encrypted: set web_stomp.ssl.password"


def test_the_broker_side_names_its_settings(files: dict[str, Path]) -> None:
    def broker(**overrides: object) -> object:
        return broker_tls_context(load_settings(None, overrides))

    assert error_of(broker, amqp_tls_cafile="/nonexistent.pem") == (
        "adapter.amqp_tls_cafile = /nonexistent.pem: no such file"
    )
    message = error_of(
        broker, amqp_tls_certfile=str(files["cert"]), amqp_tls_keyfile=str(files["encrypted_key"])
    )
    assert (
        message
        == "adapter.amqp_tls_keyfile: the private key is encrypted: this setting takes an unencrypted key"
    )
    assert broker(
        amqp_tls_cafile=str(files["ca"]),
        amqp_tls_certfile=str(files["cert"]),
        amqp_tls_keyfile=str(files["key"]),
    )
