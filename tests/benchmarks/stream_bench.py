#!/usr/bin/env python3
"""Streams side by side: publish with confirms, replay from ``first`` by 1 and by 10 consumers.

    python tests/benchmarks/stream_bench.py \
        --broker warren=amqp://guest:guest@127.0.0.1:5673/@$WARREN_PID \
        --broker rabbitmq=amqp://guest:guest@127.0.0.1:5672/@$RABBIT_PID \
        --messages 1000000 --size 100 --runs 1

Per run, on a new stream on each broker: one producer publishes ``--messages`` with confirms
(``--window`` outstanding), then one consumer replays them all from ``first``, then
``--readers`` consumers replay them all at once. Each phase runs on every broker before the
next phase starts, and who goes first alternates from run to run, so that other load on the
machine hits both.
Every client is its own process with bench.py's raw-socket AMQP code (no client library
in the way); consumers ack with multiple=true every ``--multi-ack`` deliveries under a
``--prefetch`` window. The broker's RSS (from /proc, with the pid after ``@``) is sampled
every 0.1 s: before the fill and the peak during each phase; its CPU time (from
/proc/<pid>/stat) gives messages per broker CPU-second, which a machine shared with other load
distorts less than the wall-clock rates. Results: a table on stderr (medians over the runs) and
JSON on stdout. The streams are deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import threading
import time
from typing import Any

from bench import (
    ACK_FRAME,
    CH,
    FRAME_END,
    FRAME_HEAD,
    FRAME_METHOD,
    METHOD_HEAD,
    U64,
    BenchError,
    Conn,
    parse_url,
    publish_triple,
)
from pamqp import commands

STREAM = {"x-queue-type": "stream"}


def rss_mib(pid: int | None) -> float | None:
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def cpu_s(pid: int | None) -> float | None:
    """The broker's CPU seconds so far (user + system, all its threads)."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RssPeak:
    """Samples a pid's RSS in a thread; ``peak`` is the largest seen."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.peak = rss_mib(pid) or 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            value = rss_mib(self.pid)
            if value is not None:
                self.peak = max(self.peak, value)

    def stop(self) -> float | None:
        self._stop.set()
        self._thread.join()
        return self.peak if self.pid else None


def publish(url: str, queue: str, count: int, size: int, window: int) -> float:
    """Publish ``count`` messages with confirms; seconds from the first to the last confirm."""
    conn = Conn(parse_url(url), "producer")
    try:
        conn.rpc(commands.Confirm.Select(), commands.Confirm.SelectOk)
        triple = publish_triple(queue, size, conn.frame_max)
        sock = conn.sock
        sent = confirmed = 0
        start = time.monotonic()
        buf = b""
        while confirmed < count:
            room = min(window - (sent - confirmed), count - sent)
            if room >= max(1, window // 4) or (room > 0 and sent == confirmed):
                sock.sendall(triple * room)
                sent += room
            data = sock.recv(1 << 16)
            if not data:
                raise BenchError("producer: EOF")
            buf += data
            pos = 0
            while len(buf) - pos >= 8:
                ftype, _, fsize, cls, meth = METHOD_HEAD.unpack_from(buf, pos)
                end = pos + 7 + fsize
                if end >= len(buf):
                    break
                if ftype == FRAME_METHOD and cls == 60 and meth in (80, 120):
                    if meth == 120:
                        raise BenchError("producer: basic.nack")
                    confirmed = max(confirmed, U64.unpack_from(buf, pos + 11)[0])
                elif ftype == FRAME_METHOD and cls in (10, 20) and meth == 40:
                    raise BenchError(f"producer: closed by the broker {buf[pos : end + 1]!r}")
                pos = end + 1
            buf = buf[pos:]
        return time.monotonic() - start
    finally:
        conn.close()


def replay(url: str, queue: str, count: int, prefetch: int, every: int, go: Any, out: Any) -> None:
    """One consumer from ``first`` until ``count`` deliveries; puts (seconds, received)."""
    conn = Conn(parse_url(url), "reader")
    try:
        conn.rpc(commands.Basic.Qos(prefetch_count=prefetch), commands.Basic.QosOk)
        go.wait()
        start = time.monotonic()
        conn.rpc(
            commands.Basic.Consume(queue=queue, arguments={"x-stream-offset": "first"}),
            commands.Basic.ConsumeOk,
        )
        sock = conn.sock
        sock.settimeout(30)
        buf = bytearray(4 << 20)
        mv = memoryview(buf)
        have = len(conn.pending)  # deliveries read along with consume-ok
        buf[:have] = conn.pending
        received = last_tag = acked = group = tag_at = 0
        unpack, unpack_tag = METHOD_HEAD.unpack_from, U64.unpack_from
        while received < count:
            got = sock.recv_into(mv[have:])
            if not got:
                raise BenchError("reader: EOF")
            n = have + got
            pos = 0
            while n - pos >= 11:
                # a run of deliveries of the same length (one stream, one message size: only
                # the tag and the offset differ): one check a delivery, not a parse a frame
                if (
                    group
                    and n - pos >= group
                    and buf[pos] == FRAME_METHOD
                    and buf[pos + 7 : pos + 11] == b"\x00\x3c\x00\x3c"
                    and buf[pos + group - 1] == FRAME_END
                ):
                    received += 1
                    last_tag = unpack_tag(buf, tag_at + pos)[0]
                    pos += group
                    continue
                ftype, _, size, cls, meth = unpack(buf, pos)
                end = pos + 7 + size
                if end >= n:
                    break
                if ftype == FRAME_METHOD:
                    if cls == 60 and meth == 60:
                        received += 1
                        tag_at = 12 + buf[pos + 11]
                        last_tag = unpack_tag(buf, pos + tag_at)[0]
                        group = delivery_length(buf, pos, n)
                    elif meth == 40 and cls in (10, 20):
                        raise BenchError(f"reader: closed by the broker {bytes(buf[pos:end])!r}")
                pos = end + 1
            have = n - pos
            buf[:have] = buf[pos:n]
            if last_tag - acked >= every or (received >= count and last_tag > acked):
                sock.sendall(ACK_FRAME.pack(1, CH, 13, 60, 80, last_tag, 1, FRAME_END))
                acked = last_tag
        out.put((time.monotonic() - start, received))
    except Exception as exc:  # reported by the parent
        out.put((-1.0, repr(exc)))
    finally:
        conn.sock.close()  # mid-stream: no clean close to wait for


def delivery_length(buf: bytearray, pos: int, n: int) -> int:
    """Bytes of the delivery (method, header, body frames) at ``pos``; 0 if not all here."""
    start = pos
    for _ in range(2):  # the method and the content header frame
        if n - pos < 7:
            return 0
        pos += 8 + FRAME_HEAD.unpack_from(buf, pos)[2]
    if n - pos < 19 - 8:
        return 0
    body_size = U64.unpack_from(buf, start + 8 + FRAME_HEAD.unpack_from(buf, start)[2] + 11)[0]
    while body_size > 0:  # body frames
        if n - pos < 7:
            return 0
        size = FRAME_HEAD.unpack_from(buf, pos)[2]
        body_size -= size
        pos += 8 + size
    return pos - start if pos <= n else 0


def run_readers(url: str, queue: str, cfg: argparse.Namespace, readers: int) -> float:
    """``readers`` processes replay the whole stream at once; seconds until the last is done."""
    ctx = mp.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(
            target=replay, args=(url, queue, cfg.messages, cfg.prefetch, cfg.multi_ack, go, out)
        )
        for _ in range(readers)
    ]
    for proc in procs:
        proc.start()
    time.sleep(0.5)  # connected and qos set; the clock starts at go
    go.set()
    results = [out.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join(10)
    for seconds, received in results:
        if seconds < 0:
            raise BenchError(str(received))
    return max(seconds for seconds, _ in results)


def declare(url: str, queue: str, delete: bool = False) -> None:
    conn = Conn(parse_url(url), "setup")
    try:
        if delete:
            conn.rpc(commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)
        else:
            conn.rpc(
                commands.Queue.Declare(queue=queue, durable=True, arguments=STREAM),
                commands.Queue.DeclareOk,
            )
    finally:
        conn.close()


def one_run(
    brokers: list[tuple[str, str, int | None]], cfg: argparse.Namespace, run: int
) -> list[dict[str, Any]]:
    """Each phase on every broker before the next phase, first broker alternating by run."""
    order = brokers if run % 2 == 0 else brokers[::-1]
    queue = f"stream-bench-{int(time.time())}-{run}-{os.getpid()}"
    outs: dict[str, dict[str, Any]] = {}
    for name, url, pid in order:
        declare(url, queue)
        outs[name] = {"broker": name, "run": run, "rss_before_mib": rss_mib(pid)}
    n = cfg.readers
    phases = ("publish", "replay1", f"replay{n}")[: 1 if cfg.publish_only else 3]
    for phase in phases:
        for name, url, pid in order:
            out = outs[name]
            peak, cpu = RssPeak(pid), cpu_s(pid)
            if phase == "publish":
                count, seconds = cfg.messages, publish(url, queue, cfg.messages, cfg.size,
                                                       cfg.window)  # fmt: skip
            else:
                readers = 1 if phase == "replay1" else n
                count, seconds = readers * cfg.messages, run_readers(url, queue, cfg, readers)
            after = cpu_s(pid)
            out[f"{phase}_msg_s"] = count / seconds
            out[f"{phase}_msg_per_cpu_s"] = (
                count / (after - cpu) if after is not None and cpu is not None else None
            )
            out[f"{phase}_rss_peak_mib"] = peak.stop()
            print(json.dumps({"broker": name, phase: out[f"{phase}_msg_s"]}), file=sys.stderr)
    for _, url, _ in order:
        if not cfg.keep:
            declare(url, queue, delete=True)
    return [outs[name] for name, _, _ in brokers]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", action="append", required=True, help="name=url[@pid]")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--window", type=int, default=1000, help="unconfirmed publishes")
    parser.add_argument("--prefetch", type=int, default=1000)
    parser.add_argument("--multi-ack", type=int, default=100)
    parser.add_argument("--readers", type=int, default=10)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="do not delete the streams")
    parser.add_argument("--publish-only", action="store_true", help="no replay phases")
    cfg = parser.parse_args()
    brokers = []
    for spec in cfg.broker:
        name, _, rest = spec.partition("=")
        url, _, pid = rest.rpartition("@")
        if not pid.isdigit():  # no pid: the @ was the URL's own
            url, pid = rest, ""
        brokers.append((name, url, int(pid) if pid else None))
    results = []
    for run in range(cfg.runs):
        results += one_run(brokers, cfg, run)
    keys = [k for k in results[0] if k not in ("broker", "run")]
    print(f"{'':28}" + "".join(f"{name:>14}" for name, _, _ in brokers), file=sys.stderr)
    for key in keys:
        row = []
        for name, _, _ in brokers:
            values = sorted(r[key] for r in results if r["broker"] == name and r[key] is not None)
            row.append(f"{values[len(values) // 2]:>14,.0f}" if values else f"{'-':>14}")
        print(f"{key:28}" + "".join(row), file=sys.stderr)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
