#!/usr/bin/env python3
"""Do many expiring messages slow delivery down? ``python tests/benchmarks/ttl_bench.py``

Starts a Warren (``with_broker.warren``) and measures 1 producer / 1 consumer
throughput with bench.py in three situations, each for ``--seconds`` and
``--runs`` times (the median is reported):

* plain: nothing else in the broker;
* parked: ``--parked`` messages (default 1,000,000) with random per-message TTLs
  between 10 min and 1 h sit in another queue ("ttl-parked") the whole time;
* parked+ttl: the same, and every benchmark message carries a per-message TTL
  (expiration 30 min) too, so the hot queue tracks deadlines as well.

The 1 p / 1 c figures come from bench.py (its workers are forked from this
process, so the "parked+ttl" publisher is bench.py's with an expiration
property added). The broker's resident memory is printed after each phase.

    python tests/benchmarks/ttl_bench.py [--seconds 10] [--runs 3] [--parked 1000000]
        [--modes prefetch100,autoack] [--port N]
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import statistics
import struct
import sys
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench  # noqa: E402
from pamqp import body as pbody  # noqa: E402
from pamqp import commands, frame, header  # noqa: E402
from with_broker import warren  # noqa: E402

MODES = {
    "prefetch100": {"prefetch": 100, "autoack": False, "multi_ack": 10},
    "autoack": {"prefetch": 0, "autoack": True, "multi_ack": 10},
}
TEN_MINUTES_MS = 600_000
ONE_HOUR_MS = 3_600_000
HOT_TTL = "1800000"  # the per-message TTL of the bench messages in "parked+ttl"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def drain_stderr(proc: Any) -> None:
    """The broker logs to a pipe nobody reads after start-up: keep it from filling."""

    def pump() -> None:
        for _ in proc.stderr:
            pass

    threading.Thread(target=pump, daemon=True).start()


# -- filling a queue with expiring messages ------------------------------------------------------


def _frame(kind: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", kind, bench.CH, len(payload)) + payload + b"\xce"


def fill(url: str, queue: str, count: int, size: int, seed: int = 1) -> float:
    """Publish ``count`` messages with random expirations (10 min - 1 h); returns the seconds."""
    conn = bench.Conn(bench.parse_url(url), "filler")
    try:
        conn.rpc(commands.Queue.Declare(queue=queue, durable=True), commands.Queue.DeclareOk)
        conn.rpc(commands.Queue.Purge(queue=queue), commands.Queue.PurgeOk)
        method = frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), bench.CH)
        body = frame.marshal(pbody.ContentBody(b"p" * size), bench.CH) if size else b""
        rng = random.Random(seed)
        start = time.monotonic()
        batch: list[bytes] = []
        for i in range(count):
            expiration = str(rng.randint(TEN_MINUTES_MS, ONE_HOUR_MS)).encode()
            # content header: class 60, weight 0, body size, flags (expiration only), shortstr
            props = struct.pack(">HHQHB", 60, 0, size, 0x0100, len(expiration)) + expiration
            batch.append(method + _frame(2, props) + body)
            if len(batch) == 2000 or i == count - 1:
                conn.sock.sendall(b"".join(batch))
                batch.clear()
        while True:  # the broker has them all when a passive declare counts them
            ok = conn.rpc(
                commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk
            )
            if ok.message_count >= count:
                return time.monotonic() - start
            time.sleep(0.2)
    finally:
        conn.close()


# -- one bench.py run ---------------------------------------------------------------------------


def with_expiration(expiration: str) -> Any:
    """bench.publish_triple, with an expiration property on every message."""

    def triple(routing_key: str, size: int, frame_max: int) -> bytes:
        payload = b"x" * size
        chunk = frame_max - 8
        parts = [
            frame.marshal(commands.Basic.Publish(exchange="", routing_key=routing_key), bench.CH),
            frame.marshal(
                header.ContentHeader(0, size, commands.Basic.Properties(expiration=expiration)),
                bench.CH,
            ),
        ]
        parts += [
            frame.marshal(pbody.ContentBody(payload[i : i + chunk]), bench.CH)
            for i in range(0, size, chunk)
        ]
        return b"".join(parts)

    return triple


def run_bench(url: str, queue: str, seconds: float, mode: str, expiration: str | None) -> float:
    cfg: dict[str, Any] = {
        "url": url,
        "queue": queue,
        "seconds": seconds,
        "drain": 2.0,
        "producers": 1,
        "consumers": 1,
        "size": 16,
        "confirm": 0,
        "quiet": True,
        **MODES[mode],
    }
    original = bench.publish_triple
    if expiration is not None:
        bench.publish_triple = with_expiration(expiration)
    try:
        report, status = bench.run(cfg)
    finally:
        bench.publish_triple = original
    if status != 0 or report.get("errors"):
        raise SystemExit(f"bench.py failed: {report.get('errors')}")
    return float(report["consume_rate"])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--parked", type=int, default=1_000_000)
    parser.add_argument("--parked-size", type=int, default=16, help="body bytes of parked ones")
    parser.add_argument("--modes", default="prefetch100,autoack")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    port = args.port or free_port()
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    results: dict[tuple[str, str], list[float]] = {}
    with warren(port) as proc:
        drain_stderr(proc)
        print(f"broker pid {proc.pid}, RSS {rss_mib(proc.pid):.0f} MiB at start", file=sys.stderr)

        def phase(label: str, expiration: str | None) -> None:
            for run in range(args.runs):
                for mode in modes:
                    queue = f"bench-{label}-{mode}"
                    rate = run_bench(url, queue, args.seconds, mode, expiration)
                    results.setdefault((label, mode), []).append(rate)
                    print(
                        f"{label:11} {mode:12} run {run + 1}: {rate:,.0f} msg/s, "
                        f"RSS {rss_mib(proc.pid):.0f} MiB",
                        file=sys.stderr,
                    )

        phase("plain", None)
        took = fill(url, "ttl-parked", args.parked, args.parked_size)
        print(
            f"parked {args.parked:,} messages with random TTLs (10 min - 1 h) in {took:.1f} s "
            f"({args.parked / took:,.0f} msg/s), RSS {rss_mib(proc.pid):.0f} MiB",
            file=sys.stderr,
        )
        phase("parked", None)
        phase("parked+ttl", HOT_TTL)
        print(f"RSS at the end {rss_mib(proc.pid):.0f} MiB", file=sys.stderr)

    print(f"\n1 producer / 1 consumer, 16 B, {args.seconds:g} s runs, median of {args.runs}\n")
    print("| mode | plain | 1M parked with TTLs | ratio | parked + TTL on every message | ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for mode in modes:
        plain = statistics.median(results[("plain", mode)])
        parked = statistics.median(results[("parked", mode)])
        hot = statistics.median(results[("parked+ttl", mode)])
        print(
            f"| {mode} | {plain:,.0f} | {parked:,.0f} | {parked / plain:.2f} "
            f"| {hot:,.0f} | {hot / plain:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
