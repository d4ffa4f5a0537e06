"""/api/users, /api/vhosts and /api/permissions: administrator-only, as in RabbitMQ."""

from __future__ import annotations

import base64
import binascii
import re
from typing import TYPE_CHECKING, Any

from aiohttp import web

from warren.broker.engine.deprecated import erlang_term
from warren.broker.engine.users import HASHING_ALGORITHM, hash_password
from warren.broker.ops.management import auth
from warren.broker.ops.management.app import Ctx, Resource, created, no_content, reply, reply_list
from warren.broker.ops.management.errors import bad_request, not_found
from warren.broker.ops.management.formats import parse_bool, with_details
from warren.broker.ops.management.user_limits import checked_limits

if TYPE_CHECKING:
    from warren.broker.engine.users import User
    from warren.broker.ops.management.core import Management


# ---- users ----


def user_json(user: User, limits: dict[str, int] | None = None) -> dict[str, Any]:
    return {
        "name": user.name,
        "password_hash": user.password_hash,
        "hashing_algorithm": HASHING_ALGORITHM,
        "tags": list(user.tags),
        "limits": dict(limits or {}),
    }


def parse_tags(value: Any) -> tuple[str, ...]:
    """Tags as a list or RabbitMQ's comma-separated string ("management, policymaker")."""
    if isinstance(value, list):
        tags = [str(t).strip() for t in value]
    elif isinstance(value, str):
        tags = [t.strip() for t in value.split(",")]
    else:
        raise bad_request(["invalid_tags", value])
    return tuple(t for t in tags if t)


def check_password_hash(value: Any, algorithm: Any) -> str:
    if algorithm not in (None, HASHING_ALGORITHM):
        # Warren verifies RabbitMQ's default scheme only (salted SHA-256)
        raise bad_request(["unsupported_hashing_algorithm", algorithm])
    if not isinstance(value, str):
        raise bad_request(["not_base64", value])
    if value == "":
        return value
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(["not_base64", value]) from None
    if len(raw) != 36:  # 4 octets of salt, 32 of SHA-256
        raise bad_request(["invalid_password_hash", value])
    return value


def put_user(mgmt: Management, name: str, body: dict[str, Any]) -> bool:
    """RabbitMQ's put_user: create or update; True if created. Shared with definitions import."""
    access = mgmt.broker.access
    if "tags" in body and body["tags"] is not None:
        tags = parse_tags(body["tags"])
    elif body.get("administrator") is not None:
        tags = ("administrator",) if parse_bool(body["administrator"]) else ()
    else:
        raise bad_request("tags_not_present")
    has_password = body.get("password") is not None
    has_hash = body.get("password_hash") is not None
    if has_password and has_hash:
        raise bad_request("both_password_and_password_hash_are_provided")
    if has_password:
        password = body["password"]
        if not isinstance(password, str):
            raise bad_request(["not_a_string", password])
        password_hash = hash_password(password) if password else ""
    elif has_hash:
        password_hash = check_password_hash(body["password_hash"], body.get("hashing_algorithm"))
    else:
        password_hash = ""  # RabbitMQ: no password at all clears it (no password login)
    limits = body.get("limits")  # rabbit_auth_backend_internal:put_user/3 sets them too
    if limits is not None:
        limits = checked_limits(limits)
    existed = name in access.users
    access.add_user(name, password_hash=password_hash, tags=tags)
    if limits is not None:
        access.set_user_limits(name, limits)
    return not existed


def list_users(ctx: Ctx) -> web.StreamResponse:
    users = ctx.mgmt.broker.access.users.values()
    limits = ctx.mgmt.broker.access.user_limits
    return reply_list(ctx, [user_json(u, limits.get(u.name)) for u in users], ("name",))


def list_users_without_permissions(ctx: Ctx) -> web.StreamResponse:
    access = ctx.mgmt.broker.access
    with_perms = {user for user, _ in access.permissions}
    users = [u for u in access.users.values() if u.name not in with_perms]
    rows = [user_json(u, access.user_limits.get(u.name)) for u in users]
    return reply_list(ctx, rows, ("name",))


def _user(ctx: Ctx) -> User:
    user = ctx.mgmt.broker.access.users.get(ctx.params["user"])
    if user is None:
        raise not_found()
    return user


def get_user(ctx: Ctx) -> web.StreamResponse:
    user = _user(ctx)
    return reply(ctx, user_json(user, ctx.mgmt.broker.access.user_limits.get(user.name)))


def put_user_route(ctx: Ctx) -> web.StreamResponse:
    return created() if put_user(ctx.mgmt, ctx.params["user"], ctx.json()) else no_content()


def delete_user(ctx: Ctx) -> web.StreamResponse:
    _user(ctx)
    ctx.mgmt.broker.access.delete_user(ctx.params["user"])
    return no_content()


def bulk_delete_users(ctx: Ctx) -> web.StreamResponse:
    (names,) = ctx.require(ctx.json(), "users")
    if not isinstance(names, list):
        raise bad_request(["not_a_list", names])
    for name in names:
        ctx.mgmt.broker.access.delete_user(str(name))
    return no_content()


def user_permissions(ctx: Ctx) -> web.StreamResponse:
    name = _user(ctx).name
    return reply_list(ctx, [p for p in permissions(ctx.mgmt) if p["user"] == name], ("vhost",))


# ---- permissions ----


def permissions(mgmt: Management) -> list[dict[str, Any]]:
    return [
        {
            "user": user,
            "vhost": vhost,
            "configure": p.configure,
            "write": p.write,
            "read": p.read,
        }
        for (user, vhost), p in mgmt.broker.access.permissions.items()
    ]


def set_permissions(mgmt: Management, user: Any, vhost: Any, body: dict[str, Any]) -> None:
    """Validated set_permissions; shared with definitions import."""
    configure, write, read = Ctx.require(body, "configure", "write", "read")
    for pattern in (configure, write, read):
        if not isinstance(pattern, str):
            raise bad_request(["invalid_regexp", pattern])
        try:
            re.compile(pattern)
        except re.error as exc:
            raise bad_request(["invalid_regexp", pattern, str(exc)]) from None
    if user not in mgmt.broker.access.users:
        raise bad_request(["no_such_user", user])
    if vhost not in mgmt.broker.vhosts:
        raise bad_request(["no_such_vhost", vhost])
    mgmt.broker.access.set_permissions(user, vhost, configure, write, read)


def list_permissions(ctx: Ctx) -> web.StreamResponse:
    return reply_list(ctx, permissions(ctx.mgmt), ("vhost", "user"))


def _permission(ctx: Ctx) -> dict[str, Any]:
    user, vhost = ctx.params["user"], ctx.params["vhost"]
    for p in permissions(ctx.mgmt):
        if p["user"] == user and p["vhost"] == vhost:
            return p
    raise not_found()


def get_permission(ctx: Ctx) -> web.StreamResponse:
    return reply(ctx, _permission(ctx))


def put_permission(ctx: Ctx) -> web.StreamResponse:
    user, vhost = ctx.params["user"], ctx.params["vhost"]
    mgmt = ctx.mgmt
    if user not in mgmt.broker.access.users or vhost not in mgmt.broker.vhosts:
        raise bad_request("vhost_or_user_not_found")
    existed = mgmt.broker.access.can_access_vhost(user, vhost)
    set_permissions(mgmt, user, vhost, ctx.json())
    return no_content() if existed else created()


def delete_permission(ctx: Ctx) -> web.StreamResponse:
    _permission(ctx)
    ctx.mgmt.broker.access.clear_permissions(ctx.params["user"], ctx.params["vhost"])
    return no_content()


def vhost_permissions(ctx: Ctx) -> web.StreamResponse:
    vhost = ctx.vhost().name
    return reply_list(ctx, [p for p in permissions(ctx.mgmt) if p["vhost"] == vhost], ("user",))


# ---- vhosts ----


def vhost_json(mgmt: Management, name: str) -> dict[str, Any]:
    meta = mgmt.meta(name)
    vhost = mgmt.broker.vhosts[name]
    ready = sum(q.ready_count for q in vhost.queues.values())
    unacked = sum(q.unacked_count for q in vhost.queues.values())
    rates = mgmt.rates.rates(("vhost", name))
    out: dict[str, Any] = {
        "name": name,
        "description": meta.description,
        "tags": list(meta.tags),
        # every 4.3 vhost has one (rabbit_vhost:do_add/3 writes the node default when none
        # is given; rabbit_queue_type:vhosts_with_dqt/1 puts it in the metadata too)
        "default_queue_type": vhost.default_queue_type,
        "metadata": {
            "description": meta.description,
            "tags": list(meta.tags),
            "default_queue_type": vhost.default_queue_type,
        },
        "tracing": meta.tracing,
        "cluster_state": {mgmt.node: "running"},
    }
    with_details(out, "messages", ready + unacked, rates)
    with_details(out, "messages_ready", ready, rates)
    with_details(out, "messages_unacknowledged", unacked, rates)
    return out


def put_vhost(
    mgmt: Management, name: str, body: dict[str, Any], creator: str | None = None
) -> bool:
    """Create a vhost (or update its metadata); True if created. Shared with import.

    The user who creates it gets full permissions on it, as RabbitMQ 3.10.8 grants them
    over the API and definitions import (checked side by side), so it can use it at once.
    """
    metadata = body.get("metadata")
    meta_in: dict[str, Any] = metadata if isinstance(metadata, dict) else {}
    description = body.get("description", meta_in.get("description", ""))
    tags = body.get("tags", meta_in.get("tags", []))
    # "defaultqueuetype": 3.11's name, still read by rabbit_mgmt_wm_vhost:accept_content/2
    queue_type = body.get(
        "default_queue_type", body.get("defaultqueuetype", meta_in.get("default_queue_type"))
    )
    if not isinstance(description, str):
        raise bad_request(["not_a_string", description])
    error = default_queue_type_error(queue_type)
    if error is not None:
        raise bad_request(error)
    existed = name in mgmt.broker.vhosts
    vhost = mgmt.broker.add_vhost(name)
    meta = mgmt.meta(name)
    meta.description = description
    meta.tags = list(parse_tags(tags or []))
    if queue_type not in (None, "undefined"):  # else kept (rabbit_db_vhost:merge_metadata/2)
        vhost.set_default_queue_type(queue_type)
    meta.tracing = parse_bool(body.get("tracing"))
    if not existed and creator is not None and creator in mgmt.broker.access.users:
        mgmt.broker.access.set_permissions(creator, name, ".*", ".*", ".*")
    return not existed


def default_queue_type_error(value: Any) -> str | None:
    """rabbit_queue_type:validate_default_queue_type/1's refusal, or None."""
    if value is None or value in ("undefined", "classic", "quorum", "stream"):
        return None
    if value == "":
        return "default_queue_type must not be an empty string"
    if isinstance(value, str):
        return f"{value} is not a valid queue type"
    if isinstance(value, bool):  # an atom: discover/1 fails on it
        return f"{erlang_term(value)} is not a valid queue type"
    return f"{erlang_term(value)} is not a valid default_queue_type value"


def list_vhosts(ctx: Ctx) -> web.StreamResponse:
    names = auth.visible_vhosts(ctx.mgmt, ctx.user)
    return reply_list(ctx, [vhost_json(ctx.mgmt, n) for n in names], ("name",))


def get_vhost(ctx: Ctx) -> web.StreamResponse:
    return reply(ctx, vhost_json(ctx.mgmt, ctx.vhost().name))


def put_vhost_route(ctx: Ctx) -> web.StreamResponse:
    new = put_vhost(ctx.mgmt, ctx.params["vhost"], ctx.json(), ctx.user.name)
    return created() if new else no_content()


def delete_vhost(ctx: Ctx) -> web.StreamResponse:
    name = ctx.vhost().name
    ctx.mgmt.broker.delete_vhost(name)
    ctx.mgmt.vhost_meta.pop(name, None)
    return no_content()


ROUTES = (
    Resource("users", check=auth.admin, GET=list_users),
    Resource("users/without-permissions", check=auth.admin, GET=list_users_without_permissions),
    Resource("users/bulk-delete", check=auth.admin, POST=bulk_delete_users),
    Resource(
        "users/{user}", check=auth.admin, GET=get_user, PUT=put_user_route, DELETE=delete_user
    ),
    Resource("users/{user}/permissions", check=auth.admin, GET=user_permissions),
    Resource("permissions", check=auth.admin, GET=list_permissions),
    Resource(
        "permissions/{vhost}/{user}",
        check=auth.admin,
        GET=get_permission,
        PUT=put_permission,
        DELETE=delete_permission,
    ),
    Resource("vhosts", check=auth.any_user, GET=list_vhosts),
    Resource(
        "vhosts/{vhost}", check=auth.admin, GET=get_vhost, PUT=put_vhost_route, DELETE=delete_vhost
    ),
    Resource("vhosts/{vhost}/permissions", check=auth.admin, GET=vhost_permissions),
)
