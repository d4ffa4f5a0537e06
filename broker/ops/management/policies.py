"""/api/policies[/{vhost}[/{name}]]: listed by anyone with access to the vhost, set by
administrators and policymakers (RabbitMQ's rules)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from warren.broker.engine.policy import Policy, PolicyError
from warren.broker.ops.management import auth
from warren.broker.ops.management.app import Ctx, Resource, created, no_content, reply, reply_list
from warren.broker.ops.management.errors import bad_request, not_found

if TYPE_CHECKING:
    from warren.broker.ops.management.core import Management


def validation_failed(text: str) -> str:
    return f"Validation failed\n\n{text}\n"


def make_policy(vhost: str, name: str, body: dict[str, Any]) -> Policy:
    """A policy from its JSON (API body or definitions entry); 400 with RabbitMQ's wording."""
    pattern, definition = Ctx.require(body, "pattern", "definition")
    if not isinstance(pattern, str):
        raise bad_request(
            validation_failed(f"pattern should be a string, actually was {pattern!r}")
        )
    if definition in ({}, []):
        raise bad_request(validation_failed("no policy provided"))
    if not isinstance(definition, dict):
        raise bad_request(validation_failed(f"definition should be an object, got {definition!r}"))
    priority: Any = body.get("priority", 0)
    if priority is None:
        priority = 0
    if isinstance(priority, str) and priority.lstrip("-").isdigit():
        priority = int(priority)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise bad_request(
            validation_failed(f"priority should be a number, actually was {priority!r}")
        )
    apply_to = body.get("apply-to") or "all"
    try:
        return Policy(vhost, name, pattern, definition, apply_to, priority)
    except PolicyError as exc:
        raise bad_request(validation_failed(str(exc))) from None


def set_policy(mgmt: Management, vhost: str, name: str, body: dict[str, Any]) -> bool:
    """Set (or replace) a policy; True if it is new. Shared with definitions import."""
    target = mgmt.broker.vhosts.get(vhost)
    if target is None:
        raise not_found("vhost_not_found")
    definition = body.get("definition") if isinstance(body, dict) else None
    if isinstance(definition, dict) and (
        refused := mgmt.broker.deprecated.policy_error(definition)
    ):
        raise bad_request(validation_failed(refused))
    policy = make_policy(vhost, name, body)
    existed = name in target.policies
    target.set_policy(policy)
    return not existed


def policies(mgmt: Management, vhosts: list[str]) -> list[dict[str, Any]]:
    broker = mgmt.broker
    return [p.as_json() for v in vhosts for p in broker.vhosts[v].policies.values()]


def list_policies(ctx: Ctx) -> web.StreamResponse:
    only = ctx.vhost_or_none()
    vhosts = [v for v in auth.listed_vhosts(ctx.mgmt, ctx.user) if only is None or v == only]
    return reply_list(ctx, policies(ctx.mgmt, vhosts))


def _policy(ctx: Ctx) -> Policy:
    policy = ctx.vhost().policies.get(ctx.params["name"])
    if policy is None:
        raise not_found()
    return policy


def get_policy(ctx: Ctx) -> web.StreamResponse:
    return reply(ctx, _policy(ctx).as_json())


def put_policy(ctx: Ctx) -> web.StreamResponse:
    new = set_policy(ctx.mgmt, ctx.params["vhost"], ctx.params["name"], ctx.json())
    return created() if new else no_content()


def delete_policy(ctx: Ctx) -> web.StreamResponse:
    policy = _policy(ctx)
    ctx.vhost().clear_policy(policy.name)
    return no_content()


ROUTES = (
    Resource("policies", "policies/{vhost}", check=auth.vhost, GET=list_policies),
    Resource(
        "policies/{vhost}/{name}",
        check=auth.policies,
        GET=get_policy,
        PUT=put_policy,
        DELETE=delete_policy,
    ),
)
