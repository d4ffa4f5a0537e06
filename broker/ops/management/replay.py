"""POST /api/queues/{vhost}/{queue}/replay: dead letters go back where they died.

Each ready message's first x-death entry names the exchange and routing keys it was
published with before it was dead-lettered (RabbitMQ 4.3 mc.erl record_death puts the
newest death first); the message is published there again, with x-death kept or cleared.
Messages without x-death stay where they were, unmarked, and are counted.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from warren.broker.engine.dead_letter import decode_deaths
from warren.broker.engine.message import Message
from warren.broker.engine.queue import fan_out
from warren.broker.ops.management import operations
from warren.broker.ops.management.app import Ctx, reply
from warren.broker.ops.management.errors import bad_request, from_channel, not_found
from warren.protocol.errors import AMQPError
from warren.protocol.properties import join_properties, split_properties
from warren.protocol.tables import join_entries, table_entries

DEATH_HEADERS = (
    "x-death",
    "x-first-death-reason",
    "x-first-death-queue",
    "x-first-death-exchange",
    "x-last-death-reason",
    "x-last-death-queue",
    "x-last-death-exchange",
)


def _count(body: dict[str, Any]) -> int | None:
    value = body.get("count")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise bad_request(["not_int", "count"])
    if value < 0:
        raise bad_request(["count_below_zero", value])
    return value


def replay(ctx: Ctx) -> web.StreamResponse:
    vhost = ctx.vhost()
    queue = vhost.queues.get(ctx.params["queue"])
    if queue is None:
        raise not_found()
    body = ctx.json()
    count = _count(body)
    keep = body.get("keep_x_death", False)
    if not isinstance(keep, bool):
        raise bad_request(["not_bool", "keep_x_death"])
    if queue.queue_type == "stream":
        raise bad_request("Replaying from a stream is not supported")
    try:
        operations.allow(ctx.mgmt, ctx.user.name, vhost.name, "read", "queue", queue.name)
        vhost.check_exclusive(queue, operations.API_OWNER)
    except AMQPError as exc:
        raise from_channel(exc) from None
    limit = queue.ready_count if count is None else min(count, queue.ready_count)
    taken: list[Message] = []
    for _ in range(limit):  # all in one turn of the loop: none is delivered meanwhile
        msg = queue.get()
        if msg is None:
            break
        taken.append(msg)
    stay: list[Message] = []
    unroutable = without = 0
    to: dict[tuple[str, tuple[str, ...]], int] = {}
    for msg in taken:
        fields = split_properties(msg.properties)
        entries: dict[str, bytes] = {}
        if "headers" in fields:
            entries, _ = table_entries(fields["headers"])
        raw = entries.get("x-death", b"")
        deaths = decode_deaths(raw) if raw[:1] == b"A" else []
        first = deaths[0] if deaths else {}
        name = first.get("exchange")
        keys = [k for k in first.get("routing-keys") or [] if isinstance(k, str)]
        exchange = vhost.exchanges.get(name) if isinstance(name, str) else None
        if not keys or exchange is None:
            without += 1
            stay.append(msg)
            continue
        if not keep:
            for header in DEATH_HEADERS:
                entries.pop(header, None)
            fields["headers"] = join_entries(entries)
        copy = Message(exchange.name, keys[0], join_properties(fields), msg.body)
        if len(keys) > 1:
            copy.sender_keys = (keys[1:], [])
        queues = vhost.route(exchange, copy)
        if not queues:  # it stays rather than being lost
            unroutable += 1
            stay.append(msg)
            continue
        fan_out(queues, copy, None)
        where = (exchange.name, tuple(keys))
        to[where] = to.get(where, 0) + 1
        queue.settled(msg)
    if stay:
        # back at their positions as they were: not redelivered, not counted as such
        fresh = [m for m in stay if not m.redelivered]
        queue.unacked_count -= len(stay)
        queue.requeue(stay, "replay")
        for msg in fresh:
            msg.redelivered = False
        queue.stats.redelivered -= len(fresh)
    replayed = sum(to.values())
    return reply(
        ctx,
        {
            "replayed": replayed,
            "unroutable": unroutable,
            "without_x_death": without,
            "to": [
                {"exchange": ex, "routing_keys": list(keys), "messages": n}
                for (ex, keys), n in to.items()
            ],
        },
    )
