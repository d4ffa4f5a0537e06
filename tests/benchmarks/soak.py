"""``make soak``: many connections, channels and queues, publishing and consuming for minutes.

    python tests/benchmarks/soak.py [--minutes 10] [--connections 1000] [--channels 5]
                                    [--queues 2] [--rate 5000] [--workers 4]

Starts a Warren in its own process, then ``--workers`` client processes that
between them open ``--connections`` connections with ``--channels`` channels
each and ``--queues`` queues per channel (by default 1,000 / 5,000 / 10,000).
Every queue has one consumer (manual acks, prefetch 100) and one publisher
(confirms), ``--rate`` messages a second in all. Each message carries its
queue and sequence number, so the consumer sees a loss, a duplicate or a
reordering the moment it happens.

The run passes when: no channel or connection was closed by the broker, no
publish was nacked, every confirmed message was delivered exactly once and
in order, the broker logged nothing at error level, and its memory was flat
after warm-up (RSS sampled every 10 s; the median of the last third of the
samples within max(5 %, 16 MiB) of the median of the first third).
Figures go to stdout and to build/soak-<time>.json.

The clients speak AMQP over asyncio directly (no client library), so that one
client core keeps up with one broker core; mind a 2-core machine's numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import resource
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import typing
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pamqp import commands  # noqa: E402

from warren.protocol.frames import content_frames  # noqa: E402
from warren.protocol.methods import ack_frame, decode_method, make, method_frame  # noqa: E402

SAMPLE_EVERY = 10.0  # seconds between broker RSS samples
PREFETCH = 100
_head = struct.Struct(">BHI")
_deliver_tail = struct.Struct(">QB")
_u64 = struct.Struct(">Q")
_body_head = struct.Struct(">IQd")  # queue index, sequence number, publish time
TRANSIENT = b"\x10\x00\x01"  # properties: delivery_mode = 1


# ---- the client side ------------------------------------------------------------------------


@dataclass
class Queue:
    index: int
    name: str
    channel: Channel
    sent: int = 0  # next sequence number to publish
    confirmed: int = 0  # sequence numbers below this are confirmed
    received: int = 0  # next sequence number the consumer expects


@dataclass
class Channel:
    conn: Conn
    id: int
    queues: list[Queue] = field(default_factory=list)
    publish_seq: int = 0
    unconfirmed: collections.deque[tuple[int, Queue, int]] = field(
        default_factory=collections.deque
    )
    ack_upto: int = 0
    ack_scheduled: bool = False
    consumers: dict[str, Queue] = field(default_factory=dict)
    delivery: tuple[Queue, int, int, bytearray] | None = None  # queue, tag, size, body so far


class Stats:
    def __init__(self) -> None:
        self.published = 0
        self.confirmed = 0
        self.nacked = 0
        self.delivered = 0
        self.duplicates = 0
        self.gaps = 0
        self.errors: list[str] = []
        self.latencies: list[float] = []  # a sample: every 50th delivery
        self.blocked = 0


class Conn(asyncio.Protocol):
    """One AMQP connection: handshake, then the frames of its channels."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.stats = worker.stats
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiters: dict[int, collections.deque[asyncio.Future[Any]]] = {}
        self.channels: dict[int, Channel] = {}
        self.frame_max = 131072
        self.closed = asyncio.get_running_loop().create_future()
        self.writable = True
        self.blocked = False
        self.closing = False

    # -- asyncio.Protocol --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = typing.cast(asyncio.Transport, transport)  # uvloop's: no subclass
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.write(b"AMQP\x00\x00\x09\x01")

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closing:
            self.stats.errors.append(f"connection lost: {exc!r}")
        if not self.closed.done():
            self.closed.set_result(None)
        for waiters in self.waiters.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(ConnectionError("connection lost"))

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        off = 0
        size_all = len(buf)
        while size_all - off >= 8:
            ftype, channel, size = _head.unpack_from(buf, off)
            end = off + 7 + size
            if end >= size_all:
                break
            payload = bytes(buf[off + 7 : end])
            off = end + 1
            if ftype == 1:
                self.on_method(channel, payload)
            elif ftype == 2:
                self.on_header(channel, payload)
            elif ftype == 3:
                self.on_body(channel, payload)
        del buf[:off]

    # -- frames --

    def on_method(self, channel: int, payload: bytes) -> None:
        index = payload[:4]
        if index == b"\x00\x3c\x00\x3c":  # basic.deliver
            ch = self.channels[channel]
            n = payload[4]
            ctag = payload[5 : 5 + n].decode()
            tag, _redelivered = _deliver_tail.unpack_from(payload, 5 + n)
            ch.delivery = (ch.consumers[ctag], tag, -1, bytearray())
            return
        if index in (b"\x00\x3c\x00\x50", b"\x00\x3c\x00\x78"):  # basic.ack / nack
            (tag,) = _u64.unpack_from(payload, 4)
            self.on_confirm(self.channels[channel], tag, bool(payload[12] & 1), index[3] == 0x50)
            return
        method = decode_method(payload)
        if isinstance(method, commands.Connection.Blocked):
            self.blocked = True
            self.stats.blocked += 1
            return
        if isinstance(method, commands.Connection.Unblocked):
            self.blocked = False
            return
        if isinstance(method, commands.Connection.Close | commands.Channel.Close):
            self.stats.errors.append(f"broker closed channel {channel}: {dict(method)}")
            if self.transport is not None:
                self.closing = True
                self.transport.close()
            return
        waiters = self.waiters.get(channel)
        if waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(method)

    def on_header(self, channel: int, payload: bytes) -> None:
        ch = self.channels[channel]
        assert ch.delivery is not None
        queue, tag, _, body = ch.delivery
        (size,) = _u64.unpack_from(payload, 4)
        ch.delivery = (queue, tag, size, body)
        if size == 0:
            self.on_delivery(ch)

    def on_body(self, channel: int, payload: bytes) -> None:
        ch = self.channels[channel]
        assert ch.delivery is not None
        ch.delivery[3].extend(payload)
        if len(ch.delivery[3]) >= ch.delivery[2]:
            self.on_delivery(ch)

    def on_delivery(self, ch: Channel) -> None:
        assert ch.delivery is not None
        queue, tag, _, body = ch.delivery
        ch.delivery = None
        index, seq, sent_at = _body_head.unpack_from(body)
        stats = self.stats
        stats.delivered += 1
        if index != queue.index:
            stats.errors.append(f"message of queue {index} delivered from queue {queue.index}")
        elif seq == queue.received:
            queue.received += 1
        elif seq < queue.received:
            stats.duplicates += 1
        else:
            stats.gaps += 1  # something between was lost or overtaken
            queue.received = seq + 1
        if stats.delivered % 50 == 0:
            stats.latencies.append(time.time() - sent_at)
        ch.ack_upto = tag
        if not ch.ack_scheduled:  # one multiple-ack per channel per loop turn
            ch.ack_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush_acks, ch)

    def flush_acks(self, ch: Channel) -> None:
        ch.ack_scheduled = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(ack_frame(ch.id, ch.ack_upto, True))

    def on_confirm(self, ch: Channel, tag: int, multiple: bool, ack: bool) -> None:
        pending = ch.unconfirmed
        while pending and (pending[0][0] <= tag if multiple else pending[0][0] == tag):
            _, queue, seq = pending.popleft()
            if ack:
                self.stats.confirmed += 1
                queue.confirmed = seq + 1
            else:
                self.stats.nacked += 1
        if not multiple and pending and pending[0][0] < tag:
            self.stats.errors.append("a single confirm out of order")

    # -- requests --

    def send(self, channel: int, method: Any) -> None:
        assert self.transport is not None
        self.transport.write(method_frame(channel, method))

    def expect(self, channel: int) -> asyncio.Future[Any]:
        """The next synchronous reply on ``channel`` (registered before it can arrive)."""
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.setdefault(channel, collections.deque()).append(waiter)
        return waiter

    async def call(self, channel: int, method: Any) -> Any:
        waiter = self.expect(channel)
        self.send(channel, method)
        return await asyncio.wait_for(waiter, 60)

    def publish(self, queue: Queue, size: int) -> None:
        assert self.transport is not None
        ch = queue.channel
        body = _body_head.pack(queue.index, queue.sent, time.time()).ljust(size, b".")
        ch.publish_seq += 1
        ch.unconfirmed.append((ch.publish_seq, queue, queue.sent))
        queue.sent += 1
        self.stats.published += 1
        name = queue.name.encode()
        self.transport.write(
            _head.pack(1, ch.id, 9 + len(name))  # ids 4, reserved 2, exchange 1, key, bits 1
            + b"\x00\x3c\x00\x28\x00\x00\x00"
            + bytes([len(name)])
            + name
            + b"\x00\xce"
        )
        self.transport.writelines(content_frames(ch.id, TRANSIENT, body, self.frame_max))


class Worker:
    def __init__(self, args: argparse.Namespace, number: int) -> None:
        self.args = args
        self.number = number
        self.stats = Stats()
        self.conns: list[Conn] = []
        self.queues: list[Queue] = []

    async def connect_one(self, c: int) -> None:
        loop = asyncio.get_running_loop()
        conn = Conn(self)
        self.conns.append(conn)
        start = conn.expect(0)
        await loop.create_connection(lambda: conn, "127.0.0.1", self.args.port)
        await asyncio.wait_for(start, 60)
        start_ok = make(
            commands.Connection.StartOk,
            client_properties={"product": "warren-soak"},
            mechanism="PLAIN",
            response=b"\x00guest\x00guest",
            locale="en_US",
        )
        tuned = await conn.call(0, start_ok)
        conn.frame_max = tuned.frame_max
        tune_ok = commands.Connection.TuneOk(
            channel_max=tuned.channel_max, frame_max=tuned.frame_max, heartbeat=30
        )
        conn.send(0, tune_ok)
        await conn.call(0, make(commands.Connection.Open, virtual_host="/"))
        for ch_id in range(1, self.args.channels + 1):
            ch = Channel(conn, ch_id)
            conn.channels[ch_id] = ch
            await conn.call(ch_id, commands.Channel.Open())
            await conn.call(ch_id, commands.Confirm.Select())
            await conn.call(ch_id, commands.Basic.Qos(prefetch_count=PREFETCH))
            for q in range(self.args.queues):
                index = len(self.queues)
                name = f"soak.{self.number}.{c}.{ch_id}.{q}"
                queue = Queue(index, name, ch)
                self.queues.append(queue)
                ch.queues.append(queue)
                await conn.call(
                    ch_id, make(commands.Queue.Declare, queue=name, exclusive=True, arguments={})
                )
                ok = await conn.call(
                    ch_id,
                    make(commands.Basic.Consume, queue=name, consumer_tag=f"c{q}", arguments={}),
                )
                ch.consumers[ok.consumer_tag] = queue

    async def heartbeats(self) -> None:
        while True:
            await asyncio.sleep(15)
            for conn in self.conns:
                if conn.transport is not None and not conn.transport.is_closing():
                    conn.transport.write(b"\x08\x00\x00\x00\x00\x00\x00\xce")

    async def publisher(self, stop: asyncio.Event) -> None:
        """``rate`` messages a second, round robin over this worker's queues, in 20 ms ticks."""
        per_tick = self.args.rate / self.args.workers * 0.02
        owed = 0.0
        cursor = 0
        queues = self.queues
        started = time.monotonic()
        ticks = 0
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(max(0.0, started + ticks * 0.02 - time.monotonic()))
            owed += per_tick
            while owed >= 1:
                owed -= 1
                queue = queues[cursor % len(queues)]
                cursor += 1
                conn = queue.channel.conn
                if conn.writable and not conn.blocked and not conn.closing:
                    conn.publish(queue, self.args.size)

    async def run(self) -> None:
        sem = asyncio.Semaphore(50)  # handshakes at once

        async def connect(c: int) -> None:
            async with sem:
                await self.connect_one(c)

        await asyncio.gather(*(connect(c) for c in range(self.args.connections_here)))
        emit({"ready": self.number, "queues": len(self.queues)})
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, stop.set)
        beats = asyncio.create_task(self.heartbeats())
        publishing = asyncio.create_task(self.publisher(stop))
        reporter = asyncio.create_task(self.report_every(SAMPLE_EVERY))
        await stop.wait()
        await publishing
        await self.drain()
        reporter.cancel()
        beats.cancel()
        await self.close_all()
        emit({"done": self.number, **self.summary()})

    async def drain(self, timeout: float = 60.0) -> None:
        """Wait until every published message is confirmed and every confirmed one delivered."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(
                q.confirmed == q.sent and q.received >= q.confirmed for q in self.queues
            ) and not any(ch.unconfirmed for conn in self.conns for ch in conn.channels.values()):
                return
            await asyncio.sleep(0.2)

    async def close_all(self) -> None:
        async def close(conn: Conn) -> None:
            if conn.transport is None or conn.transport.is_closing():
                return
            conn.closing = True
            with contextlib.suppress(Exception):
                await conn.call(0, commands.Connection.Close(reply_code=200, reply_text="soak"))
            conn.transport.close()

        await asyncio.gather(*(close(conn) for conn in self.conns))

    async def report_every(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            emit({"progress": self.number, **self.summary(final=False)})

    def summary(self, final: bool = True) -> dict[str, Any]:
        s = self.stats
        out: dict[str, Any] = {
            "published": s.published,
            "confirmed": s.confirmed,
            "delivered": s.delivered,
            "nacked": s.nacked,
            "duplicates": s.duplicates,
            "gaps": s.gaps,
            "blocked": s.blocked,
            "errors": s.errors[:20],
            "error_count": len(s.errors),
        }
        if final:
            lost = sum(max(0, q.confirmed - q.received) for q in self.queues)
            out["lost_confirmed"] = lost
            out["unconfirmed"] = sum(q.sent - q.confirmed for q in self.queues)
            out["latencies"] = s.latencies
        return out


def emit(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def worker_main(args: argparse.Namespace) -> None:
    raise_fd_limit()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(Worker(args, args.worker).run())


# ---- the coordinator --------------------------------------------------------------------------


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def overview(port: int) -> dict[str, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/overview")
    request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    with urllib.request.urlopen(request, timeout=30) as reply:
        totals: dict[str, Any] = json.load(reply)["object_totals"]
        return totals


class WorkerProcess:
    def __init__(self, args: argparse.Namespace, number: int, connections: int) -> None:
        command = [
            sys.executable,
            __file__,
            "--worker",
            str(number),
            "--connections-here",
            str(connections),
            *sys.argv[1:],
        ]
        command += ["--port", str(args.port)]
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        self.ready = threading.Event()
        self.done: dict[str, Any] | None = None
        self.progress: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            record = json.loads(line)
            if "ready" in record:
                self.ready.set()
            elif "progress" in record:
                self.progress = record
            elif "done" in record:
                self.done = record


def coordinator(args: argparse.Namespace) -> int:
    limit = raise_fd_limit()
    needed = args.connections + 200
    if limit < needed:
        sys.exit(f"the open-files limit is {limit}; this run needs {needed} (ulimit -n)")
    args.port = free_port()
    mgmt_port = free_port()
    data_dir = tempfile.mkdtemp(prefix="warren-soak-")
    build = ROOT / "build"
    build.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_path = build / f"soak-{stamp}-broker.log"
    with open(log_path, "w") as log:
        broker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "broker",
                "--port",
                str(args.port),
                "--bind",
                "127.0.0.1",
                "--data-dir",
                data_dir,
                "--management-port",
                str(mgmt_port),
                "--prometheus-port",
                "none",
            ],
            stderr=log,
            cwd=ROOT,
        )
    try:
        return run(args, broker, mgmt_port, log_path, stamp)
    finally:
        broker.send_signal(signal.SIGTERM)
        try:
            broker.wait(30)
        except subprocess.TimeoutExpired:
            broker.kill()


def run(
    args: argparse.Namespace, broker: subprocess.Popen[bytes], mgmt_port: int, log: Path, stamp: str
) -> int:
    deadline = time.monotonic() + 30
    while "ready" not in log.read_text():
        if broker.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"the broker did not start; see {log}")
        time.sleep(0.1)
    print(
        f"soak: {args.connections} connections x {args.channels} channels x {args.queues} "
        f"queues, {args.rate} msg/s, {args.size} B, {args.minutes} min, {args.workers} workers"
    )
    shares = [args.connections // args.workers] * args.workers
    for i in range(args.connections % args.workers):
        shares[i] += 1
    started = time.monotonic()
    workers = [WorkerProcess(args, n, share) for n, share in enumerate(shares)]
    for w in workers:
        while not w.ready.wait(1):
            if w.proc.poll() is not None:
                sys.exit("a client process failed while connecting")
    setup = time.monotonic() - started
    totals = overview(mgmt_port)
    print(f"set up in {setup:.1f} s: {json.dumps(totals)}")
    samples: list[tuple[float, float, float]] = []  # (seconds, RSS MiB, broker CPU s)
    begin = time.monotonic()
    end = begin + args.minutes * 60
    while True:
        now = time.monotonic()
        samples.append((now - begin, rss_mib(broker.pid), cpu_seconds(broker.pid)))
        delivered = sum(w.progress.get("delivered", 0) for w in workers)
        errors = sum(w.progress.get("error_count", 0) for w in workers)
        print(
            f"  {now - begin:6.0f} s  broker RSS {samples[-1][1]:7.1f} MiB  "
            f"CPU {samples[-1][2]:7.1f} s  delivered {delivered:>10,}  errors {errors}",
            flush=True,
        )
        if now >= end:
            break
        time.sleep(min(SAMPLE_EVERY, max(0.0, end - time.monotonic())))
    totals_end = overview(mgmt_port)
    for w in workers:
        w.proc.send_signal(signal.SIGUSR1)
    for w in workers:
        w.proc.wait(180)
        w.thread.join(5)
    return report(args, workers, samples, totals, totals_end, setup, log, stamp)


def report(
    args: argparse.Namespace,
    workers: list[WorkerProcess],
    samples: list[tuple[float, float, float]],
    totals: dict[str, Any],
    totals_end: dict[str, Any],
    setup: float,
    log: Path,
    stamp: str,
) -> int:
    done = [w.done for w in workers]
    failures: list[str] = []
    if any(d is None for d in done):
        failures.append("a client process did not finish")
    results = [d for d in done if d is not None]

    def total(key: str) -> int:
        return sum(int(r[key]) for r in results)

    latencies = sorted(x for r in results for x in r["latencies"])
    duration = samples[-1][0] if samples else 0.0
    warmup = min(60.0, duration / 3)
    steady = [s for s in samples if s[0] >= warmup]
    third = max(1, len(steady) // 3)
    first = statistics.median(s[1] for s in steady[:third]) if steady else 0.0
    last = statistics.median(s[1] for s in steady[-third:]) if steady else 0.0
    slope = _slope([(s[0] / 60, s[1]) for s in steady])
    cpu = (samples[-1][2] - samples[0][2]) / duration if duration else 0.0
    broker_errors = [
        ln for ln in log.read_text().splitlines() if "[error" in ln or "Traceback" in ln
    ]
    expected = {
        "connections": args.connections,
        "channels": args.connections * args.channels,
        "queues": args.connections * args.channels * args.queues,
        "consumers": args.connections * args.channels * args.queues,
    }
    for key, want in expected.items():
        for name, seen in (("start", totals), ("end", totals_end)):
            if seen.get(key) != want:
                failures.append(f"{key} at the {name}: {seen.get(key)}, expected {want}")
    for key in ("nacked", "duplicates", "gaps", "lost_confirmed", "error_count"):
        if total(key):
            failures.append(f"{key}: {total(key)}")
    if broker_errors:
        failures.append(f"{len(broker_errors)} error lines in {log}")
    if last - first > max(16.0, 0.05 * first):
        failures.append(f"broker memory grew from {first:.1f} to {last:.1f} MiB after warm-up")
    figures = {
        "when": stamp,
        "settings": {
            k: v for k, v in vars(args).items() if k not in ("worker", "connections_here", "port")
        },
        "objects": totals,
        "setup_seconds": round(setup, 1),
        "duration_seconds": round(duration, 1),
        "published": total("published"),
        "confirmed": total("confirmed"),
        "delivered": total("delivered"),
        "published_per_second": round(total("published") / duration) if duration else 0,
        "nacked": total("nacked"),
        "duplicates": total("duplicates"),
        "gaps": total("gaps"),
        "lost_confirmed": total("lost_confirmed"),
        "unconfirmed_at_end": total("unconfirmed"),
        "blocked_events": total("blocked"),
        "client_errors": [e for r in results for e in r["errors"]][:20],
        "latency_ms": {
            "p50": round(_pct(latencies, 0.5) * 1000, 2),
            "p99": round(_pct(latencies, 0.99) * 1000, 2),
            "max": round(latencies[-1] * 1000, 2) if latencies else None,
        },
        "broker_rss_mib": {
            "samples": [round(s[1], 1) for s in samples],
            "after_warmup_first_third": round(first, 1),
            "last_third": round(last, 1),
            "slope_mib_per_min": round(slope, 3),
        },
        "broker_cpu_share": round(cpu, 2),
        "broker_error_lines": broker_errors[:20],
        "failures": failures,
    }
    out = ROOT / "build" / f"soak-{stamp}.json"
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps({k: v for k, v in figures.items() if k != "broker_rss_mib"}, indent=2))
    rss = figures["broker_rss_mib"]
    print(
        f"broker RSS: {rss['after_warmup_first_third']} -> {rss['last_third']} MiB after "
        f"warm-up, slope {rss['slope_mib_per_min']} MiB/min; figures in {out}"
    )
    print("PASS" if not failures else "FAIL: " + "; ".join(failures))
    return 1 if failures else 0


def _pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def _slope(points: list[tuple[float, float]]) -> float:
    if len(points) < 2:
        return 0.0
    mx = statistics.fmean(p[0] for p in points)
    my = statistics.fmean(p[1] for p in points)
    den = sum((p[0] - mx) ** 2 for p in points)
    return sum((p[0] - mx) * (p[1] - my) for p in points) / den if den else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--channels", type=int, default=5, help="per connection")
    parser.add_argument("--queues", type=int, default=2, help="per channel")
    parser.add_argument("--rate", type=float, default=5000.0, help="messages a second, in all")
    parser.add_argument("--size", type=int, default=128, help="body octets (at least 20)")
    parser.add_argument("--workers", type=int, default=4, help="client processes")
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--connections-here", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.size = max(args.size, _body_head.size)
    if args.worker is not None:
        worker_main(args)
        return 0
    return coordinator(args)


if __name__ == "__main__":
    sys.exit(main())
