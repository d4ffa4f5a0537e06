"""The broker's settings, with RabbitMQ's defaults.

One frozen dataclass that every part of Warren reads; ``config.parser``
fills it from a rabbitmq.conf-style file and the environment.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Listener:
    name: str
    host: str  # "": every address, IPv6 and IPv4, as RabbitMQ's port-only listener
    port: int


@dataclass(frozen=True)
class Settings:
    # listeners.tcp.default / listeners.tcp.<name>; RabbitMQ takes every address (IPv6 and
    # IPv4) on 5672
    listeners: tuple[Listener, ...] = (Listener("default", "", 5672),)
    # listeners.ssl.<name> (AMQPS, RabbitMQ's port 5671) and ssl_options.*; no TLS by default
    ssl_listeners: tuple[Listener, ...] = ()
    ssl_cacertfile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_verify: str = "verify_none"  # or "verify_peer": ask for a client certificate
    ssl_fail_if_no_peer_cert: bool = False  # with verify_peer: refuse clients without one
    default_user: str = "guest"
    default_pass: str = field(default="guest", repr=False)
    default_vhost: str = "/"
    default_permissions: tuple[str, str, str] = (".*", ".*", ".*")  # configure, write, read
    default_user_tags: tuple[str, ...] = ("administrator",)
    # users that may only connect from loopback (RabbitMQ: guest)
    loopback_users: tuple[str, ...] = ("guest",)
    heartbeat: int = 60  # seconds, 0 disables
    frame_max: int = 131072
    # the smallest frame_max a client may ask for: 4.1+'s 8192, or 3.x's 4096
    # (warren.frame_min_size; RabbitMQ has it as a constant, so no key of its own)
    frame_min_size: int = 8192
    channel_max: int = 2047
    handshake_timeout: int = 10000  # ms
    connection_max: int | None = None  # None: `infinity`; checked at connection.open
    # connections accepted but not authenticated yet; past it new ones are closed at once
    # (warren.handshake_max; broker/server/shell.py admit)
    handshake_max: int = 1000
    # descriptors kept free for the store, the definitions and the monitor: below it new
    # connections are closed at once (warren.descriptor_reserve)
    descriptor_reserve: int = 100
    # ms between the management statistics' samples (RabbitMQ's key and default): rates, and
    # the age of each consumer's oldest unsettled delivery (broker/ops/management/stuck.py)
    collect_statistics_interval: int = 5000
    # a consumer whose oldest unsettled delivery is older than this (ms) shows as stuck
    consumer_stuck_after: int = 60000
    # ms a publisher's socket waits between small, quick reads; 0 reads as data arrives
    # (warren.read_coalescing_interval; broker/server/amqp_connection.py Connection._coalesce)
    read_coalescing_interval: int = 1
    consumer_timeout: int | None = 1800000  # ms; None = disabled (Warren: `infinity`)
    consumer_max_per_channel: int | None = None  # None = unlimited
    # publishes awaiting their confirm on one channel before its connection is not read
    max_unconfirmed_per_channel: int | None = 10000  # None = unlimited (Warren's own)
    max_message_size: int = 16 * 1024 * 1024  # RabbitMQ 4.x's default (3.x: 128 MiB)
    # product.name / product.version: connection.start's product and version, and the
    # management API's product_name / product_version; None: Warren's own version
    product_name: str = "Warren"
    # message_interceptors.incoming.set_header_{timestamp,routing_node}.overwrite (RabbitMQ
    # 4.2+): None leaves the interceptor off, a boolean is its overwrite setting
    interceptor_timestamp: bool | None = None
    interceptor_routing_node: bool | None = None
    product_version: str | None = None
    local_random_exchange_enabled: bool = True  # exchange_types.local_random.enabled
    log_console: bool = True
    log_level: str = "info"
    log_formatter: str = "plaintext"  # or "json"
    management_port: int | None = 15672
    # no management.tcp.ip / prometheus.tcp.ip: RabbitMQ's HTTP listeners (ranch, gen_tcp's
    # default family) take IPv4 only; "::" takes IPv6 and IPv4
    management_ip: str = "0.0.0.0"
    prometheus_port: int | None = 15692
    prometheus_ip: str = "0.0.0.0"
    vm_memory_high_watermark_relative: float | None = 0.6
    vm_memory_high_watermark_absolute: int | None = None  # bytes
    disk_free_limit_absolute: int = 50 * 1000 * 1000  # bytes
    load_definitions: str | None = None
    data_dir: str | None = "./data"  # None: nothing is kept on disk
    segment_size: int = 16 * 1024 * 1024  # message_store.segment_size (Warren's own)
    # body bytes of ready persistent messages a durable queue keeps in memory; past it they
    # are read back from the segments when delivered. None: `infinity` (never paged out)
    queue_body_memory_limit: int | None = 64 * 1024 * 1024
    # message-lifecycle tracing (Warren's own trace.* keys; broker/tracing/tracer.py)
    trace_enabled: bool = False
    track_auth_attempt_source: bool = False  # warren.track_auth_attempt_source
    trace_dir: str = "./trace"
    trace_vhosts: tuple[str, ...] | None = None  # None: every vhost (trace.vhosts = all)
    trace_rotate_size: int = 64 * 1024 * 1024  # bytes
    trace_rotate_interval: int = 3600  # seconds
    trace_buffer: int = 262144  # events held for the writer; past this they are dropped
    # deprecated_features.permit.<name> = true|false: (name, permitted) in file order; a
    # feature not named keeps RabbitMQ 4.3's default for its phase (broker/engine/deprecated.py)
    deprecated_features_permit: tuple[tuple[str, bool], ...] = ()
    # default_queue_type: the type of a queue declared without x-queue-type (RabbitMQ 4.x);
    # a vhost's own default_queue_type (management API, definitions) wins over it
    default_queue_type: str = "classic"
    # quorum_queue.property_equivalence.relaxed_checks_on_redeclaration (RabbitMQ 4.x): a
    # quorum queue redeclared as classic (x-queue-type: classic, or none under a classic
    # default) is checked on a few arguments only instead of refused
    quorum_relaxed_checks_on_redeclaration: bool = False
    # the test kit (docs/test-kit.md): broker time "real" or "manual" (warren.clock), and
    # the /api/warren/* test endpoints, which also record what happens (warren.test_api)
    clock: str = "real"
    test_api: bool = False
    # RabbitMQ 3.x counted a basic.nack with requeue toward a quorum queue's delivery-limit;
    # 4.x counts only basic.reject (warren.delivery_limit.count_nacks, docs/messages.md)
    delivery_limit_counts_nacks: bool = False
    # keys of a real rabbitmq.conf that Warren accepts but does not use
    ignored_keys: tuple[str, ...] = field(default=(), compare=False)
    # the files these settings were read from, in the order they were applied
    config_files: tuple[str, ...] = field(default=(), compare=False)

    def replace(self, **changes: object) -> Settings:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]
