"""CONNECT through stomp.py (1.0, 1.1, 1.2) and raw sockets: versions, credentials, vhosts."""

from __future__ import annotations

import re
import socket

import pytest

from tests.support import StompClient, frame_headers, read_frames


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_stomp_py_connects_with_each_version(stomp_client, version):
    client = stomp_client(version)
    connected = client.next("CONNECTED")
    assert connected.headers["version"] == version
    assert re.fullmatch(r"session-[A-Za-z0-9_-]{22}", connected.headers["session"])
    assert connected.headers["server"].startswith("RabbitMQ/")
    assert client.conn.is_connected()


def _connect_raw(sock: socket.socket, headers: str) -> tuple[str, dict[str, str], bytes, bool]:
    sock.sendall(f"CONNECT\n{headers}\n\0".encode())
    frames, closed = read_frames(sock, timeout=5, count=1)
    assert frames, "no answer to CONNECT"
    command, hdrs, body = frame_headers(frames[0])
    return command, hdrs, body, closed


def test_wrong_password_is_refused_and_closed(raw_socket):
    command, headers, body, closed = _connect_raw(
        raw_socket(), "accept-version:1.2\nhost:/\nlogin:guest\npasscode:wrong\n"
    )
    assert command == "ERROR"
    assert headers["message"] == "Bad CONNECT"
    assert body == b"Access refused for user 'guest'\n"
    assert closed


def test_unknown_vhost_is_refused(raw_socket):
    command, headers, body, closed = _connect_raw(
        raw_socket(), "accept-version:1.2\nhost:no-such-vhost\nlogin:guest\npasscode:guest\n"
    )
    assert (command, headers["message"]) == ("ERROR", "Bad CONNECT")
    assert body == b"Virtual host 'no-such-vhost' access denied"
    assert closed


def test_version_mismatch_lists_supported_versions(raw_socket):
    command, headers, body, closed = _connect_raw(raw_socket(), "accept-version:2.0\nhost:/\n")
    assert (command, headers["message"]) == ("ERROR", "Version mismatch")
    assert headers["version"] == "1.0,1.1,1.2"
    assert body == b"Supported versions are 1.0,1.1,1.2\n"
    assert closed


@pytest.mark.parametrize(
    ("accept", "expected"),
    [("1.2,1.0", "1.2"), ("1.1,2.0", "1.1"), ("1.0,1.1,1.2,1.3", "1.2"), (None, "1.0")],
)
def test_version_negotiation_picks_highest_common(raw_socket, accept, expected):
    line = f"accept-version:{accept}\n" if accept else ""
    command, headers, _, closed = _connect_raw(raw_socket(), f"{line}host:/\nlogin:guest\npasscode:guest\n")
    assert command == "CONNECTED"
    assert headers["version"] == expected
    assert not closed


def test_default_user_applies_without_login(raw_socket):
    # no login/passcode: the configured default user (guest/guest), as in the plugin
    command, _, _, _ = _connect_raw(raw_socket(), "accept-version:1.2\nhost:/\n")
    assert command == "CONNECTED"


def test_stomp_command_is_an_alias_of_connect(raw_socket):
    sock = raw_socket()
    sock.sendall(b"STOMP\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0")
    frames, _ = read_frames(sock, timeout=5, count=1)
    assert frame_headers(frames[0])[0] == "CONNECTED"


def test_frame_before_connect_is_refused(raw_socket):
    sock = raw_socket()
    sock.sendall(b"SEND\ndestination:/queue/x\n\nhello\0")
    frames, closed = read_frames(sock, timeout=5, count=1)
    command, headers, body = frame_headers(frames[0])
    assert (command, headers["message"]) == ("ERROR", "Illegal command")
    assert body == b"You must log in using CONNECT first"
    assert closed


def test_loopback_users_none_allows_guest(start_adapter):
    allowed = start_adapter(loopback_users="none")
    client = StompClient(allowed.port)
    assert client.conn.is_connected()
    client.close()


def test_loopback_only_user_from_non_loopback_address(start_adapter):
    # Every adapter connection reaches RabbitMQ from the adapter's own host, so the adapter
    # applies loopback_users itself, to the STOMP client's address.
    server = start_adapter(listeners=["0.0.0.0:0"])
    address = _non_loopback_address()
    if address is None:
        pytest.fail("this machine has no non-loopback IPv4 address to test from")
    sock = socket.create_connection((address, server.port), timeout=5)
    try:
        command, headers, body, closed = _connect_raw(
            sock, "accept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n"
        )
    finally:
        sock.close()
    assert (command, headers["message"], body) == ("ERROR", "Bad CONNECT", b"non-loopback access denied")
    assert closed


def _non_loopback_address() -> str | None:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # TEST-NET address: no packet is sent for a UDP connect
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") else address


def test_disconnect_with_receipt(stomp_client):
    client = stomp_client("1.2")
    client.conn.disconnect(receipt="bye")
    assert client.next("RECEIPT").headers["receipt-id"] == "bye"
