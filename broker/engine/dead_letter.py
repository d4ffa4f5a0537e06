"""The dead-lettered copy of a message: RabbitMQ's x-death headers, byte-exact elsewhere.

Only the headers the broker owns are rebuilt; every other header entry and
property keeps the publisher's bytes.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

from warren.broker.engine.message import Message
from warren.protocol.properties import decode_field, join_properties, split_properties
from warren.protocol.tables import decode_table, encode_value, join_entries, table_entries


def dead_letter_copy(
    msg: Message,
    queue: str,
    reason: str,
    exchange: str,
    routing_key: str,
    wall: float | None = None,
) -> tuple[Message, list[dict[str, Any]]]:
    """Return the copy to route to the dead-letter exchange, and its x-death list.

    ``wall``: the broker clock's time (seconds since the epoch) for x-death's ``time``.
    """
    fields = split_properties(msg.properties)
    expiration = fields.pop("expiration", None)
    entries: dict[str, bytes] = {}
    if "headers" in fields:
        entries, _ = table_entries(fields["headers"])
    deaths: list[dict[str, Any]] = []
    if "x-death" in entries:
        raw = entries["x-death"]
        if raw[:1] == b"A":
            deaths = decode_deaths(raw)
    now = datetime.datetime.fromtimestamp(
        time.time() if wall is None else wall, tz=datetime.UTC
    ).replace(microsecond=0)
    for i, death in enumerate(deaths):
        if death.get("queue") == queue and death.get("reason") == reason:
            death = deaths.pop(i)
            count = death.get("count", 0)
            death["count"] = (count if isinstance(count, int) else 0) + 1
            deaths.insert(0, death)  # the rest, the time of the first such death too, is kept
            break
    else:
        death = {
            "count": 1,
            "reason": reason,
            "queue": queue,
            "time": now,
            "exchange": msg.exchange,
            "routing-keys": _death_keys(msg),
        }
        if expiration is not None:
            death["original-expiration"] = decode_field("expiration", expiration)
        deaths.insert(0, death)
    entries.pop("x-delivery-count", None)  # counted deliveries from the queue it is leaving
    entries["x-death"] = encode_value(deaths)
    for key, value in (("reason", reason), ("queue", queue), ("exchange", msg.exchange)):
        entries.setdefault(f"x-first-death-{key}", encode_value(value))
        entries[f"x-last-death-{key}"] = encode_value(value)
    fields["headers"] = join_entries(entries)
    copy = Message(exchange, routing_key, join_properties(fields), msg.body)
    copy.trace_id = msg.trace_id  # the trace follows the message into the dead-letter queue
    return copy, deaths


def _death_keys(msg: Message) -> list[str]:
    """The routing keys x-death records: CC's too, BCC's not (RabbitMQ 4.3 mc.erl
    record_death subtracts the BCC keys from all the routing keys, Erlang's ``--``)."""
    keys = msg.routing_keys()
    if msg.sender_keys is not None:
        for key in msg.sender_keys[1]:
            keys.remove(key)  # the first occurrence, as Erlang's list subtraction does
    return keys


def decode_deaths(raw: bytes) -> list[dict[str, Any]]:
    # wrap the array in a one-entry table to reuse the table decoder
    body = b"\x01a" + raw
    table, _ = decode_table(len(body).to_bytes(4, "big") + body)
    items = table.get("a", [])
    return [d for d in items if isinstance(d, dict)] if isinstance(items, list) else []
