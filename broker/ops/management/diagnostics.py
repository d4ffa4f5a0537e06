"""What RabbitMQ's tools read about the node itself: feature flags, memory, login attempts,
the old node health check and the management UI's auth settings.

- ``/api/feature-flags`` (rabbit_mgmt_wm_feature_flags, any management user): RabbitMQ 4.3's
  core feature flags that every 4.3 node has enabled (``stability: required`` in
  rabbit_core_ff.erl); Warren behaves as a node with them on. Enabling one
  (``PUT /api/feature-flags/{name}/enable``) answers 204 for a listed flag, 400 otherwise.
- ``/api/nodes/{node}/memory[/relative]`` (rabbit_mgmt_wm_node_memory, monitors): RabbitMQ's
  breakdown keys; Warren measures its resident memory (``total.rss``) and the message bodies
  queues hold in memory, per queue type; what it cannot tell apart is ``other_proc``, and
  the keys of Erlang's own areas are 0. Relative values as RabbitMQ rounds them (percentage/2:
  a non-zero part is at least 1).
- ``/api/nodes/{node}/memory/ets[/{filter}][/relative]`` (rabbit_mgmt_wm_node_memory_ets):
  Warren has no ETS tables, which RabbitMQ answers as ``"no_tables"``.
- ``/api/auth/attempts/{node}[/source]`` (rabbit_mgmt_wm_auth_attempts, monitors; DELETE
  resets them, administrators): rabbit_core_metrics:format_auth_attempt/1's rows for AMQP
  0-9-1 logins; per source only with ``track_auth_attempt_source``.
- ``/api/healthchecks/node[/{node}]`` (3.x's rabbit_mgmt_wm_healthchecks): ``{"status": "ok"}``.
- ``/api/auth`` (3.x's rabbit_mgmt_wm_auth, no login: the console asks before it has one):
  UAA/OAuth is off.
- ``POST /api/rebalance/queues`` (rabbit_mgmt_wm_rebalance_queues): one node has nothing to
  move, 204; ``DELETE /api/reset[/{node}]`` (rabbit_mgmt_wm_reset): the rate samples start
  again, 204; ``POST /api/vhosts/{vhost}/start/{node}`` (rabbit_mgmt_wm_vhost_restart): every
  vhost runs, 204 (400 ``Unknown node: x``). Administrators only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from warren.broker.ops.management import auth
from warren.broker.ops.management.app import Ctx, Resource, json_response, no_content, reply
from warren.broker.ops.management.errors import bad_request, not_found

if TYPE_CHECKING:
    from warren.broker.ops.management.core import Management

# (name, desc, doc_url): RabbitMQ 4.3.5's rabbit_core_ff.erl, the flags with stability required
REQUIRED_FEATURE_FLAGS = (
    ("classic_mirrored_queue_version", "Support setting version for classic mirrored queues", ""),
    (
        "quorum_queue",
        "Support queues of type `quorum`",
        "https://www.rabbitmq.com/docs/quorum-queues",
    ),
    ("stream_queue", "Support queues of type `stream`", "https://www.rabbitmq.com/docs/stream"),
    (
        "implicit_default_bindings",
        "Default bindings are now implicit, instead of being stored in the database",
        "",
    ),
    ("virtual_host_metadata", "Virtual host metadata (description, tags, etc)", ""),
    ("maintenance_mode_status", "Maintenance mode status", ""),
    ("user_limits", "Configure connection and channel limits for a user", ""),
    (
        "stream_single_active_consumer",
        "Single active consumer for streams",
        "https://www.rabbitmq.com/docs/stream",
    ),
    ("feature_flags_v2", "Feature flags subsystem V2", ""),
    ("direct_exchange_routing_v2", "v2 direct exchange routing implementation", ""),
    ("listener_records_in_ets", "Store listener records in ETS instead of Mnesia", ""),
    ("tracking_records_in_ets", "Store tracking records in ETS instead of Mnesia", ""),
    (
        "classic_queue_type_delivery_support",
        "Bug fix for classic queue deliveries using mixed versions",
        "https://github.com/rabbitmq/rabbitmq-server/issues/5931",
    ),
    (
        "restart_streams",
        "Support for restarting streams with optional preferred next leader argument."
        "Used to implement stream leader rebalancing",
        "",
    ),
    (
        "stream_sac_coordinator_unblock_group",
        "Bug fix to unblock a group of consumers in a super stream partition",
        "https://github.com/rabbitmq/rabbitmq-server/issues/7743",
    ),
    ("stream_filtering", "Support for stream filtering.", ""),
    ("message_containers", "Message containers.", ""),
    (
        "khepri_db",
        "New Raft-based metadata store.",
        "https://www.rabbitmq.com/docs/next/metadata-store",
    ),
    (
        "stream_update_config_command",
        "A new internal command that is used to update streams as part of a policy.",
        "",
    ),
    (
        "quorum_queue_non_voters",
        "Allows new quorum queue members to be added as non voters initially.",
        "",
    ),
    (
        "message_containers_deaths_v2",
        "Bug fix for dead letter cycle detection",
        "https://github.com/rabbitmq/rabbitmq-server/issues/11159",
    ),
)

# rabbit_vm:memory/0's keys besides ``total`` and ``strategy``, in its order
MEMORY_KEYS = (
    "connection_readers", "connection_writers", "connection_channels", "connection_other",
    "queue_procs", "quorum_queue_procs", "quorum_queue_dlx_procs", "stream_queue_procs",
    "stream_queue_replica_reader_procs", "stream_queue_coordinator_procs", "plugins",
    "metadata_store", "other_proc", "metrics", "mgmt_db", "mnesia", "quorum_ets",
    "metadata_store_ets", "other_ets", "binary", "msg_index", "code", "atom", "other_system",
    "allocated_unused", "reserved_unallocated",
)  # fmt: skip


def feature_flags(ctx: Ctx) -> web.StreamResponse:
    rows = [
        {
            "name": name,
            "desc": desc,
            "doc_url": doc_url,
            "state": "enabled",
            "stability": "required",
            "provided_by": "rabbit",
        }
        for name, desc, doc_url in REQUIRED_FEATURE_FLAGS
    ]
    return reply(ctx, rows)


def enable_feature_flag(ctx: Ctx) -> web.StreamResponse:
    if ctx.params["name"] not in {name for name, _, _ in REQUIRED_FEATURE_FLAGS}:
        raise bad_request(f"Feature flag '{ctx.params['name']}' is unsupported")
    return no_content()  # already enabled


def _node(ctx: Ctx) -> None:
    if ctx.params.get("node", ctx.mgmt.node) != ctx.mgmt.node:
        raise not_found()


def memory_breakdown(mgmt: Management) -> dict[str, Any]:
    """rabbit_vm:memory/0's shape from what Warren measures (see the module's docstring)."""
    rss = mgmt.broker.monitor.memory_used
    held = {"classic": 0, "quorum": 0, "stream": 0}
    for queue in mgmt.queues():
        kind = queue.queue_type if queue.queue_type in held else "classic"
        held[kind] += max(queue.ready_bytes - queue.paged_bytes, 0)
    out: dict[str, Any] = dict.fromkeys(MEMORY_KEYS, 0)
    out["queue_procs"] = held["classic"]
    out["quorum_queue_procs"] = held["quorum"]
    out["stream_queue_procs"] = held["stream"]
    out["other_proc"] = max(rss - sum(held.values()), 0)
    out["strategy"] = "rss"
    out["total"] = {"erlang": rss, "rss": rss, "allocated": rss}
    return out


def _percentage(part: int, total: int) -> int:
    # rabbit_mgmt_wm_node_memory:percentage/2 (Erlang's round: halves away from zero)
    value = int(part * 100 / total + 0.5) if total else 0
    return 1 if value == 0 and part != 0 else value


def node_memory(ctx: Ctx) -> web.StreamResponse:
    _node(ctx)
    memory = memory_breakdown(ctx.mgmt)
    if ctx.request.path.endswith("/relative"):
        total = memory["total"]["rss"]
        relative = {"total": 100}
        for key, value in memory.items():
            if key not in ("total", "strategy"):
                relative[key] = _percentage(value, total)
        return reply(ctx, {"memory": relative})
    return reply(ctx, {"memory": memory})


def node_memory_ets(ctx: Ctx) -> web.StreamResponse:
    _node(ctx)
    return reply(ctx, {"ets_tables_memory": "no_tables"})


def auth_attempts(ctx: Ctx) -> web.StreamResponse:
    _node(ctx)
    stats = ctx.mgmt.broker.stats
    if ctx.request.path.endswith("/source"):
        rows = [
            {
                "remote_address": address,
                "username": user,
                "protocol": protocol,
                "auth_attempts": ok + failed,
                "auth_attempts_failed": failed,
                "auth_attempts_succeeded": ok,
            }
            for (address, user, protocol), (ok, failed) in stats.auth_attempts_by_source.items()
        ]
        return reply(ctx, rows)
    ok, failed = stats.auth_attempts_succeeded, stats.auth_attempts_failed
    rows = [
        {
            "protocol": "amqp091",
            "auth_attempts": ok + failed,
            "auth_attempts_failed": failed,
            "auth_attempts_succeeded": ok,
        }
    ]
    return reply(ctx, rows if ok + failed else [])


def reset_auth_attempts(ctx: Ctx) -> web.StreamResponse:
    _node(ctx)
    stats = ctx.mgmt.broker.stats  # rabbit_core_metrics:reset_auth_attempt_metrics/0
    stats.auth_attempts_succeeded = stats.auth_attempts_failed = 0
    stats.auth_attempts_by_source.clear()
    return no_content()


def node_healthcheck(ctx: Ctx) -> web.StreamResponse:
    _node(ctx)
    return reply(ctx, {"status": "ok"})


def auth_settings(ctx: Ctx) -> web.StreamResponse:
    return json_response({"enable_uaa": False, "uaa_client_id": "", "uaa_location": ""})


def rebalance(ctx: Ctx) -> web.StreamResponse:
    return no_content()


def reset_stats(ctx: Ctx) -> web.StreamResponse:
    _node(ctx)
    ctx.mgmt.rates.reset()
    return no_content()


def start_vhost(ctx: Ctx) -> web.StreamResponse:
    ctx.vhost()
    if ctx.params["node"] != ctx.mgmt.node:
        raise bad_request(f"Unknown node: {ctx.params['node']}")
    return no_content()  # already started (rabbit_vhost_sup_sup: already_started is ok)


ROUTES = (
    Resource("feature-flags", check=auth.any_user, GET=feature_flags),
    Resource("feature-flags/{name}/enable", check=auth.admin, PUT=enable_feature_flag),
    Resource(
        "nodes/{node}/memory", "nodes/{node}/memory/relative", check=auth.monitor, GET=node_memory
    ),
    Resource(
        "nodes/{node}/memory/ets",
        "nodes/{node}/memory/ets/relative",
        "nodes/{node}/memory/ets/{filter}",
        "nodes/{node}/memory/ets/{filter}/relative",
        check=auth.monitor,
        GET=node_memory_ets,
    ),
    Resource(
        "auth/attempts/{node}", "auth/attempts/{node}/source", check=auth.monitor, GET=auth_attempts
    ),
    Resource(
        "auth/attempts/{node}",
        "auth/attempts/{node}/source",
        check=auth.admin,
        DELETE=reset_auth_attempts,
    ),
    Resource(
        "healthchecks/node", "healthchecks/node/{node}", check=auth.any_user, GET=node_healthcheck
    ),
    Resource("auth", check=auth.public, GET=auth_settings),
    Resource("rebalance/queues", check=auth.admin, POST=rebalance),
    Resource("reset", "reset/{node}", check=auth.admin, DELETE=reset_stats),
    Resource("vhosts/{vhost}/start/{node}", check=auth.admin, POST=start_vhost),
)
