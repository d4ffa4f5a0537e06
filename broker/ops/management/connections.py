"""/api/connections, /api/channels, /api/consumers and their per-vhost forms.

Monitors and administrators see everyone's; other users only their own.
``DELETE /api/connections/{name}`` closes a connection with 320
CONNECTION_FORCED and the ``X-Reason`` header as its text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from warren.broker.ops.management import auth
from warren.broker.ops.management.app import Ctx, Resource, no_content, reply, reply_list
from warren.broker.ops.management.errors import not_found
from warren.broker.ops.management.formats import (
    channel_json,
    channel_name,
    connection_json,
    connection_name,
    consumer_json,
)

if TYPE_CHECKING:
    from warren.broker.engine.channel import Channel
    from warren.broker.server.amqp_connection import Connection

CLOSE_REASON = "Closed via management plugin"


def _visible(ctx: Ctx, owner: str) -> bool:
    return auth.is_monitor(ctx.user) or owner == ctx.user.name


def _connections(ctx: Ctx) -> list[Connection]:
    only = ctx.vhost_or_none()
    return [
        c
        for c in ctx.mgmt.connections()
        if _visible(ctx, c.user) and (only is None or c.vhost.name == only)
    ]


def _channels(ctx: Ctx) -> list[Channel]:
    return [ch for c in _connections(ctx) for ch in c.channels.values() if not ch.closed]


def list_connections(ctx: Ctx) -> web.StreamResponse:
    return reply_list(ctx, [connection_json(ctx.mgmt, c) for c in _connections(ctx)])


def _connection(ctx: Ctx) -> Connection:
    name = ctx.params["connection"]
    for conn in ctx.mgmt.connections():
        if connection_name(conn) == name:
            auth.owner_or(ctx, conn.user)
            return conn
    raise not_found()


def get_connection(ctx: Ctx) -> web.StreamResponse:
    return reply(ctx, connection_json(ctx.mgmt, _connection(ctx)))


def close_connection(ctx: Ctx) -> web.StreamResponse:
    conn = _connection(ctx)
    conn.force_close(ctx.request.headers.get("X-Reason", CLOSE_REASON))
    return no_content()


def connection_channels(ctx: Ctx) -> web.StreamResponse:
    conn = _connection(ctx)
    channels = [ch for ch in conn.channels.values() if not ch.closed]
    return reply_list(ctx, [channel_json(ctx.mgmt, ch) for ch in channels])


def user_connections(ctx: Ctx) -> web.StreamResponse:
    name = ctx.params["username"]
    conns = [c for c in _connections(ctx) if c.user == name]
    return reply_list(ctx, [connection_json(ctx.mgmt, c) for c in conns])


def close_user_connections(ctx: Ctx) -> web.StreamResponse:
    """rabbit_mgmt_wm_connection_user_name:delete_resource/2: every connection of the user."""
    name = ctx.params["username"]
    auth.owner_or(ctx, name)
    reason = ctx.request.headers.get("X-Reason", CLOSE_REASON)
    for conn in [c for c in ctx.mgmt.broker.connections if c.user == name]:
        conn.force_close(reason)
    return no_content()


def list_channels(ctx: Ctx) -> web.StreamResponse:
    return reply_list(ctx, [channel_json(ctx.mgmt, ch) for ch in _channels(ctx)])


def get_channel(ctx: Ctx) -> web.StreamResponse:
    name = ctx.params["channel"]
    for conn in ctx.mgmt.connections():
        for ch in conn.channels.values():
            if not ch.closed and channel_name(ch) == name:
                auth.owner_or(ctx, conn.user)
                return reply(ctx, channel_json(ctx.mgmt, ch, full=True))
    raise not_found()


def list_consumers(ctx: Ctx) -> web.StreamResponse:
    only = ctx.vhost_or_none()
    out: list[dict[str, Any]] = []
    for conn in ctx.mgmt.connections():
        if not _visible(ctx, conn.user) or (only is not None and conn.vhost.name != only):
            continue
        for ch in conn.channels.values():
            if not ch.closed:
                out.extend(consumer_json(ctx.mgmt, c) for c in ch.consumers.values())
    return reply_list(ctx, out, ("queue.vhost", "queue.name", "consumer_tag"))


ROUTES = (
    Resource("connections", check=auth.any_user, GET=list_connections),
    Resource(
        "connections/{connection}", check=auth.any_user, GET=get_connection, DELETE=close_connection
    ),
    Resource("connections/{connection}/channels", check=auth.any_user, GET=connection_channels),
    Resource(
        "connections/username/{username}",
        check=auth.any_user,
        GET=user_connections,
        DELETE=close_user_connections,
    ),
    Resource("vhosts/{vhost}/connections", check=auth.vhost_visible, GET=list_connections),
    Resource("channels", check=auth.any_user, GET=list_channels),
    Resource("channels/{channel}", check=auth.any_user, GET=get_channel),
    Resource("vhosts/{vhost}/channels", check=auth.vhost_visible, GET=list_channels),
    Resource("consumers", check=auth.any_user, GET=list_consumers),
    Resource("consumers/{vhost}", check=auth.vhost, GET=list_consumers),
)
