"""Who may do what over HTTP: basic auth against the broker's users, then RabbitMQ's tag rules.

- any management tag (administrator, monitoring, policymaker, management) is needed at all;
- administrator: users, vhosts, permissions, definitions, and every vhost's objects;
- monitoring: sees every vhost, connection and channel;
- policymaker: policies in the vhosts it can log into;
- management: its own vhosts' objects and its own connections.

Refusals are 401 ``not_authorised`` as in RabbitMQ 3.x.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import TYPE_CHECKING

from warren.broker.engine.users import User
from warren.broker.ops.management.errors import login_failed, not_authorised

if TYPE_CHECKING:
    from warren.broker.ops.management.app import Ctx
    from warren.broker.ops.management.core import Management

ANONYMOUS = User("", "")  # the user of a public route's request, with no tags

MANAGEMENT_TAGS = frozenset(("administrator", "monitoring", "policymaker", "management"))

Check = Callable[["Ctx"], None]


def is_admin(user: User) -> bool:
    return "administrator" in user.tags


def is_monitor(user: User) -> bool:
    return "administrator" in user.tags or "monitoring" in user.tags


def is_policymaker(user: User) -> bool:
    return "administrator" in user.tags or "policymaker" in user.tags


def is_mgmt_user(user: User) -> bool:
    return not MANAGEMENT_TAGS.isdisjoint(user.tags)


def is_loopback(host: str | None) -> bool:
    host = host or ""
    return host.startswith("127.") or host in ("::1", "localhost") or host.startswith("::ffff:127.")


def authenticate(mgmt: Management, header: str | None, peer: str | None) -> User:
    """The user named by an ``Authorization: Basic`` header, or 401."""
    if not header or not header.lower().startswith("basic "):
        raise login_failed()
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise login_failed() from None
    name, sep, password = decoded.partition(":")
    if not sep:
        raise login_failed()
    user = mgmt.broker.access.authenticate(name, password)
    if user is None:
        raise login_failed()
    if name in mgmt.broker.settings.loopback_users and not is_loopback(peer):
        raise not_authorised("User can only log in via localhost")
    if not is_mgmt_user(user):
        raise not_authorised("Not management user")
    return user


def login_vhosts(mgmt: Management, user: User) -> list[str]:
    """Vhosts the user may open an AMQP connection to (has permissions in)."""
    access = mgmt.broker.access
    return [v for v in mgmt.broker.vhosts if access.can_access_vhost(user.name, v)]


def visible_vhosts(mgmt: Management, user: User) -> list[str]:
    """Monitors see every vhost, other users those they can log into."""
    return list(mgmt.broker.vhosts) if is_monitor(user) else login_vhosts(mgmt, user)


def listed_vhosts(mgmt: Management, user: User) -> list[str]:
    """RabbitMQ's filter_vhost for queue, exchange, binding and policy lists."""
    return list(mgmt.broker.vhosts) if is_admin(user) else login_vhosts(mgmt, user)


# ---- per-route checks ----


def public(ctx: Ctx) -> None:
    """No login at all: the dispatcher does not authenticate (the user is ANONYMOUS)."""


def any_user(ctx: Ctx) -> None:
    """Any user with a management tag (checked at login)."""


def admin(ctx: Ctx) -> None:
    if not is_admin(ctx.user):
        raise not_authorised("Not administrator user")


def monitor(ctx: Ctx) -> None:
    if not is_monitor(ctx.user):
        raise not_authorised("Not monitor user")


def _user_matches_vhost(ctx: Ctx, visible: bool) -> bool:
    name = ctx.params.get("vhost")
    if name is None or name not in ctx.mgmt.broker.vhosts:
        return True  # no vhost in the path, or a missing one (404 comes next)
    vhosts = visible_vhosts if visible else login_vhosts
    return name in vhosts(ctx.mgmt, ctx.user)


def vhost(ctx: Ctx) -> None:
    if not (is_admin(ctx.user) or _user_matches_vhost(ctx, visible=False)):
        raise not_authorised("User not authorised to access virtual host")


def vhost_visible(ctx: Ctx) -> None:
    if not (is_admin(ctx.user) or _user_matches_vhost(ctx, visible=True)):
        raise not_authorised("User not authorised to access virtual host")


def policies(ctx: Ctx) -> None:
    user = ctx.user
    if not (is_admin(user) or (is_policymaker(user) and _user_matches_vhost(ctx, visible=False))):
        raise not_authorised("User not authorised to access object")


def owner_or(ctx: Ctx, owner: str) -> None:
    """Connections and channels: monitors see any, admins close any, others only their own."""
    user = ctx.user
    allowed = is_admin(user) if ctx.method == "DELETE" else is_monitor(user)
    if not (allowed or user.name == owner):
        raise not_authorised("User not authorised to access object")
