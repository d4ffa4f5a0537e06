"""Prometheus metrics on their own port (``prometheus.tcp.port``, default 15692).

RabbitMQ 4.x's ``rabbitmq_prometheus`` endpoints, with its family names, types, labels
and HELP texts wherever a family means something on one Warren node:

- ``/metrics``: queue, channel and connection families summed over the node;
- ``/metrics/per-object``: the same with one sample per queue, channel and connection;
- ``/metrics/detailed?family=...&vhost=...&queue=...``: only the families asked for, per
  object, named ``rabbitmq_detailed_*``, filtered by vhost and by a queue-name regex.

Erlang VM, Raft, stream and Erlang-process families (reductions, process memory) are left
out: nothing in Warren has those meanings (docs/operating.md lists them). Warren's own
families (consumer timeouts, delayed retries, expiries, dead-letters by reason) are
``warren_``. Everything is read when scraped: the message path only increments counters
it already had (per channel now, summed here).
"""

from __future__ import annotations

import math
import os
import platform
import re
import resource
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from warren.broker.engine.alarms import resident_memory
from warren.broker.engine.message import Message
from warren.broker.engine.stats import SIZE_BOUNDS, ChannelStats, IOStats
from warren.broker.ops.management.formats import (
    channel_name,
    connection_name,
    head_message_timestamp,
    oldest_unacked,
    send_pending,
)
from warren.broker.ops.management.overview import API_VERSION, sockets_limit

if TYPE_CHECKING:
    from warren.broker.engine.channel import Channel
    from warren.broker.engine.exchange import Exchange
    from warren.broker.engine.queue import Queue
    from warren.broker.ops.management.core import Management
    from warren.broker.server.amqp_connection import Connection

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
QUEUE_TYPES = {
    "classic": "rabbit_classic_queue",
    "quorum": "rabbit_quorum_queue",
    "stream": "rabbit_stream_queue",
}
DEAD_LETTER_REASONS = ("expired", "rejected", "maxlen", "delivery_limit")
DEAD_LETTER_HELP = {
    "expired": "Total number of messages dead-lettered due to message TTL exceeded",
    "rejected": "Total number of messages dead-lettered due to basic.reject or basic.nack",
    "maxlen": "Total number of messages dead-lettered due to overflow drop-head or "
    "reject-publish-dlx",
    "delivery_limit": "Total number of messages dead-lettered due to delivery-limit exceeded",
}
PROTOCOL = {"protocol": "amqp091"}
MAX_QUEUE_FILTER_LENGTH = 1000  # RabbitMQ's limit on the `queue` regex

Labels = dict[str, str]
Sample = tuple[Labels, float]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _number(value: float) -> str:
    if value != value:
        return "NaN"  # RabbitMQ's undefined (prometheus_text_format)
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class Exposition:
    """Prometheus' text format, one family at a time."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str, samples: Iterable[Sample]) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            self.lines.append(f"{name}{_labels(labels)} {_number(value)}")

    def one(self, name: str, kind: str, help_text: str, value: float) -> None:
        self.family(name, kind, help_text, [({}, value)])

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


# ---- RabbitMQ's families, by the group (its ETS table) /metrics/detailed selects ----


@dataclass(frozen=True)
class Family:
    name: str  # without the rabbitmq_ / rabbitmq_detailed_ prefix
    kind: str
    help: str
    read: Callable[[Any, Scope], float | None]  # None: no sample for this object
    # False: RabbitMQ's sum over the node has no value for it (no sample on /metrics)
    aggregated: bool = True


def _acks_uncommitted(ch: Channel, scope: Scope) -> int:
    return sum(len(msgs) for kind, msgs, _ in ch.tx_settles if kind == "ack")


def _classic(q: Queue, value: float) -> float | None:
    """A classic queue's value; quorum queues report no such key (rabbit_quorum_queue)."""
    return None if q.queue_type == "quorum" else value


def _capacity(q: Queue, scope: Scope) -> float:
    return q.use.capacity(q) if q.consumers else 0


def _delivered_consume_manual(q: Queue) -> int:
    stats = q.stats
    return stats.delivered - stats.delivered_auto - stats.get_auto - stats.get_manual


def _head_message_timestamp(q: Queue, scope: Scope) -> float | None:
    """rabbit_variable_queue:head_message_timestamp/2 (formats.head_message_timestamp);
    NaN (RabbitMQ's '') if neither has one. Quorum queues have no such key."""
    if q.queue_type == "quorum":
        return None
    stamp = head_message_timestamp(q, scope.oldest_unacked(q))
    return math.nan if stamp is None else stamp


# The counters RabbitMQ keeps both per queue and per channel (queue_delivery_metrics and
# channel_queue_metrics), and both per exchange and per channel (exchange_metrics and
# channel_exchange_metrics): each declared once, the name after the subject's prefix and
# the HELP text with the subject's words in the braces.
DELIVERY_COUNTERS = (
    (
        "get_ack_total",
        "Total number of messages fetched{from_queue} with basic.get in manual acknowledgement "
        "mode",
    ),
    (
        "get_total",
        "Total number of messages fetched{from_queue} with basic.get in automatic "
        "acknowledgement mode",
    ),
    (
        "messages_delivered_ack_total",
        "Total number of messages delivered{from_queue} to consumers in manual acknowledgement "
        "mode",
    ),
    (
        "messages_delivered_total",
        "Total number of messages delivered{from_queue} to consumers in automatic "
        "acknowledgement mode",
    ),
    (
        "messages_redelivered_total",
        "Total number of messages redelivered{from_queue} to consumers",
    ),
    ("messages_acked_total", "Total number of messages acknowledged by consumers{on_queue}"),
    ("get_empty_total", "Total number of times basic.get operations fetched no message{on_queue}"),
)
PUBLISH_COUNTERS = (
    ("messages_published_total", "Total number of messages published into an exchange{on_a}"),
    (
        "messages_confirmed_total",
        "Total number of messages published into an exchange and confirmed{on_the}",
    ),
    (
        "messages_unroutable_returned_total",
        "Total number of messages published as mandatory into an exchange and returned to "
        "the publisher as unroutable",
    ),
    (
        "messages_unroutable_dropped_total",
        "Total number of messages published as non-mandatory into an exchange and dropped "
        "as unroutable",
    ),
)


def _counters(
    prefix: str,
    declared: tuple[tuple[str, str], ...],
    words: dict[str, str],
    reads: dict[str, Callable[[Any, Scope], float]],
) -> tuple[Family, ...]:
    """``declared``'s counter families for one subject, read by ``reads`` (one per name)."""
    assert reads.keys() == {name for name, _ in declared}
    return tuple(
        Family(prefix + name, "counter", text.format(**words), reads[name])
        for name, text in declared
    )


QUEUE_GROUPS: dict[str, tuple[Family, ...]] = {
    "queue_coarse_metrics": (
        Family(
            "queue_messages_ready",
            "gauge",
            "Messages ready to be delivered to consumers",
            lambda q, _: q.ready_count,
        ),
        Family(
            "queue_messages_unacked",
            "gauge",
            "Messages delivered to consumers but not yet acknowledged",
            lambda q, _: q.unacked_count,
        ),
        Family(
            "queue_messages",
            "gauge",
            "Sum of ready and unacknowledged messages - total queue depth",
            lambda q, _: q.ready_count + q.unacked_count,
        ),
    ),
    # a strict subset of queue_metrics: only when queue_metrics is not asked for as well
    "queue_consumer_count": (
        Family("queue_consumers", "gauge", "Consumers on a queue", lambda q, _: len(q.consumers)),
    ),
    # rabbit_amqqueue_process / rabbit_variable_queue info keys (classic queues) and
    # rabbit_quorum_queue's (quorum: no RAM, head timestamp or disk counts, every message
    # persistent); read from the queue's own counts at the scrape
    "queue_metrics": (
        Family("queue_consumers", "gauge", "Consumers on a queue", lambda q, _: len(q.consumers)),
        Family(
            "queue_consumer_capacity", "gauge", "Consumer capacity", _capacity, aggregated=False
        ),
        Family("queue_consumer_utilisation", "gauge", "Same as consumer capacity", _capacity),
        Family(
            "queue_messages_ram",
            "gauge",
            "Ready and unacknowledged messages stored in memory",
            lambda q, _: _classic(q, q.ready_count - q.paged_count + q.unacked_count),
        ),
        Family(
            "queue_messages_ram_bytes",
            "gauge",
            "Size of ready and unacknowledged messages stored in memory",
            lambda q, s: _classic(q, q.ready_bytes - q.paged_bytes + q.unacked_bytes),
        ),
        Family(
            "queue_messages_ready_ram",
            "gauge",
            "Ready messages stored in memory",
            lambda q, _: _classic(q, q.ready_count - q.paged_count),
        ),
        Family(
            "queue_messages_unacked_ram",
            "gauge",
            "Unacknowledged messages stored in memory",
            lambda q, _: _classic(q, q.unacked_count),  # a delivered body is always read back
        ),
        Family(
            "queue_messages_persistent",
            "gauge",
            "Persistent messages",
            lambda q, _: (
                q.ready_count + q.unacked_count if q.queue_type == "quorum" else q.stats.persistent
            ),
        ),
        # RabbitMQ's sum over the node reads this one under another key (messages_bytes_
        # persistent) and so never has it: per object only, as there
        Family(
            "queue_messages_persistent_bytes",
            "gauge",
            "Size in bytes of persistent messages",
            lambda q, s: (
                q.ready_bytes + q.unacked_bytes
                if q.queue_type == "quorum"
                else q.stats.persistent_bytes
            ),
            aggregated=False,
        ),
        Family(
            "queue_messages_bytes",
            "gauge",
            "Size in bytes of ready and unacknowledged messages",
            lambda q, s: q.ready_bytes + q.unacked_bytes,
        ),
        Family(
            "queue_messages_ready_bytes",
            "gauge",
            "Size in bytes of ready messages",
            lambda q, _: q.ready_bytes,
        ),
        Family(
            "queue_messages_unacked_bytes",
            "gauge",
            "Size in bytes of all unacknowledged messages",
            lambda q, s: q.unacked_bytes,
        ),
        # RabbitMQ 3.x's (3.10 prometheus_rabbitmq_core_metrics_collector ?METRICS_RAW;
        # gone in 4.x with lazy paging): ready messages whose bodies are on disk only
        Family(
            "queue_messages_paged_out",
            "gauge",
            "Messages paged out to disk",
            lambda q, _: _classic(q, q.paged_count),
        ),
        Family(
            "queue_messages_paged_out_bytes",
            "gauge",
            "Size in bytes of messages paged out to disk",
            lambda q, _: _classic(q, q.paged_bytes),
        ),
        Family(
            "queue_head_message_timestamp",
            "gauge",
            "Timestamp of the first message in the queue, if any",
            _head_message_timestamp,
            aggregated=False,
        ),
        Family(
            "queue_disk_reads_total",
            "counter",
            "Total number of times queue read messages from disk",
            lambda q, _: _classic(q, q.stats.disk_reads),
        ),
        Family(
            "queue_disk_writes_total",
            "counter",
            "Total number of times queue wrote messages to disk",
            lambda q, _: _classic(q, q.stats.disk_writes),
        ),
    ),
    # rabbit_core_metrics:channel_stats(queue_stats, ...): a delivery counts in the
    # branch of its ack mode; the queue's own counts give the manual-ack ones
    "queue_delivery_metrics": _counters(
        "queue_",
        DELIVERY_COUNTERS,
        {"from_queue": " from a queue", "on_queue": " on a queue"},
        {
            "get_ack_total": lambda q, _: q.stats.get_manual,
            "get_total": lambda q, _: q.stats.get_auto,
            "messages_delivered_ack_total": lambda q, _: _delivered_consume_manual(q),
            "messages_delivered_total": lambda q, _: q.stats.delivered_auto,
            "messages_redelivered_total": lambda q, _: q.stats.redeliveries,
            # the queue settles a no-ack delivery as it settles an ack: those are not acks
            "messages_acked_total": (
                lambda q, _: q.stats.acked - q.stats.delivered_auto - q.stats.get_auto
            ),
            "get_empty_total": lambda q, _: q.stats.get_empty,
        },
    ),
    "channel_queue_exchange_metrics": (
        Family(
            "queue_messages_published_total",
            "counter",
            "Total number of messages published into a queue through an exchange on a channel",
            lambda q, _: q.stats.published,
        ),
    ),
}
EXCHANGE_GROUPS: dict[str, tuple[Family, ...]] = {
    "exchange_metrics": _counters(
        "exchange_",
        PUBLISH_COUNTERS,
        {"on_a": "", "on_the": ""},
        {
            "messages_published_total": lambda e, _: e[1].published,
            "messages_confirmed_total": lambda e, _: e[1].confirmed,
            "messages_unroutable_returned_total": lambda e, _: e[1].unroutable_returned,
            "messages_unroutable_dropped_total": lambda e, _: e[1].unroutable_dropped,
        },
    ),
}

CHANNEL_GROUPS: dict[str, tuple[Family, ...]] = {
    "channel_metrics": (
        Family(
            "channel_consumers", "gauge", "Consumers on a channel", lambda c, _: len(c.consumers)
        ),
        Family(
            "channel_messages_unacked",
            "gauge",
            "Delivered but not yet acknowledged messages",
            lambda c, _: len(c.unacked),
        ),
        Family(
            "channel_messages_unconfirmed",
            "gauge",
            "Published but not yet confirmed messages",
            lambda c, _: c.confirms.unconfirmed if c.confirm else 0,
        ),
        Family(
            "channel_messages_uncommitted",
            "gauge",
            "Messages received in a transaction but not yet committed",
            lambda c, _: len(c.tx_publishes),
        ),
        Family(
            "channel_acks_uncommitted",
            "gauge",
            "Message acknowledgements in a transaction not yet committed",
            _acks_uncommitted,
        ),
        Family(
            "consumer_prefetch",
            "gauge",
            "Limit of unacknowledged messages for each consumer",
            lambda c, _: c.limiter.prefetch_count,
        ),
        Family(
            "channel_prefetch",
            "gauge",
            "Deprecated and will be removed in a future version",
            lambda c, _: c.limiter.prefetch_global,
        ),
    ),
    "channel_exchange_metrics": _counters(
        "channel_",
        PUBLISH_COUNTERS,
        {"on_a": " on a channel", "on_the": " on the channel"},
        {
            "messages_published_total": lambda c, _: c.stats.received,
            "messages_confirmed_total": lambda c, _: c.stats.confirmed,
            "messages_unroutable_returned_total": lambda c, _: c.stats.unroutable_returned,
            "messages_unroutable_dropped_total": lambda c, _: c.stats.unroutable_dropped,
        },
    ),
    "channel_queue_metrics": _counters(
        "channel_",
        DELIVERY_COUNTERS,
        {"from_queue": "", "on_queue": ""},
        {
            "get_ack_total": lambda c, _: c.stats.delivered_get_manual,
            "get_total": lambda c, _: c.stats.delivered_get_auto,
            "messages_delivered_ack_total": lambda c, _: c.stats.delivered_consume_manual,
            "messages_delivered_total": lambda c, _: c.stats.delivered_consume_auto,
            "messages_redelivered_total": lambda c, _: c.stats.redelivered,
            "messages_acked_total": lambda c, _: c.stats.acked,
            "get_empty_total": lambda c, _: c.stats.get_empty,
        },
    ),
}

CONNECTION_GROUPS: dict[str, tuple[Family, ...]] = {
    "connection_coarse_metrics": (
        Family(
            "connection_incoming_bytes_total",
            "counter",
            "Total number of bytes received on a connection",
            lambda c, _: c.recv_oct,
        ),
        Family(
            "connection_outgoing_bytes_total",
            "counter",
            "Total number of bytes sent on a connection",
            lambda c, _: c.send_oct,
        ),
    ),
    "connection_metrics": (
        Family(
            "connection_incoming_packets_total",
            "counter",
            "Total number of packets received on a connection",
            lambda c, _: c.recv_cnt,
        ),
        Family(
            "connection_outgoing_packets_total",
            "counter",
            "Total number of packets sent on a connection",
            lambda c, _: c.send_cnt,
        ),
        Family(
            "connection_pending_packets",
            "gauge",
            "Number of packets waiting to be sent on a connection",
            lambda c, _: send_pending(c),
        ),
        Family(
            "connection_channels",
            "gauge",
            "Channels on a connection",
            lambda c, _: sum(1 for ch in c.channels.values() if not ch.closed),
        ),
    ),
}


@dataclass
class Scope:
    """What one scrape covers: the objects, how they are labelled, which groups."""

    mgmt: Management
    per_object: bool
    prefix: str = "rabbitmq_"
    groups: frozenset[str] | None = None  # None: all
    vhosts: frozenset[str] | None = None  # None: all
    queue_filter: re.Pattern[str] | None = None

    def wants(self, group: str) -> bool:
        return self.groups is None or group in self.groups

    _unacked: dict[Queue, Message] | None = field(default=None, init=False, repr=False)

    def oldest_unacked(self, q: Queue) -> Message | None:
        """A queue's oldest unacknowledged message, read off the channels once a scrape."""
        if self._unacked is None:
            self._unacked = oldest_unacked(self.mgmt)
        return self._unacked.get(q)

    def exchanges(self) -> list[tuple[str, Exchange]]:
        """Exchanges published into (RabbitMQ's exchange_metrics rows), vhost-filtered."""
        return [
            (vhost.name, x)
            for vhost in self.mgmt.broker.vhosts.values()
            if self.vhosts is None or vhost.name in self.vhosts
            for x in vhost.exchanges.values()
            if x.published
        ]

    def queues(self) -> list[Queue]:
        out = []
        for vhost in self.mgmt.broker.vhosts.values():
            if self.vhosts is not None and vhost.name not in self.vhosts:
                continue
            for q in vhost.queues.values():
                if self.queue_filter is None or self.queue_filter.search(q.name):
                    out.append(q)
        return out


def _objects(
    out: Exposition,
    scope: Scope,
    groups: dict[str, tuple[Family, ...]],
    objects: Sequence[Any],
    label: Callable[[Any], Labels],
) -> None:
    for group, families in groups.items():
        if not scope.wants(group):
            continue
        if group == "queue_consumer_count" and scope.wants("queue_metrics"):
            continue  # rabbitmq_prometheus' mutually_exclusive_mf: the subset goes
        for family in families:
            read = family.read
            if scope.per_object:
                samples: list[Sample] = [
                    (label(o), v) for o in objects if (v := read(o, scope)) is not None
                ]
            elif family.aggregated:
                samples = [({}, sum(v for o in objects if (v := read(o, scope)) is not None))]
            else:
                samples = []
            out.family(scope.prefix + family.name, family.kind, family.help, samples)


def _exchange_label(e: tuple[str, Exchange]) -> Labels:
    return {"vhost": e[0], "exchange": e[1].name}


def _queue_label(q: Queue) -> Labels:
    return {"vhost": q.vhost.name, "queue": q.name}


def _channel_label(ch: Channel) -> Labels:
    return {"channel": channel_name(ch)}


def _connection_label(conn: Connection) -> Labels:
    return {"connection": connection_name(conn)}


def _open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def _node_groups(out: Exposition, scope: Scope) -> None:
    """connection_churn_metrics, node_coarse_metrics, node_metrics: one sample each."""
    broker = scope.mgmt.broker
    stats, monitor = broker.stats, broker.monitor
    p = scope.prefix
    if scope.wants("connection_churn_metrics"):
        for name, help_text, value in (
            (
                "connections_opened_total",
                "Total number of connections opened",
                stats.connections_opened,
            ),
            (
                "connections_closed_total",
                "Total number of connections closed or terminated",
                stats.connections_closed,
            ),
            ("channels_opened_total", "Total number of channels opened", stats.channels_opened),
            ("channels_closed_total", "Total number of channels closed", stats.channels_closed),
            ("queues_declared_total", "Total number of queues declared", stats.queues_declared),
            ("queues_created_total", "Total number of queues created", stats.queues_created),
            ("queues_deleted_total", "Total number of queues deleted", stats.queues_deleted),
        ):
            out.one(p + name, "counter", help_text, value)
    if scope.wants("node_persister_metrics"):
        _persister(out, scope)
    if scope.wants("auth_attempt_metrics"):
        # one row per protocol once it had an attempt, labelled so on every endpoint
        # (the table is read as it is: rabbitmq_prometheus' get_data/4 catch-all)
        ok, failed = stats.auth_attempts_succeeded, stats.auth_attempts_failed
        rows = [(PROTOCOL, (ok + failed, ok, failed))] if ok + failed else []
        _auth_families(out, p + "auth_attempts", "", rows)
    # per source only per object (the node's sum is auth_attempt_metrics), and only
    # with track_auth_attempt_source on (warren.track_auth_attempt_source)
    if scope.per_object and scope.wants("auth_attempt_detailed_metrics"):
        source_rows: list[tuple[Labels, tuple[int, int, int]]] = []
        for (address, user, protocol), (ok, failed) in stats.auth_attempts_by_source.items():
            labels = {"remote_address": address, "username": user, "protocol": protocol}
            labels = {k: v for k, v in labels.items() if v}
            source_rows.append((labels, (ok + failed, ok, failed)))
        _auth_families(out, p + "auth_attempts_detailed", " with source info", source_rows)
    if scope.wants("node_coarse_metrics"):
        out.one(p + "process_open_fds", "gauge", "Open file descriptors", _open_fds())
        # RabbitMQ 3.x's (file_handle_cache's sockets_used): the client sockets open
        out.one(
            p + "process_open_tcp_sockets",
            "gauge",
            "Open TCP sockets",
            len(broker.connections),
        )
        out.one(
            p + "process_resident_memory_bytes", "gauge", "Memory used in bytes", resident_memory()
        )
        # the data dir's file system; without one (nothing kept on disk) the working dir's
        data_dir = broker.settings.data_dir or "."
        if os.path.isdir(data_dir):
            free = shutil.disk_usage(data_dir).free
            out.one(
                p + "disk_space_available_bytes", "gauge", "Disk space available in bytes", free
            )
    if scope.wants("node_metrics"):
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        out.one(p + "process_max_fds", "gauge", "Open file descriptors limit", soft)
        out.one(
            p + "process_max_tcp_sockets", "gauge", "Open TCP sockets limit", sockets_limit(soft)
        )
        out.one(
            p + "resident_memory_limit_bytes",
            "gauge",
            "Memory high watermark in bytes",
            monitor.memory_limit,
        )
        out.one(
            p + "disk_space_available_limit_bytes",
            "gauge",
            "Free disk space low watermark in bytes",
            monitor.disk_limit,
        )
        uptime = time.time() - broker.started_at
        out.one(p + "erlang_uptime_seconds", "gauge", "Node uptime", round(uptime, 3))


def _auth_families(
    out: Exposition, prefix: str, suffix: str, rows: list[tuple[Labels, tuple[int, int, int]]]
) -> None:
    for i, (name, help_text) in enumerate(
        (
            ("_total", "Total number of authentication attempts"),
            ("_succeeded_total", "Total number of successful authentication attempts"),
            ("_failed_total", "Total number of failed authentication attempts"),
        )
    ):
        samples = [(labels, counts[i]) for labels, counts in rows]
        out.family(prefix + name, "counter", help_text + suffix, samples)


# node_persister_metrics that mean something here: the message store's log (one append-only
# file set, broker/store/segments.py); (name, help, IOStats attribute or a reader)
PERSISTER_FAMILIES: tuple[tuple[str, str, Callable[[Any], float]], ...] = (
    ("io_read_ops_total", "Total number of I/O read operations", lambda s: s.io.read_ops),
    ("io_read_bytes_total", "Total number of I/O bytes read", lambda s: s.io.read_bytes),
    ("io_write_ops_total", "Total number of I/O write operations", lambda s: s.io.write_ops),
    ("io_write_bytes_total", "Total number of I/O bytes written", lambda s: s.io.write_bytes),
    ("io_sync_ops_total", "Total number of I/O sync operations", lambda s: s.io.sync_ops),
    # the log is appended to and read with pread: no seek is ever made
    ("io_seek_ops_total", "Total number of I/O seek operations", lambda s: 0),
    (
        "io_reopen_ops_total",
        "Total number of times files have been reopened",
        lambda s: s.io.reopen_ops,
    ),
    (
        "msg_store_read_total",
        "Total number of Message Store read operations",
        lambda s: s.io.msg_store_reads,
    ),
    (
        "msg_store_write_total",
        "Total number of Message Store write operations",
        lambda s: s.messages_written,
    ),
    ("io_read_time_seconds_total", "Total I/O read time", lambda s: round(s.io.read_time, 6)),
    ("io_write_time_seconds_total", "Total I/O write time", lambda s: round(s.io.write_time, 6)),
    ("io_sync_time_seconds_total", "Total I/O sync time", lambda s: round(s.io.sync_time, 6)),
    ("io_seek_time_seconds_total", "Total I/O seek time", lambda s: 0),
)


class _NoStore:
    """A broker without a data dir: nothing is ever read or written."""

    io = IOStats()
    messages_written = 0


def _persister(out: Exposition, scope: Scope) -> None:
    persistence = scope.mgmt.broker.persistence
    store: Any = persistence.messages if persistence is not None else _NoStore()
    for name, help_text, read in PERSISTER_FAMILIES:
        out.one(scope.prefix + name, "counter", help_text, read(store))


def _info(out: Exposition, scope: Scope, endpoint: str) -> None:
    mgmt = scope.mgmt
    out.family(
        "rabbitmq_build_info",
        "untyped",
        "RabbitMQ & Erlang/OTP version info",
        [
            (
                {
                    "product_name": "Warren",
                    "product_version": mgmt.version,
                    "rabbitmq_version": API_VERSION,
                    "prometheus_plugin_version": API_VERSION,
                    "prometheus_client_version": "warren",
                    # no Erlang: the runtime that stands in for it
                    "erlang_version": "python-" + platform.python_version(),
                },
                1,
            )
        ],
    )
    out.family(
        "warren_build_info",
        "untyped",
        "Warren and Python versions",
        [({"version": mgmt.version, "python_version": platform.python_version()}, 1)],
    )
    out.family(
        "rabbitmq_identity_info",
        "untyped",
        "RabbitMQ node & cluster identity info",
        [
            (
                {
                    "rabbitmq_node": mgmt.node,
                    "rabbitmq_cluster": mgmt.node,
                    "rabbitmq_cluster_permanent_id": mgmt.node,
                    "rabbitmq_endpoint": endpoint,
                },
                1,
            )
        ],
    )


def _queue_info(out: Exposition, scope: Scope, queues: list[Queue]) -> None:
    out.family(
        scope.prefix + "queue_info",
        "gauge",
        "A metric with a constant '1' value and labels that provide some queue details",
        [
            (
                {
                    "vhost": q.vhost.name,
                    "queue": q.name,
                    "queue_type": QUEUE_TYPES.get(q.queue_type, q.queue_type),
                    "membership": "leader",
                },
                1,
            )
            for q in queues
        ],
    )


def _totals(out: Exposition, queues: list[Queue], channels: list[Channel], conns: int) -> None:
    consumers = sum(len(q.consumers) for q in queues)
    out.one("rabbitmq_connections", "gauge", "Connections currently open", conns)
    out.one("rabbitmq_channels", "gauge", "Channels currently open", len(channels))
    out.one("rabbitmq_consumers", "gauge", "Consumers currently connected", consumers)
    out.one("rabbitmq_queues", "gauge", "Queues available", len(queues))


def _live_channels(connections: list[Connection]) -> list[Channel]:
    return [ch for c in connections for ch in c.channels.values() if not ch.closed]


def render(mgmt: Management, per_object: bool) -> str:
    """``/metrics`` (summed) or ``/metrics/per-object``."""
    scope = Scope(mgmt, per_object)
    out = Exposition()
    queues = scope.queues()
    connections = mgmt.connections()
    channels = _live_channels(connections)
    _objects(out, scope, QUEUE_GROUPS, queues, _queue_label)
    _objects(out, scope, CHANNEL_GROUPS, channels, _channel_label)
    _objects(out, scope, CONNECTION_GROUPS, connections, _connection_label)
    _objects(out, scope, EXCHANGE_GROUPS, scope.exchanges(), _exchange_label)
    _node_groups(out, scope)
    _totals(out, queues, channels, len(connections))
    if per_object:
        _queue_info(out, scope, queues)
    _info(out, scope, "per-object" if per_object else "aggregated")
    _warren_queues(out, queues, per_object)
    _warren_exchanges(out, mgmt, per_object)
    _globals(mgmt, out, queues, channels)
    _alarms(mgmt, out)
    out.one(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
        int(mgmt.broker.started_at),
    )
    return out.text()


def render_detailed(mgmt: Management, query: Any) -> str:
    """``/metrics/detailed``: the groups named by ``family``, per object, vhost- and
    queue-filtered; RabbitMQ renders nothing but the identity families without ``family``."""
    vhosts = query.getall("vhost", [])
    pattern = query.get("queue") or None
    queue_filter = None
    if pattern is not None:
        if len(pattern) > MAX_QUEUE_FILTER_LENGTH:
            raise web.HTTPBadRequest(text="'queue' regex too long")
        try:
            queue_filter = re.compile(pattern)
        except re.error as exc:
            raise web.HTTPBadRequest(
                text=f"Invalid 'queue' regex at position {exc.pos}: {exc.msg}"
            ) from None
    scope = Scope(
        mgmt,
        True,
        prefix="rabbitmq_detailed_",
        groups=frozenset(query.getall("family", [])),
        vhosts=frozenset(v for v in vhosts if v in mgmt.broker.vhosts) if vhosts else None,
        queue_filter=queue_filter,
    )
    out = Exposition()
    queues = scope.queues()
    connections = mgmt.connections()
    _objects(out, scope, QUEUE_GROUPS, queues, _queue_label)
    _objects(out, scope, CHANNEL_GROUPS, _live_channels(connections), _channel_label)
    _objects(out, scope, CONNECTION_GROUPS, connections, _connection_label)
    _objects(out, scope, EXCHANGE_GROUPS, scope.exchanges(), _exchange_label)
    _node_groups(out, scope)
    _cluster_groups(out, scope)
    if any(
        scope.wants(g) for g in ("queue_coarse_metrics", "queue_consumer_count", "queue_metrics")
    ):
        _queue_info(out, scope, queues)
    _info(out, scope, "detailed")
    return out.text()


def _cluster_groups(out: Exposition, scope: Scope) -> None:
    """vhost_status, exchange_bindings, exchange_names: ``rabbitmq_cluster_*``."""
    vhosts = [
        v
        for v in scope.mgmt.broker.vhosts.values()
        if scope.vhosts is None or v.name in scope.vhosts
    ]
    if scope.wants("vhost_status"):
        out.family(
            "rabbitmq_cluster_vhost_status",
            "gauge",
            "Whether a given vhost is running",
            [({"vhost": v.name}, 1) for v in vhosts],
        )
    # neither internal exchanges nor the default one (rabbitmq_prometheus' get_data/4)
    exchanges = [(v, x) for v in vhosts for x in v.exchanges.values() if x.name and not x.internal]
    if scope.wants("exchange_bindings"):
        out.family(
            "rabbitmq_cluster_exchange_bindings",
            "gauge",
            "Number of bindings for an exchange. This value is cluster-wide.",
            [
                ({"vhost": v.name, "exchange": x.name, "type": x.kind}, len(x.bindings))
                for v, x in exchanges
            ],
        )
    if scope.wants("exchange_names"):
        out.family(
            "rabbitmq_cluster_exchange_name",
            "gauge",
            "Enumerates exchanges without any additional info. This value is cluster-wide. "
            "A cheaper alternative to `exchange_bindings`",
            [({"vhost": v.name, "exchange": x.name, "type": x.kind}, 1) for v, x in exchanges],
        )


def _alarms(mgmt: Management, out: Exposition) -> None:
    alarms = mgmt.broker.alarms
    out.family(
        "rabbitmq_alarms_free_disk_space_watermark",
        "untyped",
        "is 1 if free disk space watermark alarm is in effect",
        [({}, int("disk" in alarms))],
    )
    out.family(
        "rabbitmq_alarms_memory_used_watermark",
        "untyped",
        "is 1 if VM memory watermark alarm is in effect",
        [({}, int("memory" in alarms))],
    )


# ---- Warren's own queue families ----

# (name, type, help, value of one queue)
WARREN_QUEUE_FAMILIES: tuple[tuple[str, str, str, Callable[[Queue], float]], ...] = (
    (
        "warren_queue_messages_delayed",
        "gauge",
        "Messages waiting for a delayed retry before they are ready again",
        lambda q: q.delayed_count,
    ),
    (
        "warren_queue_messages_delivered_total",
        "counter",
        "Deliveries and basic.get-oks from the queue",
        lambda q: q.stats.delivered,
    ),
    (
        "warren_queue_messages_acked_total",
        "counter",
        "Messages acknowledged",
        lambda q: q.stats.acked,
    ),
    (
        "warren_queue_messages_redelivered_total",
        "counter",
        "Messages returned to the queue for another delivery",
        lambda q: q.stats.redelivered,
    ),
    (
        "warren_queue_messages_expired_total",
        "counter",
        "Messages expired by TTL",
        lambda q: q.stats.expired,
    ),
    (
        "warren_queue_retries_total",
        "counter",
        "Returned messages that waited for a delayed retry",
        lambda q: q.stats.retried,
    ),
    (
        "warren_queue_consumer_timeouts_total",
        "counter",
        "Deliveries not acknowledged within the consumer timeout",
        lambda q: q.stats.consumer_timeouts,
    ),
    (
        "warren_queue_consumers_timed_out",
        "gauge",
        "Consumers in the timeout state (timed-out deliveries not yet settled)",
        lambda q: sum(1 for c in q.consumers if c.timed_out),
    ),
)


def _warren_exchanges(out: Exposition, mgmt: Management, per_object: bool) -> None:
    delayed = [
        ({"vhost": v.name, "exchange": x.name}, getattr(x, "messages_delayed", 0))
        for v in mgmt.broker.vhosts.values()
        for x in v.exchanges.values()
        if x.delays
    ]
    out.family(
        "warren_exchange_messages_delayed",
        "gauge",
        "Messages an x-delayed-message exchange holds until their delay is over",
        delayed if per_object else [({}, sum(count for _, count in delayed))],
    )


def _warren_queues(out: Exposition, queues: list[Queue], per_object: bool) -> None:
    for name, kind, help_text, read in WARREN_QUEUE_FAMILIES:
        if per_object:
            samples: list[Sample] = [(_queue_label(q), read(q)) for q in queues]
        else:
            samples = [({}, sum(read(q) for q in queues))]
        out.family(name, kind, help_text, samples)
    if per_object:
        dead = [
            ({**_queue_label(q), "reason": reason}, count)
            for q in queues
            for reason, count in sorted(q.stats.dead_lettered.items())
        ]
        out.family(
            "warren_queue_messages_dead_lettered_total",
            "counter",
            "Messages dead-lettered, by reason",
            dead,
        )


# ---- rabbitmq_global_* ----

GLOBAL_COUNTERS = (
    ("received", "received", "Total number of messages received from publishers"),
    (
        "received_confirm",
        "received_confirm",
        "Total number of messages received from publishers expecting confirmations",
    ),
    ("routed", "routed", "Total number of messages routed to queues or streams"),
    (
        "unroutable_dropped",
        "unroutable_dropped",
        "Total number of messages published as non-mandatory into an exchange and dropped as "
        "unroutable",
    ),
    (
        "unroutable_returned",
        "unroutable_returned",
        "Total number of messages published as mandatory into an exchange and returned to the "
        "publisher as unroutable",
    ),
    ("confirmed", "confirmed", "Total number of messages confirmed to publishers"),
    ("delivered", "delivered", "Total number of messages delivered to consumers"),
    (
        "delivered_consume_manual_ack",
        "delivered_consume_manual",
        "Total number of messages delivered to consumers using basic.consume with manual "
        "acknowledgment",
    ),
    (
        "delivered_consume_auto_ack",
        "delivered_consume_auto",
        "Total number of messages delivered to consumers using basic.consume with automatic "
        "acknowledgment",
    ),
    (
        "delivered_get_manual_ack",
        "delivered_get_manual",
        "Total number of messages delivered to consumers using basic.get with manual "
        "acknowledgment",
    ),
    (
        "delivered_get_auto_ack",
        "delivered_get_auto",
        "Total number of messages delivered to consumers using basic.get with automatic "
        "acknowledgment",
    ),
    (
        "get_empty",
        "get_empty",
        "Total number of times basic.get operations fetched no message",
    ),
    ("redelivered", "redelivered", "Total number of messages redelivered to consumers"),
    ("acknowledged", "acked", "Total number of messages acknowledged by consumers"),
)


def _globals(
    mgmt: Management, out: Exposition, queues: list[Queue], channels: list[Channel]
) -> None:
    totals = mgmt.broker.message_totals()
    for name, attribute, help_text in GLOBAL_COUNTERS:
        value = getattr(totals, attribute)
        out.family(
            f"rabbitmq_global_messages_{name}_total", "counter", help_text, [(PROTOCOL, value)]
        )
    publishers = sum(1 for ch in channels if ch.stats.received)  # a channel that published
    out.family(
        "rabbitmq_global_publishers",
        "gauge",
        "Current number of publishers",
        [(PROTOCOL, publishers)],
    )
    consumers = sum(len(q.consumers) for q in queues)
    out.family(
        "rabbitmq_global_consumers", "gauge", "Current number of consumers", [(PROTOCOL, consumers)]
    )
    _dead_letters(mgmt, out, queues, totals.consumer_timeouts)
    _message_sizes(out, totals)


def _message_sizes(out: Exposition, totals: ChannelStats) -> None:
    """rabbitmq_message_size_bytes: a cumulative histogram, as Prometheus' buckets are."""
    name = "rabbitmq_message_size_bytes"
    out.lines.append(f"# HELP {name} Size of messages received from publishers")
    out.lines.append(f"# TYPE {name} histogram")
    cumulative = 0
    for bound, count in zip((*SIZE_BOUNDS, "+Inf"), totals.size_buckets, strict=True):
        cumulative += count
        labels = _labels({**PROTOCOL, "le": str(bound)})
        out.lines.append(f"{name}_bucket{labels} {cumulative}")
    out.lines.append(f"{name}_sum{_labels(PROTOCOL)} {totals.size_sum}")
    out.lines.append(f"{name}_count{_labels(PROTOCOL)} {cumulative}")


def _dead_letters(
    mgmt: Management, out: Exposition, queues: list[Queue], consumer_timeouts: int
) -> None:
    # Warren's counters summed over queues: deleted queues' final counts are kept by the
    # sampler (retired), and queues deleted since it last ran are still counted here.
    # (A queue created and deleted between two scrapes and samples is never counted.)
    live = list(queues)
    seen = set(live)
    counted = live + [q for q in mgmt.rates.known if q not in seen]
    mgmt.rates.known.update(live)  # exposed now: their counts must not vanish when deleted
    retired = mgmt.rates.retired
    dead: dict[tuple[str, str], int] = dict(retired.dead_lettered)
    expired, retried = retired.expired, retired.retried
    for q in counted:
        expired += q.stats.expired
        retried += q.stats.retried
        for reason, count in q.stats.dead_lettered.items():
            key = (q.queue_type, reason)
            dead[key] = dead.get(key, 0) + count
    for reason in DEAD_LETTER_REASONS:
        samples: list[Sample] = [
            (
                {
                    "queue_type": QUEUE_TYPES.get(kind, kind),
                    "dead_letter_strategy": "at_most_once",
                },
                dead.get((kind, reason), 0),
            )
            for kind in ("classic", "quorum")
        ]
        out.family(
            f"rabbitmq_global_messages_dead_lettered_{reason}_total",
            "counter",
            DEAD_LETTER_HELP[reason],
            samples,
        )
    # only a quorum queue's at-least-once dead-lettering confirms (rabbit_global_counters:
    # messages_dead_lettered_confirmed/3); Warren dead-letters at most once: none yet
    out.family(
        "rabbitmq_global_messages_dead_lettered_confirmed_total",
        "counter",
        "Total number of messages dead-lettered and confirmed by target queues",
        [
            (
                {"queue_type": "rabbit_quorum_queue", "dead_letter_strategy": "at_least_once"},
                0,
            )
        ],
    )
    by_reason: dict[str, int] = {r: 0 for r in DEAD_LETTER_REASONS}
    for (_, reason), count in dead.items():
        by_reason[reason] = by_reason.get(reason, 0) + count
    out.family(
        "warren_messages_dead_lettered_total",
        "counter",
        "Messages dead-lettered, by reason",
        [({"reason": r}, n) for r, n in sorted(by_reason.items())],
    )
    out.one("warren_messages_expired_total", "counter", "Messages expired by TTL", expired)
    out.one(
        "warren_messages_retried_total",
        "counter",
        "Returned messages that waited for a delayed retry",
        retried,
    )
    out.one(
        "warren_consumer_timeouts_total",
        "counter",
        "Deliveries not acknowledged within the consumer timeout (each returns them)",
        consumer_timeouts,
    )


class MetricsApp:
    def __init__(self, mgmt: Management) -> None:
        self.mgmt = mgmt
        self.app = web.Application()
        self.app.router.add_get("/metrics", self.metrics)
        self.app.router.add_get("/metrics/per-object", self.per_object)
        self.app.router.add_get("/metrics/detailed", self.detailed)

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text=render(self.mgmt, False), headers={"Content-Type": CONTENT_TYPE})

    async def per_object(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text=render(self.mgmt, True), headers={"Content-Type": CONTENT_TYPE})

    async def detailed(self, request: web.Request) -> web.StreamResponse:
        text = render_detailed(self.mgmt, request.query)
        return web.Response(text=text, headers={"Content-Type": CONTENT_TYPE})
