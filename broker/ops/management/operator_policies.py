"""/api/operator-policies[/{vhost}[/{name}]]: listed as policies are (anyone with access to
the vhost), read, set and deleted by administrators (rabbit_mgmt_wm_operator_policies,
rabbit_mgmt_wm_operator_policy, RabbitMQ 4.3).

An operator policy is the runtime parameter ``operator_policy``/<name> (broker/engine/
operator_policy.py): PUT takes ``pattern``, ``definition``, optional ``priority`` (0) and
``apply-to`` (``all``), answers 201 when new and 204 when replaced; a refused value is a
400 "Validation failed" with RabbitMQ's text, and nothing changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from warren.broker.engine.operator_policy import COMPONENT
from warren.broker.ops.management import auth
from warren.broker.ops.management.app import Ctx, Resource, created, no_content, reply, reply_list
from warren.broker.ops.management.errors import bad_request, not_found
from warren.broker.ops.management.parameters import set_parameter

if TYPE_CHECKING:
    from warren.broker.ops.management.core import Management


def operator_policy_json(vhost: str, name: str, value: dict[str, Any]) -> dict[str, Any]:
    return {
        "vhost": vhost,
        "name": name,
        "pattern": value.get("pattern"),
        "apply-to": value.get("apply-to"),
        "definition": value.get("definition"),
        "priority": value.get("priority"),
    }


def operator_policies(mgmt: Management, vhosts: list[str]) -> list[dict[str, Any]]:
    params = mgmt.broker.parameters
    allowed = set(vhosts)
    return [
        operator_policy_json(vhost, name, params.values[(vhost, component, name)])
        for vhost, component, name in params.list(COMPONENT)
        if vhost in allowed
    ]


def set_operator_policy(mgmt: Management, vhost: str, name: str, body: dict[str, Any]) -> bool:
    """rabbit_policy:set_op/7 from a request body (or a definitions entry); True if new."""
    if vhost not in mgmt.broker.vhosts:
        raise not_found("vhost_not_found")
    pattern, definition = Ctx.require(body, "pattern", "definition")
    priority = body.get("priority")
    apply_to = body.get("apply-to")
    if isinstance(priority, str):  # rabbit_mgmt_wm_policy accepts "2" as 2
        try:
            priority = int(priority)
        except ValueError:
            raise bad_request(f"{priority!r} priority must be a number") from None
    value = {
        "pattern": pattern,
        "definition": definition,
        "priority": 0 if priority is None else priority,
        "apply-to": "all" if apply_to is None else apply_to,
    }
    return set_parameter(mgmt, vhost, COMPONENT, name, value)


def list_operator_policies(ctx: Ctx) -> web.StreamResponse:
    only = ctx.vhost_or_none()
    vhosts = [v for v in auth.listed_vhosts(ctx.mgmt, ctx.user) if only is None or v == only]
    return reply_list(ctx, operator_policies(ctx.mgmt, vhosts), ("priority",))


def _value(ctx: Ctx) -> dict[str, Any]:
    value = ctx.mgmt.broker.parameters.get(ctx.vhost().name, COMPONENT, ctx.params["name"])
    if not isinstance(value, dict):
        raise not_found()
    return value


def get_operator_policy(ctx: Ctx) -> web.StreamResponse:
    return reply(ctx, operator_policy_json(ctx.params["vhost"], ctx.params["name"], _value(ctx)))


def put_operator_policy(ctx: Ctx) -> web.StreamResponse:
    vhost, name = ctx.params["vhost"], ctx.params["name"]
    new = set_operator_policy(ctx.mgmt, vhost, name, ctx.json())
    return created() if new else no_content()


def delete_operator_policy(ctx: Ctx) -> web.StreamResponse:
    _value(ctx)
    ctx.mgmt.broker.parameters.clear(ctx.params["vhost"], COMPONENT, ctx.params["name"])
    return no_content()


ROUTES = (
    Resource(
        "operator-policies",
        "operator-policies/{vhost}",
        check=auth.vhost,
        GET=list_operator_policies,
    ),
    Resource(
        "operator-policies/{vhost}/{name}",
        check=auth.admin,
        GET=get_operator_policy,
        PUT=put_operator_policy,
        DELETE=delete_operator_policy,
    ),
)
