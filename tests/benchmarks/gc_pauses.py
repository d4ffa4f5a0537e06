"""How long the cyclic collector stops the broker while a backlog builds, per threshold setting.

    python tests/benchmarks/gc_pauses.py [--messages 3000000] [--rounds 3]
        [--thresholds 10000,0,300 50000,10,10 700,10,10]

In this process, queues ``--messages`` of Warren's ``Message`` objects on a deque (what a
queue holds while nobody consumes), with each setting in turn, and times every collection
through ``gc.callbacks``. Prints, per setting, the medians over the rounds of: the time
to queue them all, the collector's share of it, the longest single collection, and how
many collections ran. A collection's length is how long the event loop stops: nothing is
read, written or timed out meanwhile. Run from outside the repository with
``PYTHONPATH=build/compiled`` for the compiled build.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections import deque
from typing import Any

from warren.broker.engine.message import Message


def one_run(thresholds: tuple[int, int, int], messages: int) -> tuple[float, float, float, int]:
    """(seconds to queue them, seconds collecting, longest collection, collections)."""
    pauses: list[float] = []
    started = 0.0

    def timer(phase: str, info: dict[str, Any]) -> None:
        nonlocal started
        if phase == "start":
            started = time.perf_counter()
        else:
            pauses.append(time.perf_counter() - started)

    gc.collect()
    gc.set_threshold(*thresholds)
    gc.callbacks.append(timer)
    try:
        queue: deque[Message] = deque()
        body = b"x" * 16
        begin = time.perf_counter()
        for _ in range(messages):
            queue.append(Message("", "q", b"\x00\x00", body))
        took = time.perf_counter() - begin
    finally:
        gc.callbacks.remove(timer)
        gc.set_threshold(700, 10, 10)
    del queue
    return took, sum(pauses), max(pauses, default=0.0), len(pauses)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--thresholds", nargs="+", default=["10000,0,300", "50000,10,10", "700,10,10"]
    )
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float, float, int]]] = {t: [] for t in args.thresholds}
    for _ in range(args.rounds):  # alternating, so that drift hits every setting
        for text in args.thresholds:
            first, second, third = (int(part) for part in text.split(","))
            results[text].append(one_run((first, second, third), args.messages))
    print(f"{args.messages:,} messages queued, medians of {args.rounds} rounds")
    print("| thresholds | seconds to queue them | collecting | longest collection | collections |")
    print("|---|---:|---:|---:|---:|")
    for text, runs in results.items():
        took = statistics.median(r[0] for r in runs)
        collecting = statistics.median(r[1] for r in runs)
        longest = statistics.median(r[2] for r in runs)
        count = statistics.median(r[3] for r in runs)
        print(
            f"| {text} | {took:.2f} | {collecting * 1000:.0f} ms | {longest * 1000:.1f} ms "
            f"| {count:.0f} |"
        )


if __name__ == "__main__":
    main()
