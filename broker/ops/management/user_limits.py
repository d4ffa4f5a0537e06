"""/api/user-limits[/{user}[/{name}]]: a user's max-connections and max-channels.

RabbitMQ 4.3 (rabbit_mgmt_wm_user_limits, rabbit_mgmt_wm_user_limit): the list of every user
is for administrators, one user's for administrators, monitors and the user itself; items are
``{"user", "value"}``; PUT and DELETE are for administrators and answer 204. Values are
validated as rabbit_auth_backend_internal:validate_user_limits/1 does; they are enforced at
connection.open and channel.open (broker/server/amqp_connection.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from warren.broker.engine.limits import validate_limits
from warren.broker.engine.parameters import ParameterError
from warren.broker.ops.management import auth
from warren.broker.ops.management.app import Ctx, Resource, no_content, reply_list
from warren.broker.ops.management.errors import bad_request, not_authorised, not_found

if TYPE_CHECKING:
    from warren.broker.ops.management.core import Management

USER_LIMITS = ("max-connections", "max-channels")


def checked_limits(value: Any) -> dict[str, int]:
    """A limits object as put_user and set_user_limits accept it; 400 with RabbitMQ's text."""
    try:
        validate_limits(value, USER_LIMITS, "user-limits")
    except ParameterError as exc:
        raise bad_request(str(exc)) from None
    return dict(value)


def limits_of(mgmt: Management, user: str) -> dict[str, int]:
    return dict(mgmt.broker.access.user_limits.get(user, {}))


def _own_or_monitor(ctx: Ctx) -> None:
    if not (auth.is_monitor(ctx.user) or ctx.user.name == ctx.params["user"]):
        raise not_authorised("User not authorised to access object")


def list_all(ctx: Ctx) -> web.StreamResponse:
    limits = ctx.mgmt.broker.access.user_limits
    rows = [{"user": user, "value": dict(value)} for user, value in limits.items() if value]
    return reply_list(ctx, rows, ("user",))


def list_user(ctx: Ctx) -> web.StreamResponse:
    user = ctx.params["user"]
    if user not in ctx.mgmt.broker.access.users:
        raise not_found()
    value = limits_of(ctx.mgmt, user)
    return reply_list(ctx, [{"user": user, "value": value}] if value else [], ("user",))


def put_limit(ctx: Ctx) -> web.StreamResponse:
    user, name = ctx.params["user"], ctx.params["name"]
    (value,) = Ctx.require(ctx.json(), "value")
    new = checked_limits({name: value})
    access = ctx.mgmt.broker.access
    if user not in access.users:
        raise bad_request(["no_such_user", user])
    access.set_user_limits(user, {**limits_of(ctx.mgmt, user), **new})
    return no_content()


def delete_limit(ctx: Ctx) -> web.StreamResponse:
    user, name = ctx.params["user"], ctx.params["name"]
    access = ctx.mgmt.broker.access
    if user not in access.users:
        raise not_found("vhost_not_found")  # sic: rabbit_mgmt_wm_user_limit:delete_resource/2
    limits = limits_of(ctx.mgmt, user)
    if name == "all":  # rabbit_auth_backend_internal:clear_user_limits/3
        limits = {}
    limits.pop(name, None)
    access.set_user_limits(user, limits)
    return no_content()


ROUTES = (
    Resource("user-limits", check=auth.admin, GET=list_all),
    Resource("user-limits/{user}", check=_own_or_monitor, GET=list_user),
    Resource("user-limits/{user}/{name}", check=auth.admin, PUT=put_limit, DELETE=delete_limit),
)
