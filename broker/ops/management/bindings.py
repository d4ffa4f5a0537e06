"""/api/bindings..., /api/queues/{vhost}/{q}/bindings, /api/exchanges/{vhost}/{x}/bindings/*.

A binding's URL is ``/api/bindings/{vhost}/e/{source}/{q|e}/{destination}/{props}``
where ``props`` is its ``properties_key`` (routing key, plus a hash of the
arguments when there are any), as in RabbitMQ.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, unquote_plus

from aiohttp import web

from warren.broker.engine.exchange import Exchange
from warren.broker.ops.management import auth, operations
from warren.broker.ops.management.app import Ctx, Resource, created, no_content, reply, reply_list
from warren.broker.ops.management.errors import bad_request, not_found
from warren.broker.ops.management.exchanges import exchange_name
from warren.broker.ops.management.formats import props_key, table_from_json, vhost_bindings

SORT = ("vhost", "source", "destination", "destination_type", "routing_key", "properties_key")


def _kind(ctx: Ctx) -> str:
    kind = ctx.params["dtype"]
    if kind not in ("q", "e"):
        raise not_found()
    return kind


def _type_name(kind: str) -> str:
    return "queue" if kind == "q" else "exchange"


def list_bindings(ctx: Ctx) -> web.StreamResponse:
    only = ctx.vhost_or_none()
    out: list[dict[str, Any]] = []
    for name in auth.listed_vhosts(ctx.mgmt, ctx.user):
        if only is None or name == only:
            out.extend(vhost_bindings(ctx.mgmt.broker.vhosts[name]))
    return reply_list(ctx, out, SORT)


def _between(ctx: Ctx) -> list[dict[str, Any]]:
    """Bindings from ``source`` to the named destination; 404 if either is missing."""
    vhost = ctx.vhost()
    kind = _kind(ctx)
    source = exchange_name(ctx, "source")
    dest = ctx.params["destination"] if kind == "q" else exchange_name(ctx, "destination")
    if source not in vhost.exchanges:
        raise not_found()
    if (vhost.queues if kind == "q" else vhost.exchanges).get(dest) is None:
        raise not_found()
    return [
        b
        for b in vhost_bindings(vhost)
        if b["source"] == source
        and b["destination"] == dest
        and b["destination_type"] == _type_name(kind)
    ]


def get_between(ctx: Ctx) -> web.StreamResponse:
    return reply_list(ctx, _between(ctx), SORT)


def create_binding(ctx: Ctx) -> web.StreamResponse:
    vhost = ctx.vhost()
    kind = _kind(ctx)
    source = exchange_name(ctx, "source")
    dest = ctx.params["destination"] if kind == "q" else exchange_name(ctx, "destination")
    body = ctx.json()
    routing_key = body.get("routing_key", "")
    if not isinstance(routing_key, str):
        raise bad_request(["not_a_string", routing_key])
    arguments = table_from_json(body.get("arguments"))
    operations.bind(ctx.mgmt, vhost, source, kind, dest, routing_key, arguments, ctx.user.name)
    key = props_key(routing_key, arguments)
    # relative to the request path, as RabbitMQ's Location header is
    return created(f"{quote(dest, safe='')}/{key}")


def _binding(ctx: Ctx) -> dict[str, Any]:
    # decoded twice, as RabbitMQ does: rabbitmqadmin sends the listed (quoted) key quoted again
    wanted = unquote_plus(ctx.params["props"])
    for b in _between(ctx):
        if unquote_plus(b["properties_key"]) == wanted:
            return b
    raise not_found()


def get_binding(ctx: Ctx) -> web.StreamResponse:
    return reply(ctx, _binding(ctx))


def delete_binding(ctx: Ctx) -> web.StreamResponse:
    found = _binding(ctx)
    vhost = ctx.vhost()
    kind = _kind(ctx)
    source = vhost.exchanges[found["source"]]
    for binding in list(source.bindings.values()):
        dest = binding.destination
        if (
            dest.name == found["destination"]
            and isinstance(dest, Exchange) == (kind == "e")
            and props_key(binding.routing_key, binding.arguments) == found["properties_key"]
        ):
            operations.unbind(
                ctx.mgmt,
                vhost,
                source.name,
                kind,
                dest,
                binding.routing_key,
                binding.arguments,
                ctx.user.name,
            )
            break
    return no_content()


def queue_bindings(ctx: Ctx) -> web.StreamResponse:
    vhost = ctx.vhost()
    name = ctx.params["queue"]
    if name not in vhost.queues:
        raise not_found()
    out = [
        b
        for b in vhost_bindings(vhost)
        if b["destination"] == name and b["destination_type"] == "queue"
    ]
    return reply_list(ctx, out, SORT)


def _exchange_bindings(ctx: Ctx, side: str) -> web.StreamResponse:
    vhost = ctx.vhost()
    name = exchange_name(ctx)
    if name not in vhost.exchanges:
        raise not_found()
    if side == "source":
        out = [b for b in vhost_bindings(vhost) if b["source"] == name]
    else:
        out = [
            b
            for b in vhost_bindings(vhost)
            if b["destination"] == name and b["destination_type"] == "exchange"
        ]
    return reply_list(ctx, out, SORT)


def exchange_source_bindings(ctx: Ctx) -> web.StreamResponse:
    return _exchange_bindings(ctx, "source")


def exchange_destination_bindings(ctx: Ctx) -> web.StreamResponse:
    return _exchange_bindings(ctx, "destination")


ROUTES = (
    Resource("bindings", "bindings/{vhost}", check=auth.vhost, GET=list_bindings),
    Resource(
        "bindings/{vhost}/e/{source}/{dtype}/{destination}",
        check=auth.vhost,
        GET=get_between,
        POST=create_binding,
    ),
    Resource(
        "bindings/{vhost}/e/{source}/{dtype}/{destination}/{props}",
        check=auth.vhost,
        GET=get_binding,
        DELETE=delete_binding,
    ),
    Resource("queues/{vhost}/{queue}/bindings", check=auth.vhost, GET=queue_bindings),
    Resource(
        "exchanges/{vhost}/{exchange}/bindings/source",
        check=auth.vhost,
        GET=exchange_source_bindings,
    ),
    Resource(
        "exchanges/{vhost}/{exchange}/bindings/destination",
        check=auth.vhost,
        GET=exchange_destination_bindings,
    ),
)
