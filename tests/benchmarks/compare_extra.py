#!/usr/bin/env python3
"""S6, S9 and S10 of issue #9, one broker at a time; ``compare.sh`` calls it for both brokers.

    compare_extra.py s6  --url URL --pid PID [--time 10] [--queues 4]
    compare_extra.py s9  --url URL --pid PID [--messages 1000000] [--persistent]
    compare_extra.py s10 --url URL --pid PID [--connections 10000] [--idle 30]
    compare_extra.py cleanup --url URL --pid PID --names QUEUE...

S6 runs one amqp-perf per queue at once (1 producer, 1 consumer, prefetch 100, one ack per
message each) and sums their consume rates. S9 fills a fresh queue with 16-byte messages
(publisher confirms, so the broker holds every one of them when the fill ends) and reads the
broker's VmRSS before and after. S10 opens idle connections with one channel each from this
process (raw sockets, heartbeats answered) and reads the broker's RSS and its CPU over the idle
window from /proc. Each prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import struct
import subprocess
import sys
import time
from typing import Any
from urllib.parse import unquote, urlsplit

AMQP_PERF = os.environ.get("AMQP_PERF", "/tmp/perf/amqp-perf")
TICK = os.sysconf("SC_CLK_TCK")
FRAME = struct.Struct(">BHI")
HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def perf(url: str, queue: str, *flags: str) -> subprocess.Popen[str]:
    cmd = [AMQP_PERF, "--uri", url, "--queue", queue, "--json", "--quiet", *flags]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate()
    try:
        doc: dict[str, Any] = json.loads(out)
    except ValueError:
        return {"ok": False, "errors": [err.strip()[-300:]]}
    return doc


def delete_queue(url: str, queue: str) -> None:
    import pika  # type: ignore[import-untyped]  # the test extra; only for cleaning up

    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        conn.channel().queue_delete(queue)
    finally:
        conn.close()


def cleanup(args: argparse.Namespace) -> dict[str, Any]:
    """Delete the queues earlier scenarios left full, so that S9 and S10 start from less."""
    for name in args.names:
        delete_queue(args.url, name)
    time.sleep(5)  # RabbitMQ frees a deleted queue's memory in the background
    return {"ok": True, "deleted": args.names, "rss_kib": rss_kib(args.pid)}


def s6(args: argparse.Namespace) -> dict[str, Any]:
    flags = ["--time", str(args.time), "--purge", "--prefetch", "100"]
    # several --url/--pid: queue i goes to broker i mod n (the multi-process experiment)
    cpu0, t0 = sum(map(cpu_seconds, args.pids)), time.monotonic()
    urls = args.urls
    procs = [perf(urls[i % len(urls)], f"cmp-S6-{i}", *flags) for i in range(args.queues)]
    docs = [finish(p) for p in procs]
    cpu = (sum(map(cpu_seconds, args.pids)) - cpu0) / (time.monotonic() - t0) * 100
    return {
        "ok": all(d.get("ok") for d in docs),
        "consume_rate": sum(d.get("consume_rate") or 0 for d in docs),
        "publish_rate": sum(d.get("publish_rate") or 0 for d in docs),
        "per_queue": [d.get("consume_rate") for d in docs],
        "broker_cpu_pct": round(cpu, 1),  # whole run including the drain
        "errors": [e for d in docs for e in d.get("errors", [])][:5],
    }


def s9(args: argparse.Namespace) -> dict[str, Any]:
    queue = "cmp-S9-durable" if args.persistent else "cmp-S9-transient"
    extra = ["--durable", "--persistent"] if args.persistent else []
    before = rss_kib(args.pid)
    flags = ["--consumers", "0", "--pmessages", str(args.messages), "--time", "300"]
    doc = finish(perf(args.url, queue, "--purge", "--confirm", "1000", *flags, *extra))
    time.sleep(2)  # let the broker settle (RabbitMQ's queue process may still be paging)
    after = rss_kib(args.pid)
    delete_queue(args.url, queue)
    return {
        "ok": bool(doc.get("ok")) and doc.get("confirmed") == args.messages,
        "confirmed": doc.get("confirmed"),
        "rss_before_kib": before,
        "rss_kib": after,
        "rss_delta_kib": after - before,
        "bytes_per_message": round((after - before) * 1024 / args.messages, 1),
        "errors": doc.get("errors", [])[:5],
    }


class Idle(asyncio.Protocol):
    """One connection: handshake, channel.open, then answer heartbeats and stay quiet."""

    def __init__(self, user: str, password: str, vhost: str) -> None:
        self.user, self.password, self.vhost = user, password, vhost
        self.buf = b""
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.heartbeat = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(b"AMQP\x00\x00\x09\x01")

    def method(self, channel: int, cls: int, meth: int, args: bytes) -> None:
        payload = struct.pack(">HH", cls, meth) + args
        assert self.transport is not None
        self.transport.write(FRAME.pack(1, channel, len(payload)) + payload + b"\xce")

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= 7:
            kind, channel, size = FRAME.unpack_from(self.buf)
            if len(self.buf) < size + 8:
                return
            payload, self.buf = self.buf[7 : 7 + size], self.buf[size + 8 :]
            if kind == 1:
                self.on_method(channel, payload)

    def on_method(self, channel: int, payload: bytes) -> None:
        cls, meth = struct.unpack_from(">HH", payload)
        if (cls, meth) == (10, 10):  # start -> start-ok (PLAIN)
            creds = f"\0{self.user}\0{self.password}".encode()
            args = b"\0\0\0\0" + b"\x05PLAIN" + struct.pack(">I", len(creds)) + creds
            self.method(0, 10, 11, args + b"\x05en_US")
        elif (cls, meth) == (10, 30):  # tune -> tune-ok with the broker's values, then open
            channel_max, frame_max, self.heartbeat = struct.unpack_from(">HIH", payload, 4)
            self.method(0, 10, 31, struct.pack(">HIH", channel_max, frame_max, self.heartbeat))
            vhost = self.vhost.encode()
            self.method(0, 10, 40, bytes([len(vhost)]) + vhost + b"\x00\x00")
        elif (cls, meth) == (10, 41):  # open-ok -> channel.open
            self.method(1, 20, 10, b"\x00")
        elif (cls, meth) == (20, 11) and not self.ready.done():
            self.ready.set_result(None)
        elif not self.ready.done():
            self.ready.set_exception(RuntimeError(f"unexpected method {cls}.{meth}"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ready.done():
            self.ready.set_exception(exc or ConnectionError("closed by broker"))


async def s10_async(args: argparse.Namespace) -> dict[str, Any]:
    parts = urlsplit(args.url)
    user, password = unquote(parts.username or "guest"), unquote(parts.password or "guest")
    vhost = unquote(parts.path[1:]) or "/"
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(100)  # handshakes in flight; more only makes accept queues overflow

    async def open_one() -> Idle:
        async with gate:
            _, proto = await loop.create_connection(
                lambda: Idle(user, password, vhost), parts.hostname, parts.port or 5672
            )
            await asyncio.wait_for(proto.ready, 30)
            return proto

    before = rss_kib(args.pid)
    t0 = time.monotonic()
    conns = await asyncio.gather(*(open_one() for _ in range(args.connections)))
    open_s = time.monotonic() - t0
    heartbeat = conns[0].heartbeat

    async def beat() -> None:  # one heartbeat per connection per half interval, as clients do
        while heartbeat:
            await asyncio.sleep(heartbeat / 2)
            for c in conns:
                if c.transport is not None and not c.transport.is_closing():
                    c.transport.write(HEARTBEAT_FRAME)

    beater = asyncio.create_task(beat())
    await asyncio.sleep(2)  # the last handshakes' work is done
    rss_open = rss_kib(args.pid)
    cpu0, w0 = cpu_seconds(args.pid), time.monotonic()
    await asyncio.sleep(args.idle)
    cpu_pct = (cpu_seconds(args.pid) - cpu0) / (time.monotonic() - w0) * 100
    rss_idle = rss_kib(args.pid)
    beater.cancel()
    alive = sum(1 for c in conns if c.transport is not None and not c.transport.is_closing())
    for c in conns:
        if c.transport is not None:
            c.transport.close()
    return {
        "ok": alive == args.connections,
        "connections": args.connections,
        "alive_after_idle": alive,
        "open_seconds": round(open_s, 1),
        "heartbeat": heartbeat,
        "rss_before_kib": before,
        "rss_kib": rss_idle,
        "rss_after_open_kib": rss_open,
        "bytes_per_connection": round((rss_idle - before) * 1024 / args.connections),
        "idle_cpu_pct": round(cpu_pct, 2),
    }


def s10(args: argparse.Namespace) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = args.connections + 100
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
    return asyncio.run(s10_async(args))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", choices=["s6", "s9", "s10", "cleanup"])
    parser.add_argument("--url", dest="urls", action="append", required=True)
    parser.add_argument("--pid", dest="pids", type=int, action="append", required=True)
    parser.add_argument("--time", type=float, default=10.0)
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--idle", type=float, default=30.0)
    parser.add_argument("--names", nargs="*", default=[], help="cleanup: queues to delete")
    args = parser.parse_args()
    run = {"s6": s6, "s9": s9, "s10": s10, "cleanup": cleanup}[args.scenario]
    args.url, args.pid = args.urls[0], args.pids[0]
    try:
        result = run(args)
    except Exception as exc:  # report, do not hide: the table shows "failed"
        result = {"ok": False, "errors": [f"{type(exc).__name__}: {exc}"]}
    print(json.dumps(result))
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
