#!/usr/bin/env python3
"""Warren's load generator: fast enough to saturate a Python AMQP 0-9-1 broker.

Every producer and every consumer is its own process with its own connection
(channel 1). pamqp is used only for the handshake, for queue setup and to
encode one publish (method + content header + body frames) once; producers
then write that triple repeated many times per ``send``. Consumers parse the
incoming byte stream minimally: they walk the frame headers, count
``basic.deliver`` method frames and ack with ``multiple=true`` every N.

    python tests/benchmarks/bench.py --url amqp://guest:guest@127.0.0.1:5673/ \
        --seconds 10 --producers 2 --consumers 1 --size 16 [--confirm N] \
        [--prefetch N] [--autoack] [--multi-ack N]

Output: per-second progress and a one-line summary on stderr, one JSON object
on stdout. Rates follow amqp-perf's definitions: published/s = sent / publish
time, consumed/s = received / (start -> last delivery), confirmed/s =
confirmed / (start -> last confirm).

Exit status: 0 ok; 1 on any error (connection.close or channel.close from the
broker, basic.nack, basic.cancel, connection.blocked, socket error, confirms
still outstanding after the drain, a broker that stops reading for drain + 5 s);
2 bad arguments; 3 a worker had to be killed at the hard deadline (seconds +
drain + 20 s).

--multi-ack defaults to 10 and is capped at --prefetch; a partial window is
acked whenever nothing arrives for 100 ms. Use --multi-ack 1 to match
amqp-perf's default of one ack per message (bench.py still writes all the acks
of one recv() in a single send()).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import multiprocessing as mp
import os
import queue
import select
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from pamqp import body as pbody
from pamqp import commands, frame, header
from pamqp.base import Frame as PamqpFrame

FRAME_METHOD = 1
FRAME_END = 0xCE
FRAME_HEAD = struct.Struct(">BHI")
METHOD_HEAD = struct.Struct(">BHIHH")  # frame header + class id + method id
U64 = struct.Struct(">Q")
ACK_FRAME = struct.Struct(">BHIHHQBB")  # basic.ack as one method frame

CH = 1  # the one channel every worker uses
CONNECTION_CLOSE = (10, 50)
CONNECTION_BLOCKED = (10, 60)
CHANNEL_CLOSE = (20, 40)
CHANNEL_CLOSE_OK = (20, 41)
BASIC_CANCEL = (60, 30)
BASIC_RETURN = (60, 50)
BASIC_DELIVER = (60, 60)
BASIC_ACK = (60, 80)
BASIC_NACK = (60, 120)

RECV_BUF = 4 << 20
PUBLISH_BATCH_BYTES = 128 << 10
IO_TIMEOUT = 0.1
RPC_TIMEOUT = 10.0
CLOSE_WAIT = 5.0  # producers: max wait for channel.close-ok (or a stuck send) after the drain
HARD_GRACE = 20.0  # workers still alive at seconds + drain + this are killed


class BenchError(Exception):
    """A protocol, socket or setup error; the run fails."""


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    user: str
    password: str
    vhost: str


def parse_url(url: str) -> Target:
    parts = urlsplit(url)
    if parts.scheme != "amqp":
        raise ValueError(f"only amqp:// URLs are supported, got {url!r}")
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    return Target(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 5672,
        user=unquote(parts.username or "guest"),
        password=unquote(parts.password or "guest"),
        vhost=vhost,
    )


def describe_close(method: Any) -> str:
    code = getattr(method, "reply_code", "?")
    text = getattr(method, "reply_text", "")
    return f"{method.name} {code} {text}".rstrip()


class Conn:
    """A blocking AMQP connection on one channel, with pamqp for the slow path."""

    def __init__(self, target: Target, name: str) -> None:
        self.name = name
        self.sock = socket.create_connection((target.host, target.port), timeout=5.0)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        self.sock.settimeout(RPC_TIMEOUT)
        self.poller = select.poll()
        self.poller.register(self.sock, select.POLLIN)
        self.pending = b""
        self.frame_max = 131072
        try:
            self._handshake(target)
        except OSError as exc:
            raise BenchError(
                f"{name}: handshake failed: {exc!r} (wrong credentials? the broker may just drop"
                " the socket)"
            ) from exc

    def send(self, value: Any, channel: int = CH) -> None:
        self.sock.sendall(frame.marshal(value, channel))

    def read_frame(self) -> tuple[int, Any]:
        while True:
            if len(self.pending) >= 7:
                size = FRAME_HEAD.unpack_from(self.pending, 0)[2]
                if len(self.pending) >= size + 8:
                    used, channel, value = frame.unmarshal(self.pending)
                    self.pending = self.pending[used:]
                    return channel, value
            try:
                data = self.sock.recv(65536)
            except TimeoutError as exc:
                raise BenchError(
                    f"{self.name}: no reply from the broker in {RPC_TIMEOUT} s"
                ) from exc
            if not data:
                raise BenchError(f"{self.name}: connection closed by the broker (EOF)")
            self.pending += data

    def expect(self, wanted: type[PamqpFrame]) -> Any:
        while True:
            _, value = self.read_frame()
            if isinstance(value, wanted):
                return value
            if isinstance(value, commands.Connection.Close | commands.Channel.Close):
                with contextlib.suppress(OSError):
                    self.send(
                        commands.Connection.CloseOk()
                        if isinstance(value, commands.Connection.Close)
                        else commands.Channel.CloseOk()
                    )
                raise BenchError(f"{self.name}: broker sent {describe_close(value)}")
            if value.name == "Heartbeat":
                continue
            raise BenchError(f"{self.name}: expected {wanted.name}, got {value.name}")

    def rpc(self, request: PamqpFrame, reply: type[PamqpFrame]) -> Any:
        self.send(request)
        return self.expect(reply)

    def _handshake(self, target: Target) -> None:
        self.sock.sendall(frame.marshal(header.ProtocolHeader(), 0))
        self.expect(commands.Connection.Start)
        response = f"\0{target.user}\0{target.password}"
        props: dict[str, Any] = {
            "product": "warren-bench",
            "capabilities": {"publisher_confirms": True, "basic.nack": True},
        }
        self.send(commands.Connection.StartOk(props, "PLAIN", response, "en_US"), 0)
        tune = self.expect(commands.Connection.Tune)
        self.frame_max = tune.frame_max or 131072
        channel_max = tune.channel_max or 2047
        self.send(commands.Connection.TuneOk(channel_max, self.frame_max, 0), 0)
        self.send(commands.Connection.Open(target.vhost), 0)
        self.expect(commands.Connection.OpenOk)
        self.rpc(commands.Channel.Open(), commands.Channel.OpenOk)

    def close(self) -> None:
        """Best-effort clean close: connection.close, skip frames until close-ok (5 s at most)."""
        end = time.monotonic() + 5.0
        with contextlib.suppress(OSError, BenchError, ValueError):
            self.sock.settimeout(1.0)
            self.send(commands.Connection.Close(200, "bye", 0, 0), 0)
            while time.monotonic() < end:
                _, value = self.read_frame()
                if isinstance(value, commands.Connection.CloseOk | commands.Connection.Close):
                    break
        self.sock.close()


def publish_triple(routing_key: str, size: int, frame_max: int) -> bytes:
    payload = b"x" * size
    chunk = frame_max - 8
    parts = [
        frame.marshal(commands.Basic.Publish(exchange="", routing_key=routing_key), CH),
        frame.marshal(header.ContentHeader(0, size, commands.Basic.Properties()), CH),
    ]
    parts += [
        frame.marshal(pbody.ContentBody(payload[i : i + chunk]), CH) for i in range(0, size, chunk)
    ]
    return b"".join(parts)


@dataclass
class WorkerResult:
    name: str
    count: int = 0
    confirmed: int = 0
    publish_end: float = 0.0  # producers: monotonic time the last publish was written
    ingress_end: float = 0.0  # producers: channel.close-ok received
    last_event: float = 0.0  # last delivery / last confirm
    cpu_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    ready: bool = False  # set up and counted on the ready semaphore


@dataclass
class Shared:
    """Process-shared state (fork- and spawn-safe when passed to Process)."""

    counts: Any  # RawArray('q'): per worker, messages sent / received
    confirms: Any  # RawArray('q'): per producer, messages confirmed
    ready: Any  # Semaphore: one release per worker once set up
    go: Any  # Event: start publishing / consuming
    stop: Any  # Event: consumers stop; producers abort the confirm drain
    t0: Any  # Value('d'): the common start time (time.monotonic, system-wide)
    results: Any  # Queue of WorkerResult dicts


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def drain_incoming(
    conn: Conn, handle: Callable[[int, int, int, bytes, int], None], block: bool
) -> None:
    """Read what is available (or wait up to IO_TIMEOUT if block) and dispatch method frames."""
    if not conn.poller.poll(IO_TIMEOUT * 1000 if block else 0):
        return
    data = conn.sock.recv(1 << 20)
    if not data:
        raise BenchError(f"{conn.name}: connection closed by the broker (EOF)")
    buf = conn.pending + data
    pos, n = 0, len(buf)
    while n - pos >= 8:
        ftype, channel, size = FRAME_HEAD.unpack_from(buf, pos)
        end = pos + 7 + size
        if end >= n:
            break
        if buf[end] != FRAME_END:
            raise BenchError(f"{conn.name}: bad frame end byte at offset {end}")
        if ftype == FRAME_METHOD:
            _, _, _, cls, meth = METHOD_HEAD.unpack_from(buf, pos)
            handle(cls, meth, channel, buf, pos)
        pos = end + 1
    conn.pending = buf[pos:]


def broker_close(conn: Conn, buf: bytes, pos: int) -> BenchError:
    _, _, size = FRAME_HEAD.unpack_from(buf, pos)
    _, _, method = frame.unmarshal(bytes(buf[pos : pos + size + 8]))
    with contextlib.suppress(OSError):
        if isinstance(method, commands.Connection.Close):
            conn.send(commands.Connection.CloseOk(), 0)
        else:
            conn.send(commands.Channel.CloseOk())
    return BenchError(f"{conn.name}: broker sent {describe_close(method)}")


def producer_main(idx: int, cfg: dict[str, Any], shared: Shared) -> None:
    res = WorkerResult(name=f"producer-{idx}")
    conn: Conn | None = None
    try:
        conn = c = Conn(parse_url(cfg["url"]), res.name)
        window: int = cfg["confirm"]
        if window:
            conn.rpc(commands.Confirm.Select(), commands.Confirm.SelectOk)
        triple = publish_triple(cfg["queue"], cfg["size"], conn.frame_max)
        per_batch = max(1, PUBLISH_BATCH_BYTES // len(triple))
        if window:
            per_batch = min(per_batch, window)
        batch = memoryview(triple * per_batch)
        tlen = len(triple)
        conn.sock.settimeout(IO_TIMEOUT)
        shared.ready.release()
        res.ready = True
        shared.go.wait()
        t0 = shared.t0.value
        deadline = t0 + cfg["seconds"]
        hard = deadline + cfg["drain"]  # end of the confirm drain
        give_up = hard + CLOSE_WAIT  # a broker that stops reading for this long is stuck
        sock = conn.sock
        sent = 0
        acked = 0  # every tag <= acked is confirmed
        loose: set[int] = set()  # single acks above the watermark
        got_close_ok = False

        def on_method(cls: int, meth: int, channel: int, buf: bytes, pos: int) -> None:
            nonlocal acked, got_close_ok
            key = (cls, meth)
            if key == BASIC_ACK:
                tag = U64.unpack_from(buf, pos + 11)[0]
                multiple = buf[pos + 19] & 1
                if multiple:
                    acked = max(acked, tag)
                    loose.difference_update([t for t in loose if t <= acked])
                elif tag == acked + 1:
                    acked = tag
                    while acked + 1 in loose:
                        acked += 1
                        loose.discard(acked)
                elif tag > acked:
                    loose.add(tag)
                res.last_event = time.monotonic()
            elif key == CHANNEL_CLOSE_OK:
                got_close_ok = True
            elif key in (CONNECTION_CLOSE, CHANNEL_CLOSE):
                raise broker_close(c, buf, pos)
            elif key == BASIC_NACK:
                raise BenchError(f"{res.name}: basic.nack from the broker")
            elif key == BASIC_RETURN:
                raise BenchError(f"{res.name}: basic.return from the broker")
            elif key == CONNECTION_BLOCKED:
                raise BenchError(f"{res.name}: connection.blocked (resource alarm)")

        def confirmed() -> int:
            return acked + len(loose)

        while True:
            if time.monotonic() >= deadline or shared.stop.is_set():
                break
            k = per_batch
            if window:
                room = window - (sent - confirmed())
                if room <= 0:
                    drain_incoming(conn, on_method, block=True)
                    shared.confirms[idx] = confirmed()
                    continue
                k = min(k, room)
            view, off, nbytes = batch[: k * tlen], 0, k * tlen
            # sendall, except that at the deadline only the message being written is finished
            while off < nbytes:
                try:
                    off += sock.send(view[off:nbytes])
                except TimeoutError:
                    drain_incoming(conn, on_method, block=False)
                now = time.monotonic()
                if now >= deadline:
                    nbytes = min(nbytes, -(-off // tlen) * tlen)
                    if now >= give_up:
                        break
            sent += off // tlen
            shared.counts[idx] = sent
            drain_incoming(conn, on_method, block=False)
            if window:
                shared.confirms[idx] = confirmed()
            if off < nbytes:
                raise BenchError(f"{res.name}: broker stopped reading; publish abandoned")
        res.publish_end = time.monotonic()
        # Drain: outstanding confirms, then channel.close-ok (broker read every publish).
        while window and confirmed() < sent and time.monotonic() < hard:
            drain_incoming(conn, on_method, block=True)
        if window:
            shared.confirms[idx] = confirmed()
            if confirmed() < sent:
                res.errors.append(f"{res.name}: {sent - confirmed()} confirms outstanding")
        sock.settimeout(CLOSE_WAIT)
        try:
            conn.send(commands.Channel.Close(200, "done", 0, 0))
        except TimeoutError as exc:
            raise BenchError(
                f"{res.name}: broker stopped reading (channel.close not sent)"
            ) from exc
        while not got_close_ok and time.monotonic() < give_up:
            drain_incoming(conn, on_method, block=True)
        if got_close_ok:
            res.ingress_end = time.monotonic()
        else:  # not an error: the broker is still reading a backlog of publishes
            res.notes.append(f"{res.name}: no channel.close-ok within the drain + {CLOSE_WAIT} s")
        res.count, res.confirmed = sent, confirmed()
    except (BenchError, OSError) as exc:
        res.errors.append(str(exc) if isinstance(exc, BenchError) else f"{res.name}: {exc!r}")
        res.count, res.confirmed = shared.counts[idx], shared.confirms[idx]
        res.publish_end = res.publish_end or time.monotonic()
        if not res.ready:
            shared.ready.release()  # never leave the parent waiting on setup
    finally:
        if conn is not None:
            conn.close()
        res.cpu_s = cpu_seconds()
        shared.results.put(asdict(res))


def consumer_main(idx: int, slot: int, cfg: dict[str, Any], shared: Shared) -> None:
    res = WorkerResult(name=f"consumer-{idx}")
    conn: Conn | None = None
    buf = bytearray(RECV_BUF)
    have = 0  # bytes at the start of buf holding data not parsed yet
    try:
        conn = Conn(parse_url(cfg["url"]), res.name)
        autoack: bool = cfg["autoack"]
        every: int = cfg["multi_ack"]
        if cfg["prefetch"]:
            conn.rpc(commands.Basic.Qos(prefetch_count=cfg["prefetch"]), commands.Basic.QosOk)
        conn.rpc(
            commands.Basic.Consume(queue=cfg["queue"], consumer_tag=f"c{idx}", no_ack=autoack),
            commands.Basic.ConsumeOk,
        )
        sock = conn.sock
        sock.settimeout(IO_TIMEOUT)
        shared.ready.release()
        res.ready = True
        shared.go.wait()
        mv = memoryview(buf)
        received = 0
        last_tag = 0  # highest delivery tag seen
        acked_tag = 0  # highest delivery tag acked
        unpack = METHOD_HEAD.unpack_from
        unpack_tag = U64.unpack_from
        idle = False
        while not shared.stop.is_set():
            if idle and not autoack and last_tag > acked_tag:
                # nothing arrived for IO_TIMEOUT: flush a partial ack window
                sock.sendall(ACK_FRAME.pack(1, CH, 13, 60, 80, last_tag, 1, FRAME_END))
                acked_tag = last_tag
            try:
                got = sock.recv_into(mv[have:])
            except TimeoutError:
                idle = True
                continue
            if not got:
                raise BenchError(f"{res.name}: connection closed by the broker (EOF)")
            idle = False
            n = have + got
            pos = 0
            before = received
            acks: list[bytes] = []
            while n - pos >= 11:
                ftype, _, size, cls, meth = unpack(buf, pos)
                end = pos + 7 + size
                if end >= n:
                    break
                if buf[end] != FRAME_END:
                    raise BenchError(f"{res.name}: bad frame end byte")
                if ftype == FRAME_METHOD:
                    if cls == 60 and meth == 60:
                        received += 1
                        last_tag = unpack_tag(buf, pos + 12 + buf[pos + 11])[0]
                        if not autoack and last_tag - acked_tag >= every:
                            acks.append(ACK_FRAME.pack(1, CH, 13, 60, 80, last_tag, 1, FRAME_END))
                            acked_tag = last_tag
                    elif (cls, meth) in (CONNECTION_CLOSE, CHANNEL_CLOSE):
                        raise broker_close(conn, bytes(buf[pos : end + 1]), 0)
                    elif (cls, meth) == BASIC_CANCEL:
                        raise BenchError(f"{res.name}: consumer cancelled by the broker")
                    elif (cls, meth) == CONNECTION_BLOCKED:
                        raise BenchError(f"{res.name}: connection.blocked (resource alarm)")
                pos = end + 1
            if pos:
                have = n - pos
                buf[:have] = buf[pos:n]
            else:
                have = n
                if have == RECV_BUF:
                    raise BenchError(f"{res.name}: frame larger than the receive buffer")
            if acks:
                sock.sendall(b"".join(acks))
            if received != before:
                res.last_event = time.monotonic()
                shared.counts[slot] = received
        if not autoack and last_tag > acked_tag:
            sock.sendall(ACK_FRAME.pack(1, CH, 13, 60, 80, last_tag, 1, FRAME_END))
        res.count = received
    except (BenchError, OSError) as exc:
        res.count = shared.counts[slot]
        res.errors.append(str(exc) if isinstance(exc, BenchError) else f"{res.name}: {exc!r}")
        if not res.ready:
            shared.ready.release()
    finally:
        if conn is not None:
            conn.pending = bytes(buf[:have])  # frame-aligned leftover, for close()
            conn.close()
        res.cpu_s = cpu_seconds()
        shared.results.put(asdict(res))


def setup_queue(cfg: dict[str, Any]) -> int:
    conn = Conn(parse_url(cfg["url"]), "setup")
    try:
        conn.rpc(commands.Queue.Declare(queue=cfg["queue"], durable=True), commands.Queue.DeclareOk)
        purged = conn.rpc(commands.Queue.Purge(queue=cfg["queue"]), commands.Queue.PurgeOk)
        return int(purged.message_count)
    finally:
        conn.close()


def rate(count: int, seconds: float) -> float:
    return round(count / seconds, 1) if seconds > 0 else 0.0


def run(cfg: dict[str, Any]) -> tuple[dict[str, Any], int]:
    purged = setup_queue(cfg)
    ctx = mp.get_context("fork")
    nprod, ncons = cfg["producers"], cfg["consumers"]
    shared = Shared(
        counts=ctx.RawArray(ctypes.c_int64, nprod + ncons),
        confirms=ctx.RawArray(ctypes.c_int64, max(1, nprod)),
        ready=ctx.Semaphore(0),
        go=ctx.Event(),
        stop=ctx.Event(),
        t0=ctx.Value(ctypes.c_double, 0.0),
        results=ctx.Queue(),
    )
    procs = [
        ctx.Process(target=consumer_main, args=(i, nprod + i, cfg, shared)) for i in range(ncons)
    ]
    procs += [ctx.Process(target=producer_main, args=(i, cfg, shared)) for i in range(nprod)]
    for p in procs:
        p.start()
    setup_deadline = time.monotonic() + RPC_TIMEOUT + 6
    for _ in procs:
        if not shared.ready.acquire(timeout=max(0.0, setup_deadline - time.monotonic())):
            break
    t0 = time.monotonic()
    shared.t0.value = t0
    shared.go.set()
    cpu0 = cpu_seconds()
    deadline = t0 + cfg["seconds"]
    drain_end = deadline + cfg["drain"]
    hard = drain_end + HARD_GRACE
    results: list[dict[str, Any]] = []
    producers_left = nprod
    last_print, last_sent, last_recv = t0, 0, 0
    while True:
        with contextlib.suppress(queue.Empty):
            while True:
                r = shared.results.get(timeout=0.05)
                results.append(r)
                if r["name"].startswith("producer"):
                    producers_left -= 1
                if r["errors"]:
                    shared.stop.set()
        now = time.monotonic()
        sent = sum(shared.counts[:nprod])
        recv = sum(shared.counts[nprod:])
        if not cfg["quiet"] and now - last_print >= 1.0:
            dt = now - last_print
            print(
                f"time {now - t0:6.1f}s  sent {(sent - last_sent) / dt:9.0f} msg/s"
                f"  received {(recv - last_recv) / dt:9.0f} msg/s",
                file=sys.stderr,
            )
            last_print, last_sent, last_recv = now, sent, recv
        if len(results) == len(procs):
            break
        if now >= deadline and ((producers_left == 0 and recv >= sent) or now >= drain_end):
            shared.stop.set()  # consumers: everything arrived, or the drain is over
        if now >= hard:
            break
    hung = []
    for p in procs:
        p.join(timeout=max(0.1, hard - time.monotonic()))
        if p.is_alive():
            hung.append(p.pid)
            p.kill()
            p.join()
    cpu1 = cpu_seconds()
    prods = [r for r in results if r["name"].startswith("producer")]
    cons = [r for r in results if r["name"].startswith("consumer")]
    errors = [e for r in results for e in r["errors"]]
    if hung:
        errors.append(f"{len(hung)} worker(s) killed at the hard deadline: pids {hung}")
    sent = sum(r["count"] for r in prods)
    received = sum(r["count"] for r in cons)
    confirmed = sum(r["confirmed"] for r in prods)
    publish_end = max((r["publish_end"] for r in prods), default=t0)
    all_read = bool(prods) and all(r["ingress_end"] for r in prods)
    ingress_end = max(r["ingress_end"] for r in prods) if all_read else 0.0
    last_delivery = max((r["last_event"] for r in cons), default=0.0)
    last_confirm = max((r["last_event"] for r in prods), default=0.0)
    wall = max(1e-9, publish_end - t0)
    notes = [n for r in results for n in r["notes"]]
    if purged:
        notes.append(f"purged {purged} messages before the run")
    if ncons and received < sent:
        notes.append(f"received {received} < sent {sent} after the drain")
    report = {
        "tool": "warren-bench",
        "config": {k: v for k, v in cfg.items() if k != "quiet"},
        "publish_s": round(wall, 3),
        "sent": sent,
        "received": received,
        "confirmed": confirmed,
        "publish_rate": rate(sent, wall),
        "broker_ingress_rate": rate(sent, ingress_end - t0) if ingress_end else None,
        "consume_rate": rate(received, last_delivery - t0) if last_delivery else 0.0,
        "confirm_rate": rate(confirmed, last_confirm - t0) if last_confirm else 0.0,
        "client_cpu_pct": round(
            100 * (sum(r["cpu_s"] for r in results) + cpu1 - cpu0) / max(1e-9, now - t0), 1
        ),
        "errors": errors,
        "notes": notes,
        "ok": not errors,
    }
    status = 3 if hung else (1 if errors else 0)
    return report, status


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5673/")
    ap.add_argument("--queue", default="warren-bench")
    ap.add_argument("--seconds", type=float, default=10.0, help="publishing time")
    ap.add_argument("--drain", type=float, default=2.0, help="max wait for confirms/consumers")
    ap.add_argument("--producers", type=int, default=1)
    ap.add_argument("--consumers", type=int, default=1, help="0 = publish only")
    ap.add_argument("--size", type=int, default=16, help="body bytes")
    ap.add_argument("--confirm", type=int, default=0, help="max unconfirmed per producer")
    ap.add_argument("--prefetch", type=int, default=0, help="basic.qos prefetch (0 = none)")
    ap.add_argument("--autoack", action="store_true", help="consume with no-ack")
    ap.add_argument("--multi-ack", type=int, default=10, help="ack multiple=true every N")
    ap.add_argument("--quiet", action="store_true", help="no per-second lines")
    args = ap.parse_args(argv)
    if args.producers < 0 or args.consumers < 0 or args.producers + args.consumers == 0:
        ap.error("need at least one producer or consumer")
    if args.seconds <= 0 or args.drain < 0 or args.size < 0 or args.confirm < 0:
        ap.error("--seconds must be > 0; --drain, --size, --confirm >= 0")
    if args.multi_ack < 1 or args.prefetch < 0:
        ap.error("--multi-ack must be >= 1 and --prefetch >= 0")
    try:
        parse_url(args.url)
    except ValueError as exc:
        ap.error(str(exc))
    multi_ack = min(args.multi_ack, args.prefetch) if args.prefetch else args.multi_ack
    cfg: dict[str, Any] = {
        "url": args.url,
        "queue": args.queue,
        "seconds": args.seconds,
        "drain": args.drain,
        "producers": args.producers,
        "consumers": args.consumers,
        "size": args.size,
        "confirm": args.confirm,
        "prefetch": args.prefetch,
        "autoack": args.autoack,
        "multi_ack": multi_ack,
        "quiet": args.quiet,
    }
    try:
        report, status = run(cfg)
    except (BenchError, OSError) as exc:
        print(f"warren-bench: setup failed: {exc}", file=sys.stderr)
        return 1
    line = (
        f"published {report['publish_rate']:,.0f} msg/s"
        f" (broker ingress {report['broker_ingress_rate'] or 0:,.0f})"
        f"  consumed {report['consume_rate']:,.0f} msg/s"
    )
    if args.confirm:
        line += f"  confirmed {report['confirm_rate']:,.0f} msg/s"
    line += f"  sent {report['sent']} received {report['received']}"
    line += "  errors: " + ("; ".join(report["errors"]) or "none")
    print(line, file=sys.stderr)
    print(json.dumps(report))
    return status


if __name__ == "__main__":
    sys.exit(main())
