"""Message and lifecycle counters: per channel on the message path, per node when read."""

from __future__ import annotations

from typing import Any, Final


class Version:
    """A number bumped on every change that others cache decisions on (AccessControl's):
    compiled, so that the publish path reads it as a native attribute."""

    def __init__(self) -> None:
        self.n = 0


# counters a channel keeps, added up over the node when read (broker.message_totals())
CHANNEL_COUNTERS: Final = (
    "acked",
    "confirmed",
    "consumer_timeouts",
    "delivered_consume_auto",
    "delivered_consume_manual",
    "delivered_get_auto",
    "delivered_get_manual",
    "get_empty",
    "received",
    "received_confirm",
    "redelivered",
    "routed",
    "unroutable_dropped",
    "unroutable_returned",
)


# rabbitmq_message_size_bytes' bucket bounds (RabbitMQ 4.x rabbit_msg_size_metrics.erl);
# the last bucket is +Inf
SIZE_BOUNDS: Final = (100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000, 50_000_000, 100_000_000)
# a size's bucket by its bit length: the highest bucket that bit length can reach, one
# comparison (size <= the bound below it) away from exact (channel_publish.basic_publish)
SIZE_BUCKET_BY_BITS: Final = tuple(
    next((i for i, bound in enumerate(SIZE_BOUNDS) if (1 << bits) - 1 <= bound), len(SIZE_BOUNDS))
    if bits
    else 0
    for bits in range(64)
)


class ChannelStats:
    """One channel's cumulative message counters (Prometheus' rabbitmq_channel_*_total).

    The message path increments these instead of node-wide ones: the same one increment
    per message, and per-channel samples for free. A closing channel adds its counts to
    the broker's BrokerStats, so the node's totals never go down."""

    __slots__ = (*CHANNEL_COUNTERS, "_buckets", "run", "run_bucket", "size_sum")

    acked: int
    confirmed: int
    consumer_timeouts: int
    delivered_consume_auto: int
    delivered_consume_manual: int
    delivered_get_auto: int
    delivered_get_manual: int
    get_empty: int
    received: int
    received_confirm: int
    redelivered: int
    routed: int
    unroutable_dropped: int
    unroutable_returned: int

    def __init__(self) -> None:
        for name in CHANNEL_COUNTERS:
            setattr(self, name, 0)
        # rabbitmq_message_size_bytes: published messages by body size, and the sizes' sum.
        # The publishes in a row of one bucket are counted in ``run`` (a native int
        # compiled; an item of the list is an object, a new one at each increment), and
        # added to the list when another bucket comes.
        self._buckets = [0] * (len(SIZE_BOUNDS) + 1)
        self.run_bucket = 0
        self.run = 0
        self.size_sum = 0

    def switch_bucket(self, bucket: int) -> None:
        """The next publishes are of ``bucket``: the run so far goes into the list."""
        buckets = self._buckets
        buckets[self.run_bucket] = buckets[self.run_bucket] + self.run
        self.run_bucket = bucket
        self.run = 0

    @property
    def size_buckets(self) -> list[int]:
        """Published messages by body size, one count per SIZE_BOUNDS bucket and +Inf."""
        buckets = list(self._buckets)
        buckets[self.run_bucket] = buckets[self.run_bucket] + self.run
        return buckets

    @property
    def delivered(self) -> int:
        """Deliveries and basic.get-oks, either acknowledgement mode."""
        return (
            self.delivered_consume_auto
            + self.delivered_consume_manual
            + self.delivered_get_auto
            + self.delivered_get_manual
        )

    def add(self, other: ChannelStats) -> None:
        for name in CHANNEL_COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        mine, theirs = self.size_buckets, other.size_buckets
        self._buckets = [a + b for a, b in zip(mine, theirs, strict=True)]
        self.run = 0
        self.size_sum += other.size_sum


# BrokerStats' own fields (a module constant: a compiled class has no __slots__ to read)
BROKER_FIELDS: Final = (
    "auth_attempts_by_source",
    "auth_attempts_failed",
    "auth_attempts_succeeded",
    "channels_closed",
    "channels_opened",
    "connections_closed",
    "connections_opened",
    "dead_lettered",
    "deleted_disk_reads",
    "deleted_disk_writes",
    "expired",
    "queues_created",
    "queues_declared",
    "queues_deleted",
    "retried",
    "track_auth_attempt_source",
)


class BrokerStats(ChannelStats):
    """The counts of closed channels and of the management API's publishes and gets, and
    node-wide counters no channel owns (expiries, dead-letters, object churn)."""

    __slots__ = BROKER_FIELDS

    def __init__(self) -> None:
        super().__init__()
        self.expired = 0
        self.retried = 0
        self.dead_lettered: dict[str, int] = {}  # by reason
        self.connections_opened = self.connections_closed = 0
        self.channels_opened = self.channels_closed = 0
        self.queues_declared = self.queues_created = self.queues_deleted = 0
        # deleted queues' disk reads and writes (Queue.close), for the node's totals
        self.deleted_disk_reads = self.deleted_disk_writes = 0
        self.auth_attempts_succeeded = self.auth_attempts_failed = 0  # AMQP logins
        # RabbitMQ's track_auth_attempt_source (off by default: the table only grows):
        # (remote address, username, protocol) -> [succeeded, failed]
        self.track_auth_attempt_source = False
        self.auth_attempts_by_source: dict[tuple[str, str, str], list[int]] = {}

    def auth_attempt(self, succeeded: bool, address: str, username: str) -> None:
        """An AMQP 0-9-1 login (rabbit_core_metrics:auth_attempt_succeeded/failed)."""
        if succeeded:
            self.auth_attempts_succeeded += 1
        else:
            self.auth_attempts_failed += 1
        if self.track_auth_attempt_source and (address or username):
            key = (address, username, "amqp091")
            counts = self.auth_attempts_by_source.setdefault(key, [0, 0])
            counts[0 if succeeded else 1] += 1

    def as_dict(self) -> dict[str, Any]:
        names = (*CHANNEL_COUNTERS, *BROKER_FIELDS)
        skip = ("auth_attempts_by_source", "track_auth_attempt_source")
        return {name: getattr(self, name) for name in names if name not in skip}


class IOStats:
    """The message store's disk I/O (RabbitMQ's node_persister_metrics: io_*, msg_store_*).

    Counted per system call or per batch, never per message: the writer thread counts
    its writes and fsyncs per round, the loop its reads of bodies back."""

    __slots__ = (
        "msg_store_reads",
        "read_bytes",
        "read_ops",
        "read_time",
        "reopen_ops",
        "sync_ops",
        "sync_time",
        "write_bytes",
        "write_ops",
        "write_time",
    )

    def __init__(self) -> None:
        self.read_ops = self.read_bytes = self.write_ops = self.write_bytes = 0
        self.sync_ops = self.reopen_ops = self.msg_store_reads = 0
        self.read_time = self.write_time = self.sync_time = 0.0


class ConfirmedByExchange:
    """Which exchange each publish of a confirm-mode channel went to, to count its confirms
    per exchange (exchange_messages_confirmed_total) when they are sent.

    Runs, not messages: (first sequence number, exchange) each time the exchange changes,
    so a channel publishing to one exchange keeps one entry and pays one comparison."""

    __slots__ = ("last", "runs")

    def __init__(self) -> None:
        self.runs: list[tuple[int, Any]] = []
        self.last: Any = None

    def switch(self, seq: int, exchange: Any) -> None:
        self.runs.append((seq, exchange))
        self.last = exchange

    def confirmed(self, first: int, last: int) -> None:
        """Publishes ``first``..``last`` were acked (nacked ones are never in such a range)."""
        runs = self.runs
        for i, (start, exchange) in enumerate(runs):
            if start > last:
                break
            end = runs[i + 1][0] - 1 if i + 1 < len(runs) else last
            lo, hi = max(start, first), min(end, last)
            if lo <= hi:
                exchange.confirmed += hi - lo + 1

    def settled(self, upto: int) -> None:
        """Every publish up to ``upto`` was acked or nacked: the runs wholly before it go
        (the newest stays: the next publish may extend it)."""
        runs = self.runs
        drop = 0
        while drop + 1 < len(runs) and runs[drop + 1][0] - 1 <= upto:
            drop += 1
        if drop:
            del runs[:drop]


class QueueStats:
    """Cumulative counters of one queue (management API message_stats, metrics)."""

    __slots__ = (
        "acked",
        "consumer_timeouts",
        "dead_lettered",
        "delivered",
        "delivered_auto",
        "disk_reads",
        "disk_writes",
        "expired",
        "get_auto",
        "get_empty",
        "get_manual",
        "persistent",
        "persistent_bytes",
        "published",
        "redelivered",
        "redeliveries",
        "retried",
    )

    def __init__(self) -> None:
        self.published = 0
        self.delivered = 0  # basic.deliver and basic.get-ok
        self.acked = 0
        self.redelivered = 0  # messages returned to the queue for another delivery
        self.expired = 0
        self.dead_lettered: dict[str, int] = {}  # by reason
        self.consumer_timeouts = 0
        self.retried = 0  # returns that waited for a delayed retry
        # Prometheus' per-queue split (broker/ops/metrics.py): consume no-ack deliveries (the
        # queue settles them as acks), basic.get by ack mode and empty, counted by the channel
        self.delivered_auto = self.get_auto = self.get_manual = self.get_empty = 0
        self.redeliveries = 0  # deliveries and get-oks of a message marked redelivered
        # persistent messages in the store (gauge), publish records written, bodies read back
        self.persistent = self.persistent_bytes = self.disk_writes = self.disk_reads = 0
