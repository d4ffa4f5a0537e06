"""A queue's ready messages: browse them, and delete, move or send to the tail one of them.

RabbitMQ 4.3's open-source management API has neither: its /get takes the messages and
requeues them, marked redelivered (rabbit_mgmt_wm_queue_get.erl, basic_gets/6), and it
has no route that acts on one message. The routes here are Warren's:

- ``GET .../messages?offset=N&count=M[&search=TEXT]``: browse (broker/engine/queue_browse.py)
- ``POST .../messages/delete``, ``.../messages/move``, ``.../messages/to-tail``: the body
  chooses the message by ``position``, ``seq`` (browse's, stable while it stays) or
  ``message_id`` (the oldest with it); a move names ``queue``, or ``exchange`` and
  optionally ``routing_key``. 409 when that message is no longer ready in the queue.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from aiohttp import web

from warren.broker.engine import queue_browse
from warren.broker.engine.message import Message
from warren.broker.engine.queue import fan_out
from warren.broker.ops.management import auth, operations
from warren.broker.ops.management.app import Ctx, Resource, reply
from warren.broker.ops.management.errors import ApiError, bad_request, from_channel, not_found
from warren.broker.ops.management.formats import properties_json
from warren.protocol.errors import AMQPError

if TYPE_CHECKING:
    from warren.broker.engine.exchange import Exchange
    from warren.broker.engine.queue import Queue
    from warren.broker.engine.vhost import VirtualHost
    from warren.broker.streams.stream import StreamQueue


def _queue(ctx: Ctx) -> tuple[VirtualHost, Queue]:
    vhost = ctx.vhost()
    queue = vhost.queues.get(ctx.params["queue"])
    if queue is None:
        raise not_found()
    return vhost, queue


def _int(value: Any, name: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise bad_request(["not_int", name])


def row_json(row: queue_browse.Browsed) -> dict[str, Any]:
    """A browsed message: /get's fields (payload as RabbitMQ's ``auto`` encoding gives it),
    and where it is, how often it was delivered, its x-death and when it arrived."""
    try:
        payload, kind = row.body.decode("utf-8"), "string"
    except UnicodeDecodeError:
        payload, kind = base64.b64encode(row.body).decode(), "base64"
    props = properties_json(row.properties)  # RabbitMQ's [] when a message has none
    headers = (props.get("headers") if isinstance(props, dict) else None) or {}
    return {
        "position": row.position,
        "seq": row.seq,
        "payload_bytes": len(row.body),
        "redelivered": row.redelivered,
        "exchange": row.exchange,
        "routing_key": row.routing_key,
        "properties": props,
        "payload": payload,
        "payload_encoding": kind,
        "x_death": headers.get("x-death"),
        "delivery_count": row.delivery_count,
        "enqueued_at": None if row.enqueued_at is None else int(row.enqueued_at * 1000),
        "paged_out": row.paged_out,
    }


def browse(ctx: Ctx) -> web.StreamResponse:
    """GET .../messages: the ready messages at those positions, oldest first (a stream:
    from that offset), taken from nowhere."""
    vhost, queue = _queue(ctx)
    offset = _int(ctx.query("offset") or "0", "offset")
    count = _int(ctx.query("count") or "20", "count")
    if offset < 0:
        raise bad_request(["offset_below_zero", offset])
    if count < 0:
        raise bad_request(["count_below_zero", count])
    search = ctx.query("search") or None
    try:
        operations.allow(ctx.mgmt, ctx.user.name, vhost.name, "read", "queue", queue.name)
    except AMQPError as exc:
        raise from_channel(exc) from None
    if queue.queue_type == "stream":
        if search is not None:
            raise bad_request("Searching a stream is not supported")
        stream: StreamQueue = queue  # type: ignore[assignment]
        return reply(ctx, [row_json(r) for r in queue_browse.stream_rows(stream, offset, count)])
    match = queue_browse.Matcher(search) if search is not None else None
    return reply(ctx, [row_json(r) for r in queue_browse.browse(queue, offset, count, match)])


def _choose(queue: Queue, body: dict[str, Any]) -> int:
    """The seq of the message the body chooses; 409 when it is not ready in the queue."""
    given = [k for k in ("position", "seq", "message_id") if body.get(k) is not None]
    if len(given) != 1:
        raise bad_request("Choose the message with one of position, seq or message_id")
    key = given[0]
    value = body[key]
    if key == "message_id":
        if not isinstance(value, str):
            raise bad_request(["not_string", "message_id"])
        found = queue_browse.find(queue, message_id=value)
        what = f"with message_id '{value}'"
    else:
        number = _int(value, key)
        if number < 0:
            raise bad_request([f"{key}_below_zero", number])
        if key == "position":
            found = queue_browse.find(queue, position=number)
            what = f"at position {number}"
        else:
            found = queue_browse.find(queue, seq=number)
            what = f"with seq {number}"
    if found is None:
        raise _gone(queue, what)
    return found


def _gone(queue: Queue, what: str) -> ApiError:
    return ApiError(
        409,
        "conflict",
        f"No ready message {what} in queue '{queue.name}' in vhost '{queue.vhost.name}': "
        "it was delivered, or it left the queue",
    )


def _source(ctx: Ctx) -> tuple[VirtualHost, Queue, dict[str, Any]]:
    vhost, queue = _queue(ctx)
    body = ctx.json()
    if queue.queue_type == "stream":
        raise bad_request("A stream's messages cannot be deleted or moved (it is append-only)")
    try:
        operations.allow(ctx.mgmt, ctx.user.name, vhost.name, "read", "queue", queue.name)
        vhost.check_exclusive(queue, operations.API_OWNER)
    except AMQPError as exc:
        raise from_channel(exc) from None
    return vhost, queue, body


def _remaining_ttl(queue: Queue, msg: Message) -> int | None:
    """What is left of its TTL, in ms: a moved message does not live longer for it."""
    if msg.expires_at is None:
        return None
    return max(0, int((msg.expires_at - queue.vhost.timers.now()) * 1000))


def delete(ctx: Ctx) -> web.StreamResponse:
    """POST .../messages/delete: the chosen message leaves the queue, not dead-lettered (as
    a purge drops messages)."""
    _, queue, body = _source(ctx)
    seq = _choose(queue, body)
    msg = queue_browse.take_out(queue, seq, "deleted")
    assert msg is not None  # found ready a moment ago, in this same turn of the loop
    return reply(ctx, {"deleted": 1, "seq": seq})


def to_tail(ctx: Ctx) -> web.StreamResponse:
    """POST .../messages/to-tail: the chosen message goes to the back of its queue, with its
    redelivered flag, delivery count and what is left of its TTL; it gets a new seq."""
    _, queue, body = _source(ctx)
    seq = _choose(queue, body)
    old = queue_browse.take_out(queue, seq, "to_tail")
    assert old is not None
    msg = Message(old.exchange, old.routing_key, old.properties, old.body)
    msg.sender_keys = old.sender_keys
    msg.redelivered = old.redelivered
    msg.delivery_count, msg.retries = old.delivery_count, old.retries
    queue.publish(msg, _remaining_ttl(queue, old))
    return reply(ctx, {"moved": 1, "seq": seq, "new_seq": msg.seq})


def move(ctx: Ctx) -> web.StreamResponse:
    """POST .../messages/move: the chosen message goes to another queue (as it is, exchange
    and routing key kept) or is published to an exchange (with ``routing_key``, else its
    own); there it is a new message (not redelivered, no deliveries yet), x-death kept. It
    leaves its queue only once a queue took it: unroutable or refused, nothing changes."""
    vhost, queue, body = _source(ctx)
    target_queue, exchange, routing_key = _destination(ctx, vhost, body)
    seq = _choose(queue, body)
    found = queue_browse.held(queue, seq)
    assert found is not None  # found ready a moment ago, in this same turn of the loop
    ttl = _remaining_ttl(queue, found)
    copy = Message(
        exchange.name if exchange is not None else found.exchange,
        routing_key if routing_key is not None else found.routing_key,
        found.properties,
        found.body,
    )
    if exchange is None:
        assert target_queue is not None
        queues = [target_queue]
    else:
        copy.sender_keys = found.sender_keys if routing_key is None else None
        delay = exchange.delay(copy) if exchange.delays else 0
        if delay:  # x-delayed-message: it waits in the exchange (the plugin's route/3)
            exchange.hold(copy, ttl, delay)
            queue_browse.take_out(queue, seq, "moved")
            return reply(ctx, {"moved": 1, "seq": seq, "queues": 0, "delayed": True})
        queues = vhost.route(exchange, copy)
        if not queues:
            raise bad_request("The message was not moved: no queue is bound for it; it stays")
    if not fan_out(queues, copy, ttl):
        raise ApiError(
            409, "conflict", "The message was not moved: the destination refused it; it stays"
        )
    queue_browse.take_out(queue, seq, "moved")
    return reply(ctx, {"moved": 1, "seq": seq, "queues": len(queues)})


def _destination(
    ctx: Ctx, vhost: VirtualHost, body: dict[str, Any]
) -> tuple[Queue | None, Exchange | None, str | None]:
    """The move's destination, checked before anything changes."""
    name_q, name_x = body.get("queue"), body.get("exchange")
    routing_key = body.get("routing_key")
    if (name_q is None) == (name_x is None):
        raise bad_request("Move to one of queue or exchange")
    if routing_key is not None and (name_x is None or not isinstance(routing_key, str)):
        raise bad_request("routing_key is a string, given with exchange")
    try:
        if name_q is not None:
            if not isinstance(name_q, str):
                raise bad_request(["not_string", "queue"])
            target = vhost.queues.get(name_q)
            if target is None:
                raise not_found(f"no queue '{name_q}' in vhost '{vhost.name}'")
            operations.allow(ctx.mgmt, ctx.user.name, vhost.name, "write", "exchange", "")
            vhost.check_exclusive(target, operations.API_OWNER)
            return target, None, None
        if not isinstance(name_x, str):
            raise bad_request(["not_string", "exchange"])
        exchange = vhost.exchanges.get(name_x)
        if exchange is None:
            raise not_found(f"no exchange '{name_x}' in vhost '{vhost.name}'")
        if exchange.internal:
            raise bad_request(f"cannot publish to internal exchange '{name_x}'")
        operations.allow(ctx.mgmt, ctx.user.name, vhost.name, "write", "exchange", name_x)
    except AMQPError as exc:
        raise from_channel(exc) from None
    return None, exchange, routing_key


ROUTES = (
    Resource("queues/{vhost}/{queue}/messages", check=auth.vhost, GET=browse),
    Resource("queues/{vhost}/{queue}/messages/delete", check=auth.vhost, POST=delete),
    Resource("queues/{vhost}/{queue}/messages/move", check=auth.vhost, POST=move),
    Resource("queues/{vhost}/{queue}/messages/to-tail", check=auth.vhost, POST=to_tail),
)
