"""/api/exchanges[/{vhost}[/{name}]] and /api/exchanges/{vhost}/{name}/publish."""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING, Any

from aiohttp import web

from warren.broker.engine.channel_publish import checked_ttl, publish_target
from warren.broker.engine.message import Message, routing_headers
from warren.broker.engine.queue import fan_out
from warren.broker.engine.reply_to import REPLY_TO_PREFIX
from warren.broker.ops.management import auth, operations
from warren.broker.ops.management.app import Ctx, Resource, created, no_content, reply, reply_list
from warren.broker.ops.management.errors import ApiError, bad_request, not_found
from warren.broker.ops.management.formats import exchange_json, properties_from_json
from warren.protocol.errors import AMQPError
from warren.protocol.properties import split_properties

if TYPE_CHECKING:
    from warren.broker.engine.exchange import Exchange
    from warren.broker.engine.vhost import VirtualHost


def exchange_name(ctx: Ctx, key: str = "exchange") -> str:
    """RabbitMQ's URLs name the default exchange ``amq.default``."""
    name = ctx.params[key]
    return "" if name == "amq.default" else name


def _exchange(ctx: Ctx) -> tuple[VirtualHost, Exchange]:
    vhost = ctx.vhost()
    exchange = vhost.exchanges.get(exchange_name(ctx))
    if exchange is None:
        raise not_found()
    return vhost, exchange


def list_exchanges(ctx: Ctx) -> web.StreamResponse:
    only = ctx.vhost_or_none()
    broker = ctx.mgmt.broker
    out: list[dict[str, Any]] = []
    for name in auth.listed_vhosts(ctx.mgmt, ctx.user):
        if only is not None and name != only:
            continue
        vhost = broker.vhosts[name]
        out.extend(exchange_json(vhost, x) for x in vhost.exchanges.values())
    return reply_list(ctx, out)


def get_exchange(ctx: Ctx) -> web.StreamResponse:
    vhost, exchange = _exchange(ctx)
    return reply(ctx, exchange_json(vhost, exchange))


def put_exchange(ctx: Ctx) -> web.StreamResponse:
    vhost = ctx.vhost()
    new = operations.declare_exchange(
        ctx.mgmt, vhost, exchange_name(ctx), ctx.json(), ctx.user.name
    )
    return created() if new else no_content()


def delete_exchange(ctx: Ctx) -> web.StreamResponse:
    vhost, exchange = _exchange(ctx)
    if_unused = ctx.query("if-unused") == "true"
    operations.delete_exchange(ctx.mgmt, vhost, exchange.name, ctx.user.name, if_unused)
    return no_content()


def _publish_error(exc: AMQPError) -> ApiError:
    # RabbitMQ publishes on a channel and reports how it closed: "403 ACCESS_REFUSED - ..."
    return bad_request(f"{exc.code} {exc.text}")


def _payload(body: dict[str, Any]) -> tuple[str, bytes, bytes]:
    routing_key, props, payload, encoding = Ctx.require(
        body, "routing_key", "properties", "payload", "payload_encoding"
    )
    if not isinstance(payload, str):
        raise bad_request("payload_not_string")
    if encoding == "string":
        data = payload.encode()
    elif encoding == "base64":
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request(["not_base64", payload]) from None
    else:
        raise bad_request(["unsupported_encoding", encoding])
    return str(routing_key), properties_from_json(props), data


def _ttl(ctx: Ctx, properties: bytes) -> int | None:
    """The checks basic.publish makes on properties: user-id must be the user; expiration."""
    return checked_ttl(split_properties(properties), ctx.user.name)


def publish(ctx: Ctx) -> web.StreamResponse:
    """Publish one message, mandatory and confirmed, as RabbitMQ's API does: routed or not."""
    vhost = ctx.vhost()
    name = exchange_name(ctx)
    routing_key, properties, data = _payload(ctx.json())
    stats = ctx.mgmt.broker.stats
    try:
        operations.allow(ctx.mgmt, ctx.user.name, vhost.name, "write", "exchange", name)
        exchange = publish_target(vhost, name)
        sender_keys = None
        if properties.find(b"CC") >= 0:  # CC or BCC headers route too, as over AMQP
            properties, sender_keys = routing_headers(properties)
        ttl = _ttl(ctx, properties)
    except AMQPError as exc:
        raise _publish_error(exc) from None
    stats.received += 1
    if name == "" and routing_key.startswith(REPLY_TO_PREFIX):
        return reply(ctx, {"routed": False})  # replies need an AMQP channel to reach
    msg = Message(name, routing_key, properties, data)
    msg.sender_keys = sender_keys
    # x-delayed-message: held, so no queue now (the plugin's route/3), as over AMQP
    delay = exchange.delay(msg) if exchange.delays else 0
    queues = [] if delay else vhost.route(exchange, msg)
    if delay:
        exchange.hold(msg, ttl, delay)
    if not queues:
        stats.unroutable_returned += 1
        stats.confirmed += 1
        return reply(ctx, {"routed": False})
    stats.routed += 1
    if fan_out(queues, msg, ttl) < len(queues):  # a queue refused it (reject-publish): a nack
        raise bad_request("rejected Unable to publish message. Check queue limits.")
    stats.confirmed += 1
    return reply(ctx, {"routed": True})


ROUTES = (
    Resource("exchanges", "exchanges/{vhost}", check=auth.vhost, GET=list_exchanges),
    Resource(
        "exchanges/{vhost}/{exchange}",
        check=auth.vhost,
        GET=get_exchange,
        PUT=put_exchange,
        DELETE=delete_exchange,
    ),
    Resource("exchanges/{vhost}/{exchange}/publish", check=auth.vhost, POST=publish),
)
