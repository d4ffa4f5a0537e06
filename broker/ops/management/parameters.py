"""/api/parameters[/{component}[/{vhost}[/{name}]]]: runtime parameters (engine/parameters.py).

RabbitMQ's rules (rabbit_mgmt_wm_parameters, rabbit_mgmt_wm_parameter): administrators
and policymakers only; lists show the vhosts the user may list; PUT takes ``{"value": ...}``
and answers 201 when new, 204 when replaced; a value the component refuses is a 400
"Validation failed" with the component's message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from warren.broker.engine.parameters import Key, ParameterError
from warren.broker.ops.management import auth
from warren.broker.ops.management.app import Ctx, Resource, created, no_content, reply, reply_list
from warren.broker.ops.management.errors import bad_request, not_found
from warren.broker.ops.management.policies import validation_failed

if TYPE_CHECKING:
    from warren.broker.ops.management.core import Management


def parameter_json(mgmt: Management, key: Key) -> dict[str, Any]:
    vhost, component, name = key
    return {
        "value": mgmt.broker.parameters.get(vhost, component, name),
        "vhost": vhost,
        "component": component,
        "name": name,
    }


def set_parameter(mgmt: Management, vhost: str, component: str, name: str, value: Any) -> bool:
    """Set a parameter (API and definitions import); True if new. 400 if refused."""
    if vhost not in mgmt.broker.vhosts:
        raise not_found("vhost_not_found")
    try:
        return mgmt.broker.parameters.set(vhost, component, name, value)
    except ParameterError as exc:
        raise bad_request(validation_failed(str(exc))) from None


def parameters(mgmt: Management, vhosts: list[str], component: str | None = None) -> list[Key]:
    allowed = set(vhosts)
    return [k for k in mgmt.broker.parameters.list(component) if k[0] in allowed]


def list_parameters(ctx: Ctx) -> web.StreamResponse:
    only = ctx.vhost_or_none()
    vhosts = [v for v in auth.listed_vhosts(ctx.mgmt, ctx.user) if only is None or v == only]
    keys = parameters(ctx.mgmt, vhosts, ctx.params.get("component"))
    return reply_list(ctx, [parameter_json(ctx.mgmt, k) for k in keys])


def _key(ctx: Ctx) -> Key:
    key = (ctx.vhost().name, ctx.params["component"], ctx.params["name"])
    if ctx.mgmt.broker.parameters.get(*key) is None:
        raise not_found()
    return key


def get_parameter(ctx: Ctx) -> web.StreamResponse:
    return reply(ctx, parameter_json(ctx.mgmt, _key(ctx)))


def put_parameter(ctx: Ctx) -> web.StreamResponse:
    body = ctx.json()
    (value,) = Ctx.require(body, "value")
    params = ctx.params
    new = set_parameter(ctx.mgmt, params["vhost"], params["component"], params["name"], value)
    return created() if new else no_content()


def delete_parameter(ctx: Ctx) -> web.StreamResponse:
    ctx.mgmt.broker.parameters.clear(*_key(ctx))
    return no_content()


ROUTES = (
    Resource(
        "parameters",
        "parameters/{component}",
        "parameters/{component}/{vhost}",
        check=auth.policies,
        GET=list_parameters,
    ),
    Resource(
        "parameters/{component}/{vhost}/{name}",
        check=auth.policies,
        GET=get_parameter,
        PUT=put_parameter,
        DELETE=delete_parameter,
    ),
)
