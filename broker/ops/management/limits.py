"""/api/vhost-limits[/{vhost}[/{name}]]: a vhost's max-connections and max-queues.

RabbitMQ stores them as the runtime parameter ``vhost-limits``/``limits`` (rabbit_vhost_limit),
so they are listed under /api/parameters too and travel in definitions as a parameter.
Shapes and codes as RabbitMQ 3.10.8 answers side by side (rabbit_mgmt_wm_limits,
rabbit_mgmt_wm_limit): PUT and DELETE answer 204, a list item is ``{"vhost", "value"}``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from warren.broker.ops.management import auth
from warren.broker.ops.management.app import Ctx, Resource, no_content, reply_list
from warren.broker.ops.management.parameters import set_parameter

if TYPE_CHECKING:
    from warren.broker.ops.management.core import Management

COMPONENT = "vhost-limits"
NAME = "limits"


def limits_of(mgmt: Management, vhost: str) -> dict[str, Any]:
    value = mgmt.broker.parameters.get(vhost, COMPONENT, NAME)
    return dict(value) if isinstance(value, dict) else {}


def list_limits(ctx: Ctx) -> web.StreamResponse:
    only = ctx.vhost_or_none()
    vhosts = [v for v in auth.visible_vhosts(ctx.mgmt, ctx.user) if only is None or v == only]
    rows = [{"vhost": v, "value": limits_of(ctx.mgmt, v)} for v in vhosts]
    return reply_list(ctx, [r for r in rows if r["value"]], sort=("vhost",))


def put_limit(ctx: Ctx) -> web.StreamResponse:
    vhost = ctx.vhost().name
    (value,) = Ctx.require(ctx.json(), "value")
    limits = {**limits_of(ctx.mgmt, vhost), ctx.params["name"]: value}
    set_parameter(ctx.mgmt, vhost, COMPONENT, NAME, limits)
    return no_content()


def delete_limit(ctx: Ctx) -> web.StreamResponse:
    vhost = ctx.vhost().name
    limits = limits_of(ctx.mgmt, vhost)
    if limits.pop(ctx.params["name"], None) is not None:
        if limits:
            set_parameter(ctx.mgmt, vhost, COMPONENT, NAME, limits)
        else:
            ctx.mgmt.broker.parameters.clear(vhost, COMPONENT, NAME)
    return no_content()


ROUTES = (
    Resource("vhost-limits", "vhost-limits/{vhost}", check=auth.vhost_visible, GET=list_limits),
    Resource("vhost-limits/{vhost}/{name}", check=auth.admin, PUT=put_limit, DELETE=delete_limit),
)
