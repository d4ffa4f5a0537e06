"""Prometheus metrics on their own port (``prometheus.tcp.port``, default 15692).

``/metrics`` gives RabbitMQ's aggregated families (queue, channel and
connection gauges summed over the node, as RabbitMQ's default endpoint does)
and ``/metrics/per-object`` the same with one sample per queue, channel and
connection. Families RabbitMQ also has keep its ``rabbitmq_`` names; Warren's
own (consumer timeouts, delayed retries, expiries, dead-letters by reason) are
``warren_``. Everything is read from the engine's counters when scraped: the
message path only increments them.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from aiohttp import web

from warren.broker.management.formats import channel_name, connection_name

if TYPE_CHECKING:
    from warren.broker.channel import Channel
    from warren.broker.management.core import Management
    from warren.broker.queue import Queue

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
QUEUE_TYPES = {
    "classic": "rabbit_classic_queue",
    "quorum": "rabbit_quorum_queue",
    "stream": "rabbit_stream_queue",
}
DEAD_LETTER_REASONS = ("expired", "rejected", "maxlen", "delivery_limit")

Labels = dict[str, str]
Sample = tuple[Labels, float]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _number(value: float) -> str:
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


# (name, type, help, value of one queue)
QUEUE_FAMILIES: tuple[tuple[str, str, str, str], ...] = (
    (
        "rabbitmq_queue_messages_ready",
        "gauge",
        "Messages ready to be delivered to consumers",
        "ready",
    ),
    (
        "rabbitmq_queue_messages_unacked",
        "gauge",
        "Messages delivered to consumers but not yet acknowledged",
        "unacked",
    ),
    (
        "rabbitmq_queue_messages",
        "gauge",
        "Sum of ready and unacknowledged messages - total queue depth",
        "messages",
    ),
    ("rabbitmq_queue_messages_ready_bytes", "gauge", "Size in bytes of ready messages", "bytes"),
    ("rabbitmq_queue_consumers", "gauge", "Consumers on a queue", "consumers"),
    (
        "rabbitmq_queue_messages_published_total",
        "counter",
        "Total number of messages published to queues",
        "published",
    ),
    (
        "warren_queue_messages_delayed",
        "gauge",
        "Messages waiting for a delayed retry before they are ready again",
        "delayed",
    ),
    (
        "warren_queue_messages_delivered_total",
        "counter",
        "Deliveries and basic.get-oks from the queue",
        "delivered",
    ),
    ("warren_queue_messages_acked_total", "counter", "Messages acknowledged", "acked"),
    (
        "warren_queue_messages_redelivered_total",
        "counter",
        "Messages returned to the queue for another delivery",
        "redelivered",
    ),
    ("warren_queue_messages_expired_total", "counter", "Messages expired by TTL", "expired"),
    (
        "warren_queue_retries_total",
        "counter",
        "Returned messages that waited for a delayed retry",
        "retried",
    ),
    (
        "warren_queue_consumer_timeouts_total",
        "counter",
        "Deliveries not acknowledged within the consumer timeout",
        "consumer_timeouts",
    ),
    (
        "warren_queue_consumers_timed_out",
        "gauge",
        "Consumers in the timeout state (timed-out deliveries not yet settled)",
        "timed_out",
    ),
)


def _queue_values(queue: Queue) -> dict[str, float]:
    s = queue.stats
    return {
        "ready": queue.ready_count,
        "unacked": queue.unacked_count,
        "messages": queue.ready_count + queue.unacked_count,
        "bytes": queue.ready_bytes,
        "consumers": len(queue.consumers),
        "published": s.published,
        "delayed": queue.delayed_count,
        "delivered": s.delivered,
        "acked": s.acked,
        "redelivered": s.redelivered,
        "expired": s.expired,
        "retried": s.retried,
        "consumer_timeouts": s.consumer_timeouts,
        "timed_out": sum(1 for c in queue.consumers if c.timed_out),
    }


def render(mgmt: Management, per_object: bool) -> str:
    broker = mgmt.broker
    out = Exposition()
    out.family(
        "rabbitmq_identity_info",
        "untyped",
        "RabbitMQ node & cluster identity info",
        [({"rabbitmq_node": mgmt.node, "rabbitmq_cluster": mgmt.node}, 1)],
    )
    out.family(
        "warren_build_info",
        "untyped",
        "Warren and Python versions",
        [({"version": mgmt.version, "python_version": platform.python_version()}, 1)],
    )
    queues = [(v.name, q) for v in broker.vhosts.values() for q in v.queues.values()]
    connections = mgmt.connections()
    channels = [ch for c in connections for ch in c.channels.values() if not ch.closed]
    consumers = sum(len(q.consumers) for _, q in queues)
    out.one("rabbitmq_connections", "gauge", "Connections currently open", len(connections))
    out.one("rabbitmq_channels", "gauge", "Channels currently open", len(channels))
    out.one("rabbitmq_consumers", "gauge", "Consumers currently connected", consumers)
    out.one("rabbitmq_queues", "gauge", "Queues available", len(queues))

    values = [(vhost, q, _queue_values(q)) for vhost, q in queues]
    for name, kind, help_text, key in QUEUE_FAMILIES:
        if per_object:
            samples: list[Sample] = [
                ({"vhost": vhost, "queue": q.name}, v[key]) for vhost, q, v in values
            ]
        else:
            samples = [({}, sum(v[key] for _, _, v in values))]
        out.family(name, kind, help_text, samples)
    if per_object:
        dead = [
            ({"vhost": vhost, "queue": q.name, "reason": reason}, count)
            for vhost, q, _ in values
            for reason, count in sorted(q.stats.dead_lettered.items())
        ]
        out.family(
            "warren_queue_messages_dead_lettered_total",
            "counter",
            "Messages dead-lettered, by reason",
            dead,
        )

    # channels and connections: summed, or one sample each
    channel_families: tuple[tuple[str, str, Callable[[Channel], int]], ...] = (
        ("rabbitmq_channel_consumers", "Consumers on a channel", lambda ch: len(ch.consumers)),
        (
            "rabbitmq_channel_messages_unacked",
            "Delivered but not yet acknowledged messages",
            lambda ch: len(ch.unacked),
        ),
        (
            "rabbitmq_channel_messages_unconfirmed",
            "Published but not yet confirmed messages",
            lambda ch: ch.publish_seq - ch.confirmed if ch.confirm else 0,
        ),
        (
            "rabbitmq_channel_messages_uncommitted",
            "Messages received in a transaction but not yet committed",
            lambda ch: len(ch.tx_publishes),
        ),
        (
            "rabbitmq_channel_prefetch",
            "Total limit of unacknowledged messages for all consumers on a channel",
            lambda ch: ch.prefetch_global,
        ),
    )
    for name, help_text, read in channel_families:
        if per_object:
            samples = [({"channel": channel_name(ch)}, read(ch)) for ch in channels]
        else:
            samples = [({}, sum(read(ch) for ch in channels))]
        out.family(name, "gauge", help_text, samples)
    if per_object:
        samples = [({"connection": connection_name(c)}, len(c.channels)) for c in connections]
    else:
        samples = [({}, sum(len(c.channels) for c in connections))]
    out.family("rabbitmq_connection_channels", "gauge", "Channels on a connection", samples)

    _globals(mgmt, out, queues)
    return out.text()


def _globals(mgmt: Management, out: Exposition, queues: list[tuple[str, Queue]]) -> None:
    stats = mgmt.broker.stats
    proto = {"protocol": "amqp091"}
    counters = (
        ("received", "Total number of messages received from publishers", stats.received),
        ("routed", "Total number of messages routed to queues or streams", stats.routed),
        (
            "unroutable_dropped",
            "Total number of messages published as non-mandatory into an exchange and dropped "
            "as unroutable",
            stats.unroutable_dropped,
        ),
        (
            "unroutable_returned",
            "Total number of messages published as mandatory into an exchange and returned to "
            "the publisher as unroutable",
            stats.unroutable_returned,
        ),
        ("delivered", "Total number of messages delivered to consumers", stats.delivered),
        ("redelivered", "Total number of messages redelivered to consumers", stats.redelivered),
        ("acknowledged", "Total number of messages acknowledged by consumers", stats.acked),
        ("confirmed", "Total number of messages confirmed to publishers", stats.confirmed),
    )
    for name, help_text, value in counters:
        out.family(f"rabbitmq_global_messages_{name}_total", "counter", help_text, [(proto, value)])
    consumers = sum(len(q.consumers) for _, q in queues)
    out.family(
        "rabbitmq_global_consumers", "gauge", "Current number of consumers", [(proto, consumers)]
    )

    # Warren's counters summed over queues: deleted queues' final counts are kept by the
    # sampler (retired), and queues deleted since it last ran are still counted here.
    # (A queue created and deleted between two scrapes and samples is never counted.)
    live = [q for _, q in queues]
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
            f"Total number of messages dead-lettered ({reason})",
            samples,
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
        stats.consumer_timeouts,
    )


class MetricsApp:
    def __init__(self, mgmt: Management) -> None:
        self.mgmt = mgmt
        self.app = web.Application()
        self.app.router.add_get("/metrics", self.metrics)
        self.app.router.add_get("/metrics/per-object", self.per_object)

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text=render(self.mgmt, False), headers={"Content-Type": CONTENT_TYPE})

    async def per_object(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text=render(self.mgmt, True), headers={"Content-Type": CONTENT_TYPE})
