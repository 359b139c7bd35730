"""STOMP frames as data: the command set, the frame value object and the protocol versions.

Owns nothing but plain data. Must not import asyncio, aio-pika, pamqp or pydantic.

Header names and values are ``str`` decoded from UTF-8 with ``errors="surrogateescape"``, so any
byte sequence a client sends survives a decode/encode round trip unchanged (the plugin does no
UTF-8 validation, docs/behaviour.md#limits).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Command(StrEnum):
    """Every command a STOMP 1.0-1.2 client or server may send."""

    CONNECT = "CONNECT"
    STOMP = "STOMP"
    SEND = "SEND"
    SUBSCRIBE = "SUBSCRIBE"
    UNSUBSCRIBE = "UNSUBSCRIBE"
    ACK = "ACK"
    NACK = "NACK"
    BEGIN = "BEGIN"
    COMMIT = "COMMIT"
    ABORT = "ABORT"
    DISCONNECT = "DISCONNECT"
    # server frames
    CONNECTED = "CONNECTED"
    MESSAGE = "MESSAGE"
    RECEIPT = "RECEIPT"
    ERROR = "ERROR"


CLIENT_COMMANDS = frozenset(
    {
        Command.CONNECT,
        Command.STOMP,
        Command.SEND,
        Command.SUBSCRIBE,
        Command.UNSUBSCRIBE,
        Command.ACK,
        Command.NACK,
        Command.BEGIN,
        Command.COMMIT,
        Command.ABORT,
        Command.DISCONNECT,
    }
)

SUPPORTED_VERSIONS = ("1.0", "1.1", "1.2")


@dataclass(slots=True)
class Frame:
    """One STOMP frame.

    ``command`` is kept as the raw text the client sent: an unknown command is not a parse
    error but a ``Bad command`` ERROR (docs/behaviour.md#limits), so the session, not the codec, decides
    what it means.  ``headers`` keeps the first occurrence of
    each name in arrival order (STOMP 1.2 "Repeated Header Entries").
    """

    command: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def get(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name, default)
