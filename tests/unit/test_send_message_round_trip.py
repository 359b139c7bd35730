"""A SEND's headers through the whole message path and back: ``properties_from_send`` (SEND side
of the mapping), the AMQP content header the adapter writes (``wire.encode_properties``), the
one it reads (``wire.decode_content_header``), and ``message_headers`` (MESSAGE side).  For any
headers a STOMP client may send, a subscriber sees each of them again with the same value,
except the documented rewrites: ``persistent:true`` stays, other ``persistent`` values vanish,
frame-control headers are not carried, ``reply-to`` gets ``/reply-queue/`` unless it names a
destination (docs/destinations.md#send--amqp, #amqp--message)."""

from __future__ import annotations

import struct

from hypothesis import example, given
from hypothesis import strategies as st

from adapter.amqp import wire
from adapter.mapping.destinations import message_reply_to
from adapter.mapping.properties import FRAME_CONTROL_HEADERS, message_headers, properties_from_send

TEXT_PROPERTIES = [
    "content-type",
    "content-encoding",
    "correlation-id",
    "reply-to",
    "expiration",
    "amqp-message-id",
    "type",
    "user-id",
    "app-id",
]
# header text: any Unicode except surrogates, at most 255 bytes for the AMQP short strings
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
custom_name = text.filter(
    lambda n: (
        n not in TEXT_PROPERTIES
        and n not in FRAME_CONTROL_HEADERS
        and n not in ("persistent", "priority", "timestamp", "destination")
        and len(n.encode()) < 128
    )
)


def through_the_wire(headers: dict[str, str]) -> dict[str, str]:
    properties = properties_from_send(headers, None)
    flags, encoded = wire.encode_properties(properties)
    body_size = 5
    payload = struct.pack(">HHQH", 60, 0, body_size, flags) + encoded
    size, decoded = wire.decode_content_header(payload)
    assert size == body_size
    return dict(message_headers(decoded))


@given(
    st.dictionaries(custom_name, text, max_size=8),
    st.dictionaries(st.sampled_from(TEXT_PROPERTIES), text, max_size=9),
    st.sampled_from([None, "true", "True", "false", "yes"]),
    st.one_of(st.none(), st.integers(0, 255)),
    st.one_of(st.none(), st.integers(0, 2**63)),
)
@example({"x-custom": "a:b\nc"}, {"content-type": "text/plain"}, "true", 9, 1_700_000_000)
def test_what_a_send_carries_a_message_shows(
    custom: dict[str, str],
    properties: dict[str, str],
    persistent: str | None,
    priority: int | None,
    timestamp: int | None,
) -> None:
    headers = {**custom, **properties, "destination": "/queue/q", "receipt": "r-1"}
    if persistent is not None:
        headers["persistent"] = persistent
    if priority is not None:
        headers["priority"] = str(priority)
    if timestamp is not None:
        headers["timestamp"] = str(timestamp)
    shown = through_the_wire(headers)
    expected = dict(custom)
    for name, value in properties.items():
        expected[name] = message_reply_to(value) or "" if name == "reply-to" else value
    if persistent in ("true", "True"):
        expected["persistent"] = "true"
    if priority is not None:
        expected["priority"] = str(priority)
    if timestamp is not None:
        expected["timestamp"] = str(timestamp)
    assert shown == expected
