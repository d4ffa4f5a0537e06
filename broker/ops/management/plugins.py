"""Routes of RabbitMQ's plugins' management extensions that Warren answers.

- ``/api/extensions``: the console extensions of enabled plugins; Warren's console has none.
- ``/api/federation-links[/{vhost}]``: Warren runs no federation, so no links (an upstream
  stored as a ``federation-upstream`` parameter is kept, never started).
- ``/api/shovels[/{vhost}]``: what the ``shovel`` parameter component reports if one is
  registered (its ``statuses()``: RabbitMQ's shovel status objects, each with ``vhost``),
  else none.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from warren.broker.ops.management import auth
from warren.broker.ops.management.app import Ctx, Router, reply, reply_list


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


def routes(router: Router) -> None:
    router.add("GET", "extensions", extensions, auth.any_user)
    for path in ("federation-links", "federation-links/{vhost}"):
        router.add("GET", path, federation_links, auth.vhost)
    for path in ("shovels", "shovels/{vhost}"):
        router.add("GET", path, shovels, auth.vhost)
