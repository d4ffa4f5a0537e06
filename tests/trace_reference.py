"""The job's main aggregates computed in plain Python, to check the Spark job against.

Written independently of pipeline/job.py: it replays each copy's events in order with an
explicit state machine instead of window functions.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from warren.broker.tracing import format as trace_format

# the events of one copy (a message in one queue); routed is split into one arrival per queue
COPY_EVENTS = frozenset(
    ("adopted", "routed", "delivered", "nacked", "acked", "requeued", "retry_scheduled",
     "expired", "dead_lettered", "dropped")
)  # fmt: skip


def nearest_rank(values: list[int], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)] / 1000


def load(directory: Path) -> list[dict[str, Any]]:
    return trace_format.events(str(directory))


def reference(events: list[dict[str, Any]]) -> dict[str, Any]:
    per_copy: dict[tuple[str, int, str], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["ev"] == "routed":
            for queue in e["queues"]:
                per_copy[(e["vhost"], e["msg"], queue)].append({**e, "queue": queue})
        elif e["ev"] in COPY_EVENTS:
            per_copy[(e["vhost"], e["msg"], e["queue"])].append(e)
    queues: dict[str, Counter[str]] = defaultdict(Counter)
    consumers: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    processing: dict[tuple[str, str], list[int]] = defaultdict(list)
    processing_by_queue: dict[str, list[int]] = defaultdict(list)
    outcomes: Counter[str] = Counter()
    for (_, _, queue), evs in per_copy.items():
        evs.sort(key=lambda e: e["ts"])  # stable: events sharing a time keep the stream's order
        q = queues[queue]
        state = "none"
        delivery: tuple[int, str] | None = None
        for e in evs:
            ev = e["ev"]
            q[ev] += 1
            before = state
            if ev == "routed":
                state = "ready"
            elif ev == "delivered":
                state = "unacked"
                who = e["consumer"] or "basic.get"
                delivery = (e["ts"], who)
                consumers[(queue, who)]["deliveries"] += 1
                if e["redelivered"]:
                    q["redelivered"] += 1
            elif ev == "acked":
                state = "gone"
                assert delivery is not None
                consumers[(queue, delivery[1])]["acks"] += 1
                processing[(queue, delivery[1])].append(e["ts"] - delivery[0])
                processing_by_queue[queue].append(e["ts"] - delivery[0])
            elif ev == "nacked":
                state = "unacked" if e["requeue"] else "gone"
            elif ev == "requeued":
                state = "ready"
            elif ev == "retry_scheduled":
                state = "delayed"
            elif ev == "dead_lettered":
                state = "gone"
                q[f"dead_lettered_{e['reason']}"] += 1
            else:
                state = "gone"
            if ev in ("requeued", "retry_scheduled") and e["why"] == "consumer_timeout":
                q["timed_out"] += 1
                assert delivery is not None
                consumers[(queue, delivery[1])]["timeouts"] += 1
            for name in ("ready", "unacked", "delayed"):
                q[f"depth_{name}"] += (state == name) - (before == name)
        last = evs[-1]["ev"]
        outcomes["acked" if last == "acked" else last] += 1
    return {
        "queues": queues,
        "consumers": consumers,
        "processing": processing,
        "processing_by_queue": processing_by_queue,
        "copy_outcomes": outcomes,
        "messages": len({e["msg"] for e in events if e["ev"] == "published"}),
        "unroutable": sum(1 for e in events if e["ev"] == "routed" and not e["queues"]),
    }
