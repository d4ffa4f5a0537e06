"""/api/overview, /api/whoami, /api/cluster-name, health checks and the aliveness test."""

from __future__ import annotations

import asyncio
import os
import platform
import resource
import shutil
from typing import TYPE_CHECKING, Any

from aiohttp import web

from warren import build
from warren.broker.engine.alarms import descriptor_limit, open_descriptors
from warren.broker.engine.stats import IOStats
from warren.broker.ops.management import auth
from warren.broker.ops.management.app import Ctx, Resource, json_response, reply, reply_list
from warren.broker.ops.management.core import (
    GLOBAL_FIELDS,
    QUEUE_FIELDS,
    node_values,
    queue_values,
)
from warren.broker.ops.management.errors import bad_request, not_found
from warren.broker.ops.management.formats import message_stats, with_details
from warren.broker.ops.management.global_parameters import cluster_name
from warren.broker.server.main import started_plugins

if TYPE_CHECKING:
    from warren.broker.ops.management.core import Management

# RabbitMQ's own answer for the version its API speaks; Warren follows 3.10's management API
API_VERSION = "3.10.8"
EXCHANGE_TYPES = (
    ("direct", "AMQP direct exchange, as per the AMQP specification"),
    ("fanout", "AMQP fanout exchange, as per the AMQP specification"),
    ("headers", "AMQP headers exchange, as per the AMQP specification"),
    ("topic", "AMQP topic exchange, as per the AMQP specification"),
    # plugins' and 4.x core's types, with the descriptions they register
    ("x-consistent-hash", "Consistent Hashing Exchange"),
    ("x-delayed-message", "Delayed Message Exchange."),
    ("x-local-random", "Picks one random local binding (queue) to route via (to)."),
    ("x-modulus-hash", "Modulus Hashing Exchange"),
)


BUILD = build()  # which build this process runs: it does not change while it runs


def _global_counts(mgmt: Management) -> dict[str, int]:
    stats = mgmt.broker.message_totals()
    counts = {
        "publish": stats.received,
        "deliver_get": stats.delivered,
        "ack": stats.acked,
        "confirm": stats.confirmed,
        "redeliver": stats.redelivered,
        "return_unroutable": stats.unroutable_returned,
        "drop_unroutable": stats.unroutable_dropped,
        # by delivery kind and acknowledgement mode (rabbit_channel's deliver/get stats)
        "deliver": stats.delivered_consume_manual,
        "deliver_no_ack": stats.delivered_consume_auto,
        "get": stats.delivered_get_manual,
        "get_no_ack": stats.delivered_get_auto,
        "get_empty": stats.get_empty,
    }
    counts["disk_reads"], counts["disk_writes"] = mgmt.rates.disk_counts()
    return counts


def churn_counts(mgmt: Management) -> dict[str, int]:
    """Objects created and closed since the start (RabbitMQ's churn_rates)."""
    stats = mgmt.broker.stats
    return {
        "channel_closed": stats.channels_closed,
        "channel_created": stats.channels_opened,
        "connection_closed": stats.connections_closed,
        "connection_created": stats.connections_opened,
        "queue_created": stats.queues_created,
        "queue_declared": stats.queues_declared,
        "queue_deleted": stats.queues_deleted,
    }


def _add_samples(mgmt: Management, stats: dict[str, Any], age_text: str) -> None:
    """RabbitMQ's ``msg_rates_age``: the counters' samples of the last seconds, newest first."""
    try:
        age = int(age_text)
    except ValueError:
        raise bad_request(f"invalid msg_rates_age: {age_text}") from None
    since = int(mgmt.wall_clock() * 1000) - age * 1000
    recent = [(ms, values) for ms, values in reversed(mgmt.rates.history) if ms >= since]
    for i, name in enumerate(GLOBAL_FIELDS):  # the message counters; lengths are not here
        details = stats.get(name + "_details")
        if details is not None:
            details["samples"] = [{"sample": v[i], "timestamp": ms} for ms, v in recent]


def overview(ctx: Ctx) -> web.StreamResponse:
    mgmt = ctx.mgmt
    broker = mgmt.broker
    user = ctx.user
    vhosts = [broker.vhosts[v] for v in auth.visible_vhosts(mgmt, user)]
    queues = [q for v in vhosts for q in v.queues.values()]
    connections = [c for c in mgmt.connections() if auth.is_monitor(user) or c.user == user.name]
    channels = [ch for c in connections for ch in c.channels.values() if not ch.closed]
    ready = sum(q.ready_count for q in queues)
    unacked = sum(q.unacked_count for q in queues)
    global_rates = mgmt.rates.rates("global")
    if auth.is_monitor(user):
        stats = message_stats(_global_counts(mgmt), global_rates)
        age = ctx.query("msg_rates_age")
        if age is not None:
            _add_samples(mgmt, stats, age)
        length_rates = global_rates
    else:  # other users see the sum over their own vhosts' queues
        counts = dict.fromkeys(QUEUE_FIELDS[: QUEUE_FIELDS.index("messages")], 0)
        for q in queues:
            for name, value in zip(counts, queue_values(q), strict=False):
                counts[name] += value
        stats = message_stats(counts, {})
        length_rates = {}
    totals: dict[str, Any] = {}
    with_details(totals, "messages", ready + unacked, length_rates)
    with_details(totals, "messages_ready", ready, length_rates)
    with_details(totals, "messages_unacknowledged", unacked, length_rates)
    listeners: list[dict[str, Any]] = [
        {"node": mgmt.node, "protocol": "amqp", "ip_address": host, "port": port}
        for host, port in mgmt.listeners
    ]
    if mgmt.management_port is not None:
        listeners.append(
            {
                "node": mgmt.node,
                "protocol": "http",
                "ip_address": broker.settings.management_ip,
                "port": mgmt.management_port,
            }
        )
    if mgmt.prometheus_port is not None:
        listeners.append(
            {
                "node": mgmt.node,
                "protocol": "http/prometheus",
                "ip_address": broker.settings.prometheus_ip,
                "port": mgmt.prometheus_port,
            }
        )
    body = {
        "management_version": API_VERSION,
        "rabbitmq_version": API_VERSION,
        "product_name": mgmt.product_name,
        "product_version": mgmt.product_version,
        "python_version": platform.python_version(),
        "warren_build": BUILD,  # compiled or pure (docs/building.md)
        "rates_mode": "basic",
        "sample_retention_policies": {"global": [600], "basic": [600], "detailed": [600]},
        "exchange_types": [
            {"name": name, "description": text, "enabled": True} for name, text in EXCHANGE_TYPES
        ],
        "cluster_name": cluster_name(mgmt),
        "node": mgmt.node,
        "disable_stats": False,
        "enable_queue_totals": False,
        "statistics_db_event_queue": 0,
        "message_stats": stats,
        "churn_rates": message_stats(churn_counts(mgmt), global_rates),
        "queue_totals": totals,
        "object_totals": {
            "connections": len(connections),
            "channels": len(channels),
            "consumers": sum(len(q.consumers) for q in queues),
            "exchanges": sum(len(v.exchanges) for v in vhosts),
            "queues": len(queues),
        },
        "listeners": listeners,
        "contexts": [],
        "uptime": int((mgmt.wall_clock() - broker.started_at) * 1000),
    }
    return reply(ctx, body)


def whoami(ctx: Ctx) -> web.StreamResponse:
    return reply(ctx, {"name": ctx.user.name, "tags": list(ctx.user.tags)})


def current_alarms(mgmt: Management) -> list[dict[str, Any]]:
    """The engine's resource alarms (memory, disk), as RabbitMQ lists them."""
    return [{"resource": name, "node": mgmt.node} for name in sorted(mgmt.broker.alarms)]


def health_alarms(ctx: Ctx) -> web.StreamResponse:
    alarms = current_alarms(ctx.mgmt)
    if not alarms:
        return reply(ctx, {"status": "ok"})
    return json_response(
        {
            "status": "failed",
            "reason": "There are alarms in effect in the cluster",
            "alarms": alarms,
        },
        503,
    )


def aliveness(ctx: Ctx) -> web.StreamResponse:
    """RabbitMQ 4.3 (rabbit_mgmt_wm_aliveness_test:to_json/2): a no-op for a user who may use
    the vhost (the route checks that). 3.x declared a transient queue, which 4.3 refuses."""
    ctx.vhost()  # 404 for a vhost that does not exist
    return reply(ctx, {"status": "ok"})


def node_json(mgmt: Management) -> dict[str, Any]:
    """This node as /api/nodes shows it, with RabbitMQ's keys (rabbit_mgmt_external_stats,
    rabbit_mgmt_wm_nodes) where Warren has their meaning; what stands in for an Erlang one
    is said next to it (docs/operating.md lists the ones left out)."""
    broker = mgmt.broker
    monitor = broker.monitor  # memory, disk and descriptors, measured once a second
    alarms = broker.alarms
    fd_total = descriptor_limit()
    persistence = broker.persistence
    store: Any = persistence.messages if persistence is not None else None
    io = store.io if store is not None else IOStats()
    loop = asyncio.get_running_loop()
    measured = node_values(broker)
    out: dict[str, Any] = {
        "name": mgmt.node,
        "type": "disc",
        "running": True,
        "being_drained": False,
        "uptime": int((mgmt.wall_clock() - broker.started_at) * 1000),
        "os_pid": str(os.getpid()),  # a string, as RabbitMQ's
        "processors": len(os.sched_getaffinity(0)),
        # the Erlang run queue's counterpart: callbacks ready to run on the event loop
        "run_queue": len(getattr(loop, "_ready", ())),
        "rates_mode": "basic",
        "enabled_plugins": started_plugins(mgmt.management_port, mgmt.prometheus_port),
        "mem_limit": monitor.memory_limit,
        "mem_alarm": "memory" in alarms,
        "mem_calculation_strategy": "rss",
        "disk_free_limit": monitor.disk_limit,
        "disk_free_alarm": "disk" in alarms,
        "fd_total": fd_total,
        # RabbitMQ 3.x's file_handle_cache socket accounting: client sockets and their limit
        "sockets_total": sockets_limit(fd_total),
        # Erlang processes' counterparts: the event loop's tasks, under the OS process limit
        "proc_total": process_limit(),
        "io_read_avg_time": _avg_ms(io.read_time, io.read_ops),
        "io_write_avg_time": _avg_ms(io.write_time, io.write_ops),
        "io_sync_avg_time": _avg_ms(io.sync_time, io.sync_ops),
        "io_seek_avg_time": 0.0,
        "db_dir": broker.settings.data_dir or "",
        "config_files": list(broker.settings.config_files),
        "log_files": ["<stdout>"],
        "net_ticktime": 60,  # RabbitMQ's default; one node has no peers to tick to
        "exchange_types": [
            {"name": name, "description": text, "enabled": True} for name, text in EXCHANGE_TYPES
        ],
        "auth_mechanisms": [
            {"name": name, "description": text, "enabled": True} for name, text in AUTH_MECHANISMS
        ],
        "contexts": _contexts(mgmt),
        "partitions": [],
        "cluster_links": [],
        "applications": [{"name": "warren", "description": "Warren", "version": mgmt.version}],
    }
    # measured now, with their rates of change over the last samples (node_values)
    measured["fd_used"] = open_descriptors()
    if monitor.disk_free is None:  # no data dir: nothing is written; the working dir's
        measured["disk_free"] = shutil.disk_usage(".").free
    node_rates = mgmt.rates.rates("node")
    for name, value in measured.items():
        with_details(out, name, value, node_rates)
    rates = mgmt.rates.rates("global")
    for name, value in churn_counts(mgmt).items():
        with_details(out, name, value, rates)
    return out


# the SASL mechanisms the AMQP listener knows (broker/server/amqp_connection.py)
AUTH_MECHANISMS = (
    ("PLAIN", "SASL PLAIN authentication mechanism"),
    ("AMQPLAIN", "QPid AMQPLAIN mechanism"),
)


def _avg_ms(seconds: float, count: int) -> float:
    """Average time of one operation in ms, over the node's life (RabbitMQ averages over
    the last sample interval)."""
    return round(seconds * 1000 / count, 3) if count else 0.0


def sockets_limit(fd_limit: int) -> int:
    """RabbitMQ 3.x's socket limit (file_handle_cache:init/1 and ?OBTAIN_LIMIT): 90% of the
    descriptors left after 103 reserved, less 2."""
    return max(0, int(max(2, fd_limit - 103) * 0.9 - 2))


def process_limit() -> int:
    """The OS's process and thread limit for this user (RLIMIT_NPROC); Erlang's default
    process limit where there is none."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    return soft if soft != resource.RLIM_INFINITY else 1_048_576


def _contexts(mgmt: Management) -> list[dict[str, Any]]:
    out = []
    if mgmt.management_port is not None:
        out.append(
            {"description": "RabbitMQ Management", "path": "/", "port": str(mgmt.management_port)}
        )
    if mgmt.prometheus_port is not None:
        out.append(
            {"description": "RabbitMQ Prometheus", "path": "/", "port": str(mgmt.prometheus_port)}
        )
    return out


def list_nodes(ctx: Ctx) -> web.StreamResponse:
    return reply(ctx, [node_json(ctx.mgmt)])


def get_node(ctx: Ctx) -> web.StreamResponse:
    if ctx.params["node"] != ctx.mgmt.node:
        raise not_found()
    return reply(ctx, node_json(ctx.mgmt))


def deprecated_features(ctx: Ctx) -> web.StreamResponse:
    """RabbitMQ 4.3's /api/deprecated-features (rabbit_depr_ff_extra:cli_info(all))."""
    return reply_list(ctx, ctx.mgmt.broker.deprecated.listing(), sort=("name",))


def deprecated_features_used(ctx: Ctx) -> web.StreamResponse:
    broker = ctx.mgmt.broker
    queues = (q for vhost in broker.vhosts.values() for q in vhost.queues.values())
    return reply_list(
        ctx, broker.deprecated.listing(broker.deprecated.used(queues)), sort=("name",)
    )


ROUTES = (
    Resource("nodes", check=auth.monitor, GET=list_nodes),
    Resource("nodes/{node}", check=auth.monitor, GET=get_node),
    Resource("overview", check=auth.any_user, GET=overview),
    Resource("whoami", check=auth.any_user, GET=whoami),
    Resource(
        "health/checks/alarms", "health/checks/local-alarms", check=auth.any_user, GET=health_alarms
    ),
    Resource("aliveness-test/{vhost}", check=auth.vhost, GET=aliveness),
    Resource("deprecated-features", check=auth.any_user, GET=deprecated_features),
    Resource("deprecated-features/used", check=auth.any_user, GET=deprecated_features_used),
)
