"""/api/topic-permissions[/{vhost}/{user}], /api/users/{user}/topic-permissions and
/api/vhosts/{vhost}/topic-permissions: administrators only.

RabbitMQ 4.3 (rabbit_mgmt_wm_topic_permission[s][_user|_vhost]): items are
``{user, vhost, exchange, write, read}``; GET of a (vhost, user) pair is a list, 404 when it
has none; PUT takes ``exchange``, ``write`` and ``read`` and answers 201 when the pair had
none, 204 after; DELETE clears every exchange of the pair, or with ``/{exchange}`` that one
(204 while the pair has any, as the resource exists). Refusals, in RabbitMQ's order
(rabbit_auth_backend_internal:set_topic_permissions/6): unknown user or vhost 400
``vhost_or_user_not_found``, a missing key, an invalid regex, a missing exchange.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from warren.broker.engine.topic_permissions import TopicPermission, validate_pattern
from warren.broker.ops.management import auth
from warren.broker.ops.management.app import Ctx, Resource, created, no_content, reply, reply_list
from warren.broker.ops.management.errors import bad_request, not_found

if TYPE_CHECKING:
    from warren.broker.ops.management.core import Management


def topic_permissions(
    mgmt: Management, user: str | None = None, vhost: str | None = None
) -> list[dict[str, Any]]:
    return [
        {"user": u, "vhost": v, "exchange": p.exchange, "write": p.write, "read": p.read}
        for (u, v), per_exchange in mgmt.broker.access.topic_permissions.items()
        if (user is None or u == user) and (vhost is None or v == vhost)
        for p in per_exchange.values()
    ]


def set_topic_permission(mgmt: Management, user: Any, vhost: Any, body: dict[str, Any]) -> None:
    """Validated set (API and definitions import); 400 with RabbitMQ's reasons."""
    exchange, write, read = Ctx.require(body, "exchange", "write", "read")
    for pattern in (write, read):
        if not isinstance(pattern, str):
            raise bad_request(["invalid_regexp", pattern])
        error = validate_pattern(pattern)
        if error is not None:
            raise bad_request(["invalid_regexp", pattern, error])
    access = mgmt.broker.access
    if user not in access.users:
        raise bad_request(["no_such_user", user])
    target = mgmt.broker.vhosts.get(vhost) if isinstance(vhost, str) else None
    if target is None:
        raise bad_request(["no_such_vhost", vhost])
    if not isinstance(exchange, str) or exchange not in target.exchanges:
        # 4.3 checks the exchange (set_topic_permissions/6, rabbitmq-server#16587)
        raise bad_request(["no_such_exchange", exchange])
    access.set_topic_permission(user, vhost, TopicPermission(exchange, write, read))


def list_all(ctx: Ctx) -> web.StreamResponse:
    return reply_list(ctx, topic_permissions(ctx.mgmt), ("vhost", "user"))


def list_for_user(ctx: Ctx) -> web.StreamResponse:
    user = ctx.params["user"]
    if user not in ctx.mgmt.broker.access.users:
        raise not_found()
    return reply_list(ctx, topic_permissions(ctx.mgmt, user=user), ("vhost", "user"))


def list_for_vhost(ctx: Ctx) -> web.StreamResponse:
    vhost = ctx.vhost().name
    rows = [
        {"vhost": r["vhost"], "user": r["user"], **r}
        for r in topic_permissions(ctx.mgmt, vhost=vhost)
    ]
    return reply_list(ctx, rows, ("vhost", "user"))


def _pair(ctx: Ctx) -> tuple[str, str] | None:
    user, vhost = ctx.params["user"], ctx.params["vhost"]
    if user not in ctx.mgmt.broker.access.users or vhost not in ctx.mgmt.broker.vhosts:
        return None
    return user, vhost


def get_pair(ctx: Ctx) -> web.StreamResponse:
    pair = _pair(ctx)
    rows = topic_permissions(ctx.mgmt, *pair) if pair is not None else []
    if not rows:
        raise not_found()
    return reply(ctx, rows)


def put_pair(ctx: Ctx) -> web.StreamResponse:
    pair = _pair(ctx)
    if pair is None:
        raise bad_request("vhost_or_user_not_found")
    existed = pair in ctx.mgmt.broker.access.topic_permissions
    set_topic_permission(ctx.mgmt, pair[0], pair[1], ctx.json())
    return no_content() if existed else created()


def delete_pair(ctx: Ctx) -> web.StreamResponse:
    pair = _pair(ctx)
    if pair is None or not ctx.mgmt.broker.access.clear_topic_permissions(*pair):
        raise not_found()
    return no_content()


def delete_exchange(ctx: Ctx) -> web.StreamResponse:
    pair = _pair(ctx)
    if pair is None or pair not in ctx.mgmt.broker.access.topic_permissions:
        raise not_found()
    ctx.mgmt.broker.access.clear_topic_permissions(*pair, ctx.params["exchange"])
    return no_content()


ROUTES = (
    Resource("topic-permissions", check=auth.admin, GET=list_all),
    Resource("users/{user}/topic-permissions", check=auth.admin, GET=list_for_user),
    Resource("vhosts/{vhost}/topic-permissions", check=auth.admin, GET=list_for_vhost),
    Resource(
        "topic-permissions/{vhost}/{user}",
        check=auth.admin,
        GET=get_pair,
        PUT=put_pair,
        DELETE=delete_pair,
    ),
    # one exchange's: GET shows the pair's (RabbitMQ's resource reads no exchange), DELETE
    # clears that exchange's only (clear_topic_permissions/4)
    Resource(
        "topic-permissions/{vhost}/{user}/{exchange}",
        check=auth.admin,
        GET=get_pair,
        DELETE=delete_exchange,
    ),
)
