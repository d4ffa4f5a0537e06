"""The loop's own cost of publishing with confirms to a stream, without sockets or clients.

    python tests/benchmarks/stream_path.py [--messages 200000] [--rounds 5] [--callgrind]
        [--size 100] [--part] [--keep-profile DIR]

One broker ``Connection`` on a uvloop loop, over a data directory (the store's writer and
syncer threads run as in production, fdatasync included), is fed bytes as a socket would
feed it: a confirm-mode channel publishing ``--size``-byte messages to a stream through the
default exchange, ``BATCH`` messages per read (what stream_bench.py's window of 1000 sends
in two writes), each batch sent once the previous one is confirmed. Its output goes nowhere.

Without ``--callgrind`` each round prints the microseconds of CPU per message of the loop's
thread (and of the whole process, the writer threads too). ``--callgrind`` counts the loop
thread's instructions instead (valgrind, ``--separate-threads``): the slope between 5,000
and 25,000 messages, so that start-up cancels out; exact on a machine shared with other load.
``--part`` measures the stream's own share: ``StreamQueue.publish`` called directly with a
new ``Message`` (its construction counted), 64 a loop turn as a publisher's connection
hands them over, each turn's chunk handed to the writer; no framing, routing or confirms.
``--keep-profile DIR`` keeps the larger run's callgrind files for callgrind_annotate.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import uvloop
from pamqp import body as pbody
from pamqp import commands, frame, header

from warren.broker.engine.broker import Broker
from warren.broker.engine.message import Message
from warren.broker.engine.timers import Timers
from warren.broker.server.amqp_connection import PUBLISH_EVENTS_PER_TURN, Connection
from warren.broker.server.logging import configure_logging
from warren.broker.streams.stream import StreamQueue
from warren.config import Settings

BATCH = 500  # messages per data_received


class Transport:
    """Counts what the broker writes; a write wakes whoever waits for one (the confirms)."""

    def __init__(self) -> None:
        self.written = 0
        self.wrote: asyncio.Future[None] | None = None

    def write(self, data: bytes) -> None:
        self.written += len(data)
        if self.wrote is not None and not self.wrote.done():
            self.wrote.set_result(None)

    def close(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _m(value: frame.FrameTypes, channel: int = 1) -> bytes:
    return bytes(frame.marshal(value, channel))


def handshake() -> bytes:
    out = _m(header.ProtocolHeader(), 0)
    login = "\0guest\0guest"
    out += _m(commands.Connection.StartOk(mechanism="PLAIN", response=login, locale="en_US"), 0)
    out += _m(commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0), 0)
    out += _m(commands.Connection.Open(virtual_host="/"), 0)
    out += _m(commands.Channel.Open())
    out += _m(commands.Queue.Declare(queue="s", durable=True,
                                     arguments={"x-queue-type": "stream"}))  # fmt: skip
    out += _m(commands.Confirm.Select())
    return out


def publishes(n: int, size: int) -> bytes:
    one = (
        _m(commands.Basic.Publish(exchange="", routing_key="s"))
        + _m(header.ContentHeader(0, size, commands.Basic.Properties()))
        + _m(pbody.ContentBody(b"x" * size))
    )
    return one * n


async def run(messages: int, size: int, data_dir: str, part: bool) -> tuple[float, float]:
    """(loop thread, process) CPU microseconds per message."""
    loop = asyncio.get_running_loop()
    broker = Broker(Settings(data_dir=data_dir, management_port=None), Timers(loop))
    broker.open_store()
    transport = Transport()
    conn = Connection(broker, transport, ("127.0.0.1", 1))
    conn.data_received(handshake())
    queue = broker.vhosts["/"].queues["s"]
    assert isinstance(queue, StreamQueue)
    channel = conn.channels[1]
    batch = publishes(BATCH, size)
    thread, process = time.thread_time(), time.process_time()
    sent = 0
    if part:
        messages -= messages % PUBLISH_EVENTS_PER_TURN
        await publish_directly(queue, messages, size)
        sent = messages
    while sent < messages:
        conn.data_received(batch)
        sent += BATCH
        while channel.confirms.confirmed < sent:
            transport.wrote = loop.create_future()
            await transport.wrote  # the loop sleeps until the writer thread reports
    thread = time.thread_time() - thread
    process = time.process_time() - process
    assert queue.log.committed == sent, "messages not committed"
    conn.connection_lost()
    broker.close_store()
    return thread * 1e6 / messages, process * 1e6 / messages


async def publish_directly(queue: StreamQueue, messages: int, size: int) -> None:
    """StreamQueue.publish alone, a publisher's turn of messages a loop turn."""
    loop = asyncio.get_running_loop()
    log = queue.log
    committed = log.on_commit
    waiting: list[asyncio.Future[None]] = []

    def on_commit() -> None:
        if committed is not None:
            committed()
        if waiting and not waiting[0].done():
            waiting[0].set_result(None)

    log.on_commit = on_commit
    properties = b"\x00\x00"  # no properties: what stream_bench.py publishes
    body = b"x" * size
    publish = queue.publish
    sent = 0
    while sent < messages:
        for _ in range(PUBLISH_EVENTS_PER_TURN):
            publish(Message("", "s", properties, body), None)
        sent += PUBLISH_EVENTS_PER_TURN
        await asyncio.sleep(0)  # the store hands the turn's chunk to its writer
        if sent % BATCH < PUBLISH_EVENTS_PER_TURN or sent >= messages:
            while log.committed < sent:  # a window's worth in flight at most
                waiting[:] = [loop.create_future()]
                await waiting[0]


def instructions(messages: int, size: int, part: bool, keep: str | None) -> tuple[int, int]:
    """(loop thread, all threads) instructions of one run, as callgrind counts them."""
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "callgrind.out")
        subprocess.run(
            ["valgrind", "--tool=callgrind", "--separate-threads=yes",
             f"--callgrind-out-file={out}", sys.executable, __file__, "--only",
             "--messages", str(messages), "--size", str(size)] + (["--part"] if part else []),
            check=True, capture_output=True,
        )  # fmt: skip
        totals = {}
        for path in glob.glob(out + "-*"):
            with open(path, encoding="ascii") as f:
                for line in f:
                    if line.startswith(("summary:", "totals:")):
                        totals[int(path.rsplit("-", 1)[1])] = int(line.split()[1])
                        break
        if keep is not None:
            os.makedirs(keep, exist_ok=True)
            for path in glob.glob(out + "-*"):
                shutil.copy(path, keep)
    if 1 not in totals:
        raise SystemExit("no totals in callgrind's output")
    return totals[1], sum(totals.values())


def callgrind(size: int, part: bool, keep: str | None) -> None:
    # whole publishes of BATCH (or turns of 64 with --part): 5,000 and 25,000 or 5,120 and 25,600
    small, large = (5_120, 25_600) if part else (5_000, 25_000)
    few = instructions(small, size, part, None)
    many = instructions(large, size, part, keep)
    loop = (many[0] - few[0]) / (large - small)
    every = (many[1] - few[1]) / (large - small)
    print(f"loop thread {loop:9,.0f} instructions per message")
    print(f"all threads {every:9,.0f} instructions per message (writer and syncer too)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--callgrind", action="store_true", help="count instructions")
    parser.add_argument("--part", action="store_true", help="StreamQueue.publish alone")
    parser.add_argument("--keep-profile", metavar="DIR", help="with --callgrind")
    parser.add_argument("--only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    configure_logging("error", "plaintext", False)
    if args.callgrind:
        callgrind(args.size, args.part, args.keep_profile)
        return 0
    rounds = 1 if args.only else args.rounds
    loops, processes = [], []
    for round_ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="warren-stream-path-") as data_dir:
            loop_us, process_us = uvloop.run(run(args.messages, args.size, data_dir, args.part))
        loops.append(loop_us)
        processes.append(process_us)
        if not args.only:
            print(f"round {round_ + 1}: loop thread {loop_us:5.2f} us/msg, "
                  f"process {process_us:5.2f}", flush=True)  # fmt: skip
    if not args.only:
        print(f"medians: loop thread {statistics.median(loops):5.2f} us/msg, "
              f"process {statistics.median(processes):5.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
