"""A small blocking AMQP 0-9-1 client for the Spark side: one socket, one channel, no threads.

Owns the broker URL option (``amqp[s]://user:pass@host:port/vhost``), the node loop, the
blocking socket with its deadlines, and the few methods the Spark source and sink need:
declare (passive or not), bind, qos, consume with arguments, ack, cancel, publish (mandatory)
with publisher confirms, and waiting for deliveries or confirms with a deadline.  The protocol
itself (handshake, phases, channel, calls, delivery assembly, confirms, closes) is the adapter's
sans-IO AMQP cores (``adapter.amqp.client.ConnectionCore``, ``adapter.amqp.channel.ChannelCore``),
the same ones the server's asyncio socket and links own; this is their blocking shell.

Why its own client and not aio-pika or pika (docs/spark.md, "The AMQP client"): Spark calls a
data source from plain blocking Python code in its workers, one task at a time, so an event
loop buys nothing; the frames are encoded and decoded by the adapter's own pure modules
(``adapter.amqp.client``, ``adapter.amqp.channel``, ``adapter.amqp.wire``,
``adapter.amqp.framing``), so a delivery arrives as the very ``MessageProperties`` the
adapter's MESSAGE rendering takes, names pamqp would refuse (``/queue/a%2fb``) work, and nothing
new has to be installed on the executors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import socket
import ssl
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

from ..amqp import wire
from ..amqp.channel import ChannelCore
from ..amqp.client import CHANNEL, BrokerCall, ConnectionCore, Phase, UnexpectedMethod
from ..amqp.errors import AmqpError, reply_code_name
from ..mapping.operations import (
    BasicCancel,
    BasicConsume,
    BasicQos,
    ConfirmSelect,
    Delivery,
    QueueBind,
    QueueDeclare,
    QueueDelete,
)
from ..mapping.properties import MessageProperties
from .tokens import TokenRefresher, TokenSource

_counts = struct.Struct(">II")
# mandatory basic.publish method frames kept per connection, one per (exchange, routing key)
_METHODS_KEPT = 1024

# start-ok's client properties (the connection name is added per connection)
_CAPABILITIES = {
    "publisher_confirms": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "authentication_failure_close": True,
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
    # options token / tokenFile: the AMQP password is that token, refreshed (adapter/spark/tokens.py)
    token: TokenSource | None = None

    def __repr__(self) -> str:
        # Spark shows options objects (a failed task, a debugger, a log): never the password
        return (
            f"BrokerUrl(host={self.host!r}, port={self.port!r}, tls={self.tls!r}, user={self.user!r}, "
            f"password='***', vhost={self.vhost!r}, cafile={self.cafile!r}, others={self.others!r})"
        )

    def nodes(self) -> list[BrokerUrl]:
        """Every node, in the order one connection tries them: from a random one on, so the
        tasks of a job spread over the nodes, and a node that is down is skipped."""
        nodes = [dataclasses.replace(self, others=())]
        nodes += (dataclasses.replace(other, token=self.token) for other in self.others)
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


class _BrokerReplies:
    """What the broker sends back to the blocking client, kept until a call reads it: the
    channel core's events (deliveries queued, confirms counted, a server cancel) and hooks (a
    call's reply, returns), and the connection core's hooks (a close, with the broker's reply
    code and text, becomes the ``BrokerError`` the running call raises)."""

    __slots__ = (
        "closed_error",
        "confirmed",
        "deliveries",
        "failed_step",
        "nacked",
        "reply",
        "returned_messages",
    )

    def __init__(self) -> None:
        self.deliveries: deque[Delivery] = deque()
        self.confirmed = 0  # every publish up to this number is settled
        self.nacked: list[int] = []
        self.returned_messages: list[str] = []  # mandatory publishes the broker could not route
        self.closed_error: BrokerError | None = None
        self.reply: bytes | None = None
        self.failed_step = ""  # the handshake step a broker's close came in

    def lost(self, text: str) -> BrokerError:
        self.closed_error = BrokerError(text)
        return self.closed_error

    # ----------------------------------------------------------------- the channel's events
    def on_deliver(self, delivery: Delivery) -> None:
        self.deliveries.append(delivery)

    def on_confirm(self, delivery_tag: int, multiple: bool, ack: bool) -> None:
        if not ack:
            self.nacked.append(delivery_tag)
        # RabbitMQ confirms in order, so a multiple (or single) confirm of ``tag`` settles
        # everything up to it that is not yet settled
        self.confirmed = max(self.confirmed, delivery_tag)

    def on_server_cancel(self, consumer_tag: str) -> None:
        self.closed_error = BrokerError(
            f"the broker cancelled consumer {consumer_tag!r} (was its queue deleted?)"
        )

    # ----------------------------------------------------------------- the cores' hooks
    def handshake_done(self) -> None:
        """The blocking client waits for the phase itself."""

    def blocked_changed(self) -> None:
        """A blocked broker holds publishes back; drain_confirms' deadline tells."""

    def connection_failed(self, error: AmqpError) -> None:
        if error.from_broker:
            scope = "channel" if error.channel_only else "connection"
            name = reply_code_name(error.code, str(error.code))
            self.failed_step = error.phase
            self.closed_error = BrokerError(
                f"the broker closed the {scope}: {name} ({error.code}) {error.text}"
            )
        else:
            self.closed_error = BrokerError(error.text)

    def channel_failed(self, error: AmqpError) -> None:
        self.connection_failed(error)

    def close_ok_received(self) -> None:
        self.closed_error = BrokerError("connection closed")

    def replied(self, method: tuple[int, int], payload: bytes) -> None:
        self.reply = payload

    def got(self, delivery: Delivery) -> None:
        """The Spark side makes no basic.get."""

    def returned(self, code: int, text: str, exchange: str, routing_key: str) -> None:
        self.returned_messages.append(f"{text} ({code}): exchange {exchange!r}, routing key {routing_key!r}")

    def encode_failed(self, error: wire.EncodeError) -> Exception:
        return BrokerError(f"a value AMQP cannot carry: {error}")


def _login_step(step: str, vhost: str) -> str:
    if step == Phase.CONNECT:
        return "connecting"
    if step == Phase.AUTH:
        return "logging in"
    return f"opening virtual host {vhost!r}"


class BlockingBroker:
    """One AMQP connection with channel 1, driven by blocking calls: the blocking shell over
    the sans-IO connection and channel cores (adapter/amqp/client.py, adapter/amqp/channel.py).

    Deliveries are queued as they are read and handed out by ``take_deliveries``; confirms are
    counted as they arrive.  A channel or connection close from the broker raises BrokerError
    from whichever call is running, with the broker's reply code and text."""

    def __init__(self, url: BrokerUrl, *, connection_name: str, timeout: float = 30.0) -> None:
        self.url = url
        self.timeout = timeout
        # publisher confirms: the broker numbers publishes 1, 2, ... once confirm.select is on
        self._confirming = False
        self.published = 0
        # (exchange, routing key) -> its mandatory basic.publish frame (the channel core keeps
        # the others')
        self._mandatory_methods: dict[tuple[str, str], bytes] = {}
        client_properties = wire.table(
            {
                "product": "stomp-amqp-adapter (spark)",
                "connection_name": connection_name,
                "capabilities": _CAPABILITIES,
            }
        )
        failures = []
        for node in url.nodes():
            self.url = node
            self._start(node, client_properties)
            try:
                self._sock = self._connect()
                break
            except BrokerError as error:
                failures.append(str(error))
        else:
            if len(failures) == 1:
                raise BrokerError(failures[0])
            raise BrokerError(f"no broker node could be used: {'; '.join(failures)}")

    def _start(self, node: BrokerUrl, client_properties: bytes) -> None:
        """Fresh cores for ``node`` (the next node starts from nothing)."""
        self._replies = replies = _BrokerReplies()
        # no heart-beats: every wait here has its own deadline, and a task that waits for the
        # broker longer than that fails anyway
        password = node.password
        self.token_refresher: TokenRefresher | None = None
        if node.token is not None:
            password = node.token.current()
            self.token_refresher = TokenRefresher(node.token, password)
        self._connection = ConnectionCore(
            replies,
            heartbeat=0,
            client_properties=client_properties,
            credentials=(node.user, password, node.vhost),
        )
        self._channel = ChannelCore(self._connection, CHANNEL, self._connection.out, replies, replies)
        self._connection.carry(self._channel)

    @property
    def deliveries(self) -> deque[Delivery]:
        return self._replies.deliveries

    @property
    def confirmed(self) -> int:
        """Every publish up to this number is settled."""
        return self._replies.confirmed

    # ----------------------------------------------------------------- connection
    def _connect(self) -> socket.socket:
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
            self._flush()  # the protocol header; the core answers start and tune as they come
            self._wait(
                lambda: self._connection.phase is Phase.OPEN,
                lambda: _login_step(self._replies.failed_step or self._connection.handshake_step, url.vhost),
                login=True,
            )
            # the channel is opened here, not lazily: a refusal names this step
            self._channel.unopened = False
            self._call(wire.channel_open(CHANNEL), wire.CHANNEL_OPEN_OK, "opening a channel")
        except BaseException:
            sock.close()
            raise
        return sock

    def close(self) -> None:
        """Close politely (the broker then forgets consumers at once), never raise."""
        try:
            if self._replies.closed_error is None:
                self._connection.send_close()
                self._flush()
                deadline = time.monotonic() + 2.0
                while self._replies.closed_error is None and time.monotonic() < deadline:
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
        """Read once, feeding the cores; False when the deadline passed first."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        self._sock.settimeout(remaining)
        replies = self._replies
        try:
            data = self._sock.recv(1 << 18)
        except TimeoutError:
            return False
        except OSError as error:
            raise replies.lost(f"connection to {self.url.redacted} failed: {error}") from error
        if not data:
            raise replies.lost(f"the broker at {self.url.redacted} closed the connection")
        try:
            self._connection.reader.feed(data)
        except UnexpectedMethod as error:
            raise replies.lost(f"unexpected method from the broker: {error}") from error
        except wire.DecodeError as error:
            raise replies.lost(f"undecodable frame from the broker: {error}") from error
        out = self._connection.out
        if out:
            # what the cores answered (start-ok, tune-ok, a close-ok ...)
            data = b"".join(out)
            out.clear()
            with contextlib.suppress(OSError):  # the next read reports the failure
                self._sock.sendall(data)
        if replies.closed_error is not None:
            raise replies.closed_error
        return True

    def _wait(self, ready: Callable[[], bool], what: Callable[[], str], *, login: bool = False) -> None:
        """Read until ``ready()``; ``what`` names what is awaited in a timeout's message."""
        deadline = time.monotonic() + self.timeout
        while not ready():
            if self._replies.closed_error is not None:
                raise self._replies.closed_error
            try:
                read = self._read(deadline)
            except BrokerError as error:
                if login and "closed the connection" in str(error):
                    # RabbitMQ drops the socket after a failed login unless it can send a close
                    raise BrokerError(f"{error} while {what()} (wrong user or password?)") from None
                raise
            if not read:
                raise BrokerError(
                    f"no answer from the broker at {self.url.redacted} within "
                    f"{self.timeout:g} s while waiting for {what()}"
                )

    # ----------------------------------------------------------------- methods
    def _call(self, frame: bytes, reply: tuple[int, int], what: str = "") -> bytes:
        replies = self._replies
        if replies.closed_error is not None:
            raise replies.closed_error
        self._channel.start_call(frame, (reply,))
        replies.reply = None
        try:
            self._flush()
            self._wait(lambda: replies.reply is not None, lambda: what or f"the reply to AMQP method {reply}")
        finally:
            self._channel.call_replies = None  # answered, or given up with the error raised
        payload, replies.reply = replies.reply, None
        assert payload is not None
        return payload

    def refresh_token(self) -> None:
        """With a token (options token / tokenFile): when its refresh is due, hand the
        connection the source's current token (``connection.update-secret``) and wait for the
        broker to take it.  A no-op otherwise; cheap enough to call per message."""
        refresher = self.token_refresher
        if refresher is None:
            return
        token = refresher.next_token()
        if token is None:
            return
        replies = self._replies
        if replies.closed_error is not None:
            raise replies.closed_error
        taken: list[AmqpError | None] = []
        self._connection.update_secret(
            token.encode("utf-8"), "token refreshed by the Spark connector", taken.append
        )
        self._flush()
        self._wait(lambda: bool(taken), lambda: "connection.update-secret-ok")
        if taken[0] is not None:
            raise BrokerError(f"the broker refused the refreshed token: {taken[0].text}")
        refresher.refreshed(token)

    def _call_operation(self, op: BrokerCall) -> bytes:
        return self._call(*self._channel.operation_call(op))

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
        op = QueueDeclare(
            queue,
            durable=durable,
            exclusive=exclusive,
            auto_delete=auto_delete,
            arguments=arguments or {},
            passive=passive,
        )
        payload = self._call_operation(op)
        name, offset = wire.decode_shortstr(payload, 4)
        messages, consumers = _counts.unpack_from(payload, offset)
        return DeclareOk(name, messages, consumers)

    def queue_bind(self, queue: str, exchange: str, routing_key: str) -> None:
        self._call_operation(QueueBind(queue, exchange, routing_key))

    def queue_delete(self, queue: str) -> None:
        self._call_operation(QueueDelete(queue))

    def basic_qos(self, prefetch_count: int) -> None:
        self._call_operation(BasicQos(prefetch_count))

    def basic_consume(self, queue: str, consumer_tag: str, arguments: dict[str, object]) -> None:
        self._call_operation(BasicConsume(queue, consumer_tag, False, arguments))

    def basic_cancel(self, consumer_tag: str) -> None:
        self._call_operation(BasicCancel(consumer_tag))

    def ack(self, delivery_tag: int, multiple: bool) -> None:
        self._channel.ack(delivery_tag, multiple)
        self._flush()

    def take_deliveries(self, deadline: float, at_most: int = 0) -> list[Delivery]:
        """The deliveries queued, in order (``at_most`` of them, 0: all), reading the socket until
        ``deadline`` (monotonic) if none is; [] when the deadline passed first.  What one read of
        the socket brought comes out at once, so a reader's loop runs once per read, not once
        per message."""
        replies = self._replies
        queued = replies.deliveries
        while not queued:
            if replies.closed_error is not None:
                raise replies.closed_error
            if not self._read(deadline):
                return []
        if at_most and at_most < len(queued):
            return [queued.popleft() for _ in range(at_most)]
        taken = list(queued)
        queued.clear()
        return taken

    # ----------------------------------------------------------------- publishing
    def confirm_select(self) -> None:
        """Publisher confirms on (once per connection; later calls do nothing)."""
        if self._confirming:
            return
        self._call_operation(ConfirmSelect())
        self._confirming = True

    def publish(
        self,
        exchange: str,
        routing_key: str,
        properties: MessageProperties,
        body: bytes,
        *,
        mandatory: bool = False,
    ) -> None:
        """Buffer one publish; written when the buffer is large or at the next wait.  A
        ``mandatory`` message the broker cannot route comes back (basic.return), and
        ``drain_confirms`` then fails."""
        out = self._connection.out
        if mandatory:
            try:
                method = self._mandatory_methods.get((exchange, routing_key))
                if method is None:
                    method = wire.publish_method(CHANNEL, exchange, routing_key, mandatory=True)
                    if len(self._mandatory_methods) < _METHODS_KEPT:
                        self._mandatory_methods[(exchange, routing_key)] = method
                frames = wire.content_frames(CHANNEL, properties, body, self._connection.frame_max)
            except wire.EncodeError as error:
                raise self._replies.encode_failed(error) from error
            out.append(method)
            out += frames
        else:
            self._channel.publish(exchange, routing_key, properties, body)
        self.published += 1
        if len(out) > 512:
            self._flush()

    def _flush(self) -> None:
        out = self._connection.out
        if not out:
            return
        data = b"".join(out)
        out.clear()
        self._channel.out_large = False
        try:
            self._sock.sendall(data)
        except OSError as error:
            raise self._replies.lost(f"connection to {self.url.redacted} failed: {error}") from error

    def drain_confirms(self, *, keep_unconfirmed: int = 0) -> None:
        """Read confirms until at most ``keep_unconfirmed`` publishes are unsettled.

        Raises BrokerError when the broker refused (basic.nack) a message or did not confirm in
        time: a Spark task must fail rather than report success for an unconfirmed message."""
        self._flush()
        replies = self._replies
        deadline = time.monotonic() + self.timeout
        while self.published - replies.confirmed > keep_unconfirmed:
            if not self._read(deadline):
                raise BrokerError(
                    f"the broker did not confirm {self.published - replies.confirmed} published "
                    f"message(s) within {self.timeout:g} s"
                )
        if replies.returned_messages:
            raise BrokerError(
                f"the broker could not route {len(replies.returned_messages)} published message(s), "
                f"first: {replies.returned_messages[0]}"
            )
        if replies.nacked:
            raise BrokerError(
                f"the broker refused (basic.nack) {len(replies.nacked)} published message(s); "
                "they may not be stored"
            )
