#!/usr/bin/env python3
"""Routing rate against the number of bindings, Warren and RabbitMQ side by side (issue 24).

    routing_curve.py --warren-url URL --rabbit-url URL [--kind topic] \
        [--bindings 100,1000,10000,100000] [--time 3] [--runs 2] [--json FILE]

For each N, both brokers get an exchange of ``--kind`` with N bindings to 4 queues
(x-max-length 1000, so that what is measured is routing, not a growing backlog):

    topic    binding i: ``user.<i>.#``     routing keys ``user.<random i>.x``
    direct   binding i: ``device-<i>``     routing keys ``device-<random i>``
    headers  binding i: x-match all, user=<i>   messages with the header user=<random i>

One publisher per broker (raw frames encoded beforehand, publisher confirms, at most 4,000
unconfirmed) then publishes for ``--time`` seconds; the rate is confirmed messages per
second. Runs alternate between the brokers (who goes first alternates too), and the table
shows the medians and the ratio Warren/RabbitMQ, with the machine's load average. The
bindings are set up with pipelined no-wait queue.binds; their set-up time is reported too.

With the brokers' pids (``--warren-pid``/``--rabbit-pid``, or WARREN_PID/RABBIT_PID as
with_broker.py and compare.sh set them) it also reports the CPU time each broker spent
per message (utime + stime from /proc, all threads): on a loaded machine the rates follow
the load, the CPU per message much less.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import statistics
import struct
import sys
import time
from typing import Any
from urllib.parse import urlsplit

from pamqp import commands

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/: the raw-frame client
from amqp_raw import (  # noqa: E402
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_METHOD,
    RawClient,
    build,
    frame_bytes,
    header_payload,
    method_payload,
)

QUEUES = 4
WINDOW = 4000  # unconfirmed publishes at most
BATCH = 200  # publishes per write
POOL = 20_000  # distinct publishes encoded per point, sent round and round
FRAME = struct.Struct(">BHI")
TICK = os.sysconf("SC_CLK_TCK")
ACK = b"\x00\x3c\x00\x50"  # basic.ack
NACK = b"\x00\x3c\x00\x78"
SHAPES = {  # kind: (binding key of binding i, routing key for binding i)
    "topic": ("user.{}.#", "user.{}.x"),
    "direct": ("device-{}", "device-{}"),
    "headers": ("", ""),
}


def connect(url: str) -> RawClient:
    parts = urlsplit(url)
    c = RawClient((parts.hostname or "127.0.0.1", parts.port or 5672), timeout=600)
    c.handshake(user=parts.username or "guest", password=parts.password or "guest")
    c.channel_open(1)
    c.confirm_select(1)
    return c


def method(m: Any) -> bytes:
    return frame_bytes(FRAME_METHOD, 1, method_payload(m))


def set_up(c: RawClient, kind: str, exchange: str, n: int) -> float:
    """The exchange, the queues and n bindings; seconds the bindings took."""
    c.declare_exchange(1, exchange, kind, auto_delete=False)
    queues = [f"{exchange}.q{i}" for i in range(QUEUES)]
    for q in queues:
        c.declare_queue(1, q, arguments={"x-max-length": 1000})
    start = time.perf_counter()
    pattern = SHAPES[kind][0]
    for first in range(0, n, 5000):  # in slices: a broker reading slowly is not an error
        c.send(
            b"".join(
                method(
                    build(
                        commands.Queue.Bind,
                        queue=queues[i % QUEUES],
                        exchange=exchange,
                        routing_key=pattern.format(i),
                        arguments={"x-match": "all", "user": i} if kind == "headers" else {},
                        nowait=True,
                    )
                )
                for i in range(first, min(n, first + 5000))
            )
        )
    c.declare_queue(1, queues[0], passive=True)  # a round trip: every bind is done
    return time.perf_counter() - start


def tear_down(c: RawClient, exchange: str) -> None:
    c.delete_exchange(1, exchange)
    for i in range(QUEUES):
        c.delete_queue(1, f"{exchange}.q{i}")


def encoded(kind: str, exchange: str, n: int, seed: int) -> list[bytes]:
    """POOL publishes to random bindings' keys, BATCH to a bytes object."""
    rnd = random.Random(seed)
    key_format = SHAPES[kind][1]
    body = frame_bytes(FRAME_BODY, 1, b"x" * 16)
    plain_header = frame_bytes(FRAME_HEADER, 1, header_payload(16))
    out, batch = [], []
    for _ in range(POOL):
        i = rnd.randrange(n)
        if kind == "headers":
            props = commands.Basic.Properties(headers={"user": i})
            header = frame_bytes(FRAME_HEADER, 1, header_payload(16, props))
        else:
            header = plain_header
        publish = build(commands.Basic.Publish, exchange=exchange, routing_key=key_format.format(i))
        batch.append(method(publish) + header + body)
        if len(batch) == BATCH:
            out.append(b"".join(batch))
            batch = []
    return out


def confirmed_upto(c: RawClient, buf: bytearray, upto: int) -> int:
    """Parse what arrived: the highest sequence number acked (acks come in order)."""
    data = c.sock.recv(1 << 20)
    if not data:
        raise RuntimeError("the broker closed the connection")
    buf += data
    while len(buf) >= 7:
        kind, _, size = FRAME.unpack_from(buf)
        if len(buf) < size + 8:
            break
        payload = bytes(buf[7 : 7 + size])
        del buf[: size + 8]
        if kind == FRAME_METHOD and payload[:4] == ACK:
            upto = max(upto, struct.unpack_from(">Q", payload, 4)[0])
        elif kind == FRAME_METHOD:
            raise RuntimeError(f"unexpected method {payload[:4].hex()} (a nack or a close)")
    return upto


def publish(c: RawClient, batches: list[bytes], seconds: float) -> tuple[int, float]:
    """Publish round the pool for ``seconds``: (messages confirmed, seconds until the last
    confirm); NaN seconds if the broker stopped reading or confirming for a minute."""
    c.sock.settimeout(60)
    try:
        return _publish(c, batches, seconds)
    except TimeoutError:
        return 0, float("nan")
    finally:
        c.sock.settimeout(c.timeout)


def _publish(c: RawClient, batches: list[bytes], seconds: float) -> tuple[int, float]:
    # sequence numbers go on across runs on the channel, and so do the acks' delivery tags
    base = sent = done = c.publish_seq[1]
    buf = bytearray()
    start = time.perf_counter()
    deadline = start + seconds
    i = 0
    while time.perf_counter() < deadline:
        if sent - done < WINDOW:
            c.sock.sendall(batches[i % len(batches)])
            i += 1
            sent += BATCH
        readable, _, _ = select.select([c.sock], [], [], 0 if sent - done < WINDOW else 5)
        if readable:
            done = confirmed_upto(c, buf, done)
    while done < sent:
        done = confirmed_upto(c, buf, done)
    assert done == sent, f"acks up to {done}, {sent} published"
    c.publish_seq[1] = sent
    c.settled[1] = {}
    return sent - base, time.perf_counter() - start


def cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return float("nan")
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def curve(args: argparse.Namespace) -> list[dict[str, Any]]:
    brokers = {"warren": connect(args.warren_url), "rabbit": connect(args.rabbit_url)}
    pids = {"warren": args.warren_pid, "rabbit": args.rabbit_pid}
    rows = []
    for n in args.bindings:
        # one name per broker: the same broker may stand for both (the script's own test)
        names = {b: f"routing-curve.{args.kind}.{n}.{b}.{os.getpid()}" for b in brokers}
        row: dict[str, Any] = {"kind": args.kind, "bindings": n, "pid": os.getpid()}
        row["load_before"] = os.getloadavg()
        pools = {}
        for name, c in brokers.items():
            row[f"{name}_setup_s"] = set_up(c, args.kind, names[name], n)
            print(f"  {args.kind} {n:>7,} {name:<6} bindings set up in "
                  f"{row[f'{name}_setup_s']:.1f} s", file=sys.stderr, flush=True)  # fmt: skip
            pools[name] = encoded(args.kind, names[name], n, seed=n)
        rates: dict[str, list[float]] = {"warren": [], "rabbit": []}
        cpu: dict[str, list[float]] = {"warren": [], "rabbit": []}  # microseconds per message
        for run in range(args.runs):
            for name in ("warren", "rabbit") if run % 2 == 0 else ("rabbit", "warren"):
                before = cpu_seconds(pids[name])
                count, elapsed = publish(brokers[name], pools[name], args.time)
                used = cpu_seconds(pids[name]) - before
                rate = count / elapsed
                rates[name].append(rate)
                cpu[name].append(used * 1e6 / count if count else float("nan"))
                print(f"  {args.kind} {n:>7,} {name:<6} run {run}: {rate:,.0f} msg/s, "
                      f"{cpu[name][-1]:.1f} us CPU/msg", file=sys.stderr, flush=True)  # fmt: skip
        for name, c in brokers.items():
            tear_down(c, names[name])
            row[f"{name}_rates"] = rates[name]
            row[name] = statistics.median(rates[name])
            row[f"{name}_cpu_us"] = statistics.median(cpu[name])
        row["ratio"] = row["warren"] / row["rabbit"]
        row["load_after"] = os.getloadavg()
        rows.append(row)
    for c in brokers.values():
        c.close()
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    first = rows[0]
    lines = [
        "| bindings | Warren msg/s | RabbitMQ msg/s | ratio W/R | Warren vs its first point "
        "| CPU us/msg W / R | ratio R/W | Warren CPU/msg, first point / this "
        "| bind set-up W / R, s | load avg |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        w_cpu, r_cpu = r["warren_cpu_us"], r["rabbit_cpu_us"]
        lines.append(
            f"| {r['bindings']:,} | {r['warren']:,.0f} | {r['rabbit']:,.0f} | {r['ratio']:.2f} "
            f"| {r['warren'] / first['warren']:.2f} | {w_cpu:.1f} / {r_cpu:.1f} "
            f"| {r_cpu / w_cpu:.2f} | {first['warren_cpu_us'] / w_cpu:.2f} "
            f"| {r['warren_setup_s']:.1f} / {r['rabbit_setup_s']:.1f} "
            f"| {r['load_before'][0]:.1f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warren-url", default="amqp://guest:guest@127.0.0.1:5673/")
    parser.add_argument("--rabbit-url", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--kind", choices=list(SHAPES), default="topic")
    parser.add_argument(
        "--bindings",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[100, 1000, 10_000, 100_000],
    )
    parser.add_argument("--time", type=float, default=3.0, help="seconds per run")
    parser.add_argument("--runs", type=int, default=2, help="runs per broker and point")
    parser.add_argument("--json", help="also write the rows here")
    for name in ("warren", "rabbit"):
        pid = os.environ.get(f"{name.upper()}_PID")
        parser.add_argument(f"--{name}-pid", type=int, default=int(pid) if pid else None)
    args = parser.parse_args()
    rows = curve(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"{args.kind} exchange, {args.time:g} s x {args.runs} runs per broker and point:")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
