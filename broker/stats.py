"""Message and lifecycle counters: per channel on the message path, per node when read."""

from __future__ import annotations

from typing import Any

# counters a channel keeps, added up over the node when read (broker.message_totals())
CHANNEL_COUNTERS = (
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
SIZE_BOUNDS = (100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000, 50_000_000, 100_000_000)
# a size's bucket by its bit length: the highest bucket that bit length can reach, one
# comparison (size <= the bound below it) away from exact (Channel.on_content)
SIZE_BUCKET_BY_BITS = tuple(
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

    __slots__ = (*CHANNEL_COUNTERS, "size_buckets", "size_sum")

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
        # rabbitmq_message_size_bytes: published messages by body size, and the sizes' sum
        self.size_buckets = [0] * (len(SIZE_BOUNDS) + 1)
        self.size_sum = 0

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
        self.size_buckets = [a + b for a, b in zip(mine, theirs, strict=True)]
        self.size_sum += other.size_sum


class BrokerStats(ChannelStats):
    """The counts of closed channels and of the management API's publishes and gets, and
    node-wide counters no channel owns (expiries, dead-letters, object churn)."""

    __slots__ = (
        "auth_attempts_failed",
        "auth_attempts_succeeded",
        "channels_closed",
        "channels_opened",
        "connections_closed",
        "connections_opened",
        "dead_lettered",
        "expired",
        "queues_created",
        "queues_declared",
        "queues_deleted",
        "retried",
    )

    def __init__(self) -> None:
        super().__init__()
        self.expired = 0
        self.retried = 0
        self.dead_lettered: dict[str, int] = {}  # by reason
        self.connections_opened = self.connections_closed = 0
        self.channels_opened = self.channels_closed = 0
        self.queues_declared = self.queues_created = self.queues_deleted = 0
        self.auth_attempts_succeeded = self.auth_attempts_failed = 0  # AMQP logins

    def as_dict(self) -> dict[str, Any]:
        names = (*CHANNEL_COUNTERS, *BrokerStats.__slots__)
        return {name: getattr(self, name) for name in names}
