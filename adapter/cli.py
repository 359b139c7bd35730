"""Command line entry point: ``stomp-amqp-adapter`` and ``python -m adapter``.

Owns argument parsing, logging set-up, the event loop (uvloop where available) and signal
handling: the first SIGTERM/SIGINT starts a graceful shutdown, a second one exits at once.
``main(argv) -> int`` so that tests and scripts can call it directly.

The flags of settings come from their declarations (adapter/config/settings.py); ``build_server`` turns the
settings into the groups `Server` is built from (adapter/server/options.py), loading every TLS
file they name.  ``--check-config`` stops after that step: exit 0, or 2 with the messages start-up
would stop with.  ``--version`` prints the installed package's version.

With ``--workers N`` (N > 1) this process becomes the supervisor of N worker processes
(adapter/server/workers.py); each worker runs this same entry point with the same arguments
plus ``--worker-spec``, which hands it its listening sockets and control socket.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import dataclasses
import gc
import importlib.metadata
import itertools
import logging
import os
import signal
import ssl
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from .amqp.brokers import BrokerNodes, parse_nodes
from .amqp.multiplex_runtime import AmqpMultiplex
from .amqp.pool_runtime import AmqpReuse
from .amqp.shared import PausedBytes
from .caps import ConnectionCap
from .config import DECLARED, ConfigError, Settings, load_settings, parse_listener, redact_url
from .logs import configure_logging
from .mapping.budget import Budgets
from .server.connection import BrokerSettings
from .server.fdlimit import raise_soft_limit
from .server.listener import Server
from .server.options import AmqpOptions, Limits, Listening, Operations, SocketOptions, WebListener
from .server.proxy_protocol import ProxyTrust
from .server.websocket import WebStompSettings
from .server.workers import WORKER_SPEC_FLAG, ListenerPlan, Supervisor, WorkerControl, WorkerSpec
from .session import SessionRegistries, SessionSettings
from .session.tokens import KEY_FILE_ERRORS, TokenValidator
from .sharing.rules import Registry
from .stomp.codec import FrameLimits

log = logging.getLogger("adapter")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stomp-amqp-adapter",
        description="A STOMP 1.0-1.2 server in front of RabbitMQ (AMQP 0-9-1), "
        "behaving like RabbitMQ's STOMP plugin.",
        epilog="Precedence: command line > STOMP_ADAPTER_* environment variables > ini file > defaults. "
        "See docs/configuration.md for every key.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="ini file (rabbitmq.conf-style 'key = value' lines, see config/adapter.ini)",
    )
    parser.add_argument(
        "--check-config",
        action="store_true",
        help="load and check the configuration (ini file, STOMP_ADAPTER_* variables, flags, the TLS "
        "files they name) as start-up does, then exit: 0 if it is good, 2 with start-up's messages "
        "if not; binds no port and does not contact the broker",
    )
    for declared in DECLARED.values():
        flag = declared.setting.flag
        if flag is None:
            continue
        options: dict[str, Any] = {"dest": declared.name, "help": flag.help}
        if flag.switch:
            options.update(action="store_const", const=True)
        elif flag.choices is not None:
            options["choices"] = flag.choices
        else:
            options["metavar"] = flag.metavar
            if flag.repeat:
                options["action"] = "append"
        parser.add_argument(flag.option, **options)
    # internal: how the supervisor starts a worker (its sockets and control socket)
    parser.add_argument(WORKER_SPEC_FLAG, help=argparse.SUPPRESS)
    return parser


def version() -> str:
    """The installed package's version ("unknown" when run from a checkout that was never installed)."""
    try:
        return importlib.metadata.version("stomp-amqp-adapter")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - depends on the install
        return "unknown"


def command_line_settings(args: argparse.Namespace) -> dict[str, object]:
    """The settings the flags set (None: not given), keyed by setting name, for load_settings."""
    return {name: getattr(args, name) for name, declared in DECLARED.items() if declared.setting.flag}


def connection_cap(limit: int | None, worker: WorkerSpec | None, row: int) -> ConnectionCap | None:
    """A cap of ``limit`` connections (None: no cap); a worker of --workers N counts them in
    row ``row`` of the table its supervisor shares with every worker, so the limit holds for
    the worker set together (adapter/server/sharedcaps.py): row 0 is stomp.max_connections,
    row 1 + i web_stomp.max_connections of the i-th web_stomp listener."""
    if limit is None:
        return None
    if worker is None or worker.caps is None:
        return ConnectionCap(limit)
    return ConnectionCap(limit, worker.caps.count(row, worker.slot, limit))


def cap_rows(settings: Settings) -> int:
    """The rows of the supervisor's cap table (0: no cap is set, no table)."""
    if settings.max_connections is None and settings.web_stomp_max_connections is None:
        return 0
    return 1 + len(settings.web_stomp_listeners) + len(settings.web_stomp_ssl_listeners)


def token_validator(settings: Settings) -> TokenValidator | None:
    """adapter.oauth2_signing_key_file / _jwks_file: a file that cannot be read or holds no
    usable key stops start-up with a ConfigError naming the setting."""
    name, path = (
        ("adapter.oauth2_jwks_file", settings.oauth2_jwks_file)
        if settings.oauth2_jwks_file is not None
        else ("adapter.oauth2_signing_key_file", settings.oauth2_signing_key_file)
    )
    try:
        return TokenValidator.from_files(
            settings.oauth2_signing_key_file, settings.oauth2_jwks_file, settings.oauth2_audience
        )
    except KEY_FILE_ERRORS as error:
        raise ConfigError(f"cannot load {name} = {path}: {error}") from None


def session_settings(settings: Settings, worker: WorkerSpec | None = None) -> SessionSettings:
    """``worker``: this process is a worker of --workers N, whose stomp.max_connections counts
    every worker's sessions (adapter/server/sharedcaps.py)."""
    registries = SessionRegistries(
        connection_cap=connection_cap(settings.max_connections, worker, 0),
        shared=Registry(
            max_lag=settings.shared_subscription_max_lag,
            lag_budget=settings.shared_subscription_lag_budget,
            trailing_lf=settings.trailing_lf,
            reauthorise_seconds=settings.amqp_connection_max_age_seconds,
        )
        if settings.shared_subscriptions
        else None,
        budgets=Budgets(
            max_transaction_bytes=settings.max_transaction_bytes,
            transaction_bytes_budget=settings.transaction_bytes_budget,
            max_unacked_bytes=settings.max_unacked_bytes,
            unacked_bytes_budget=settings.unacked_bytes_budget,
        ),
    )
    return SessionSettings(
        default_user=settings.default_user,
        default_pass=settings.default_pass,
        default_vhost=settings.default_vhost,
        implicit_connect=settings.implicit_connect,
        hide_server_info=settings.hide_server_info,
        default_nack_requeue=settings.default_nack_requeue,
        min_client_heartbeat=settings.min_client_heartbeat,
        default_retry_delays=settings.default_retry_delays,
        default_topic_exchange=settings.default_topic_exchange,
        loopback_users=frozenset(settings.loopback_users),
        trailing_lf=settings.trailing_lf,
        profile=settings.profile,
        plugin_behaviour=settings.plugin_behaviour,
        declare_exchanges=settings.declare_exchanges,
        token_validator=token_validator(settings),
        frame_limits=FrameLimits(settings.max_frame_size, settings.max_headers, settings.max_header_length),
        unauthenticated_limits=FrameLimits(
            min(settings.max_frame_size_unauthenticated, settings.max_frame_size),
            settings.max_headers,
            settings.max_header_length,
        ),
        registries=registries,
    )


_TLS_VERSIONS = {"tlsv1.2": ssl.TLSVersion.TLSv1_2, "tlsv1.3": ssl.TLSVersion.TLSv1_3}


def _check_files(*settings: tuple[str, str | None]) -> None:
    for name, path in settings:
        if path and not os.path.isfile(path):
            raise ConfigError(f"{name} = {path}: no such file")


def _load_tls_files(
    context: ssl.SSLContext,
    *,
    certfile: tuple[str, str | None],
    keyfile: tuple[str, str | None],
    cafile: tuple[str, str | None],
    password: tuple[str, str | None] | None,
) -> None:
    """Load a certificate chain, its key and a CA file into ``context``; each argument is
    (the setting's name, its value), so that a start-up error names the setting and the file
    (Python's errors name neither).  An encrypted key without a password is refused: OpenSSL
    would otherwise ask for one on the terminal and the adapter would wait on its stdin."""
    _check_files(certfile, keyfile, cafile)

    def no_passphrase() -> bytes:
        hint = f"set {password[0]}" if password else "this setting takes an unencrypted key"
        raise ConfigError(
            f"{keyfile[0] if keyfile[1] else certfile[0]}: the private key is encrypted: {hint}"
        )

    if certfile[1]:
        try:
            context.load_cert_chain(
                certfile[1],
                keyfile[1],
                password[1] if password and password[1] is not None else no_passphrase,
            )
        except (OSError, ssl.SSLError) as error:
            where = f"{certfile[0]} = {certfile[1]}" + (
                f", {keyfile[0]} = {keyfile[1]}" if keyfile[1] else ""
            )
            hint = "wrong password, a key that is not the certificate's, or not PEM"
            raise ConfigError(f"cannot load {where}: {error} ({hint})") from None
    if cafile[1]:
        try:
            context.load_verify_locations(cafile[1])
        except (OSError, ssl.SSLError) as error:
            raise ConfigError(f"cannot load {cafile[0]} = {cafile[1]}: {error}") from None


def broker_tls_context(settings: Settings) -> ssl.SSLContext:
    """The TLS client context for amqps:// nodes.  Without a CA file the broker is verified
    against Python's default trust store (so SSL_CERT_FILE works as for any Python client)."""
    cafile = ("adapter.amqp_tls_cafile", settings.amqp_tls_cafile)
    _check_files(cafile)
    try:  # with a CA file, only that file is trusted (create_default_context's rule)
        context = ssl.create_default_context(cafile=settings.amqp_tls_cafile)
    except (OSError, ssl.SSLError) as error:
        raise ConfigError(f"cannot load {cafile[0]} = {cafile[1]}: {error}") from None
    _load_tls_files(
        context,
        certfile=("adapter.amqp_tls_certfile", settings.amqp_tls_certfile),
        keyfile=("adapter.amqp_tls_keyfile", settings.amqp_tls_keyfile),
        cafile=(cafile[0], None),  # loaded above
        password=None,
    )
    context.minimum_version = _TLS_VERSIONS[settings.amqp_tls_min_version]
    if not settings.amqp_tls_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        log.warning(
            "adapter.amqp_tls_verify = false: the broker's certificate is NOT checked; anyone on the "
            "network path can read and change the traffic, passwords included"
        )
    return context


def _server_tls_context() -> ssl.SSLContext:
    """A server-side context for the STOMP and WebSocket TLS listeners.  It sends no TLS 1.3
    session tickets, like the plugins' Erlang TLS server (whose session_tickets option is
    disabled unless configured): OpenSSL's default of two tickets per handshake costs the server
    about a fifth of its handshake CPU and the client two more records to read, for clients
    that mostly never resume (stomp.py, most scripts)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.num_tickets = 0
    return context


def _configured_server_context(
    section: str,
    listener_key: str,
    *,
    certfile: str | None,
    keyfile: str | None,
    cacertfile: str | None,
    password: str | None,
    versions: tuple[str, ...],
) -> ssl.SSLContext:
    """A TLS listener's context from one set of rabbitmq.conf-style keys (``section`` is their
    prefix: "ssl_options." or "web_stomp.ssl.")."""
    if not certfile:
        raise ConfigError(f"{listener_key} needs {section}certfile (and its key)")
    context = _server_tls_context()
    _load_tls_files(
        context,
        certfile=(f"{section}certfile", certfile),
        keyfile=(f"{section}keyfile", keyfile),
        cafile=(f"{section}cacertfile", cacertfile),
        password=(f"{section}password", password),
    )
    if versions:
        ordered = sorted(_TLS_VERSIONS[v] for v in versions)
        context.minimum_version, context.maximum_version = ordered[0], ordered[-1]
    return context


def listener_tls_context(settings: Settings) -> ssl.SSLContext | None:
    """The server-side TLS context of stomp.listeners.ssl.<name>, from rabbitmq.conf's
    ssl_options.* keys (verify_peer asks for a client certificate; fail_if_no_peer_cert makes it
    mandatory; versions bound the protocol versions offered)."""
    if not settings.ssl_listeners:
        return None
    context = _configured_server_context(
        "ssl_options.",
        "stomp.listeners.ssl.<name>",
        certfile=settings.ssl_certfile,
        keyfile=settings.ssl_keyfile,
        cacertfile=settings.ssl_cacertfile,
        password=settings.ssl_password,
        versions=settings.ssl_versions,
    )
    if settings.ssl_verify == "verify_peer":
        context.verify_mode = ssl.CERT_REQUIRED if settings.ssl_fail_if_no_peer_cert else ssl.CERT_OPTIONAL
    return context


def web_tls_context(settings: Settings) -> ssl.SSLContext | None:
    """The TLS context of the wss:// listener, from the web_stomp.ssl.* keys."""
    if not settings.web_stomp_ssl_listeners:
        return None
    return _configured_server_context(
        "web_stomp.ssl.",
        "web_stomp.ssl.port",
        certfile=settings.web_stomp_ssl_certfile,
        keyfile=settings.web_stomp_ssl_keyfile,
        cacertfile=settings.web_stomp_ssl_cacertfile,
        password=settings.web_stomp_ssl_password,
        versions=settings.web_stomp_ssl_versions,
    )


def web_listeners(settings: Settings, worker: WorkerSpec | None = None) -> list[WebListener]:
    """The web_stomp listeners, each with its own web_stomp.max_connections count (as each of
    the plugin's ranch listeners has), counted over every worker of --workers N together."""
    if settings.web_stomp_token_cookie is not None and not settings.web_stomp_allow_origins:
        # a browser sends a site's cookies with a WebSocket any other site opens: without an
        # origin check, a hostile page would log in with the user's token (docs/configuration.md)
        raise ConfigError(
            f"adapter.web_stomp_token_cookie = {settings.web_stomp_token_cookie} needs "
            "web_stomp.allow_origins: without it any web site could log in with the cookie's token"
        )
    limit = settings.web_stomp_max_connections
    rows = itertools.count(1)  # the i-th listener's row of the cap table (cap_rows)

    def cap() -> ConnectionCap | None:
        return connection_cap(limit, worker, next(rows))

    web = WebStompSettings(
        path=settings.web_stomp_ws_path,
        frame_type=settings.web_stomp_ws_frame,
        max_message_size=settings.web_stomp_max_frame_size,
        use_http_auth=settings.web_stomp_use_http_auth,
        compress=settings.web_stomp_compress,
        idle_timeout=settings.web_stomp_idle_timeout,
        request_timeout=settings.web_stomp_request_timeout,
        allow_origins=settings.web_stomp_allow_origins,
        proxy_protocol=settings.web_stomp_proxy_protocol,
        hsts_policy=settings.web_stomp_hsts_policy,
        console=settings.web_stomp_console,
        token_cookie=settings.web_stomp_token_cookie,
    )
    listeners = [
        WebListener(*parse_listener(address), web, backlog=settings.web_stomp_backlog, cap=cap())
        for address in settings.web_stomp_listeners
    ]
    tls = web_tls_context(settings)
    listeners += [
        WebListener(*parse_listener(address), web, tls=tls, backlog=settings.web_stomp_backlog, cap=cap())
        for address in settings.web_stomp_ssl_listeners
    ]
    return listeners


_Group = TypeVar("_Group")


def group(cls: type[_Group], settings: Settings, **given: Any) -> _Group:
    """An options group of the server (adapter/server/options.py): the fields in ``given``, every
    other one from the setting of the same name."""
    values = dict(given)
    for item in dataclasses.fields(cls):  # type: ignore[arg-type]
        if item.name not in values:
            if item.name not in DECLARED:
                raise TypeError(f"{cls.__name__}.{item.name} is neither given nor a setting's name")
            values[item.name] = getattr(settings, item.name)
    return cls(**values)


def listening(settings: Settings) -> Listening:
    """The STOMP listeners: plain, activemq-profile and TLS (whose certificate files are loaded
    here: a bad one stops start-up with a ConfigError naming the setting and the file)."""
    return Listening(
        stomp=tuple(parse_listener(listener) for listener in settings.listeners),
        sockets=group(SocketOptions, settings),
        activemq=tuple(parse_listener(listener) for listener in settings.activemq_listeners),
        tls=tuple(parse_listener(listener) for listener in settings.ssl_listeners),
        tls_context=listener_tls_context(settings),
        proxy_protocol=settings.proxy_protocol,
        proxy_trust=ProxyTrust.parse(settings.proxy_protocol_trusted),
    )


def amqp_link(settings: Settings) -> AmqpOptions:
    nodes = parse_nodes(settings.amqp_url)
    broker = BrokerSettings(
        heartbeat=settings.amqp_heartbeat,
        connect_timeout=settings.amqp_connect_timeout,
        tls=broker_tls_context(settings) if any(node.tls for node in nodes) else None,
        tls_server_name=settings.amqp_tls_server_name,
    )
    reuse = (
        AmqpReuse(
            idle_seconds=settings.amqp_connection_idle_seconds,
            max_age_seconds=settings.amqp_connection_max_age_seconds,
            max_size=settings.amqp_connection_pool_size,
        )
        if settings.amqp_connection_reuse
        else None
    )
    mux = (
        AmqpMultiplex(
            per_connection=settings.amqp_sessions_per_connection,
            idle_seconds=settings.amqp_connection_idle_seconds,
            max_age_seconds=settings.amqp_connection_max_age_seconds,
            max_idle=settings.amqp_connection_pool_size,
            paused_bytes=PausedBytes(
                settings.amqp_shared_max_paused_bytes, settings.amqp_shared_paused_bytes_budget
            ),
        )
        if settings.amqp_sessions_per_connection > 1
        else None
    )
    return AmqpOptions(broker, BrokerNodes(nodes, settings.amqp_node_order), reuse, mux)


def build_server(settings: Settings, worker: WorkerSpec | None = None) -> Server:
    """The server of these settings (not started).  Every file the settings name is read here, so
    a ConfigError from this call is one start-up would stop with (``--check-config`` relies on it)."""
    return Server(
        session_settings(settings, worker),
        listening=listening(settings),
        web=tuple(web_listeners(settings, worker)),
        link=amqp_link(settings),
        limits=group(Limits, settings),
        operations=group(
            Operations,
            settings,
            http_listen=parse_listener(settings.http_listen) if settings.http_listen else None,
        ),
        inherited_sockets=worker.sockets if worker is not None else None,
    )


def build_supervisor(settings: Settings, server: Server, argv: Sequence[str]) -> Supervisor:
    """The supervisor of ``settings.workers`` workers; ``server`` (never started) has checked the
    configuration and knows the broker nodes, which /readyz asks."""
    listening = server.listening
    plans = [ListenerPlan(host, port, settings.tcp_backlog) for host, port in listening.stomp]
    plans += [ListenerPlan(host, port, settings.tcp_backlog) for host, port in listening.tls]
    plans += [ListenerPlan(host, port, settings.tcp_backlog) for host, port in listening.activemq]
    plans += [ListenerPlan(web.host, web.port, web.backlog) for web in server.web]
    return Supervisor(
        workers=settings.workers,
        worker_command=[sys.executable, "-m", "adapter", *argv],
        plans=plans,
        http_listen=server.operations.http_listen,
        nodes=server.context.nodes,
        broker=server.context.broker,
        shutdown_timeout=settings.shutdown_timeout,
        metrics_destinations=settings.metrics_destinations,
        cap_rows=cap_rows(settings),
    )


async def supervise(supervisor: Supervisor) -> int:
    return await supervisor.run()


async def serve(server: Server, link: WorkerControl | None = None) -> None:
    """Run until SIGTERM/SIGINT (or, for a worker, until its supervisor is gone), then shut
    down gracefully."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            log.info("signal received: shutting down (send it again to exit at once)")
            stop.set()
        else:
            log.warning("second signal: exiting now")
            sys.exit(1)

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, on_signal)
    await server.start()
    linked = loop.create_task(link.run(server, stop)) if link is not None else None
    await stop.wait()
    await server.shutdown()
    if linked is not None:
        linked.cancel()


def tune_malloc() -> None:
    """Keep large message buffers in the heap (glibc only; elsewhere nothing happens).

    Every message body the adapter handles is a fresh Python ``bytes`` object.  glibc serves
    blocks over its mmap threshold (128 KiB to start with) straight from the kernel and gives
    them back on free, so each 1 MiB message cost hundreds of page faults, several times over:
    measured at 730 minor faults per message, with more CPU in the kernel than in Python.  Blocks
    below 16 MiB now come from the heap and are reused; the heap top is returned to the kernel
    once 64 MiB of it are free (docs/performance.md, "Large messages")."""
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
    mallopt(m_mmap_threshold, 16 * 1024 * 1024)
    mallopt(m_trim_threshold, 64 * 1024 * 1024)


def tune_gc() -> None:
    """Fewer, cheaper garbage collections.

    What start-up made (modules, settings, the server's tables) lives as long as the process:
    ``gc.freeze`` takes it out of every later collection.  The youngest generation is collected
    after 10,000 allocations instead of 700, so the objects a connection or a message holds for
    a moment are traced less often.  Measured: about 1 % of a connect cycle (docs/performance.md,
    "Measured design choices").  A closed connection's objects no longer refer to each other
    (docs/architecture.md, "The shell's parts"): reference counting frees them, not a
    collection."""
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(argv) if argv is not None else sys.argv[1:]
    if arguments[:1] == ["tap"]:  # the recording tap: a command of its own (adapter/tap/main.py)
        from .tap.main import main as tap_main

        return tap_main(arguments[1:])
    args = build_parser().parse_args(arguments)
    worker = WorkerSpec.parse(args.worker_spec) if args.worker_spec else None
    overrides = command_line_settings(args)
    if worker is not None:
        # the supervisor serves the HTTP port, and a worker supervises nothing
        overrides.update(http_listen="none", workers=1)
    try:
        settings = load_settings(args.config, overrides)
        server = build_server(settings, worker)
    except ConfigError as error:
        print(f"stomp-amqp-adapter: configuration error:\n{error}", file=sys.stderr)
        return 2
    if args.check_config:
        source = f"{args.config}, " if args.config else ""
        print(f"stomp-amqp-adapter: configuration OK ({source}environment and command line)")
        return 0
    configure_logging(settings.log_level, settings.log_format, worker.slot if worker is not None else None)
    if worker is None:
        log.info("fronting broker %s", redact_url(settings.amqp_url))
    log.info("file-descriptor limit: %d (two per STOMP client)", raise_soft_limit())
    tune_malloc()
    tune_gc()
    runner: Callable[[Coroutine[Any, Any, Any]], Any]
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        runner = asyncio.run
    try:
        if settings.workers > 1:
            return int(runner(supervise(build_supervisor(settings, server, arguments))))
        runner(serve(server, WorkerControl(worker.control) if worker is not None else None))
    except OSError as error:
        log.error("cannot start: %s", error)
        return 1
    return 0


def run() -> None:
    code = main()
    if sys.argv[1:2] != ["tap"] and "--check-config" not in sys.argv:
        # The server has shut down: everything it had to say is said and every socket it had
        # to close cleanly is closed.  Skip the interpreter's finalisation, which after a stop
        # with 2,000 clients spent ~3 s collecting their objects on a loaded machine (the
        # kernel closes what is left, and the broker cleans up the dropped AMQP connections).
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
