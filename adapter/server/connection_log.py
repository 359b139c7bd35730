"""The three log lines of a client connection's life: opened, logged in, closed.

Each line carries structured fields (``extra={"fields": ...}``, adapter/logs.py writes them as
JSON when asked) and is skipped entirely below INFO: building the fields costs about 1 % of a
connect cycle each (docs/performance.md).  What they say is in docs/behaviour.md, "Logs".
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..mapping import operations as ops
    from ..session import Session
    from ..session.connection import ConnectionCounters

log = logging.getLogger("adapter.connection")


class LoggedConnection(Protocol):
    """What the log lines read of a client connection (``ClientConnection`` has it), named here so
    that this module does not import the shell that calls it (tests/unit/test_layers.py)."""

    label: str
    listener: str
    peer: str
    session: Session
    counters: ConnectionCounters
    close_reason: str


def opened(connection: LoggedConnection, via: str = "") -> None:
    if not log.isEnabledFor(logging.INFO):
        return
    log.info(
        "%sconnection opened peer=%s%s",
        connection.label,
        connection.peer,
        via,
        extra={
            "fields": {"event": "connection_opened", "peer": connection.peer, "listener": connection.listener}
        },
    )


def logged_in(connection: LoggedConnection, op: ops.Established) -> None:
    if not log.isEnabledFor(logging.INFO):
        return
    session = connection.session
    log.info(
        "connection logged in peer=%s user=%s vhost=%s version=%s heart-beat=%s,%s",
        connection.peer,
        session.user,
        session.vhost,
        op.version,
        op.send_ms,
        op.receive_ms,
        extra={
            "fields": {
                "event": "connection_logged_in",
                "peer": connection.peer,
                "listener": connection.listener,
                "user": session.user,
                "vhost": session.vhost,
                "version": op.version,
                "heart_beat": f"{op.send_ms},{op.receive_ms}",
            }
        },
    )


def closed(connection: LoggedConnection) -> None:
    if not log.isEnabledFor(logging.INFO):
        return
    session = connection.session
    logged_in = session.user is not None
    frames_sent = sum(session.frames.frames_sent.values()) + session.frames.messages_sent
    fields = {
        "event": "connection_closed",
        "peer": connection.peer,
        "listener": connection.listener,
        "user": session.login.requested_user,
        "vhost": session.login.requested_vhost,
        "logged_in": logged_in,
        "version": session.version if logged_in else None,
        "duration_seconds": round(time.monotonic() - connection.counters.opened_at, 3),
        "frames_received": sum(connection.counters.frames_received.values()),
        "frames_sent": frames_sent,
        "messages_published": connection.counters.messages_published,
        "messages_delivered": session.frames.messages_sent,
        "bytes_received": connection.counters.bytes_received,
        "bytes_sent": connection.counters.bytes_sent,
        "reason": connection.close_reason,
    }
    log.info(
        "connection closed peer=%s user=%s vhost=%s version=%s duration=%.3fs frames_in=%d"
        " frames_out=%d published=%d delivered=%d reason=%s",
        connection.peer,
        fields["user"],
        fields["vhost"],
        fields["version"],
        fields["duration_seconds"],
        fields["frames_received"],
        frames_sent,
        connection.counters.messages_published,
        fields["messages_delivered"],
        connection.close_reason,
        extra={"fields": fields},
    )
