"""How throughput changes with the number of consumers, queues and channels, and how fast
queues are declared, bound and deleted: Warren and RabbitMQ side by side (issue 24).

    python tests/benchmarks/scale_curves.py [all|consumers|queues|channels|blocked|
        blocked-priority|churn|exchanges] [--seconds 5] [--runs 2]
        [--rabbit-url amqp://guest:guest@127.0.0.1:5672/] [--baseline-url URL]

starts a fresh Warren (``--config tests/rabbitmq-3.x.conf``, on a free port, its management
API on another, no Prometheus port; or ``--warren-url`` and ``--warren-api`` for one already
running), alternates the brokers run by run
(who goes first alternates too) and prints a table of the medians and the ratio
Warren/RabbitMQ with the load average. ``--baseline-url`` adds a third broker to the
alternation (another Warren, e.g. the previous commit's on a port of its own): its column,
and the ratio Warren/baseline.

The load (16-byte transient messages, non-durable queues, prefetch 100 per consumer,
manual acks: what one socket read brought, one ``multiple=true`` ack per channel) runs in
a few client processes (raw frames: publishes encoded once, deliveries counted by walking the frame
headers, as tests/benchmarks/bench.py does), so that the clients stay cheaper than either
broker. Publishers keep at most ``WINDOW`` messages a client process in flight (published,
not yet delivered), so no backlog grows whatever the rate: the figure is messages
delivered (and acked) per second over ``--seconds``.

    consumers N  one queue, N consumers (channels of 4 connections), one publisher; with
                 ``--prefetch 1`` and N > WINDOW most consumers wait at their limit
    queues N     N queues, one consumer each, published to in turn (4 connections)
    channels N   one connection, N channels, a queue and its consumer on each
    blocked N    one queue, N consumers at their limit (prefetch 1, never acked), one
                 publisher publishing as fast as the broker takes it; also the broker's CPU
                 µs per message, from /proc (Warren started here, ``--warren-pid``,
                 ``--baseline-pid``; RabbitMQ: ``--rabbit-pid``, by default the one beam.smp)
    blocked-priority N
                 the same with consumer priorities: consumer i has x-priority i % 10 (so N = 1
                 is one priority, Warren's plain dispatch)
    churn N      one connection: N queue.declare, N queue.bind (amq.direct), N
                 queue.unbind, N queue.delete, pipelined 100 deep: operations per second;
                 before the unbinds, 100 policies (one queue each) set and cleared one
                 management API request at a time (Warren's on a free port; RabbitMQ's at
                 --rabbit-api)
    exchanges N  beside N fanout exchanges, 2,000 queues each bound from one of them are
                 deleted, then the N exchanges (pipelined 100 deep): operations per second
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import multiprocessing as mp
import os
import select
import socket
import statistics
import struct
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from pamqp import body as pbody
from pamqp import commands, frame, header

sys.path.insert(0, str(Path(__file__).parent))
from bench import FRAME_HEAD, Conn, parse_url
from with_broker import warren

RABBIT_URL = "amqp://guest:guest@127.0.0.1:5672/"
POINTS = {
    "consumers": [1, 10, 100, 1000],
    "queues": [1, 10, 100, 1000, 10000],
    "channels": [1, 10, 100, 1000],
    "blocked": [1, 100, 1000],
    "blocked-priority": [1, 100, 1000],
    "churn": [1000, 10000],
    "exchanges": [100, 1000, 10000],
}
CONNECTIONS = 4  # client processes for the consumers and queues curves
WINDOW = 2000  # messages in flight per publishing process
PREFETCH = 100
DEPTH = 100  # pipelined set-up and churn operations
POLICIES = 100  # set and cleared in the churn curve
EXCHANGE_QUEUES = 2000  # declared, bound and deleted beside the exchanges curve's N
LEVELS = 10  # consumer priorities of the blocked-priority curve
ACK = struct.Struct(">BHIHHQBB")
DELIVER_TAG = struct.Struct(">Q")


def publish_frames(channel: int, queue: str) -> bytes:
    return b"".join((
        frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), channel),
        frame.marshal(header.ContentHeader(0, 16, commands.Basic.Properties()), channel),
        frame.marshal(pbody.ContentBody(b"x" * 16), channel),
    ))  # fmt: skip


class Client:
    """One connection with channels 1..n open (bench.Conn opens channel 1)."""

    def __init__(self, url: str, channels: int, name: str) -> None:
        self.conn = Conn(parse_url(url), name)
        self.conn.sock.settimeout(60)
        for ch in range(2, channels + 1):
            self.conn.send(commands.Channel.Open(), ch)
        for _ in range(2, channels + 1):
            self.conn.expect(commands.Channel.OpenOk)

    def pipeline(self, requests: list[tuple[int, Any]], reply: type) -> None:
        """Send ``requests`` (channel, method) keeping DEPTH unanswered; wait for every reply."""
        sent = answered = 0
        while answered < len(requests):
            batch = []
            while sent < len(requests) and sent - answered < DEPTH:
                ch, method = requests[sent]
                batch.append(frame.marshal(method, ch))
                sent += 1
            if batch:
                self.conn.sock.sendall(b"".join(batch))
            self.conn.expect(reply)
            answered += 1


def worker(
    url: str, index: int, spec: dict[str, Any], counts: Any, go: Any, stop: Any, ready: Any
) -> None:
    """A client process: consumers on its channels, and publishes when ``spec`` says so."""
    client = Client(url, spec["channels"], f"client-{index}")
    conn = client.conn
    consumes = spec["consume"]  # [(channel, queue)]
    for ch in sorted({ch for ch, _ in consumes}):
        conn.send(commands.Basic.Qos(prefetch_count=spec["prefetch"]), ch)
        conn.expect(commands.Basic.QosOk)
    client.pipeline(
        [(ch, commands.Basic.Consume(queue=q, consumer_tag=f"c{index}.{i}"))
         for i, (ch, q) in enumerate(consumes)],
        commands.Basic.ConsumeOk,
    )  # fmt: skip
    batch = b"".join(publish_frames(ch, q) for ch, q in spec["publish"])
    per_batch = len(spec["publish"])
    while per_batch and per_batch < 200:
        batch, per_batch = batch * 2, per_batch * 2
    shared = spec.get("shared", False)  # its messages are consumed by the other processes
    sock = conn.sock
    sock.setblocking(False)
    received = sent = 0
    pending = b""
    out = bytearray()
    ready.release()
    go.wait()
    while not stop.is_set():
        in_flight = sent - (sum(counts) if shared else received)
        if per_batch and len(out) < len(batch) and in_flight < WINDOW:
            out += batch
            sent += per_batch
        readable, writable, _ = select.select([sock], [sock] if out else [], [], 0.01)
        if writable:
            with contextlib.suppress(BlockingIOError):
                del out[: sock.send(out)]
        if not readable:
            continue
        try:
            data = sock.recv(1 << 20)
        except BlockingIOError:
            continue
        if not data:
            raise SystemExit(f"client-{index}: connection closed by the broker")
        buf = pending + data
        pos, n = 0, len(buf)
        last_tag: dict[int, int] = {}
        while n - pos >= 8:
            ftype, ch, size = FRAME_HEAD.unpack_from(buf, pos)
            end = pos + 7 + size
            if end >= n:
                break
            if ftype == 1:
                cls, meth = struct.unpack_from(">HH", buf, pos + 7)
                if cls == 60 and meth == 60:
                    at = pos + 11
                    at += 1 + buf[at]  # the consumer tag
                    last_tag[ch] = DELIVER_TAG.unpack_from(buf, at)[0]
                    received += 1
                elif (cls, meth) in ((10, 50), (20, 40)):
                    raise SystemExit(f"client-{index}: the broker closed: {buf[pos:end]!r}")
            pos = end + 1
        pending = buf[pos:]
        counts[index] = received
        for ch, tag in last_tag.items():  # what one read brought, acked per channel at once
            out += ACK.pack(1, ch, 13, 60, 80, tag, 1, 0xCE)
    sock.setblocking(True)
    if out:
        sock.sendall(out)
    conn.pending = pending
    conn.close()


def layout(curve: str, n: int) -> tuple[list[str], list[dict[str, Any]]]:
    """The queues to declare and each client process's channels, consumers and publishes."""
    if curve == "consumers":
        queues = ["scale-consumers"]
        specs = [{"channels": 0, "consume": [], "publish": []} for _ in range(CONNECTIONS)]
        for i in range(n):
            spec = specs[i % CONNECTIONS]
            spec["channels"] += 1
            spec["consume"].append((spec["channels"], queues[0]))
        specs = [s for s in specs if s["channels"]]
        specs.append({"channels": 1, "consume": [], "publish": [(1, queues[0])], "shared": True})
        return queues, specs
    if curve == "queues":
        queues = [f"scale-queue-{i}" for i in range(n)]
        specs = []
        for c in range(min(n, CONNECTIONS)):
            mine = queues[c::CONNECTIONS]
            specs.append({"channels": 1, "consume": [(1, q) for q in mine],
                          "publish": [(1, q) for q in mine]})  # fmt: skip
        return queues, specs
    if curve == "channels":
        queues = [f"scale-channel-{i}" for i in range(n)]
        pairs = [(i + 1, q) for i, q in enumerate(queues)]
        return queues, [{"channels": n, "consume": pairs, "publish": pairs}]
    raise ValueError(curve)


def throughput(url: str, curve: str, n: int, seconds: float, prefetch: int) -> float:
    queues, specs = layout(curve, n)
    for spec in specs:
        spec["prefetch"] = prefetch
    admin = Client(url, 1, "admin")
    admin.pipeline([(1, commands.Queue.Declare(queue=q)) for q in queues],
                   commands.Queue.DeclareOk)  # fmt: skip
    ctx = mp.get_context("fork")
    counts = ctx.RawArray("q", len(specs))
    go, stop, ready = ctx.Event(), ctx.Event(), ctx.Semaphore(0)
    procs = [
        ctx.Process(target=worker, args=(url, i, spec, counts, go, stop, ready), daemon=True)
        for i, spec in enumerate(specs)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        if not ready.acquire(timeout=300):
            raise SystemExit(f"{curve} {n}: the clients did not get ready")
    go.set()
    time.sleep(1)  # warm-up
    start, began = time.monotonic(), sum(counts)
    time.sleep(seconds)
    done, took = sum(counts) - began, time.monotonic() - start
    stop.set()
    for p in procs:
        p.join(30)
        if p.exitcode != 0:
            raise SystemExit(f"{curve} {n}: a client failed ({p.exitcode})")
    admin.pipeline([(1, commands.Queue.Delete(queue=q)) for q in queues],
                   commands.Queue.DeleteOk)  # fmt: skip
    admin.conn.close()
    return done / took


def http(api: str, method: str, path: str, body: dict[str, Any] | None = None) -> None:
    """One management API request (guest/guest); an error status raises."""
    request = urllib.request.Request(
        api + path, method=method, data=None if body is None else json.dumps(body).encode(),
        headers={"content-type": "application/json",
                 "authorization": "Basic " + base64.b64encode(b"guest:guest").decode()},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as reply:
        reply.read()


def wait_for_api(api: str, tries: int = 300) -> None:
    for _ in range(tries):
        try:
            http(api, "GET", "/api/overview")
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"no management API at {api}")


def policies(api: str, names: list[str]) -> dict[str, float]:
    """POLICIES policies set and cleared one request at a time, each matching one of the
    queues (all ``names`` exist meanwhile): what a policy change costs beside N queues."""
    rates = {}
    for phase in ("policy set", "policy clear"):
        start = time.monotonic()
        for i in range(POLICIES):
            path = f"/api/policies/%2F/scale-policy-{i}"
            if phase == "policy set":
                http(api, "PUT", path, {"pattern": f"^{names[i * len(names) // POLICIES]}$",
                                        "definition": {"max-length": 1000},
                                        "apply-to": "queues", "priority": 0})  # fmt: skip
            else:
                http(api, "DELETE", path)
        rates[phase] = POLICIES / (time.monotonic() - start)
    return rates


def churn(url: str, n: int, api: str | None) -> dict[str, float]:
    """Operations per second of each phase."""
    client = Client(url, 1, "churn")
    names = [f"scale-churn-{i}" for i in range(n)]
    phases: list[tuple[str, list[Any], type]] = [
        ("declare", [commands.Queue.Declare(queue=q) for q in names], commands.Queue.DeclareOk),
        ("bind", [commands.Queue.Bind(queue=q, exchange="amq.direct", routing_key=q)
                  for q in names], commands.Queue.BindOk),
        ("unbind", [commands.Queue.Unbind(queue=q, exchange="amq.direct", routing_key=q)
                    for q in names], commands.Queue.UnbindOk),
        ("delete", [commands.Queue.Delete(queue=q) for q in names], commands.Queue.DeleteOk),
    ]  # fmt: skip
    rates = {}
    for name, methods, reply in phases:
        if name == "unbind" and api:
            rates.update(policies(api, names))
        start = time.monotonic()
        client.pipeline([(1, m) for m in methods], reply)
        rates[name] = n / (time.monotonic() - start)
    client.conn.close()
    return rates


def exchanges(url: str, n: int) -> dict[str, float]:
    """Beside N fanout exchanges: EXCHANGE_QUEUES queues, each bound from one of them, are
    deleted, then the N exchanges (pipelined): operations per second of each."""
    client = Client(url, 1, "exchanges")
    names = [f"scale-x-{i}" for i in range(n)]
    queues = [f"scale-xq-{i}" for i in range(EXCHANGE_QUEUES)]
    client.pipeline([(1, commands.Exchange.Declare(exchange=x, exchange_type="fanout"))
                     for x in names], commands.Exchange.DeclareOk)  # fmt: skip
    client.pipeline([(1, commands.Queue.Declare(queue=q)) for q in queues],
                    commands.Queue.DeclareOk)  # fmt: skip
    client.pipeline([(1, commands.Queue.Bind(queue=q, exchange=names[i % n]))
                     for i, q in enumerate(queues)], commands.Queue.BindOk)  # fmt: skip
    rates = {}
    for figure_, methods, reply in (
        ("queue.delete", [commands.Queue.Delete(queue=q) for q in queues],
         commands.Queue.DeleteOk),
        ("exchange.delete", [commands.Exchange.Delete(exchange=x) for x in names],
         commands.Exchange.DeleteOk),
    ):  # fmt: skip
        start = time.monotonic()
        client.pipeline([(1, m) for m in methods], reply)
        rates[figure_] = len(methods) / (time.monotonic() - start)
    client.conn.close()
    return rates


def cpu_seconds(pid: int | None) -> float:
    """User and system CPU time of process ``pid`` (0.0 without one)."""
    if not pid:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def find_beam() -> int | None:
    """The pid of the machine's one beam.smp (RabbitMQ's Erlang VM), if just one runs."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/comm"):
        with contextlib.suppress(OSError):
            if stat.read_text().strip() == "beam.smp":
                pids.append(int(stat.parent.name))
    return pids[0] if len(pids) == 1 else None


def blocked(
    url: str, n: int, seconds: float, pid: int | None, priorities: bool
) -> dict[str, float]:
    """Messages per second one publisher gets into a queue whose N consumers are all at
    their limit (prefetch 1, never acked): what each publish costs beside them; and the
    broker's CPU per message meanwhile (with ``pid``)."""
    queue = "scale-blocked"
    holder = Client(url, 1, "holder")
    holder.conn.rpc(commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
    holder.conn.rpc(commands.Basic.Qos(prefetch_count=1), commands.Basic.QosOk)
    holder.pipeline(
        [(1, commands.Basic.Consume(queue=queue, consumer_tag=f"b{i}",
                                    arguments={"x-priority": i % LEVELS} if priorities else {}))
         for i in range(n)],
        commands.Basic.ConsumeOk,
    )  # fmt: skip
    publisher = Client(url, 1, "publisher")
    batch = publish_frames(1, queue) * 200
    sent = 0
    cpu = cpu_seconds(pid)
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        publisher.conn.sock.sendall(batch)
        sent += 200
    # the broker has taken every publish once it answers a request sent after them
    publisher.conn.rpc(commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk)
    took = time.monotonic() - start
    cpu = cpu_seconds(pid) - cpu
    holder.conn.sock.close()
    publisher.conn.rpc(commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)
    publisher.conn.close()
    out = {"msg/s": sent / took}
    if pid:
        out["CPU µs/msg"] = cpu * 1e6 / sent
    return out


def measure(
    url: str, curve: str, n: int, args: argparse.Namespace, pid: int | None
) -> dict[str, float]:
    if curve == "churn":
        api = args.warren_api if url != args.rabbit_url else args.rabbit_api
        return churn(url, n, api if args.rabbit_api else None)
    if curve == "exchanges":
        return exchanges(url, n)
    if curve in ("blocked", "blocked-priority"):
        return blocked(url, n, args.seconds, pid, curve == "blocked-priority")
    return {"msg/s": throughput(url, curve, n, args.seconds, args.prefetch)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def figure(value: float) -> float:
    return round(value, 1) if value < 100 else round(value)


def run(args: argparse.Namespace, warren_url: str, warren_pid: int | None) -> list[dict[str, Any]]:
    rows = []
    curves = list(POINTS) if args.curve == "all" else [args.curve]
    brokers = [("warren", warren_url, warren_pid), ("rabbitmq", args.rabbit_url, args.rabbit_pid)]
    if args.baseline_url:
        brokers.append(("baseline", args.baseline_url, args.baseline_pid))
    for curve in curves:
        points = [int(p) for p in args.points.split(",")] if args.points else POINTS[curve]
        for n in points:
            results: dict[str, list[dict[str, float]]] = {who: [] for who, _, _ in brokers}
            for r in range(args.runs):
                for who, url, pid in brokers if r % 2 == 0 else brokers[::-1]:
                    results[who].append(measure(url, curve, n, args, pid))
            for key in results["warren"][0]:
                medians = {who: statistics.median(x[key] for x in results[who] if key in x)
                           for who in results if all(key in x for x in results[who])}  # fmt: skip
                ours, theirs = medians["warren"], medians.get("rabbitmq")
                row: dict[str, Any] = {"curve": curve, "n": n, "figure": key,
                                       "warren": figure(ours)}  # fmt: skip
                row["rabbitmq"] = None if theirs is None else figure(theirs)
                row["ratio"] = round(ours / theirs, 2) if theirs else None
                if args.baseline_url:
                    before = medians.get("baseline")
                    row["baseline"] = None if before is None else figure(before)
                    row["vs baseline"] = round(ours / before, 2) if before else None
                row["load"] = round(os.getloadavg()[0], 1)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    baseline = any("baseline" in r for r in rows)
    head = "| curve | N | figure | Warren | RabbitMQ | ratio |"
    rule = "|---|---:|---|---:|---:|---:|"
    if baseline:
        head, rule = head + " baseline | Warren/baseline |", rule + "---:|---:|"
    lines = [head + " load |", rule + "---:|"]
    for r in rows:
        cells = [r["curve"], f"{r['n']:,}", r["figure"], r["warren"], r["rabbitmq"], r["ratio"]]
        if baseline:
            cells += [r.get("baseline"), r.get("vs baseline")]
        cells.append(r["load"])
        lines.append(
            "| " + " | ".join("-" if c is None else f"{c:,}" if isinstance(c, int) else str(c)
                              for c in cells) + " |"
        )  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("curve", nargs="?", default="all", choices=["all", *POINTS])
    parser.add_argument("--points", help="comma-separated N (default: the curve's own)")
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--prefetch", type=int, default=PREFETCH, help="per consumer")
    parser.add_argument("--rabbit-url", default=RABBIT_URL)
    parser.add_argument("--warren-url", help="a Warren already running (default: start one)")
    parser.add_argument("--warren-api", help="its management API, http://host:port")
    parser.add_argument("--warren-pid", type=int, help="its process (blocked: CPU per message)")
    parser.add_argument("--baseline-url", help="another Warren measured alongside (its column)")
    parser.add_argument("--baseline-pid", type=int, help="its process")
    parser.add_argument("--rabbit-pid", type=int, help="RabbitMQ's beam.smp (default: found)")
    parser.add_argument(
        "--rabbit-api",
        default="http://127.0.0.1:15672",
        help="RabbitMQ's management API ('' to skip the policy churn)",
    )
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if args.rabbit_api and args.curve in ("all", "churn"):
        try:
            wait_for_api(args.rabbit_api, tries=1)
        except (OSError, SystemExit):
            print(f"no management API at {args.rabbit_api}: no policy churn", file=sys.stderr)
            args.rabbit_api = ""
    if args.rabbit_pid is None:
        args.rabbit_pid = find_beam()
    if args.warren_url:
        rows = run(args, args.warren_url, args.warren_pid)
    else:
        port, http_port = free_port(), free_port()
        config = str(Path(__file__).parents[1] / "rabbitmq-3.x.conf")
        if args.rabbit_api:
            args.warren_api = f"http://127.0.0.1:{http_port}"
        with warren(port, ["--config", config], management_port=str(http_port)) as proc:
            if args.warren_api:
                wait_for_api(args.warren_api)  # it listens after the ready line
            rows = run(args, f"amqp://guest:guest@127.0.0.1:{port}/", proc.pid)
    print(f"{started} to {time.strftime('%H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
