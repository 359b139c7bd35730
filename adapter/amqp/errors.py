"""The AMQP side's errors and the one table of broker reply codes.

Owns ``REPLY_CODE_NAMES`` (AMQP 0-9-1 reply codes -> the snake_case names RabbitMQ's STOMP plugin
puts in an ERROR frame's ``message`` header, docs/behaviour.md#error-handling), ``AmqpError``
(the broker closed the channel or connection, or the link died) and the one place where the wire
encoder's own ``EncodeError`` becomes a STOMP error (``stomp_error``).  The asyncio link and the
Spark reader's blocking client both name reply codes through ``reply_code_name``.

Pure: standard library and the mapping layer's error class only; no asyncio, no sockets.
"""

from __future__ import annotations

from typing import Final

from ..mapping.destinations import ProcessingError
from .wire import EncodeError

# AMQP 0-9-1 reply codes (the spec's constants, RabbitMQ's names) -> the plugin's ERROR message.
REPLY_CODE_NAMES: Final = {
    320: "connection_forced",
    402: "invalid_path",
    403: "access_refused",
    404: "not_found",
    405: "resource_locked",
    406: "precondition_failed",
    501: "frame_error",
    502: "syntax_error",
    503: "command_invalid",
    504: "channel_error",
    505: "unexpected_frame",
    506: "resource_error",
    530: "not_allowed",
    540: "not_implemented",
    541: "internal_error",
}

# What a link that died without a reply code (code 0: lost socket, missed heart-beats) is called.
LINK_DIED: Final = "AMQP connection died"


def reply_code_name(code: int, default: str = LINK_DIED) -> str:
    """The plugin's name of reply ``code``, ``default`` for a code outside the table."""
    return REPLY_CODE_NAMES.get(code, default)


class AmqpError(Exception):
    """The broker closed the channel or connection with a reply code, or the link died."""

    def __init__(
        self,
        code: int,
        text: str,
        *,
        phase: str = "",
        channel_only: bool = False,
        from_broker: bool = False,
    ) -> None:
        super().__init__(f"{code} {text}")
        self.code = code
        self.text = text
        self.phase = phase  # "connect", "auth", "vhost" during the handshake, else ""
        # the broker closed only the channel: the connection is still open and must be closed
        self.channel_only = channel_only
        # a channel.close or connection.close the broker sent (else: the link failed here)
        self.from_broker = from_broker

    @property
    def name(self) -> str:
        return reply_code_name(self.code)


def stomp_error(error: EncodeError) -> ProcessingError:
    """A value AMQP cannot carry (a name over 255 bytes, an integer out of the range of a long)
    as the STOMP error the plugin answers with: ERROR ``Processing error``, the reason as its
    body.  The one place the encoder's error becomes a STOMP error (the link raises it)."""
    return ProcessingError(str(error))
