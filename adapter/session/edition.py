"""Which plugin's visible behaviour a session copies: the 3.10.8 plugin's or the current one's.

This module owns the *edition*: the small table of what a client can see differ between RabbitMQ's
STOMP plugin at 3.10.8 (the adapter's reference) and the current plugin (rabbitmq-server ``main``),
chosen once per process from ``adapter.plugin_behaviour`` and handed to the session's parts.  It
holds texts and decisions, no state; nothing per message goes through it.

The differences (docs/compatibility.md, "The current plugin's behaviour"):

* ``Access refused for user 'x'``: 3.10.8 ends the body with a newline, the current plugin not.
* An error of the broker (a channel or connection close): 3.10.8's plugin went through the AMQP
  client and passed the close's reply text on as is, ``NOT_FOUND - no exchange 'x' in vhost '/'``;
  the current plugin runs inside the broker and sends the explanation alone,
  ``no exchange 'x' in vhost '/'`` (the ``message`` header is the error's name in both).
* A consumer that exceeds the broker's consumer timeout: the broker closes the channel with
  ``PRECONDITION_FAILED - delivery acknowledgement on channel N timed out ...``; 3.10.8's plugin
  passes that on as any channel error, the current plugin ends the whole STOMP connection
  because of its consumer (``consumer_timeout``); the adapter says so in its own ERROR.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["CURRENT", "EDITIONS", "LEGACY", "Edition", "edition_for"]

# The reply text of a broker close starts with the error's name in capitals: "NOT_FOUND - ..."
_NAMED_TEXT = re.compile(r"[A-Z][A-Z_]* - ")
# The broker's words for a consumer timeout (rabbit_channel, 3.8.15 and later)
_CONSUMER_TIMEOUT = re.compile(r"delivery acknowledgement on channel \d+ timed out")


@dataclass(frozen=True, slots=True)
class Edition:
    """One plugin's visible behaviour."""

    name: str
    # the ERROR body of a CONNECT with a wrong user or password ends with a newline
    access_refused_newline: bool
    # the ERROR body of a broker error keeps the reply text's "NAME - " prefix
    keeps_error_prefix: bool
    # a consumer timeout is reported as the connection's own error (message "consumer_timeout")
    names_consumer_timeout: bool

    def access_refused(self, user: str) -> str:
        text = f"Access refused for user '{user}'"
        return text + "\n" if self.access_refused_newline else text

    def broker_error(self, name: str, text: str) -> tuple[str, str]:
        """The ERROR ``message`` header and body for a close of the broker named ``name``
        (``not_found``, ``precondition_failed`` ...) with reply text ``text``."""
        if self.names_consumer_timeout and name == "precondition_failed" and _CONSUMER_TIMEOUT.search(text):
            return "consumer_timeout", (
                "The STOMP connection is closed because a consumer did not acknowledge a message "
                "within the broker's consumer timeout: " + _without_prefix(text)
            )
        if self.keeps_error_prefix:
            return name, text
        return name, _without_prefix(text)


def _without_prefix(text: str) -> str:
    match = _NAMED_TEXT.match(text)
    return text[match.end() :] if match else text


LEGACY = Edition("3.10", access_refused_newline=True, keeps_error_prefix=True, names_consumer_timeout=False)
CURRENT = Edition(
    "current", access_refused_newline=False, keeps_error_prefix=False, names_consumer_timeout=True
)
EDITIONS = {edition.name: edition for edition in (LEGACY, CURRENT)}


def edition_for(name: str) -> Edition:
    """The edition of ``adapter.plugin_behaviour`` (validated by adapter/config/)."""
    return EDITIONS[name]
