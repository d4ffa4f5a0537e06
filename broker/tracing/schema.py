"""The decoded trace's events and their fields: the one declaration of what a line holds.

broker/tracing/format.py writes these JSON lines (the frequent events by hand, for speed,
the rest from this table: the tests check every line it writes against it),
pipeline/schema.py derives the Spark schema from ``FIELDS``, and docs/tracing.md's table is
``python -m warren.broker.tracing.schema``'s output (a test keeps them equal). Every line
has ``ts``, ``ev`` and ``vhost``; a field in ``Event.optional`` is there only when it has a
value.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Final

# JSON value types, as the pipeline reads them
LONG: Final = "long"
INT: Final = "int"
STRING: Final = "string"
BOOL: Final = "bool"
STRINGS: Final = "strings"  # a list of strings
LONGS: Final = "longs"  # a list of integers

FIELDS: Final[dict[str, str]] = {
    "ts": LONG,  # microseconds since the epoch
    "ev": STRING,
    "vhost": STRING,
    "msg": LONG,
    "queue": STRING,
    "exchange": STRING,
    "rk": STRING,
    "size": LONG,
    "mid": STRING,
    "cid": STRING,
    "persistent": BOOL,
    "conn": STRING,
    "ch": INT,
    "seq": LONG,
    "first": LONG,
    "ack": BOOL,
    "queues": STRINGS,
    "mandatory": BOOL,
    "dead_letter": BOOL,
    "consumer": STRING,
    "tag": LONG,
    "redelivered": BOOL,
    "count": INT,
    "no_ack": BOOL,
    "requeue": BOOL,
    "why": STRING,
    "attempt": INT,
    "delay_ms": LONG,
    "reason": STRING,
    "dlx": STRING,
    "dlrk": STRING,
    "prefetch": INT,
    "tags": LONGS,
    "msgs": LONGS,
    "timeout_ms": LONG,
    "action": STRING,
    "messages": LONG,
    "dropped": LONG,
}
COMMON: Final = ("ts", "ev", "vhost")


@dataclass(frozen=True)
class Event:
    name: str
    fields: tuple[str, ...]  # besides ts, ev and vhost
    meaning: str
    optional: tuple[str, ...] = ()


_WHY = "nack, channel_closed, connection_closed, connection_lost, consumer_timeout"

EVENTS: Final[tuple[Event, ...]] = (
    Event(
        "published",
        ("msg", "exchange", "rk", "size", "mid", "cid", "persistent", "conn", "ch", "seq"),
        "a publish; mid, cid and persistent when set; seq is the publisher-confirm sequence"
        " number (0 without confirms)",
        optional=("mid", "cid", "persistent"),
    ),
    Event(
        "routed",
        ("msg", "exchange", "rk", "queues", "mandatory", "dead_letter"),
        "where it went: queues empty when unroutable; dead_letter true for a dead-lettered copy",
    ),
    Event(
        "confirmed",
        ("conn", "ch", "first", "seq", "ack"),
        "a publisher confirm of every publish first..seq; ack false for a nack",
    ),
    Event(
        "delivered",
        ("msg", "queue", "consumer", "tag", "redelivered", "count", "no_ack", "conn", "ch"),
        "consumer null for basic.get; count is x-delivery-count (failed deliveries so far)",
    ),
    Event(
        "acked",
        ("msg", "queue", "consumer", "tag"),
        "settled; a no-ack delivery is acked when delivered",
    ),
    Event("nacked", ("msg", "queue", "consumer", "tag", "requeue"), "basic.nack or basic.reject"),
    Event("requeued", ("msg", "queue", "why"), f"back in the queue; why: {_WHY}"),
    Event(
        "retry_scheduled",
        ("msg", "queue", "attempt", "delay_ms", "why"),
        "back after a delay (delayed retry); why as for requeued",
    ),
    Event("expired", ("msg", "queue"), "its TTL ran out in the queue"),
    Event(
        "dead_lettered",
        ("msg", "queue", "reason", "dlx", "dlrk"),
        "reason: expired, rejected, maxlen, delivery_limit",
    ),
    Event(
        "dropped",
        ("msg", "queue", "reason"),
        "discarded without a dead-letter exchange; reason: rejected, maxlen, delivery_limit,"
        " overflow, purged, queue_deleted; taken out through the management API: deleted,"
        " moved, to_tail",
    ),
    Event(
        "adopted",
        ("msg", "queue", "exchange", "rk", "size"),
        "first sight of a message published before tracing was on (or recovered from disk)",
    ),
    Event(
        "delayed",
        ("msg", "exchange", "delay_ms"),
        "an x-delayed-message exchange holds the message",
    ),
    Event("released", ("msg", "exchange", "queues"), "... and routed it when its delay was over"),
    Event(
        "consumer_added", ("queue", "consumer", "prefetch", "no_ack", "conn", "ch"), "basic.consume"
    ),
    Event(
        "consumer_timed_out",
        ("queue", "consumer", "conn", "ch", "tags", "msgs", "timeout_ms", "action"),
        "its deliveries were unacked past the timeout; action: cancel or channel_close",
    ),
    Event(
        "consumer_cancelled",
        ("queue", "consumer", "why"),
        "why: client, channel_closed, connection_closed, connection_lost, queue_deleted",
    ),
    Event("queue_expired", ("queue",), "unused past x-expires; queue_deleted follows"),
    Event("queue_deleted", ("queue", "messages"), "messages: the ready ones lost with it"),
    Event("trace_started", (), "tracing turned on for the vhost"),
    Event("trace_stopped", (), "tracing turned off"),
    Event(
        "trace_dropped",
        ("dropped",),
        "events lost so far because the buffers were full (vhost null)",
    ),
)
BY_NAME: Final[dict[str, Event]] = {e.name: e for e in EVENTS}


def markdown_table() -> str:
    """docs/tracing.md's table of events."""
    rows = ["| `ev` | fields | meaning |", "|---|---|---|"]
    for event in EVENTS:
        fields = ", ".join(f"{f}?" if f in event.optional else f for f in event.fields)
        rows.append(f"| `{event.name}` | {fields or '-'} | {event.meaning} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown_table())
