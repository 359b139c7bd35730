"""adapter/amqp/link.py: the two kinds of a session's AMQP link offer the same interface.

``SessionLink`` is what the server uses of a link; a connection of the session's own
(``AmqpConnection``), a channel on a shared connection (``ChannelLink``) and the shell tests'
in-memory stand-in (``FakeAmqp``) must each offer every member of it, methods with the same
parameters (names, kinds, defaults) and the same async-ness, read from the link itself (a
link's per-message methods are its channel core's, bound when it is made).  So a member added to the interface
(or to one kind) and missed by another fails here, not in production with multiplexing on.
mypy checks the types wherever a link is handed on; this checks the surface at run time, read
from the Protocol itself."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from adapter.amqp.channel import ChannelCore
from adapter.amqp.connection import AmqpConnection
from adapter.amqp.link import AsyncChannel, SessionLink
from adapter.amqp.shared import ChannelLink
from tests.unit.fake_amqp import FakeAmqp
from tests.unit.test_amqp_connection import Events
from tests.unit.test_amqp_shared import open_shared

MEMBERS = sorted(
    {*SessionLink.__annotations__, *(name for name in vars(SessionLink) if not name.startswith("_"))}
)
METHODS = [name for name in MEMBERS if inspect.isfunction(vars(SessionLink).get(name))]


def test_the_interface_is_read_whole() -> None:
    assert {"publish", "ack", "execute", "flush", "close", "drop", "is_open", "broker_generation"} <= set(
        MEMBERS
    )
    assert "is_open" not in METHODS and "execute" in METHODS


async def links() -> dict[str, Any]:
    carrier, _transport = await open_shared()
    return {
        "AmqpConnection": AmqpConnection(Events(), heartbeat=0, connection_name="x"),  # type: ignore[arg-type]
        "ChannelLink": carrier.new_link(Events()),  # type: ignore[arg-type]
        "FakeAmqp": FakeAmqp(Events()),
    }


def shape(function: Any) -> tuple[list[tuple[str, Any, Any]], bool]:
    """Parameters (name, kind, default) but ``self``, and whether it is a coroutine function."""
    signature = inspect.signature(function)
    parameters = [(p.name, p.kind, p.default) for p in signature.parameters.values() if p.name != "self"]
    return parameters, inspect.iscoroutinefunction(function)


@pytest.mark.parametrize("kind", ["AmqpConnection", "ChannelLink", "FakeAmqp"])
async def test_each_kind_offers_the_whole_interface(kind: str) -> None:
    link = (await links())[kind]
    missing = [name for name in MEMBERS if not hasattr(link, name)]
    assert missing == [], f"{kind} lacks {missing}"
    for name in METHODS:
        assert shape(getattr(link, name)) == shape(vars(SessionLink)[name]), f"{kind}.{name}"


async def test_both_kinds_are_made_of_the_same_parts_and_neither_is_the_other() -> None:
    """Composed, not extended: each kind holds an AsyncChannel (a channel core and its call's
    future) and derives from nothing of the adapter."""
    kinds = await links()
    for kind in ("AmqpConnection", "ChannelLink"):
        parts = [value for value in vars(kinds[kind]).values() if isinstance(value, AsyncChannel)]
        assert len(parts) == 1, kind
    assert AmqpConnection.__mro__ == (AmqpConnection, object)
    assert ChannelLink.__mro__ == (ChannelLink, object)
    for kind in ("AmqpConnection", "ChannelLink"):  # per message: the channel core's own methods
        assert kinds[kind].publish.__func__ is ChannelCore.publish, kind
        assert kinds[kind].ack.__func__ is ChannelCore.ack, kind


async def test_a_channel_link_has_none_of_a_connection_of_its_own() -> None:
    """A join costs a few small objects: no socket, handshake future, heart-beat timer or pool identity
    of its own (those are the carrier's)."""
    link = (await links())["ChannelLink"]
    assert not any(
        hasattr(link, name) for name in ("socket", "_handshake", "_heartbeat_handle", "pool_identity")
    )
    assert link._socket is link.carrier.socket  # the carrier's, not a copy
