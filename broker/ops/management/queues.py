"""/api/queues[/{vhost}[/{name}]], /contents (purge) and /get (browse and acting on one
message: broker/ops/management/queue_messages.py)."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from warren.broker.engine.message import Message
from warren.broker.ops.management import auth, operations, replay
from warren.broker.ops.management.app import (
    Ctx,
    Lazy,
    Resource,
    created,
    no_content,
    reply,
    reply_list,
)
from warren.broker.ops.management.errors import bad_request, from_channel, not_found
from warren.broker.ops.management.formats import oldest_unacked, properties_json, queue_json
from warren.protocol.errors import AMQPError

if TYPE_CHECKING:
    from warren.broker.engine.queue import Queue
    from warren.broker.engine.vhost import VirtualHost

ACK_MODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false")


def _queue(ctx: Ctx) -> tuple[VirtualHost, Queue]:
    vhost = ctx.vhost()
    queue = vhost.queues.get(ctx.params["queue"])
    if queue is None:
        raise not_found()
    return vhost, queue


# what a page of queues is filtered and sorted by, read without building each queue's JSON
SORT_FIELDS: dict[str, Callable[[Queue], Any]] = {
    "name": lambda q: q.name,
    "vhost": lambda q: q.vhost.name,
    "type": lambda q: q.queue_type,
    "policy": lambda q: q.policy.name if q.policy is not None else None,
    "durable": lambda q: q.durable,
    "messages": lambda q: q.ready_count + q.unacked_count,
    "messages_ready": lambda q: q.ready_count,
    "messages_unacknowledged": lambda q: q.unacked_count,
    "messages_delayed": lambda q: q.delayed_count,
    "consumers": lambda q: len(q.consumers),
    "consumer_timeouts": lambda q: q.stats.consumer_timeouts,
}


def list_queues(ctx: Ctx) -> web.StreamResponse:
    only = ctx.vhost_or_none()
    broker = ctx.mgmt.broker
    found: list[Queue] = []
    for name in auth.listed_vhosts(ctx.mgmt, ctx.user):
        if only is None or name == only:
            found.extend(broker.vhosts[name].queues.values())
    unacked: dict[Queue, Message] = {}
    scanned = False

    def render(q: Queue) -> dict[str, Any]:
        nonlocal unacked, scanned
        if not scanned:  # once for the page, only if a row is rendered
            unacked, scanned = oldest_unacked(ctx.mgmt), True
        return queue_json(ctx.mgmt, q, unacked=unacked)

    return reply_list(ctx, Lazy(found, render, SORT_FIELDS))


def get_queue(ctx: Ctx) -> web.StreamResponse:
    _, queue = _queue(ctx)
    return reply(ctx, queue_json(ctx.mgmt, queue, full=True))


def put_queue(ctx: Ctx) -> web.StreamResponse:
    vhost = ctx.vhost()
    new = operations.declare_queue(ctx.mgmt, vhost, ctx.params["queue"], ctx.json(), ctx.user.name)
    return created() if new else no_content()


def delete_queue(ctx: Ctx) -> web.StreamResponse:
    vhost, queue = _queue(ctx)
    operations.delete_queue(
        ctx.mgmt,
        vhost,
        queue,
        ctx.user.name,
        if_unused=ctx.query("if-unused") == "true",
        if_empty=ctx.query("if-empty") == "true",
    )
    return no_content()


def purge(ctx: Ctx) -> web.StreamResponse:
    vhost, queue = _queue(ctx)
    operations.allow(ctx.mgmt, ctx.user.name, vhost.name, "read", "queue", queue.name)
    vhost.check_exclusive(queue, operations.API_OWNER)
    try:
        queue.purge()
    except AMQPError as exc:  # a stream: purge is not supported
        raise from_channel(exc) from None
    return no_content()


def _int(value: Any, name: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise bad_request(["not_int", name])


def _message_json(
    msg: Message, remaining: int, encoding: str, truncate: int | None
) -> dict[str, Any]:
    body = msg.body if truncate is None else msg.body[:truncate]
    payload: str
    kind = "base64"
    if encoding == "auto":
        try:
            payload, kind = body.decode("utf-8"), "string"
        except UnicodeDecodeError:
            payload = base64.b64encode(body).decode()
    else:
        payload = base64.b64encode(body).decode()
    return {
        "payload_bytes": len(msg.body),
        "redelivered": msg.redelivered,
        "exchange": msg.exchange,
        "routing_key": msg.routing_key,
        "message_count": remaining,
        "properties": properties_json(msg.properties),
        "payload": payload,
        "payload_encoding": kind,
    }


def get_messages(ctx: Ctx) -> web.StreamResponse:
    """basic.get up to ``count`` messages, then ack, requeue or reject them as ``ackmode`` says."""
    vhost, queue = _queue(ctx)
    body = ctx.json()
    ackmode, count_value, encoding = Ctx.require(body, "ackmode", "count", "encoding")
    count = _int(count_value, "count")
    if ackmode not in ACK_MODES:
        raise bad_request(["invalid_ackmode", ackmode])
    if encoding not in ("auto", "base64"):
        raise bad_request("Unsupported encoding. Please use auto or base64.")
    truncate = None if body.get("truncate") is None else _int(body["truncate"], "truncate")
    try:
        operations.allow(ctx.mgmt, ctx.user.name, vhost.name, "read", "queue", queue.name)
        vhost.check_exclusive(queue, operations.API_OWNER)
    except AMQPError as exc:
        raise from_channel(exc) from None
    stats = ctx.mgmt.broker.stats
    taken: list[Message] = []
    out = []
    for _ in range(max(count, 0)):
        try:
            msg = queue.get()
        except AMQPError as exc:  # a stream: basic.get is not supported
            raise from_channel(exc) from None
        if msg is None:
            break
        if msg.redelivered:
            stats.redelivered += 1
            queue.stats.redeliveries += 1
        out.append(_message_json(msg, queue.ready_count, encoding, truncate))
        if ackmode == "ack_requeue_false":
            stats.delivered_get_auto += 1
            queue.stats.get_auto += 1
            queue.settled(msg)  # fetched with no-ack
        else:
            stats.delivered_get_manual += 1
            queue.stats.get_manual += 1
            taken.append(msg)  # held unacked until all are fetched, so each is a new one
    if ackmode == "reject_requeue_false":
        for msg in taken:
            queue.rejected(msg)
    elif taken:
        queue.return_unacked(taken, "channel_closed")  # requeued as when RabbitMQ's channel closes
    return reply(ctx, out)


ROUTES = (
    Resource("queues", "queues/{vhost}", check=auth.vhost, GET=list_queues),
    Resource(
        "queues/{vhost}/{queue}",
        check=auth.vhost,
        GET=get_queue,
        PUT=put_queue,
        DELETE=delete_queue,
    ),
    Resource("queues/{vhost}/{queue}/contents", check=auth.vhost, DELETE=purge),
    Resource("queues/{vhost}/{queue}/get", check=auth.vhost, POST=get_messages),
    Resource("queues/{vhost}/{queue}/replay", check=auth.vhost, POST=replay.replay),
)
