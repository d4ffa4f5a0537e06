"""More of RabbitMQ's health checks (rabbit_mgmt_wm_health_check_*): shapes and codes as
RabbitMQ 3.10.8 answers them side by side; a failed check is a 503."""

from __future__ import annotations

from aiohttp import web

from warren.broker.ops.management import auth
from warren.broker.ops.management.app import Ctx, Router, json_response, reply
from warren.broker.ops.management.errors import bad_request


def virtual_hosts(ctx: Ctx) -> web.StreamResponse:
    return reply(ctx, {"status": "ok"})  # every vhost of a Warren node runs while it does


def single_node(ctx: Ctx) -> web.StreamResponse:
    # rabbit_mgmt_wm_health_check_node_is_quorum_critical: one node is never critical
    return reply(ctx, {"status": "ok", "reason": "single node cluster"})


def port_listener(ctx: Ctx) -> web.StreamResponse:
    mgmt = ctx.mgmt
    try:
        port = int(ctx.params["port"])
    except ValueError:
        raise bad_request(f"Invalid port: {ctx.params['port']}") from None
    ports = [p for _, p in mgmt.listeners]
    ports += [p for p in (mgmt.management_port, mgmt.prometheus_port) if p is not None]
    if port in ports:
        return reply(ctx, {"status": "ok", "port": port})
    return json_response(
        {"status": "failed", "reason": "No active listener", "missing": port, "ports": ports},
        503,
    )


def routes(router: Router) -> None:
    router.add("GET", "health/checks/virtual-hosts", virtual_hosts, auth.any_user)
    router.add("GET", "health/checks/node-is-quorum-critical", single_node, auth.any_user)
    router.add("GET", "health/checks/node-is-mirror-sync-critical", single_node, auth.any_user)
    router.add("GET", "health/checks/port-listener/{port}", port_listener, auth.any_user)
