"""Routes of RabbitMQ's plugins' management extensions that Warren answers.

- ``/api/extensions``: the console extensions of enabled plugins; Warren's console has none.
- ``/api/federation-links[/{vhost}]``: Warren runs no federation, so no links (an upstream
  stored as a ``federation-upstream`` parameter is kept, never started).
- ``/api/federation-links[/{vhost}]/state/down``: the links that are down, none either;
  ``/api/federation-links/vhost/{vhost}/{id}/{node}/restart`` names no link (404).
- ``/api/shovels[/{vhost}]``: what the ``shovel`` parameter component reports if one is
  registered (its ``statuses()``: RabbitMQ's shovel status objects, each with ``vhost``),
  else none; ``/api/shovels/vhost/{vhost}/{name}[/restart]`` one of them (404 if none;
  DELETE of the shovel clears its parameter, as rabbit_shovel_mgmt does; restart answers 204).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from warren.broker.ops.management import auth
from warren.broker.ops.management.app import Ctx, Router, no_content, reply, reply_list
from warren.broker.ops.management.errors import not_found


def extensions(ctx: Ctx) -> web.StreamResponse:
    return reply(ctx, [])


def _vhosts(ctx: Ctx) -> set[str]:
    only = ctx.vhost_or_none()
    return {v for v in auth.visible_vhosts(ctx.mgmt, ctx.user) if only is None or v == only}


def federation_links(ctx: Ctx) -> web.StreamResponse:
    _vhosts(ctx)  # a missing vhost is a 404
    return reply_list(ctx, [])


def shovels(ctx: Ctx) -> web.StreamResponse:
    vhosts = _vhosts(ctx)
    component: Any = ctx.mgmt.broker.parameters.components.get("shovel")
    statuses = getattr(component, "statuses", None)
    rows: list[dict[str, Any]] = list(statuses()) if callable(statuses) else []
    return reply_list(ctx, [r for r in rows if r.get("vhost") in vhosts])


def no_link(ctx: Ctx) -> web.StreamResponse:
    raise not_found()


def _shovel(ctx: Ctx) -> dict[str, Any]:
    vhost, name = ctx.vhost().name, ctx.params["name"]
    component: Any = ctx.mgmt.broker.parameters.components.get("shovel")
    statuses = getattr(component, "statuses", None)
    for row in list(statuses()) if callable(statuses) else []:
        if row.get("vhost") == vhost and row.get("name") == name:
            return dict(row)
    raise not_found()


def get_shovel(ctx: Ctx) -> web.StreamResponse:
    return reply(ctx, _shovel(ctx))


def delete_shovel(ctx: Ctx) -> web.StreamResponse:
    _shovel(ctx)
    ctx.mgmt.broker.parameters.clear(ctx.params["vhost"], "shovel", ctx.params["name"])
    return no_content()


def restart_shovel(ctx: Ctx) -> web.StreamResponse:
    _shovel(ctx)
    return no_content()


def routes(router: Router) -> None:
    router.add("GET", "extensions", extensions, auth.any_user)
    for path in ("federation-links", "federation-links/{vhost}"):
        router.add("GET", path, federation_links, auth.vhost)
    for path in ("federation-links/state/down", "federation-links/{vhost}/state/down"):
        router.add("GET", path, federation_links, auth.vhost)
    restart = "federation-links/vhost/{vhost}/{id}/{node}/restart"
    router.add("GET", restart, no_link, auth.vhost)
    router.add("DELETE", restart, no_link, auth.vhost)
    for path in ("shovels", "shovels/{vhost}"):
        router.add("GET", path, shovels, auth.vhost)
    one = "shovels/vhost/{vhost}/{name}"
    router.add("GET", one, get_shovel, auth.vhost)
    router.add("DELETE", one, delete_shovel, auth.vhost)
    router.add("GET", one + "/restart", get_shovel, auth.vhost)
    router.add("DELETE", one + "/restart", restart_shovel, auth.vhost)
