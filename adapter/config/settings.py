"""The adapter's settings: the `Settings` model, in which every setting is declared once.

This module owns the declarations: each field is one setting (its type, default, group, converter,
ini keys and flag, as adapter/config/declare.py describes), in the blocks of its group.  `Settings`
is a pydantic-settings ``BaseSettings``: frozen, the plain values the rest of the adapter takes.
Where a load takes its values is said in `settings_customise_sources`; the sources themselves (the
command line, the ``STOMP_ADAPTER_*`` variables, the ini file) are built per load by `load_settings`
(adapter/config/loading.py, adapter/config/ini.py).  Nothing here reads a file or the environment.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, InitSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from .declare import ENV_PREFIX, Declared, Flag, Group, IniKey, Setting, _declarations
from .values import (
    _amqp_url,
    _connection_cap,
    _credential,
    _float_converter,
    _http_listen,
    _int_converter,
    _listeners,
    _log_level,
    _milliseconds,
    _non_empty_str,
    _one_of,
    _optional,
    _optional_path,
    _origins,
    _retry_defaults,
    _tls_versions,
    _to_bool,
    _trusted_peers,
    _user_list,
    _ws_path,
    redact_url,
)

_OS_DEFAULT = "(or none for the OS default)"
_LISTEN, _WEB, _AMQP, _SESSION, _LIMITS, _OPS = (
    Group.LISTENERS,
    Group.WEBSOCKET,
    Group.AMQP,
    Group.SESSION,
    Group.LIMITS,
    Group.OPERATIONS,
)


# The keyword argument of ``Settings(...)`` that carries the sources of one load (`load_settings`).
SOURCES = "_adapter_sources"


class Settings(BaseSettings):
    """Every setting of the adapter, validated and frozen.  Build it with `load_settings`; ``Settings()``
    is the defaults (no file, no environment), ``Settings(name=value, ...)`` those values over them."""

    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",
        validate_default=True,
        # STOMP_ADAPTER_<NAME>, matched without regard to case (adapter/config/loading.py)
        env_prefix=ENV_PREFIX,
        case_sensitive=False,
        # a variable's value is the operator's text, as in the ini file: the field's converter reads
        # it (a list as "a, b" or as JSON), so that an error says "must be ..." as for the file
        enable_decoding=False,
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Where a load takes its values, highest first (pydantic-settings adds the defaults last).

        `load_settings` builds the sources of each load (the command line, the environment, the ini
        file, each knowing where its values were written) and hands them over as the keyword
        argument named by `SOURCES`: a load is one call, with no state kept in the class.  Without
        it, ``Settings(...)`` takes its keyword arguments only, as a plain model does."""
        assert isinstance(init_settings, InitSettingsSource)
        sources = init_settings.init_kwargs.pop(SOURCES, None)
        if sources is None:
            return (init_settings,)
        assert isinstance(sources, tuple), sources
        return sources

    def __repr_args__(self) -> Any:
        """The repr (and str) shows a value as an error message would (``Declared.shown``):
        amqp_url with its passwords as ``***``; the fields declared ``repr=False`` not at all."""
        for name, value in super().__repr_args__():
            redact = DECLARED[name].setting.redact if name is not None and name in DECLARED else None
            yield name, redact(value) if redact is not None and isinstance(value, str) else value

    # ---- listeners and TLS ------------------------------------------------------------------------------
    # Listening sockets, normalised "host:port" ("[v6]:port" for IPv6).  Empty: listen nowhere.
    listeners: Annotated[
        tuple[str, ...],
        Setting(
            _LISTEN,
            _listeners,
            "adapter.listeners",
            family=("stomp.listeners.tcp.<name>", "stomp.listeners.tcp = none"),
            flag=Flag(
                "--listen",
                "address to accept STOMP clients on; repeat for several "
                "(default 0.0.0.0:61613; port 0 = any free port)",
                metavar="HOST:PORT",
                repeat=True,
            ),
        ),
    ] = ("0.0.0.0:61613",)
    # plain TCP listeners that always speak the activemq profile, beside the others (a migration
    # serves RabbitMQ-style and legacy ActiveMQ clients from one adapter)
    activemq_listeners: Annotated[
        tuple[str, ...], Setting(_LISTEN, _listeners, "adapter.activemq_listeners")
    ] = ()
    # TLS listeners (stomp.listeners.ssl.<name>) and the rabbitmq.conf ssl_options.* they use.
    ssl_listeners: Annotated[
        tuple[str, ...],
        Setting(_LISTEN, _listeners, family=("stomp.listeners.ssl.<name>", "stomp.listeners.ssl = none")),
    ] = ()
    ssl_cacertfile: Annotated[str | None, Setting(_LISTEN, _optional_path, "ssl_options.cacertfile")] = None
    ssl_certfile: Annotated[str | None, Setting(_LISTEN, _optional_path, "ssl_options.certfile")] = None
    ssl_keyfile: Annotated[str | None, Setting(_LISTEN, _optional_path, "ssl_options.keyfile")] = None
    ssl_password: Annotated[str | None, Setting(_LISTEN, _optional_path, "ssl_options.password")] = Field(
        default=None, repr=False
    )
    ssl_verify: Annotated[
        Literal["verify_none", "verify_peer"],
        Setting(_LISTEN, _one_of("verify_none", "verify_peer"), "ssl_options.verify"),
    ] = "verify_none"
    ssl_fail_if_no_peer_cert: Annotated[
        bool, Setting(_LISTEN, _to_bool, "ssl_options.fail_if_no_peer_cert")
    ] = False
    ssl_versions: Annotated[
        tuple[str, ...], Setting(_LISTEN, _tls_versions, family=("ssl_options.versions.<n>",))
    ] = ()
    # every connection starts with a PROXY protocol header
    proxy_protocol: Annotated[bool, Setting(_LISTEN, _to_bool, "stomp.proxy_protocol")] = False
    # peers whose PROXY header (stomp. and web_stomp.proxy_protocol) is believed; empty: every
    # peer, as in the plugins (adapter/server/proxy_protocol.py, ProxyTrust)
    proxy_protocol_trusted: Annotated[
        tuple[str, ...], Setting(_LISTEN, _trusted_peers, "adapter.proxy_protocol_trusted")
    ] = ()
    tcp_backlog: Annotated[int, Setting(_LISTEN, _int_converter(1), "stomp.tcp_listen_options.backlog")] = 128
    tcp_nodelay: Annotated[bool, Setting(_LISTEN, _to_bool, "stomp.tcp_listen_options.nodelay")] = True
    tcp_keepalive: Annotated[bool, Setting(_LISTEN, _to_bool, "stomp.tcp_listen_options.keepalive")] = False
    tcp_sndbuf: Annotated[
        int | None,
        Setting(_LISTEN, _optional(_int_converter(1), _OS_DEFAULT), "stomp.tcp_listen_options.sndbuf"),
    ] = None
    tcp_recbuf: Annotated[
        int | None,
        Setting(_LISTEN, _optional(_int_converter(1), _OS_DEFAULT), "stomp.tcp_listen_options.recbuf"),
    ] = None

    # ---- WebSocket (the web_stomp.* keys of rabbitmq_web_stomp) -----------------------------------------
    # No listener unless a web_stomp.* key is in the ini file (then web_stomp.tcp.port, default
    # 15674) or the STOMP_ADAPTER_WEB_STOMP_LISTENERS variable names some.
    web_stomp_listeners: Annotated[
        tuple[str, ...],
        Setting(
            _WEB, _listeners, family=("web_stomp.tcp.port", "web_stomp.tcp.ip", "web_stomp.tcp.listener")
        ),
    ] = ()
    web_stomp_ssl_listeners: Annotated[
        tuple[str, ...],
        Setting(
            _WEB, _listeners, family=("web_stomp.ssl.port", "web_stomp.ssl.ip", "web_stomp.ssl.listener")
        ),
    ] = ()
    web_stomp_ssl_certfile: Annotated[str | None, Setting(_WEB, _optional_path, "web_stomp.ssl.certfile")] = (
        None
    )
    web_stomp_ssl_keyfile: Annotated[str | None, Setting(_WEB, _optional_path, "web_stomp.ssl.keyfile")] = (
        None
    )
    web_stomp_ssl_cacertfile: Annotated[
        str | None, Setting(_WEB, _optional_path, "web_stomp.ssl.cacertfile")
    ] = None
    web_stomp_ssl_password: Annotated[str | None, Setting(_WEB, _optional_path, "web_stomp.ssl.password")] = (
        Field(default=None, repr=False)
    )
    web_stomp_ssl_versions: Annotated[
        tuple[str, ...], Setting(_WEB, _tls_versions, family=("web_stomp.ssl.versions.<n>",))
    ] = ()
    web_stomp_backlog: Annotated[int, Setting(_WEB, _int_converter(1), "web_stomp.tcp.backlog")] = 1024
    web_stomp_ws_path: Annotated[str, Setting(_WEB, _ws_path, "web_stomp.ws_path")] = "/ws"
    web_stomp_ws_frame: Annotated[
        Literal["text", "binary"], Setting(_WEB, _one_of("text", "binary"), "web_stomp.ws_frame")
    ] = "text"
    # bytes per WebSocket message; None: no limit (the STOMP frame limits still apply).  0 is valid
    # in the plugin's schema: cowboy then refuses every non-empty message with 1009.
    web_stomp_max_frame_size: Annotated[
        int | None,
        Setting(
            _WEB,
            _optional(_int_converter(0), "(or none for no limit)"),
            "web_stomp.ws_opts.max_frame_size",
            "web_stomp.max_frame_size",  # the name issue #11 uses
        ),
    ] = None
    web_stomp_use_http_auth: Annotated[bool, Setting(_WEB, _to_bool, "web_stomp.use_http_auth")] = False
    web_stomp_compress: Annotated[bool, Setting(_WEB, _to_bool, "web_stomp.ws_opts.compress")] = True
    # seconds (the ini key is in milliseconds, as in the plugin)
    web_stomp_idle_timeout: Annotated[
        float,
        Setting(
            _WEB,
            _float_converter(0, inclusive=True),
            IniKey("web_stomp.ws_opts.idle_timeout", _milliseconds(0)),
        ),
    ] = 60.0
    # seconds a new connection has for its HTTP request: cowboy's request_timeout, which the
    # plugin leaves at 5 s (its cowboy_opts.idle_timeout only times request bodies); no ini key
    web_stomp_request_timeout: Annotated[float, Setting(_WEB, _float_converter(0, inclusive=False))] = 5.0
    web_stomp_allow_origins: Annotated[
        tuple[str, ...],
        Setting(_WEB, _origins, "web_stomp.allow_origins", family=("web_stomp.allow_origins.<n>",)),
    ] = ()
    web_stomp_proxy_protocol: Annotated[bool, Setting(_WEB, _to_bool, "web_stomp.proxy_protocol")] = False
    web_stomp_hsts_policy: Annotated[str | None, Setting(_WEB, _optional_path, "web_stomp.hsts.policy")] = (
        None
    )
    web_stomp_console: Annotated[bool, Setting(_WEB, _to_bool, "adapter.web_stomp_console")] = True
    # The cookie of the WebSocket handshake that may carry an OAuth 2.0 token (none: not read); the
    # handshake's Authorization: Bearer header and Sec-WebSocket-Protocol entry are always read.
    web_stomp_token_cookie: Annotated[
        str | None, Setting(_WEB, _optional_path, "adapter.web_stomp_token_cookie")
    ] = None

    # ---- AMQP link ----------------------------------------------------------------------------------------
    # Where the broker is.  STOMP sessions log in with the CONNECT frame's credentials (or the defaults).
    amqp_url: Annotated[
        str,
        Setting(
            _AMQP,
            _amqp_url,
            "adapter.amqp_url",
            family=("adapter.amqp_url.<name>",),
            redact=redact_url,
            flag=Flag(
                "--amqp-url",
                "the RabbitMQ to front (default amqp://guest:guest@localhost:5672/); clients log in "
                "with their own CONNECT credentials and vhost",
                metavar="URL",
            ),
        ),
    ] = "amqp://guest:guest@localhost:5672/"
    # With several nodes: the order a login tries them in (docs/behaviour.md, "Broker nodes").
    amqp_node_order: Annotated[
        Literal["round_robin", "shuffle"],
        Setting(_AMQP, _one_of("round_robin", "shuffle"), "adapter.amqp_node_order"),
    ] = "round_robin"
    # TLS to amqps:// nodes: CA file (None: Python's default trust store), client certificate
    # and key (brokers that require mutual TLS), peer verification, the name the certificate
    # must carry (None: the node's host name), the lowest protocol version accepted.
    amqp_tls_cafile: Annotated[str | None, Setting(_AMQP, _optional_path, "adapter.amqp_tls_cafile")] = None
    amqp_tls_certfile: Annotated[str | None, Setting(_AMQP, _optional_path, "adapter.amqp_tls_certfile")] = (
        None
    )
    amqp_tls_keyfile: Annotated[str | None, Setting(_AMQP, _optional_path, "adapter.amqp_tls_keyfile")] = None
    amqp_tls_verify: Annotated[bool, Setting(_AMQP, _to_bool, "adapter.amqp_tls_verify")] = True
    amqp_tls_server_name: Annotated[
        str | None, Setting(_AMQP, _optional_path, "adapter.amqp_tls_server_name")
    ] = None
    amqp_tls_min_version: Annotated[
        str, Setting(_AMQP, _one_of("tlsv1.2", "tlsv1.3"), "adapter.amqp_tls_min_version")
    ] = "tlsv1.2"
    amqp_connect_timeout: Annotated[
        float, Setting(_AMQP, _float_converter(0, inclusive=False), "adapter.amqp_connect_timeout")
    ] = 10.0
    amqp_heartbeat: Annotated[
        int,
        Setting(
            _AMQP,
            _int_converter(0, 65535, what="an integer from 0 to 65535 (seconds, 0 disables)"),
            "adapter.amqp_heartbeat",
        ),
    ] = 60
    # Reuse a STOMP session's AMQP connection for the next CONNECT of the same user, vhost and
    # passcode (adapter/amqp/pool_runtime.py, docs/configuration.md): off by default.  Idle
    # pooled connections close after idle_seconds, every one max_age_seconds after the broker
    # authenticated it; at most pool_size idle ones per process.
    amqp_connection_reuse: Annotated[
        bool,
        Setting(
            _AMQP,
            _to_bool,
            "adapter.amqp_connection_reuse",
            flag=Flag(
                "--amqp-connection-reuse",
                "reuse a finished STOMP session's AMQP connection for the next CONNECT of the same "
                "user, vhost and passcode (default off; docs/configuration.md says what it changes)",
                switch=True,
            ),
        ),
    ] = False
    amqp_connection_idle_seconds: Annotated[
        float, Setting(_AMQP, _float_converter(0, inclusive=False), "adapter.amqp_connection_idle_seconds")
    ] = 5.0
    amqp_connection_max_age_seconds: Annotated[
        float, Setting(_AMQP, _float_converter(0, inclusive=False), "adapter.amqp_connection_max_age_seconds")
    ] = 60.0
    amqp_connection_pool_size: Annotated[
        int, Setting(_AMQP, _int_converter(1), "adapter.amqp_connection_pool_size")
    ] = 100
    # Concurrent STOMP sessions of the same node, vhost, user and passcode share AMQP connections,
    # each on a channel of its own, at most this many per connection (adapter/amqp/multiplex_runtime.py,
    # docs/configuration.md): 1 (the default) gives every session a connection of its own.
    amqp_sessions_per_connection: Annotated[
        int,
        Setting(
            _AMQP,
            _int_converter(1, 65535, what="an integer from 1 to 65535"),
            "adapter.amqp_sessions_per_connection",
        ),
    ] = 1
    # With multiplexing, a session's client that does not read cannot hold the shared socket
    # back: what it is delivered meanwhile is bounded per session and for the process (an ERROR
    # ends the session past either).
    amqp_shared_max_paused_bytes: Annotated[
        int, Setting(_AMQP, _int_converter(1), "adapter.amqp_shared_max_paused_bytes")
    ] = 8 * 1024 * 1024
    amqp_shared_paused_bytes_budget: Annotated[
        int, Setting(_AMQP, _int_converter(1), "adapter.amqp_shared_paused_bytes_budget")
    ] = 256 * 1024 * 1024

    # ---- STOMP sessions -----------------------------------------------------------------------------------
    # Used when CONNECT has no login/passcode (and for implicit connect); None disables.
    default_user: Annotated[str | None, Setting(_SESSION, _credential, "stomp.default_user")] = "guest"
    default_pass: Annotated[str | None, Setting(_SESSION, _credential, "stomp.default_pass")] = Field(
        default="guest", repr=False
    )
    default_vhost: Annotated[str, Setting(_SESSION, _non_empty_str, "stomp.default_vhost")] = "/"
    implicit_connect: Annotated[bool, Setting(_SESSION, _to_bool, "stomp.implicit_connect")] = False
    hide_server_info: Annotated[bool, Setting(_SESSION, _to_bool, "stomp.hide_server_info")] = False
    default_nack_requeue: Annotated[bool, Setting(_SESSION, _to_bool, "stomp.default_nack_requeue")] = True
    # milliseconds: CONNECTED asks every STOMP 1.1/1.2 client that can send heart-beats for one
    # this often (the negotiated interval is the larger of the two sides'); 0: the client's offer
    min_client_heartbeat: Annotated[
        int,
        Setting(
            _SESSION,
            _int_converter(0, 86_400_000, what="an integer from 0 to 86400000 (ms, 0 disables)"),
            "adapter.min_client_heartbeat",
        ),
    ] = 0
    default_topic_exchange: Annotated[
        str, Setting(_SESSION, _non_empty_str, "stomp.default_topic_exchange")
    ] = "amq.topic"
    # OAuth 2.0 tokens as passcodes (docs/configuration.md, "OAuth 2.0 tokens"): with a public key
    # (a PEM file) or a JWKS file, a token's signature, exp, nbf and audience are checked before
    # the login reaches the broker; without either the broker alone decides.  The audience is
    # the broker's auth_oauth2.resource_server_id (none: not checked by the adapter).
    oauth2_signing_key_file: Annotated[
        str | None, Setting(_SESSION, _optional_path, "adapter.oauth2_signing_key_file")
    ] = None
    oauth2_jwks_file: Annotated[str | None, Setting(_SESSION, _optional_path, "adapter.oauth2_jwks_file")] = (
        None
    )
    oauth2_audience: Annotated[str | None, Setting(_SESSION, _optional_path, "adapter.oauth2_audience")] = (
        None
    )
    # Users that may only log in when the STOMP client connects from a loopback address.
    loopback_users: Annotated[tuple[str, ...], Setting(_SESSION, _user_list, "adapter.loopback_users")] = (
        "guest",
    )
    # NACK retry with back-off by default for the ack:client-individual subscriptions of
    # destinations with these prefixes (adapter/session/retries.py): PREFIX=DELAYS;...; none: only
    # SUBSCRIBEs with x-retry-delays retry.
    default_retry_delays: Annotated[
        tuple[tuple[str, str], ...], Setting(_SESSION, _retry_defaults, "adapter.default_retry_delays")
    ] = ()
    # Append LF after the NUL of every outgoing frame, as the plugin does.
    trailing_lf: Annotated[bool, Setting(_SESSION, _to_bool, "adapter.trailing_lf")] = True
    # Whose visible behaviour (ERROR texts, what a consumer timeout does) the adapter copies: the
    # 3.10.8 plugin's (the reference) or the current plugin's (adapter/session/edition.py).
    plugin_behaviour: Annotated[
        Literal["3.10", "current"], Setting(_SESSION, _one_of("3.10", "current"), "adapter.plugin_behaviour")
    ] = "3.10"
    # Declare the exchange of a SEND / SUBSCRIBE to /exchange/NAME that carries declare-exchange:true
    # (adapter/mapping/exchanges.py); an adapter-only feature, off: the header is refused.
    declare_exchanges: Annotated[bool, Setting(_SESSION, _to_bool, "adapter.declare_exchanges")] = False
    # Non-durable auto-ack /topic/ and /exchange/ subscriptions of the same vhost, user, passcode
    # and destination share one AMQP queue and consumer per process, the adapter copying each
    # message to them (adapter/sharing/rules.py, docs/configuration.md "Shared subscriptions").
    # Off: each subscription has its own queue and consumer, as with the plugin.
    shared_subscriptions: Annotated[
        bool,
        Setting(
            _SESSION,
            _to_bool,
            "adapter.shared_subscriptions",
            flag=Flag(
                "--shared-subscriptions",
                "share one AMQP queue and consumer among the plain topic subscriptions of the same "
                "user and destination (default off; docs/configuration.md says what it changes)",
                switch=True,
            ),
        ),
    ] = False
    # The STOMP dialect of every listener: the plugin's (rabbitmq) or ActiveMQ's
    # (docs/migration-activemq.md).
    profile: Annotated[
        Literal["rabbitmq", "activemq"],
        Setting(
            _SESSION,
            _one_of("rabbitmq", "activemq"),
            "adapter.profile",
            flag=Flag(
                "--profile",
                "STOMP dialect of every listener: rabbitmq (the STOMP plugin's, default) or activemq "
                "(legacy ActiveMQ clients, docs/migration-activemq.md)",
                choices=("rabbitmq", "activemq"),
            ),
        ),
    ] = "rabbitmq"

    # ---- limits -------------------------------------------------------------------------------------------
    max_frame_size: Annotated[int, Setting(_LIMITS, _int_converter(1), "stomp.max_frame_size")] = (
        4 * 1024 * 1024
    )
    max_frame_size_unauthenticated: Annotated[
        int,
        Setting(
            _LIMITS,
            _int_converter(1),
            "stomp.max_frame_size_unauthenticated",
            "adapter.max_frame_size_unauthenticated",
        ),
    ] = 65536
    max_headers: Annotated[int, Setting(_LIMITS, _int_converter(1), "adapter.max_headers")] = 100
    max_header_length: Annotated[int, Setting(_LIMITS, _int_converter(1), "adapter.max_header_length")] = (
        102400
    )
    # Seconds (the ini key stomp.login_timeout is in milliseconds, as in the plugin).
    login_timeout: Annotated[
        float,
        Setting(
            _LIMITS,
            _float_converter(0, inclusive=False),
            IniKey("stomp.login_timeout", _milliseconds(1)),
            "adapter.login_timeout",
        ),
    ] = 10.0
    # Seconds a client has to complete a frame once it has started sending it; 0: no limit.
    frame_timeout: Annotated[
        float, Setting(_LIMITS, _float_converter(0, inclusive=True), "adapter.frame_timeout")
    ] = 60.0
    # Bytes all connections together may hold in frames they have not completed.
    incomplete_frames_budget: Annotated[
        int, Setting(_LIMITS, _int_converter(1), "adapter.incomplete_frames_budget")
    ] = 256 * 1024 * 1024
    # Bytes of SEND bodies in open transactions: per connection, and all connections together.
    # activemq profile: bytes of unacknowledged client-ack deliveries kept for NACK, likewise.
    # (docs/configuration.md, "Byte budgets", argues the defaults)
    max_transaction_bytes: Annotated[
        int, Setting(_LIMITS, _int_converter(1), "adapter.max_transaction_bytes")
    ] = 64 * 1024 * 1024
    transaction_bytes_budget: Annotated[
        int, Setting(_LIMITS, _int_converter(1), "adapter.transaction_bytes_budget")
    ] = 1024 * 1024 * 1024
    max_unacked_bytes: Annotated[int, Setting(_LIMITS, _int_converter(1), "adapter.max_unacked_bytes")] = (
        64 * 1024 * 1024
    )
    unacked_bytes_budget: Annotated[
        int, Setting(_LIMITS, _int_converter(1), "adapter.unacked_bytes_budget")
    ] = 1024 * 1024 * 1024
    # AMQP logins of one process talking to the broker at once; the others wait their turn
    # (adapter/amqp/admission.py, docs/configuration.md "Connection caps").
    max_logins_in_flight: Annotated[
        int, Setting(_LIMITS, _int_converter(1), "adapter.max_logins_in_flight")
    ] = 64
    # SO_RCVBUF of accepted STOMP sockets (every listener: TCP, TLS, WebSocket) unless
    # stomp.tcp_listen_options.recbuf is set: the bytes a client can have sent that wait unread in
    # the kernel while the adapter holds it back; 0 leaves the OS's autotuning
    # (docs/configuration.md, docs/performance.md "Large messages")
    client_receive_buffer: Annotated[
        int, Setting(_LIMITS, _int_converter(0), "adapter.client_receive_buffer")
    ] = 262144
    # With shared subscriptions: bytes of MESSAGE frames that may wait for one subscriber to read
    # them, and for all of a process's subscribers together; over either, the subscriber (the
    # one furthest behind) gets an ERROR naming the setting and is closed.
    shared_subscription_max_lag: Annotated[
        int, Setting(_LIMITS, _int_converter(1), "adapter.shared_subscription_max_lag")
    ] = 4 * 1024 * 1024
    shared_subscription_lag_budget: Annotated[
        int, Setting(_LIMITS, _int_converter(1), "adapter.shared_subscription_lag_budget")
    ] = 256 * 1024 * 1024
    # Seconds a connection that negotiated no heart-beats may send nothing at all before it is
    # closed with an ERROR (reaps dead peers that never said so); 0: never.
    idle_client_timeout: Annotated[
        float, Setting(_LIMITS, _float_converter(0, inclusive=True), "adapter.idle_client_timeout")
    ] = 0.0
    # Factor applied to the client's heart-beat interval before the connection is declared dead.
    heartbeat_tolerance: Annotated[
        float, Setting(_LIMITS, _float_converter(1, inclusive=True, unit=""), "adapter.heartbeat_tolerance")
    ] = 1.5
    # Connection caps (adapter/caps.py, docs/configuration.md "Connection caps"); None: no cap.
    # max_connections: STOMP sessions of every listener (TCP, TLS, WebSocket), counted from
    # CONNECT to close, the CONNECT over it refused; web_stomp_max_connections: the sockets of
    # each web_stomp listener, the request over it answered 503.  With --workers N they hold
    # for the workers together (adapter/server/sharedcaps.py).
    max_connections: Annotated[int | None, Setting(_LIMITS, _connection_cap, "stomp.max_connections")] = None
    web_stomp_max_connections: Annotated[
        int | None, Setting(_LIMITS, _connection_cap, "web_stomp.max_connections")
    ] = None
    # bytes of permessage-deflate state all WebSockets together may hold (adapter-only)
    web_stomp_compress_budget: Annotated[
        int, Setting(_LIMITS, _int_converter(0), "adapter.web_stomp_compress_budget")
    ] = 256 * 1024 * 1024

    # ---- operations ---------------------------------------------------------------------------------------
    log_level: Annotated[
        str,
        Setting(
            _OPS,
            _log_level,
            "adapter.log_level",
            flag=Flag("--log-level", "DEBUG, INFO, WARNING or ERROR (default INFO)", metavar="LEVEL"),
        ),
    ] = "INFO"
    # "text": one human-readable line per event; "json": one JSON object per line (log shippers)
    log_format: Annotated[
        Literal["text", "json"],
        Setting(
            _OPS,
            _one_of("text", "json"),
            "adapter.log_format",
            flag=Flag(
                "--log-format",
                "text (default) or json: one JSON object per line, with the connection lines' fields as keys",
                metavar="FORMAT",
            ),
        ),
    ] = "text"
    # HOST:PORT of the HTTP listener for /metrics, /healthz and /readyz; None: no HTTP port
    http_listen: Annotated[
        str | None,
        Setting(
            _OPS,
            _http_listen,
            "adapter.http_listen",
            flag=Flag(
                "--http-listen",
                "serve GET /metrics (Prometheus), /healthz and /readyz on this address "
                "(default: no HTTP port; it has no authentication, keep it private)",
                metavar="HOST:PORT",
            ),
        ),
    ] = None
    # adapter processes sharing the listeners; 1: this process serves everything itself
    # (adapter/server/workers.py and docs/architecture.md, "Workers")
    workers: Annotated[
        int,
        Setting(
            _OPS,
            _int_converter(1, 256),
            "adapter.workers",
            flag=Flag(
                "--workers",
                "adapter processes sharing the listeners (default 1: this process alone); with more, "
                "this process supervises them, restarts one that dies and serves --http-listen for all",
                metavar="N",
            ),
        ),
    ] = 1
    # per-destination metric series: at most this many destinations per process get their own,
    # later ones count as "other"; 0: no per-destination series (adapter/server/stats.py)
    metrics_destinations: Annotated[
        int,
        Setting(
            _OPS,
            _int_converter(0, 10_000),
            "adapter.metrics_destinations",
            flag=Flag(
                "--metrics-destinations",
                "per-destination message series on /metrics for at most N destinations per process, "
                "later ones counted as other (default 0: none)",
                metavar="N",
            ),
        ),
    ] = 0
    # seconds a graceful shutdown waits for the connections before it gives up on them
    shutdown_timeout: Annotated[
        float, Setting(_OPS, _float_converter(0, inclusive=True), "adapter.shutdown_timeout")
    ] = 10.0
    # microseconds the event loop keeps polling its sockets after a read instead of sleeping, while
    # this process is not kept waiting for a CPU (adapter/busy_poll.py); 0: it sleeps at once
    busy_poll_microseconds: Annotated[
        int,
        Setting(
            _OPS,
            _int_converter(0, 10_000, what="an integer from 0 to 10000 (microseconds, 0 disables)"),
            "adapter.busy_poll_microseconds",
        ),
    ] = 50


# Every setting, in declaration order (the order of the groups above).
DECLARED: dict[str, Declared] = _declarations(Settings)
