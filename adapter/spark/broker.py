"""A small blocking AMQP 0-9-1 client for the Spark side: one socket, one channel, no threads.

Owns the broker URL option (``amqp[s]://user:pass@host:port/vhost``) and the few methods the
Spark source and sink need: declare (passive or not), bind, qos, consume with arguments, ack,
cancel, publish with publisher confirms, and waiting for deliveries or confirms with a
deadline.

Why its own client and not aio-pika or pika (docs/spark.md, "The AMQP client"): Spark calls a
data source from plain blocking Python code in its workers, one task at a time, so an event
loop buys nothing; the frames are encoded and decoded by the adapter's own pure modules
(``adapter.amqp.wire``, ``adapter.amqp.framing``), so a delivery arrives as the very
``MessageProperties`` the adapter's MESSAGE rendering takes, names pamqp would refuse
(``/queue/a%2fb``) work, and nothing new has to be installed on the executors.
"""

from __future__ import annotations

import dataclasses
import random
import socket
import ssl
import struct
import time
from collections import deque
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

from ..amqp import wire
from ..amqp.framing import FrameReader
from ..mapping.operations import Delivery
from ..mapping.properties import MessageProperties

CHANNEL = 1
_counts = struct.Struct(">II")

REPLY_CODE_NAMES = {
    320: "connection_forced",
    403: "access_refused",
    404: "not_found",
    405: "resource_locked",
    406: "precondition_failed",
    530: "not_allowed",
    541: "internal_error",
}


class BrokerError(Exception):
    """The broker refused something (channel or connection closed with a reply code), or could
    not be reached.  The text always names the cause: it becomes the failed Spark task's error."""


@dataclass(frozen=True, slots=True)
class BrokerUrl:
    host: str
    port: int
    tls: bool
    user: str
    password: str
    vhost: str
    cafile: str | None = None
    # the further broker nodes of a comma-separated ``url`` option, each a complete URL
    others: tuple[BrokerUrl, ...] = ()

    def __repr__(self) -> str:
        # Spark shows options objects (a failed task, a debugger, a log): never the password
        return (
            f"BrokerUrl(host={self.host!r}, port={self.port!r}, tls={self.tls!r}, user={self.user!r}, "
            f"password='***', vhost={self.vhost!r}, cafile={self.cafile!r}, others={self.others!r})"
        )

    def nodes(self) -> list[BrokerUrl]:
        """Every node, in the order one connection tries them: from a random one on, so the
        tasks of a job spread over the nodes, and a node that is down is skipped."""
        nodes = [BrokerUrl(self.host, self.port, self.tls, self.user, self.password, self.vhost, self.cafile)]
        nodes += self.others
        start = random.randrange(len(nodes))
        return nodes[start:] + nodes[:start]

    @property
    def redacted(self) -> str:
        """The URL without the password, for error messages."""
        scheme = "amqps" if self.tls else "amqp"
        return f"{scheme}://{self.user}@{self.host}:{self.port}/{self.vhost}"


def parse_broker_url(url: str) -> BrokerUrl:
    """``amqp://user:pass@host:port/vhost`` (RabbitMQ's URI rules: the vhost is the path without
    its leading slash, percent-decoded, so ``/%2F`` is ``/``; no path at all means ``/``);
    ``amqps://`` for TLS, verified against the system's CAs or ``?cacertfile=PATH``.

    Several broker nodes: a comma-separated list of such URLs, as the adapter's ``--amqp-url``
    takes them (docs/spark.md); the first becomes the fields, the rest ``others``."""
    first, *rest = [part for part in url.split(",") if part.strip()] or [""]
    node = _parse_one_url(first)
    if rest:
        node = dataclasses.replace(node, others=tuple(_parse_one_url(part) for part in rest))
    return node


_UNREADABLE = (
    "option 'url': a URL cannot be read (not shown: it may hold a password); write "
    "amqp[s]://user:password@host:port/vhost, with / ? # [ ] @ , percent-encoded in the user and password"
)


def _parse_one_url(url: str) -> BrokerUrl:
    """One node's URL.  Its errors never quote it: with a password holding a character that
    ends the user part (``/``, ``?``, ``#``, ``,``), any piece quoted may be the password's."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        raise ValueError(_UNREADABLE) from None
    scheme = parts.scheme.lower()
    if scheme not in ("amqp", "amqps"):
        shown = parts.scheme if parts.netloc else "none"  # "user:password@host" reads as scheme "user"
        raise ValueError(f"option 'url' must be an amqp:// or amqps:// URL, got scheme {shown!r}")
    if "@" not in parts.netloc and "@" in url:
        # "amqp://user:12345/secret@host/" reads as host "user", port 12345: an unencoded "/"
        raise ValueError(_UNREADABLE)
    tls = scheme == "amqps"
    path = parts.path
    vhost = "/" if path in ("", "/") else unquote(path[1:])
    cafile = parse_qs(parts.query).get("cacertfile", [None])[0]
    return BrokerUrl(
        host=unquote(parts.hostname or "localhost"),
        port=port or (5671 if tls else 5672),
        tls=tls,
        user=unquote(parts.username or "guest"),
        password=unquote(parts.password or "guest"),
        vhost=vhost,
        cafile=cafile,
    )


@dataclass(frozen=True, slots=True)
class DeclareOk:
    queue: str
    message_count: int
    consumer_count: int


class BlockingBroker:
    """One AMQP connection with channel 1, driven by blocking calls.

    Deliveries are queued as they are read and handed out by ``next_delivery``; confirms are
    counted as they arrive.  A channel or connection close from the broker raises BrokerError
    from whichever call is running, with the broker's reply code and text."""

    def __init__(self, url: BrokerUrl, *, connection_name: str, timeout: float = 30.0) -> None:
        self.url = url
        self.timeout = timeout
        self.frame_max = 131072
        self._reader = FrameReader(self._on_method, self._on_header, self._on_body)
        self._methods: deque[tuple[tuple[int, int], bytes]] = deque()
        self.deliveries: deque[Delivery] = deque()
        self._delivery: tuple[str, int, bool, str, str] | None = None
        self._properties: MessageProperties | None = None
        self._size = 0
        self._parts: list[bytes] = []
        self._received = 0
        self._closed_error: BrokerError | None = None
        # publisher confirms: the broker numbers publishes 1, 2, ... once confirm.select is on
        self._confirming = False
        self.published = 0
        self.confirmed = 0  # every publish up to this number is settled
        self._nacked: list[int] = []
        self._returned: list[str] = []  # mandatory publishes the broker could not route
        self._out: list[bytes | memoryview] = []
        failures = []
        for node in url.nodes():
            self.url = node
            try:
                self._sock = self._connect(connection_name)
                break
            except BrokerError as error:
                failures.append(str(error))
                # a fresh start for the next node
                self._reader = FrameReader(self._on_method, self._on_header, self._on_body)
                self._methods.clear()
                self._closed_error = None
        else:
            if len(failures) == 1:
                raise BrokerError(failures[0])
            raise BrokerError(f"no broker node could be used: {'; '.join(failures)}")

    # ----------------------------------------------------------------- connection
    def _connect(self, connection_name: str) -> socket.socket:
        url = self.url
        try:
            sock = socket.create_connection((url.host, url.port), timeout=self.timeout)
        except OSError as error:
            raise BrokerError(f"cannot reach the broker at {url.redacted}: {error}") from error
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if url.tls:
            context = ssl.create_default_context(cafile=url.cafile)
            try:
                sock = context.wrap_socket(sock, server_hostname=url.host)
            except (OSError, ssl.SSLError) as error:
                sock.close()
                raise BrokerError(f"TLS handshake with {url.redacted} failed: {error}") from error
        self._sock = sock
        try:
            sock.sendall(wire.PROTOCOL_HEADER)
            self._expect(wire.CONNECTION_START, phase="connecting")
            client_properties = {
                "product": "stomp-amqp-adapter (spark)",
                "connection_name": connection_name,
                "capabilities": {
                    "publisher_confirms": True,
                    "basic.nack": True,
                    "consumer_cancel_notify": True,
                    "authentication_failure_close": True,
                },
            }
            sock.sendall(wire.connection_start_ok(url.user, url.password, client_properties))
            payload = self._expect(wire.CONNECTION_TUNE, phase="logging in")
            _, frame_max, _ = wire.decode_connection_tune(payload)
            self.frame_max = min(frame_max or 131072, 131072)
            self._reader.frame_max = self.frame_max
            # no heart-beats: every wait here has its own deadline, and a task that waits for
            # the broker longer than that fails anyway
            sock.sendall(wire.connection_tune_ok(1, self.frame_max, 0) + wire.connection_open(url.vhost))
            self._expect(wire.CONNECTION_OPEN_OK, phase=f"opening virtual host {url.vhost!r}")
            sock.sendall(wire.channel_open(CHANNEL))
            self._expect(wire.CHANNEL_OPEN_OK, phase="opening a channel")
        except BaseException:
            sock.close()
            raise
        return sock

    def close(self) -> None:
        """Close politely (the broker then forgets consumers at once), never raise."""
        try:
            if self._closed_error is None:
                self._flush()
                self._sock.sendall(wire.connection_close())
                deadline = time.monotonic() + 2.0
                while self._closed_error is None and time.monotonic() < deadline:
                    if not self._read(deadline):
                        break
        except (OSError, BrokerError):
            pass
        finally:
            self._sock.close()

    def __enter__(self) -> BlockingBroker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ----------------------------------------------------------------- reading
    def _read(self, deadline: float) -> bool:
        """Read once, feeding the frame reader; False when the deadline passed first."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        self._sock.settimeout(remaining)
        try:
            data = self._sock.recv(1 << 18)
        except TimeoutError:
            return False
        except OSError as error:
            raise self._lost(f"connection to {self.url.redacted} failed: {error}") from error
        if not data:
            raise self._lost(f"the broker at {self.url.redacted} closed the connection")
        try:
            self._reader.feed(data)
        except wire.DecodeError as error:
            raise self._lost(f"undecodable frame from the broker: {error}") from error
        if self._closed_error is not None:
            raise self._closed_error
        return True

    def _lost(self, text: str) -> BrokerError:
        self._closed_error = BrokerError(text)
        return self._closed_error

    def _expect(self, *replies: tuple[int, int], phase: str = "") -> bytes:
        """Read until one of ``replies`` arrives on the channel; other methods are dropped."""
        deadline = time.monotonic() + self.timeout
        while True:
            while self._methods:
                method, payload = self._methods.popleft()
                if method in replies:
                    return payload
            if self._closed_error is not None:
                raise self._closed_error
            try:
                read = self._read(deadline)
            except BrokerError as error:
                if phase and "closed the connection" in str(error):
                    # RabbitMQ drops the socket after a failed login unless it can send a close
                    raise BrokerError(f"{error} while {phase} (wrong user or password?)") from None
                raise
            if not read:
                what = phase or f"the reply to AMQP method {replies[0]}"
                raise BrokerError(
                    f"no answer from the broker at {self.url.redacted} within "
                    f"{self.timeout:g} s while waiting for {what}"
                )

    def _on_method(self, channel: int, payload: bytes) -> None:
        method = ((payload[0] << 8) | payload[1], (payload[2] << 8) | payload[3])
        if method == wire.BASIC_DELIVER:
            self._delivery = wire.decode_deliver(payload)
        elif method in (wire.BASIC_ACK, wire.BASIC_NACK):
            tag, multiple, ack = wire.decode_ack(payload)
            if not ack:
                self._nacked.append(tag)
            # RabbitMQ confirms in order, so a multiple (or single) confirm of ``tag`` settles
            # everything up to it that is not yet settled
            self.confirmed = max(self.confirmed, tag)
        elif method in (wire.CHANNEL_CLOSE, wire.CONNECTION_CLOSE):
            code, text = wire.decode_close(payload)
            scope = "channel" if method == wire.CHANNEL_CLOSE else "connection"
            name = REPLY_CODE_NAMES.get(code, str(code))
            self._closed_error = BrokerError(f"the broker closed the {scope}: {name} ({code}) {text}")
            try:
                close_ok = wire.channel_close_ok(channel) if channel else wire.connection_close_ok()
                self._sock.sendall(close_ok)
            except OSError:
                pass
        elif method == wire.BASIC_RETURN:
            code, text = wire.decode_close(payload)  # reply-code and reply-text, as in a close
            exchange, offset = wire.decode_shortstr(
                payload, 6 + 1 + len(text.encode("utf-8", "surrogateescape"))
            )
            routing_key, _ = wire.decode_shortstr(payload, offset)
            self._returned.append(f"{text} ({code}): exchange {exchange!r}, routing key {routing_key!r}")
        elif method == wire.CONNECTION_CLOSE_OK:
            self._closed_error = BrokerError("connection closed")
        elif method == wire.BASIC_CANCEL:
            cancelled_tag, _ = wire.decode_basic_cancel(payload)
            self._closed_error = BrokerError(
                f"the broker cancelled consumer {cancelled_tag!r} (was its queue deleted?)"
            )
        else:
            self._methods.append((method, payload))

    def _on_header(self, payload: bytes) -> None:
        self._size, self._properties = wire.decode_content_header(payload)
        self._parts = []
        self._received = 0
        if self._size == 0:
            self._complete(b"")

    def _on_body(self, payload: bytes | memoryview) -> None:
        self._received += len(payload)
        self._parts.append(bytes(payload))
        if self._received >= self._size:
            self._complete(self._parts[0] if len(self._parts) == 1 else b"".join(self._parts))

    def _complete(self, body: bytes) -> None:
        delivery, properties = self._delivery, self._properties
        self._delivery = self._properties = None
        self._parts = []
        if delivery is not None and properties is not None:
            self.deliveries.append(Delivery(*delivery, properties, body))

    # ----------------------------------------------------------------- methods
    def _call(self, frame: bytes, reply: tuple[int, int]) -> bytes:
        self._flush()
        try:
            self._sock.sendall(frame)
        except OSError as error:
            raise self._lost(f"connection to {self.url.redacted} failed: {error}") from error
        return self._expect(reply)

    def queue_declare(
        self,
        queue: str,
        *,
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, object] | None = None,
    ) -> DeclareOk:
        frame = wire.queue_declare(
            CHANNEL,
            queue,
            passive=passive,
            durable=durable,
            exclusive=exclusive,
            auto_delete=auto_delete,
            arguments=arguments,
        )
        payload = self._call(frame, wire.QUEUE_DECLARE_OK)
        name, offset = wire.decode_shortstr(payload, 4)
        messages, consumers = _counts.unpack_from(payload, offset)
        return DeclareOk(name, messages, consumers)

    def queue_bind(self, queue: str, exchange: str, routing_key: str) -> None:
        self._call(wire.queue_bind(CHANNEL, queue, exchange, routing_key), wire.QUEUE_BIND_OK)

    def queue_delete(self, queue: str) -> None:
        self._call(wire.queue_delete(CHANNEL, queue), wire.QUEUE_DELETE_OK)

    def basic_qos(self, prefetch_count: int) -> None:
        self._call(wire.basic_qos(CHANNEL, prefetch_count), wire.BASIC_QOS_OK)

    def basic_consume(self, queue: str, consumer_tag: str, arguments: dict[str, object]) -> None:
        frame = wire.basic_consume(CHANNEL, queue, consumer_tag, False, arguments)
        self._call(frame, wire.BASIC_CONSUME_OK)

    def basic_cancel(self, consumer_tag: str) -> None:
        self._call(wire.basic_cancel(CHANNEL, consumer_tag), wire.BASIC_CANCEL_OK)

    def ack(self, delivery_tag: int, multiple: bool) -> None:
        self._out.append(wire.basic_ack(CHANNEL, delivery_tag, multiple))
        self._flush()

    def next_delivery(self, deadline: float) -> Delivery | None:
        """The next delivery, reading the socket until ``deadline`` (monotonic) if none is queued."""
        while not self.deliveries:
            if self._closed_error is not None:
                raise self._closed_error
            if not self._read(deadline):
                return None
        return self.deliveries.popleft()

    # ----------------------------------------------------------------- publishing
    def confirm_select(self) -> None:
        """Publisher confirms on (once per connection; later calls do nothing)."""
        if self._confirming:
            return
        self._call(wire.confirm_select(CHANNEL), wire.CONFIRM_SELECT_OK)
        self._confirming = True

    def publish(
        self, exchange: str, routing_key: str, properties: MessageProperties, body: bytes, *, mandatory: bool
    ) -> None:
        """Buffer one publish; written when the buffer is large or at the next wait.  A
        ``mandatory`` message the broker cannot route comes back (basic.return), and
        ``drain_confirms`` then fails."""
        if mandatory:
            method = wire.method_frame(
                CHANNEL,
                wire.BASIC_PUBLISH,
                b"\0\0" + wire.shortstr(exchange) + wire.shortstr(routing_key) + b"\x01",
            )
            self._out.append(method)
            self._out += wire.content_frames(CHANNEL, properties, body, self.frame_max)
        else:
            self._out += wire.basic_publish(CHANNEL, exchange, routing_key, properties, body, self.frame_max)
        self.published += 1
        if len(self._out) > 512:
            self._flush()

    def _flush(self) -> None:
        if not self._out:
            return
        out, self._out = self._out, []
        try:
            self._sock.sendall(b"".join(out))
        except OSError as error:
            raise self._lost(f"connection to {self.url.redacted} failed: {error}") from error

    def drain_confirms(self, *, keep_unconfirmed: int = 0) -> None:
        """Read confirms until at most ``keep_unconfirmed`` publishes are unsettled.

        Raises BrokerError when the broker refused (basic.nack) a message or did not confirm in
        time: a Spark task must fail rather than report success for an unconfirmed message."""
        self._flush()
        deadline = time.monotonic() + self.timeout
        while self.published - self.confirmed > keep_unconfirmed:
            if not self._read(deadline):
                raise BrokerError(
                    f"the broker did not confirm {self.published - self.confirmed} published "
                    f"message(s) within {self.timeout:g} s"
                )
        if self._returned:
            raise BrokerError(
                f"the broker could not route {len(self._returned)} published message(s), "
                f"first: {self._returned[0]}"
            )
        if self._nacked:
            raise BrokerError(
                f"the broker refused (basic.nack) {len(self._nacked)} published message(s); "
                "they may not be stored"
            )
