"""A synthetic trace, for scale runs and the job's tests.

    python -m warren.pipeline.generate --out /tmp/trace10m --messages 2000000   # about 10M events

Its files are JSON lines, made by broker/tracing/format.py's formatters: byte for byte what a
broker's binary trace files decode to (``python -m warren.broker.tracing.format decode``),
which the job reads as well. The workload: ``orders`` with three consumers of which one
is slow and a fan-out copy to ``audit``; ``emails`` with a TTL and nacks (requeued);
``payments``, a quorum queue with consumer timeouts, delayed retries and a delivery
limit; everything that is dead-lettered lands in ``dead-letters`` and is consumed there.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Callable
from typing import IO, Any

from warren.broker.tracing import events as t
from warren.broker.tracing.format import FORMATS

VHOST = "/"
PUBLISHER = ("10.0.0.5", 50000)
CONSUMERS = {
    "orders": [("c-orders-1", 2.0), ("c-orders-2", 2.0), ("c-orders-slow", 25.0)],
    "audit": [("c-audit", 0.5)],
    "emails": [("c-emails-1", 8.0), ("c-emails-2", 8.0)],
    "payments": [("c-payments", 15.0)],
    "dead-letters": [("c-dlq", 1.0)],
}  # queue -> [(consumer tag, mean processing ms)]
PEERS = {
    tag: (f"10.0.1.{i + 10}", 40000 + i)
    for i, tag in enumerate(c for cs in CONSUMERS.values() for c, _ in cs)
}
DLX = "dlx"


class Writer:
    """Formats event tuples and writes them to files of ``per_file`` events."""

    def __init__(self, out: str, per_file: int) -> None:
        os.makedirs(out, exist_ok=True)
        self.out = out
        self.per_file = per_file
        self.count = 0
        self._file: IO[str] | None = None
        self._lines: list[str] = []
        self._n = 0
        self.files: list[str] = []

    def emit(self, event: tuple[Any, ...]) -> None:
        self._lines.append(FORMATS[event[0]](event, 0))
        if len(self._lines) >= min(10_000, self.per_file):
            self._flush()

    def _flush(self) -> None:
        text = "".join(self._lines)
        events = text.count("\n")
        if self._file is None or self._n >= self.per_file:
            if self._file is not None:
                self._file.close()
            name = f"warren-trace-synthetic-{len(self.files):04d}.ndjson"
            self.files.append(name)
            self._file = open(os.path.join(self.out, name), "w", encoding="utf-8")  # noqa: SIM115
            self._n = 0
        self._file.write(text)
        self._n += events
        self.count += events
        self._lines = []

    def close(self) -> None:
        self._flush()
        if self._file is not None:
            self._file.close()


def _props(message_id: str) -> bytes:
    raw = message_id.encode()
    return b"\x00\x80" + bytes([len(raw)]) + raw  # message_id only


def generate(
    out: str,
    messages: int,
    seed: int = 1,
    rate: float = 2000.0,
    start: float = 1_767_225_600.0,
    per_file: int = 1_000_000,
) -> int:
    """Write the trace; returns the number of events."""
    rnd = random.Random(seed)
    w = Writer(out, per_file)
    emit = w.emit
    ns = 1000  # microseconds to the tuples' nanoseconds
    for queue, tags in CONSUMERS.items():
        for tag, _ in tags:
            emit((t.CONSUMER_ADDED, int(start * 1e9), VHOST, queue, tag, 50, False, PEERS[tag], 1))
    for i in range(messages):
        now = int((start + i / rate) * 1e6) + rnd.randrange(0, 300)  # microseconds
        tid = 1_000_000_000 + i
        kind = rnd.random()
        if kind < 0.5:
            queues: tuple[str, ...] = ("orders", "audit") if rnd.random() < 0.1 else ("orders",)
            rk = "orders"
        elif kind < 0.8:
            queues, rk = ("emails",), "emails"
        elif kind < 0.999:
            queues, rk = ("payments",), "payments"
        else:
            queues, rk = (), "nowhere"  # unroutable
        emit(
            (
                t.PUBLISHED,
                now * ns,
                VHOST,
                tid,
                "app",
                rk,
                100 + (i % 400),
                _props(f"m-{i}"),
                PUBLISHER,
                1,
                i + 1,
                queues if len(queues) != 1 else queues[0],
                False,
            )
        )
        emit((t.CONFIRMED, (now + 150) * ns, VHOST, PUBLISHER, 1, i + 1, i + 1, True))
        for queue in queues:
            _copy(emit, rnd, tid, queue, now + 5)
    w.close()
    return w.count


def _copy(
    emit: Callable[[tuple[Any, ...]], None], rnd: random.Random, tid: int, queue: str, now: int
) -> None:
    """One copy's life in ``queue`` from ``now`` (microseconds)."""
    ns = 1000
    consumers = CONSUMERS[queue]
    if queue == "emails" and rnd.random() < 0.02:  # TTL ran out before a consumer took it
        now += 60_000_000
        emit((t.DEAD, now * ns, VHOST, tid, queue, "expired", DLX, None))
        _dead_letter(emit, rnd, tid, now)
        return
    failed = 0
    attempt = 0
    while True:
        now += int(rnd.expovariate(1 / 3000))  # wait in the queue, mean 3 ms
        tag, mean_ms = consumers[rnd.randrange(len(consumers))]
        attempt += 1
        emit(
            (
                t.DELIVERED,
                now * ns,
                VHOST,
                tid,
                queue,
                tag,
                attempt,
                attempt > 1,
                failed,
                False,
                PEERS[tag],
                1,
            )
        )
        now += int(rnd.lognormvariate(0, 0.5) * mean_ms * 1000)
        roll = rnd.random()
        if queue == "payments" and roll < 0.03:  # consumer timeout: back, without counting
            emit(
                (
                    t.CONSUMER_TIMED_OUT,
                    now * ns,
                    VHOST,
                    queue,
                    tag,
                    PEERS[tag],
                    1,
                    (attempt,),
                    (tid,),
                    30000,
                    "cancel",
                )
            )
            emit((t.REQUEUED, now * ns, VHOST, tid, queue, "consumer_timeout"))
        elif queue == "payments" and roll < 0.10:  # nack: a failed delivery, delayed retry
            failed += 1
            emit((t.NACKED, now * ns, VHOST, tid, queue, tag, attempt, True))
            if failed > 3:  # delivery limit
                emit((t.DEAD, now * ns, VHOST, tid, queue, "delivery_limit", DLX, None))
                _dead_letter(emit, rnd, tid, now)
                return
            delay = 1000 * failed
            emit((t.RETRY, now * ns, VHOST, tid, queue, failed, delay, "nack"))
            now += delay * 1000
        elif queue == "emails" and roll < 0.05:  # nack with requeue
            emit((t.NACKED, now * ns, VHOST, tid, queue, tag, attempt, True))
            emit((t.REQUEUED, now * ns, VHOST, tid, queue, "nack"))
        elif queue == "emails" and roll < 0.06:  # reject: dead-lettered
            emit((t.NACKED, now * ns, VHOST, tid, queue, tag, attempt, False))
            emit((t.DEAD, now * ns, VHOST, tid, queue, "rejected", DLX, None))
            _dead_letter(emit, rnd, tid, now)
            return
        else:
            emit((t.ACKED, now * ns, VHOST, tid, queue, tag, attempt))
            return


def _dead_letter(
    emit: Callable[[tuple[Any, ...]], None], rnd: random.Random, tid: int, now: int
) -> None:
    now += 20
    emit((t.ROUTED, now * 1000, VHOST, tid, DLX, "dead", ("dead-letters",)))
    _copy(emit, rnd, tid, "dead-letters", now)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m warren.pipeline.generate", description=__doc__)
    p.add_argument("--out", required=True)
    p.add_argument("--messages", type=int, default=2_000_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rate", type=float, default=2000.0, help="messages per second (2000)")
    args = p.parse_args(argv)
    started = time.monotonic()
    events = generate(args.out, args.messages, args.seed, args.rate)
    elapsed = time.monotonic() - started
    print(f"{events:,} events for {args.messages:,} messages in {args.out} ({elapsed:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
