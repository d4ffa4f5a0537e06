"""/api/global-parameters[/{name}] and PUT /api/cluster-name (a global parameter).

Shapes and codes as RabbitMQ 3.10.8 answers side by side (rabbit_mgmt_wm_global_parameter,
rabbit_mgmt_wm_cluster_name): items are ``{"name", "value"}``, PUT answers 201 when new and
204 when replaced, ``value`` (``name`` for the cluster name) is required.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from warren.broker.ops.management import auth
from warren.broker.ops.management.app import Ctx, Resource, created, no_content, reply, reply_list
from warren.broker.ops.management.errors import bad_request, not_found

if TYPE_CHECKING:
    from warren.broker.ops.management.core import Management


def cluster_name(mgmt: Management) -> str:
    name = mgmt.broker.global_parameters.values.get("cluster_name")
    return name if isinstance(name, str) else mgmt.node


def global_parameters(mgmt: Management) -> list[dict[str, Any]]:
    values = mgmt.broker.global_parameters.values
    return [{"name": name, "value": values[name]} for name in sorted(values)]


def _get(ctx: Ctx) -> dict[str, Any]:
    name = ctx.params["name"]
    values = ctx.mgmt.broker.global_parameters.values
    if name not in values:
        raise not_found()
    return {"value": values[name], "name": name}


def set_global(mgmt: Management, name: str, value: Any) -> bool:
    """Set a global parameter (API and definitions import); True if new."""
    if name == "cluster_name" and not isinstance(value, str):
        raise bad_request("cluster_name must be a string")
    return mgmt.broker.global_parameters.set(name, value)


def list_globals(ctx: Ctx) -> web.StreamResponse:
    return reply_list(ctx, global_parameters(ctx.mgmt), sort=("name",))


def get_global(ctx: Ctx) -> web.StreamResponse:
    return reply(ctx, _get(ctx))


def put_global(ctx: Ctx) -> web.StreamResponse:
    (value,) = Ctx.require(ctx.json(), "value")
    return created() if set_global(ctx.mgmt, ctx.params["name"], value) else no_content()


def delete_global(ctx: Ctx) -> web.StreamResponse:
    _get(ctx)
    ctx.mgmt.broker.global_parameters.clear(ctx.params["name"])
    return no_content()


def get_cluster_name(ctx: Ctx) -> web.StreamResponse:
    return reply(ctx, {"name": cluster_name(ctx.mgmt)})


def put_cluster_name(ctx: Ctx) -> web.StreamResponse:
    (name,) = Ctx.require(ctx.json(), "name")
    set_global(ctx.mgmt, "cluster_name", name)
    return no_content()


ROUTES = (
    Resource("global-parameters", check=auth.admin, GET=list_globals),
    Resource(
        "global-parameters/{name}",
        check=auth.admin,
        GET=get_global,
        PUT=put_global,
        DELETE=delete_global,
    ),
    Resource("cluster-name", check=auth.any_user, GET=get_cluster_name),
    Resource("cluster-name", check=auth.admin, PUT=put_cluster_name),
)
