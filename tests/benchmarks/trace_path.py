"""The message path's own cost with tracing off and on, without sockets or other processes.

    python tests/benchmarks/trace_path.py [--messages 200000] [--rounds 5] [--callgrind]
        [--confirm] [--ack-each] [--autoack] [--persistent] [--modes off,on]

One broker ``Connection`` on a uvloop loop is fed bytes as a socket would feed it:
publishes (one 16-byte message per frame set), and the acks of a consumer with prefetch
that acks ``multiple=true`` every 10 deliveries, as bench.py does; its output goes
nowhere. Each round times ``--messages`` messages through publish, route, enqueue,
deliver, ack, once with tracing off and once on (the writer process runs as in
production), and prints the microseconds per message of the loop's thread. Load from
other processes on the machine cancels out of the ratio better than it does out of a
throughput test, where a publisher and a consumer compete with the broker for the CPUs.
``--callgrind`` counts instructions instead (valgrind): slower, but exactly repeatable.
``--ack-each`` acks every delivery with its own basic.ack (S2 and S3's shape).
``--autoack`` consumes with no-ack and sends no acks (S1's shape).
``--confirm`` puts the publisher's channel in confirm mode (one coalesced basic.ack per
batch); ``--persistent`` publishes with delivery_mode 2 to a broker with a data directory
(the message store's path: records, group commit, records never written because their
ack came first); ``--modes off`` measures the untraced path only (to compare two commits).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import uvloop
from pamqp import body as pbody
from pamqp import commands, frame, header

from warren.broker.engine.broker import Broker
from warren.broker.engine.timers import Timers
from warren.broker.server.amqp_connection import Connection
from warren.broker.server.logging import configure_logging
from warren.config import Settings

BATCH = 500  # messages per data_received: what one socket read might carry
ACK_EACH = False  # --ack-each
AUTOACK = False  # --autoack
PERSISTENT = False  # --persistent


class NullTransport:
    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def close(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _m(value: Any, channel: int = 1) -> bytes:
    return bytes(frame.marshal(value, channel))


def handshake(confirm: bool = False) -> bytes:
    out = _m(header.ProtocolHeader(), 0)
    login = "\0guest\0guest"
    out += _m(commands.Connection.StartOk(mechanism="PLAIN", response=login, locale="en_US"), 0)
    out += _m(commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0), 0)
    out += _m(commands.Connection.Open(virtual_host="/"), 0)
    out += _m(commands.Channel.Open())
    out += _m(commands.Queue.Declare(queue="q", durable=True))
    if AUTOACK:
        out += _m(commands.Basic.Consume(queue="q", consumer_tag="c", no_ack=True))
    else:
        out += _m(commands.Basic.Qos(prefetch_count=BATCH * 2))
        out += _m(commands.Basic.Consume(queue="q", consumer_tag="c"))
    if confirm:
        out += _m(commands.Confirm.Select())
    return out


def publishes(n: int) -> bytes:
    properties = commands.Basic.Properties(delivery_mode=2 if PERSISTENT else None)
    one = (
        _m(commands.Basic.Publish(exchange="", routing_key="q"))
        + _m(header.ContentHeader(0, 16, properties))
        + _m(pbody.ContentBody(b"x" * 16))
    )
    return one * n


def acks(first: int, n: int, each: bool = False) -> bytes:
    """basic.ack multiple=true every 10 tags, hand-encoded as bench.py does; ``each``: one
    basic.ack per tag (S2 and S3's shape)."""
    if each:
        tags = range(first, first + n)
        return b"".join(struct.pack(">BHIHHQBB", 1, 1, 13, 60, 80, t, 0, 0xCE) for t in tags)
    frames = []
    for tag in range(first + 9, first + n, 10):
        frames.append(struct.pack(">BHIHHQBB", 1, 1, 13, 60, 80, tag, 1, 0xCE))
    return b"".join(frames)


@dataclass
class Cost:
    """Microseconds per message."""

    wall: float  # elapsed: what other load on the machine inflates
    loop: float  # CPU of the loop's thread: the message path itself
    process: float  # CPU of the whole broker process (the trace thread too)
    writer: float  # CPU of the trace writer process


async def run(messages: int, traced: bool, trace_dir: str, confirm: bool = False) -> Cost:
    data_dir = os.path.join(trace_dir, "data") if PERSISTENT else None
    settings = Settings(
        data_dir=data_dir, trace_enabled=traced, trace_dir=trace_dir, management_port=None
    )
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    broker = Broker(settings, Timers(asyncio.get_running_loop()))
    broker.open_store()
    transport = NullTransport()
    conn = Connection(broker, transport, ("127.0.0.1", 1))
    conn.data_received(handshake(confirm))
    await asyncio.sleep(0.3)  # the writer process has started
    queue = broker.vhosts["/"].queues["q"]
    batch = publishes(BATCH)
    tag = 1
    wall, loop, process = time.perf_counter(), time.thread_time(), time.process_time()
    for _ in range(messages // BATCH):
        conn.data_received(batch)
        if AUTOACK:  # delivered and settled as they are published
            while conn.protocol.buffered or queue.ready_count:
                await asyncio.sleep(0)
            continue
        # the loop's turns: a publishing connection handles a share of its frames per turn
        while queue.unacked_count < BATCH:
            await asyncio.sleep(0)
        conn.data_received(acks(tag, BATCH, ACK_EACH))
        tag += BATCH
        await asyncio.sleep(0)
    while queue.unacked_count:  # single acks take more than one turn
        await asyncio.sleep(0)
    wall = time.perf_counter() - wall
    loop = time.thread_time() - loop
    process = time.process_time() - process
    assert queue.ready_count == 0 and queue.unacked_count == 0, "messages left over"
    conn.connection_lost()
    broker.close_store()
    broker.tracing.close()  # the writer process exits: its CPU time is ours to read
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    writer = (children.ru_utime + children.ru_stime) - (
        children_before.ru_utime + children_before.ru_stime
    )
    scale = 1e6 / messages
    return Cost(wall * scale, loop * scale, process * scale, writer * scale)


def instructions(mode: str, messages: int, confirm: bool) -> int:
    """Instructions the broker's process executes for one run (the writer process not
    counted), as valgrind's callgrind counts them: the same whatever else the machine does."""
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "callgrind.out")
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
             __file__, "--only", mode, "--messages", str(messages)]
            + (["--confirm"] if confirm else []) + (["--ack-each"] if ACK_EACH else [])
            + (["--autoack"] if AUTOACK else [])
            + (["--persistent"] if PERSISTENT else []),
            check=True, capture_output=True,
        )  # fmt: skip
        with open(out, encoding="ascii") as f:
            for line in f:
                if line.startswith(("summary:", "totals:")):
                    return int(line.split()[1])
    raise SystemExit("no totals in callgrind's output")


def callgrind(modes: list[str], confirm: bool) -> None:
    """Instructions per message, off and on: the slope between 5,000 and 25,000 messages,
    so that start-up and handshake cancel out."""
    per = {}
    for mode in modes:
        small, large = instructions(mode, 5_000, confirm), instructions(mode, 25_000, confirm)
        per[mode] = (large - small) / 20_000
        print(f"tracing {mode:<3} {per[mode]:9,.0f} instructions per message", flush=True)
    if len(per) == 2:
        print(f"tracing adds {per['on'] - per['off']:,.0f} (+{per['on'] / per['off'] - 1:.1%})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--callgrind", action="store_true", help="count instructions with valgrind instead"
    )
    parser.add_argument("--confirm", action="store_true", help="publish in confirm mode")
    parser.add_argument("--ack-each", action="store_true", help="one basic.ack per delivery")
    parser.add_argument("--autoack", action="store_true", help="consume with no-ack (S1)")
    parser.add_argument(
        "--persistent", action="store_true", help="persistent messages, with a message store"
    )
    parser.add_argument("--modes", default="off,on", help="with --callgrind: off, on or both")
    parser.add_argument("--only", choices=("off", "on"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    global ACK_EACH, AUTOACK, PERSISTENT
    ACK_EACH = args.ack_each
    AUTOACK = args.autoack
    PERSISTENT = args.persistent
    configure_logging("error", "plaintext", False)
    if args.callgrind:
        callgrind(args.modes.split(","), args.confirm)
        return 0
    with tempfile.TemporaryDirectory(prefix="warren-trace-path-") as trace_dir:
        if args.only:  # one run, under valgrind (instructions)
            uvloop.run(run(args.messages, args.only == "on", trace_dir, args.confirm))
        else:
            measure(args.messages, args.rounds, trace_dir)
    return 0


def measure(messages: int, rounds: int, trace_dir: str) -> None:
    results: dict[bool, list[Cost]] = {False: [], True: []}
    for round_ in range(rounds):
        for traced in (False, True) if round_ % 2 == 0 else (True, False):
            cost = uvloop.run(run(messages, traced, trace_dir))
            results[traced].append(cost)
            print(
                f"round {round_ + 1}: tracing {'on ' if traced else 'off'} "
                f"loop thread {cost.loop:5.2f} us/msg, process {cost.process:5.2f}, "
                f"writer process {cost.writer:5.2f}, wall {cost.wall:5.2f}",
                flush=True,
            )
    print("\nmedians, microseconds per message:")
    for name in ("loop", "process", "wall"):
        off = statistics.median(getattr(c, name) for c in results[False])
        on = statistics.median(getattr(c, name) for c in results[True])
        print(f"  {name:<8} off {off:6.2f}   on {on:6.2f}   +{on / off - 1:.0%}")
    writer = statistics.median(c.writer for c in results[True])
    print(f"  trace writer process (another core): {writer:.2f}")


if __name__ == "__main__":
    sys.exit(main())
