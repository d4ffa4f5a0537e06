"""What the management API, the metrics and definitions share: the broker and a rate sampler.

Rates are differences of the engine's cumulative counters between two samples,
taken every few seconds on the loop: the message path only increments counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import platform
import resource
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from warren.broker.engine.channel import Channel
from warren.broker.engine.queue import Queue
from warren.broker.engine.stats import ChannelStats, IOStats
from warren.broker.ops.management.stuck import UnackedAges
from warren.broker.server.handshake import VERSION

if TYPE_CHECKING:
    from warren.broker.engine.broker import Broker
    from warren.broker.server.amqp_connection import Connection

SAMPLE_INTERVAL = 5.0  # seconds, RabbitMQ's default collect_statistics_interval
HISTORY = 121  # global samples kept: 10 minutes at the default interval, for the console's chart

Key = object  # "global", ("vhost", name) or a Queue


@dataclass
class VhostMeta:
    """What RabbitMQ keeps about a vhost beyond its name (the engine keeps only the name)."""

    description: str = ""
    tags: list[str] = field(default_factory=list)
    tracing: bool = False


@dataclass
class Retired:
    """Final counters of deleted queues, so Warren's global counters never go down."""

    expired: int = 0
    retried: int = 0
    consumer_timeouts: int = 0
    dead_lettered: dict[tuple[str, str], int] = field(default_factory=dict)  # (type, reason)

    def add(self, queue: Queue) -> None:
        stats = queue.stats
        self.expired += stats.expired
        self.retried += stats.retried
        self.consumer_timeouts += stats.consumer_timeouts
        for reason, count in stats.dead_lettered.items():
            key = (queue.queue_type, reason)
            self.dead_lettered[key] = self.dead_lettered.get(key, 0) + count


class RateSampler:
    def __init__(self, mgmt: Management, interval: float = SAMPLE_INTERVAL) -> None:
        self.mgmt = mgmt
        self.interval = interval
        self._prev: dict[Key, tuple[float, tuple[int, ...]]] = {}
        self._rates: dict[Key, dict[str, float]] = {}
        self.retired = Retired()
        self.known: set[Queue] = set()  # queues seen at the last sample
        # (wall-clock ms, global counters) of the last samples, oldest first
        self.history: deque[tuple[int, tuple[int, ...]]] = deque(maxlen=HISTORY)
        # idle_since of queues and channels: (their counters, wall-clock ms of the first
        # sample that found them so); read against the counters of the moment (idle_since)
        self._still: dict[object, tuple[tuple[int, ...], int]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.sample()

    def disk_counts(self) -> tuple[int, int]:
        """Bodies read back and publish records written by all queues, deleted ones too
        (RabbitMQ's overview disk_reads and disk_writes, summed from its queues)."""
        node = self.mgmt.broker.stats
        reads, writes = node.deleted_disk_reads, node.deleted_disk_writes
        for queue in self.mgmt.queues():
            reads += queue.stats.disk_reads
            writes += queue.stats.disk_writes
        return reads, writes

    def _current(self) -> dict[Key, tuple[tuple[str, ...], tuple[int, ...]]]:
        broker = self.mgmt.broker
        stats = broker.message_totals()
        out: dict[Key, tuple[tuple[str, ...], tuple[int, ...]]] = {}
        total = [0, 0, 0]
        for vhost in broker.vhosts.values():
            counts = [0, 0, 0]
            for queue in vhost.queues.values():
                ready, unacked = queue.ready_count, queue.unacked_count
                counts[0] += ready + unacked
                counts[1] += ready
                counts[2] += unacked
                out[queue] = (QUEUE_FIELDS, queue_values(queue))
            out[("vhost", vhost.name)] = (LENGTH_FIELDS, tuple(counts))
            total = [a + b for a, b in zip(total, counts, strict=True)]
        for conn in self.mgmt.connections():
            out[conn] = (CONNECTION_FIELDS, (conn.recv_oct, conn.send_oct))
            for channel in conn.channels.values():
                if not channel.closed:
                    out[channel] = (CHANNEL_FIELDS, channel_values(channel.stats))
        out["node"] = (NODE_FIELDS, tuple(node_values(broker).values()))
        node = broker.stats
        out["global"] = (
            GLOBAL_FIELDS,
            (
                stats.received,
                stats.delivered,
                stats.acked,
                stats.confirmed,
                stats.redelivered,
                stats.unroutable_returned,
                stats.unroutable_dropped,
                stats.delivered_consume_manual,
                stats.delivered_consume_auto,
                stats.delivered_get_manual,
                stats.delivered_get_auto,
                stats.get_empty,
                *self.disk_counts(),
                *total,
                node.channels_closed,
                node.channels_opened,
                node.connections_closed,
                node.connections_opened,
                node.queues_created,
                node.queues_declared,
                node.queues_deleted,
            ),
        )
        return out

    def sample(self) -> None:
        now = time.monotonic()
        self.mgmt.unacked_ages.sample(self.mgmt.broker)
        current = self._current()
        rates: dict[Key, dict[str, float]] = {}
        for key, (names, values) in current.items():
            prev = self._prev.get(key)
            if prev is not None and now > prev[0]:
                elapsed = now - prev[0]
                rates[key] = {
                    name: (value - old) / elapsed
                    for name, value, old in zip(names, values, prev[1], strict=True)
                }
        self._rates = rates
        self._prev = {key: (now, values) for key, (_, values) in current.items()}
        now_ms = int(self.mgmt.wall_clock() * 1000)
        self.history.append((now_ms, current["global"][1]))
        still: dict[object, tuple[tuple[int, ...], int]] = {}
        for key, (names, values) in current.items():
            if names is QUEUE_FIELDS or names is CHANNEL_FIELDS:
                before = self._still.get(key)
                same = before is not None and before[0] == values
                still[key] = before if same and before is not None else (values, now_ms)
        self._still = still
        live = {key for key in current if isinstance(key, Queue)}
        for queue in self.known - live:
            self.retired.add(queue)
        self.known = live

    def reset(self) -> None:
        """DELETE /api/reset: rates and the chart's history start again from the next sample."""
        self._prev.clear()
        self._rates = {}
        self.history.clear()

    def rates(self, key: Key) -> dict[str, float]:
        return self._rates.get(key, {})

    def idle_since(self, key: Queue | Channel) -> int | None:
        """Wall-clock ms since when a queue or channel has done nothing, None if it did
        something since the last sample (or has not been sampled yet).

        RabbitMQ reports idle_since once the queue or channel process hibernates, a second
        after its last message (rabbit_amqqueue_process:handle_pre_hibernate/1,
        rabbit_channel:handle_pre_hibernate/1), and drops it at the next one. Warren has no
        process to hibernate: its counters are compared at each sample instead, so the
        time is that of the first sample that found them as they are now."""
        seen = self._still.get(key)
        if seen is None:
            return None
        now = queue_values(key) if isinstance(key, Queue) else channel_values(key.stats)
        return seen[1] if seen[0] == now else None


QUEUE_FIELDS = (
    "publish",
    "deliver_get",
    "ack",
    "redeliver",
    "deliver",
    "deliver_no_ack",
    "get",
    "get_no_ack",
    "get_empty",
    "messages",
    "messages_ready",
    "messages_unacknowledged",
    "consumers",
)


def queue_values(queue: Queue) -> tuple[int, ...]:
    """A queue's counters in QUEUE_FIELDS' order, read from what the engine keeps."""
    s = queue.stats
    ready, unacked = queue.ready_count, queue.unacked_count
    gets = s.get_auto + s.get_manual
    return (
        s.published,
        s.delivered,
        s.acked - s.delivered_auto - s.get_auto,  # no-ack deliveries settle as acks there
        s.redelivered,
        s.delivered - s.delivered_auto - gets,
        s.delivered_auto,
        s.get_manual,
        s.get_auto,
        s.get_empty,
        ready + unacked,
        ready,
        unacked,
        len(queue.consumers),
    )


# a channel's message_stats (RabbitMQ's channel stats keys)
CHANNEL_FIELDS = (
    "publish",
    "confirm",
    "return_unroutable",
    "drop_unroutable",
    "deliver_get",
    "deliver",
    "deliver_no_ack",
    "get",
    "get_no_ack",
    "get_empty",
    "redeliver",
    "ack",
)


def channel_values(s: ChannelStats) -> tuple[int, ...]:
    return (
        s.received,
        s.confirmed,
        s.unroutable_returned,
        s.unroutable_dropped,
        s.delivered,
        s.delivered_consume_manual,
        s.delivered_consume_auto,
        s.delivered_get_manual,
        s.delivered_get_auto,
        s.get_empty,
        s.redelivered,
        s.acked,
    )


CONNECTION_FIELDS = ("recv_oct", "send_oct")
# the node's measures that /api/nodes gives with a rate (``*_details``)
NODE_FIELDS = (
    "mem_used",
    "disk_free",
    "fd_used",
    "sockets_used",
    "proc_used",
    "context_switches",
    "gc_num",
    "io_read_count",
    "io_read_bytes",
    "io_write_count",
    "io_write_bytes",
    "io_sync_count",
    "io_seek_count",
    "io_reopen_count",
    "msg_store_read_count",
    "msg_store_write_count",
)


def node_values(broker: Broker) -> dict[str, int]:
    """The node's measures in NODE_FIELDS' order: the resource monitor's (once a second),
    the process's and the message store's I/O counters."""
    monitor = broker.monitor
    persistence = broker.persistence
    store: Any = persistence.messages if persistence is not None else None
    io = store.io if store is not None else IOStats()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    try:
        tasks = len(asyncio.all_tasks())
    except RuntimeError:  # no running loop (a sample taken off the loop)
        tasks = 0
    return {
        "mem_used": monitor.memory_used,
        "disk_free": monitor.disk_free or 0,
        "fd_used": monitor.descriptors_used,
        "sockets_used": len(broker.connections),
        "proc_used": tasks,
        "context_switches": usage.ru_nvcsw + usage.ru_nivcsw,
        "gc_num": sum(generation["collections"] for generation in gc.get_stats()),
        "io_read_count": io.read_ops,
        "io_read_bytes": io.read_bytes,
        "io_write_count": io.write_ops,
        "io_write_bytes": io.write_bytes,
        "io_sync_count": io.sync_ops,
        "io_seek_count": 0,  # the store appends and reads with pread: it never seeks
        "io_reopen_count": io.reopen_ops,
        "msg_store_read_count": io.msg_store_reads,
        "msg_store_write_count": store.messages_written if store is not None else 0,
    }
LENGTH_FIELDS = ("messages", "messages_ready", "messages_unacknowledged")
# RabbitMQ's churn_rates (overview) and the node's object churn
CHURN_FIELDS = (
    "channel_closed",
    "channel_created",
    "connection_closed",
    "connection_created",
    "queue_created",
    "queue_declared",
    "queue_deleted",
)
GLOBAL_FIELDS = (
    "publish",
    "deliver_get",
    "ack",
    "confirm",
    "redeliver",
    "return_unroutable",
    "drop_unroutable",
    "deliver",
    "deliver_no_ack",
    "get",
    "get_no_ack",
    "get_empty",
    "disk_reads",
    "disk_writes",
    *LENGTH_FIELDS,
    *CHURN_FIELDS,
)


class Management:
    """The shared state of the HTTP API, the metrics endpoint and definitions import."""

    def __init__(self, broker: Broker, sample_interval: float | None = None) -> None:
        self.broker = broker
        if sample_interval is None:
            sample_interval = broker.settings.collect_statistics_interval / 1000
        if broker.settings.test_api:  # the test API reads the test kit's recording
            from warren.broker.testkit.recorder import start_recording

            start_recording(broker)
        self.rates = RateSampler(self, sample_interval)
        self.unacked_ages = UnackedAges()
        self.stuck_after_ms = broker.settings.consumer_stuck_after
        self.vhost_meta: dict[str, VhostMeta] = {}
        self.node = f"warren@{platform.node() or 'localhost'}"
        self.version = VERSION  # Warren's own (the node's "applications")
        # product.name / product.version: what product_name and product_version report
        self.product_name = broker.settings.product_name
        self.product_version = broker.settings.product_version or VERSION
        # ports actually bound (port 0 in the settings picks a free one)
        self.management_port: int | None = None
        self.prometheus_port: int | None = None
        self.listeners: list[tuple[str, int]] = []  # AMQP

    @staticmethod
    def wall_clock() -> float:
        return time.time()

    def meta(self, vhost: str) -> VhostMeta:
        meta = self.vhost_meta.get(vhost)
        if meta is None:
            meta = self.vhost_meta[vhost] = VhostMeta()
        return meta

    def queues(self) -> Iterator[Queue]:
        for vhost in self.broker.vhosts.values():
            yield from vhost.queues.values()

    def connections(self) -> list[Connection]:
        """Open AMQP connections (the server also tracks sockets still in the handshake)."""
        return [c for c in self.broker.connections if c.opened and not c.closed]
