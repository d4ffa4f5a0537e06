"""Routes of RabbitMQ's plugins' management extensions that Warren answers.

- ``/api/extensions``: the console extensions of enabled plugins; Warren's console has none.
- ``/api/federation-links[/{vhost}]``: Warren runs no federation, so no links (an upstream
  stored as a ``federation-upstream`` parameter is kept, never started).
- ``/api/federation-links[/{vhost}]/state/down``: the links that are down, none either;
  ``/api/federation-links/vhost/{vhost}/{id}/{node}/restart`` names no link (404).
- ``/api/shovels[/{vhost}]``: what the ``shovel`` parameter component reports if one is
  registered (its ``statuses()``: RabbitMQ's shovel status objects, each with ``vhost``),
  else none.
- ``/api/shovels/vhost/{vhost}/{name}``: GET the shovel's parameter with its URIs' credentials
  removed, DELETE it (the parameter goes, so the shovel stops); ``.../restart`` (DELETE)
  restarts it (rabbit_shovel_mgmt_shovel: 404 for a shovel with no status).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from warren.broker.ops.management import auth
from warren.broker.ops.management.app import Ctx, Resource, no_content, reply, reply_list
from warren.broker.ops.management.errors import not_found
from warren.broker.ops.management.parameters import parameter_json
from warren.broker.ops.shovel.definition import UriError, parse_uri


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


def _shovel_status(ctx: Ctx) -> tuple[Any, dict[str, Any] | None]:
    """The shovel component and this shovel's status row, if it has one."""
    vhost = ctx.vhost().name  # a missing vhost is a 404
    component: Any = ctx.mgmt.broker.parameters.components.get("shovel")
    statuses = getattr(component, "statuses", None)
    rows: list[dict[str, Any]] = list(statuses()) if callable(statuses) else []
    name = ctx.params["name"]
    row = next((r for r in rows if r.get("vhost") == vhost and r.get("name") == name), None)
    return component, row


def _redacted(uris: Any) -> Any:
    """rabbit_shovel_parameters:redact_uris_in_definition/1: no credentials in the answer."""
    if isinstance(uris, list):
        return [_redacted(u) for u in uris]
    try:
        return parse_uri(uris).redacted if isinstance(uris, str) else uris
    except UriError:
        return uris


def get_shovel(ctx: Ctx) -> web.StreamResponse:
    _, row = _shovel_status(ctx)
    key = (ctx.params["vhost"], "shovel", ctx.params["name"])
    value = ctx.mgmt.broker.parameters.get(*key)
    if row is None or not isinstance(value, dict):
        raise not_found()
    body = parameter_json(ctx.mgmt, key)
    body["value"] = {
        k: _redacted(v) if k in ("src-uri", "dest-uri") else v for k, v in value.items()
    }
    return reply(ctx, body)


def delete_shovel(ctx: Ctx) -> web.StreamResponse:
    """Deleting a shovel clears its parameter, whether it runs or not (try_delete/4)."""
    vhost = ctx.vhost().name
    ctx.mgmt.broker.parameters.clear(vhost, "shovel", ctx.params["name"])
    return no_content()


def restart_shovel(ctx: Ctx) -> web.StreamResponse:
    component, row = _shovel_status(ctx)
    if row is None or not component.restart(row["vhost"], row["name"]):
        raise not_found()
    return no_content()


ROUTES = (
    Resource("extensions", check=auth.any_user, GET=extensions),
    Resource(
        "federation-links",
        "federation-links/{vhost}",
        "federation-links/state/down",
        "federation-links/{vhost}/state/down",
        check=auth.vhost,
        GET=federation_links,
    ),
    Resource("shovels", "shovels/{vhost}", check=auth.vhost, GET=shovels),
    Resource(
        "federation-links/vhost/{vhost}/{id}/{node}/restart",
        check=auth.vhost,
        GET=no_link,
        DELETE=no_link,
    ),
    Resource("shovels/vhost/{vhost}/{name}", check=auth.monitor, GET=get_shovel),
    Resource("shovels/vhost/{vhost}/{name}", check=auth.policies, DELETE=delete_shovel),
    Resource("shovels/vhost/{vhost}/{name}/restart", check=auth.policies, DELETE=restart_shovel),
)
