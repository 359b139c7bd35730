"""The file-descriptor warnings: "near the limit" (connections still accepted) and "at the
limit" (the operating system refuses them) are different lines, each rate-limited on its own."""

from __future__ import annotations

import logging

import pytest

from adapter.server.fdlimit import DescriptorWatch


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]


def test_a_socket_below_the_last_5_percent_is_not_reported(caplog):
    watch = DescriptorWatch(limit=1000, clock=Clock())
    with caplog.at_level(logging.WARNING, "adapter.server"):
        watch.accepted(949)
    assert warnings(caplog) == []


def test_near_the_limit_says_connections_are_still_accepted(caplog):
    watch = DescriptorWatch(limit=1000, clock=Clock())
    with caplog.at_level(logging.WARNING, "adapter.server"):
        watch.accepted(950)
    [line] = warnings(caplog)
    assert line.startswith("file descriptors running low: accepted a connection as file descriptor 950")
    assert "of a limit of 1000" in line
    assert "connections are still accepted" in line
    assert "out of file descriptors" not in line and "refuses new connections" not in line


def test_at_the_limit_says_the_system_refuses_new_connections(caplog):
    watch = DescriptorWatch(limit=1000, clock=Clock())
    with caplog.at_level(logging.WARNING, "adapter.server"):
        watch.exhausted("accept() failed: Too many open files")
    [line] = warnings(caplog)
    assert line.startswith("out of file descriptors (accept() failed: Too many open files)")
    assert "the operating system refuses new connections until some close" in line


def test_a_small_limit_warns_within_its_last_8_descriptors(caplog):
    watch = DescriptorWatch(limit=64, clock=Clock())
    with caplog.at_level(logging.WARNING, "adapter.server"):
        watch.accepted(55)
        watch.accepted(56)
    assert len(warnings(caplog)) == 1


def test_each_kind_is_rate_limited_on_its_own(caplog):
    clock = Clock()
    watch = DescriptorWatch(limit=1000, clock=clock)
    with caplog.at_level(logging.WARNING, "adapter.server"):
        watch.accepted(990)
        watch.accepted(991)  # within 10 s of the first: not repeated
        watch.exhausted("accept() failed")  # the first "at the limit" is never held back by a "near"
        watch.exhausted("accept() failed")
        clock.now += 10.0
        watch.accepted(992)
        watch.exhausted("cannot open an AMQP connection")
    lines = warnings(caplog)
    assert [line.split(":")[0] for line in lines] == [
        "file descriptors running low",
        "out of file descriptors (accept() failed)",
        "file descriptors running low",
        "out of file descriptors (cannot open an AMQP connection)",
    ]


def test_the_last_descriptor_is_at_the_limit(caplog):
    """uvloop drops the connections it cannot accept without a word: a socket accepted as the
    last descriptor is how the adapter knows the next ones are refused."""
    watch = DescriptorWatch(limit=64, clock=Clock())
    with caplog.at_level(logging.WARNING, "adapter.server"):
        watch.accepted(62)
        watch.accepted(63)
    near, at = warnings(caplog)
    assert near.startswith("file descriptors running low")
    assert at.startswith("out of file descriptors (accepted a connection as the last file descriptor, 63")
