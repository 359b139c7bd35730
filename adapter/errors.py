"""The one root of every error that becomes a STOMP ERROR frame.

Each carries ``message`` (the ERROR frame's ``message`` header) and ``detail`` (its body), under
those names everywhere: ``FrameError`` (the byte stream, adapter/stomp/codec.py),
``DestinationError`` and ``ProcessingError`` (a frame the mapping rules refuse, or a value AMQP
cannot carry, adapter/mapping/destinations.py).  Errors the broker reports stay ``AmqpError``
(adapter/amqp/errors.py), whose reply code is mapped to the plugin's ``message`` names there.

Pure: no imports beyond the standard library.
"""

from __future__ import annotations


class StompError(Exception):
    """An error that is answered with ERROR ``message``/``detail`` and a close."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message, detail)
        self.message = message
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.message}: {self.detail}"
