"""``stomp-amqp-adapter tap``: the command line of the recording tap.

Owns the tap's arguments, its TLS client context for the upstream, and its process life: start
the writer thread, the listeners and the operator port; on the first SIGTERM/SIGINT stop
accepting, close every connection, let the writer finish its file; a second signal exits at
once.  ``main(argv) -> int`` (argv without the ``tap`` word) so that tests can call it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import ssl
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..logs import configure_logging
from ..stomp.codec import FrameLimits
from .http import OperatorPort, build_registry
from .proxy import Tap, TapSettings, host_port
from .writer import RecordWriter

log = logging.getLogger("adapter.tap")

MIB = 1024 * 1024
# a record without its headers, its command cut to 1 KiB (six characters of JSON per byte at
# most), must fit whatever the connection's address
MIN_RECORD_BYTES = 64 * 1024
SWITCH_INTERVAL = 0.0005
_TLS_VERSIONS = {"tlsv1.2": ssl.TLSVersion.TLSv1_2, "tlsv1.3": ssl.TLSVersion.TLSv1_3}


class UsageError(Exception):
    pass


def parse_address(text: str, what: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPv6]:PORT``."""
    host, colon, port = text.rpartition(":")
    if not colon or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"{what} {text!r}: expected HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


def _microseconds(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 10_000:
        raise argparse.ArgumentTypeError("must be an integer from 0 to 10000 (microseconds)")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be a positive number of seconds")
    return value


def _bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "yes", "1", "on"):
        return True
    if lowered in ("false", "no", "0", "off"):
        return False
    raise argparse.ArgumentTypeError("must be true or false")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stomp-amqp-adapter tap",
        description="A transparent STOMP proxy that records the traffic it passes on "
        "(docs/recording-format.md): put it between STOMP clients and any STOMP broker.",
    )
    parser.add_argument(
        "--listen",
        metavar="HOST:PORT",
        action="append",
        required=True,
        help="address to accept STOMP clients on (plain TCP); repeat for several",
    )
    parser.add_argument(
        "--upstream", metavar="HOST:PORT", required=True, help="the STOMP broker to pass on to"
    )
    parser.add_argument(
        "--record", metavar="DIR", required=True, type=Path, help="directory of the recording"
    )
    parser.add_argument(
        "--record-bodies",
        action="store_true",
        help="also record message bodies (base64); off by default: recordings go to people who must "
        "not see payloads",
    )
    parser.add_argument(
        "--rotate-bytes",
        metavar="N",
        type=_positive,
        default=64 * MIB,
        help="start a new file after N bytes (compressed; default 64 MiB)",
    )
    parser.add_argument(
        "--rotate-seconds",
        metavar="S",
        type=_seconds,
        default=300.0,
        help="start a new file after S seconds (default 300): a file is visible to Spark once finished",
    )
    parser.add_argument(
        "--queue-records",
        metavar="N",
        type=_positive,
        default=50_000,
        help="records waiting for the disk at most, beyond which they are dropped (default 50000)",
    )
    parser.add_argument(
        "--queue-bytes",
        metavar="N",
        type=_positive,
        default=64 * MIB,
        help="bytes of records waiting for the disk at most (default 64 MiB)",
    )
    parser.add_argument(
        "--max-frame-size",
        metavar="N",
        type=_positive,
        default=64 * MIB,
        help="largest frame the recorder parses (default 64 MiB); a larger one ends the recording of "
        "that direction, never the connection",
    )
    parser.add_argument(
        "--parse-buffer-bytes",
        metavar="N",
        type=_positive,
        default=256 * MIB,
        help="bytes of incomplete frames the recorders hold at most, all connections together "
        "(default 256 MiB)",
    )
    parser.add_argument(
        "--max-record-bytes",
        metavar="N",
        type=_positive,
        default=16 * MIB,
        help="largest record made (default 16 MiB; at least 64 KiB, at most --queue-bytes): a frame "
        "whose record could be larger is recorded without its headers, or without its body when "
        "only the headers fit (its record says what it leaves out)",
    )
    parser.add_argument(
        "--tcp-nodelay",
        metavar="BOOL",
        type=_bool,
        default=True,
        help="TCP_NODELAY on the client's and the upstream's sockets (default true: each read is "
        "sent on at once; false: the kernel coalesces small writes while an earlier one is not "
        "acknowledged, more throughput and a longer tail latency)",
    )
    parser.add_argument(
        "--busy-poll-microseconds",
        metavar="N",
        type=_microseconds,
        default=0,
        help="after a read, poll the sockets this long before sleeping, while a CPU is free, as "
        "adapter.busy_poll_microseconds does (default 0: sleep at once; 50 cut the added p99 by "
        "a third and cost about 7 %% of throughput and 20 %% more CPU per message)",
    )
    parser.add_argument(
        "--connect-timeout",
        metavar="S",
        type=_seconds,
        default=10.0,
        help="seconds to reach the upstream before the client is reset (default 10)",
    )
    tls = parser.add_argument_group("TLS to the upstream (the adapter.amqp_tls_* settings, for the tap)")
    tls.add_argument("--upstream-tls", action="store_true", help="connect to the upstream over TLS")
    tls.add_argument(
        "--upstream-tls-cafile", metavar="FILE", help="CAs that may sign the upstream's certificate"
    )
    tls.add_argument("--upstream-tls-certfile", metavar="FILE", help="client certificate (mutual TLS)")
    tls.add_argument("--upstream-tls-keyfile", metavar="FILE", help="its key, if not in the certificate file")
    tls.add_argument(
        "--upstream-tls-verify",
        metavar="BOOL",
        type=_bool,
        default=True,
        help="check the upstream's certificate and host name (default true)",
    )
    tls.add_argument(
        "--upstream-tls-server-name", metavar="NAME", help="SNI and name checked (default: host)"
    )
    tls.add_argument(
        "--upstream-tls-min-version", choices=sorted(_TLS_VERSIONS), default="tlsv1.2", help="default tlsv1.2"
    )
    parser.add_argument("--http-listen", metavar="HOST:PORT", help="serve GET /metrics and /healthz here")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--log-format", default="text", choices=["text", "json"])
    return parser


def upstream_tls_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The TLS client context for the upstream, built as the adapter's for amqps:// nodes."""
    if not args.upstream_tls:
        given = [
            name
            for name in ("cafile", "certfile", "keyfile", "server_name")
            if getattr(args, f"upstream_tls_{name}")
        ]
        if given:
            raise UsageError(f"--upstream-tls-{given[0].replace('_', '-')} needs --upstream-tls")
        return None
    try:
        context = ssl.create_default_context(cafile=args.upstream_tls_cafile)
        if args.upstream_tls_certfile:
            context.load_cert_chain(args.upstream_tls_certfile, args.upstream_tls_keyfile)
        elif args.upstream_tls_keyfile:
            raise UsageError("--upstream-tls-keyfile needs --upstream-tls-certfile")
    except (OSError, ssl.SSLError) as error:
        raise UsageError(f"cannot load the upstream TLS files: {error}") from None
    context.minimum_version = _TLS_VERSIONS[args.upstream_tls_min_version]
    if not args.upstream_tls_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def upstream_trust(args: argparse.Namespace) -> str:
    """The CAs the upstream's certificate is checked against, for the log ("" if it is not).
    Without --upstream-tls-cafile it is OpenSSL's default trust store, which Python's default
    context loads: the file and directory named by SSL_CERT_FILE and SSL_CERT_DIR in the
    tap's environment, else the system's (on Debian, /etc/ssl/certs)."""
    if not args.upstream_tls or not args.upstream_tls_verify:
        return ""
    if args.upstream_tls_cafile:
        return f"--upstream-tls-cafile {args.upstream_tls_cafile}"
    paths = ssl.get_default_verify_paths()  # None for a file or directory that does not exist
    where = [f"{what} {path}" for what, path in (("file", paths.cafile), ("directory", paths.capath)) if path]
    return f"the default trust store ({', '.join(where) or 'no file or directory found'})"


def settings_from(args: argparse.Namespace) -> TapSettings:
    if args.max_record_bytes < MIN_RECORD_BYTES:
        raise UsageError(f"--max-record-bytes must be at least {MIN_RECORD_BYTES} (64 KiB)")
    if args.max_record_bytes > args.queue_bytes:
        raise UsageError(
            f"--max-record-bytes {args.max_record_bytes} is more than --queue-bytes {args.queue_bytes}: "
            "a record that does not fit the queue is never written"
        )
    return TapSettings(
        listeners=[parse_address(text, "--listen") for text in args.listen],
        upstream=parse_address(args.upstream, "--upstream"),
        upstream_tls=upstream_tls_context(args),
        upstream_server_name=args.upstream_tls_server_name,
        upstream_trust=upstream_trust(args),
        record_bodies=args.record_bodies,
        limits=FrameLimits(args.max_frame_size, 10_000, min(args.max_frame_size, 1 * MIB)),
        parse_buffer_bytes=args.parse_buffer_bytes,
        max_record_bytes=args.max_record_bytes,
        connect_timeout=args.connect_timeout,
        tcp_nodelay=args.tcp_nodelay,
        busy_poll_microseconds=args.busy_poll_microseconds,
    )


async def serve(args: argparse.Namespace, settings: TapSettings, stop: asyncio.Event | None = None) -> int:
    """Run the tap until ``stop`` is set (or a signal arrives)."""
    writer = RecordWriter(
        args.record,
        rotate_bytes=args.rotate_bytes,
        rotate_seconds=args.rotate_seconds,
        max_records=args.queue_records,
        max_bytes=args.queue_bytes,
    )
    writer.start()
    tap = Tap(settings, writer.offer)
    port = OperatorPort(build_registry(tap, writer))
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals > 1:
            log.warning("tap: second signal, exiting at once (the file being written stays .part)")
            os._exit(1)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal)
    try:
        await tap.start()
        if args.http_listen:
            where = await port.start(*parse_address(args.http_listen, "--http-listen"))
            log.info("tap: metrics on http://%s/metrics", where)
        log.info(
            "tap: recording into %s (bodies %s)",
            args.record,
            "recorded" if settings.record_bodies else "not recorded",
        )
        await stop.wait()
        log.info("tap: stopping")
    finally:
        await port.stop()
        await tap.stop()
        await asyncio.to_thread(writer.close)
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
    return 0


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    try:
        settings = settings_from(args)
    except UsageError as error:
        print(f"stomp-amqp-adapter tap: {error}", file=sys.stderr)
        return 2
    configure_logging(args.log_level, args.log_format)
    if settings.upstream_tls is not None and not args.upstream_tls_verify:
        log.warning("--upstream-tls-verify false: the upstream's certificate is NOT checked")
    log.info(
        "tap: %s -> %s%s",
        ", ".join(host_port(*listener) for listener in settings.listeners),
        host_port(*settings.upstream),
        (f" (TLS, CAs trusted: {settings.upstream_trust})" if settings.upstream_trust else " (TLS)")
        if settings.upstream_tls
        else "",
    )
    # the writer thread encodes and compresses while the event loop proxies: a shorter GIL switch
    # interval than the default 5 ms keeps it from adding milliseconds to a frame's way through
    sys.setswitchinterval(SWITCH_INTERVAL)
    runner: Any
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        runner = asyncio.run
    try:
        return int(runner(serve(args, settings)))
    except OSError as error:
        log.error("tap: cannot start: %s", error)
        return 1
