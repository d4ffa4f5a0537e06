"""Fuzzing a live broker over real sockets: hostile input never takes it, or anyone else, down.

Every example opens a TCP connection, sends a mutated or random stream
(``fuzz_support``) and reads what comes back. For every input:

* the reply is well-formed frames (or the protocol header, for a bad one);
* a connection.close carries a hard reply code, a channel.close a soft one,
  never 541 INTERNAL_ERROR (what a handler's unexpected exception becomes);
* the broker closes the socket without a connection.close only where the
  protocol says so: before tuning, or after the client's own close;
* nothing is logged at ERROR (an exception in a handler or a timer).

Meanwhile a second client in another vhost publishes with confirms and
consumes, and must never see an error or lose a message. After each run
the broker's connections, channels, queues and messages are back to the
baseline: nothing a fuzzed connection made outlives it.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from amqp_raw import RawClient
from fuzz_support import (
    CONNECTION_CLOSE_CODES,
    FUZZ_PERMITS,
    SOFT_CODES,
    load_seeds,
    mutated_sessions,
    random_streams,
)
from hypothesis import HealthCheck, event, given, settings
from pamqp import commands

import warren.broker.server.amqp_connection
from warren.broker.testkit import RunningBroker, run_broker
from warren.protocol.constants import PROTOCOL_HEADER, REPLY_NAMES
from warren.protocol.methods import decode_method

SEEDS = load_seeds()
LONG_RUN = int(os.environ.get("WARREN_FUZZ_EXAMPLES", "0"))
QUIET = 0.1  # seconds of silence after which the broker has said all it will say


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=LONG_RUN or examples,
        derandomize=not LONG_RUN,
        database=None,
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.function_scoped_fixture,
        ],
    )


# ---- the second client ----------------------------------------------------------------


class Witness(threading.Thread):
    """Publishes with confirms and consumes in its own vhost while the fuzzer runs."""

    def __init__(self, addr: tuple[str, int], vhost: str) -> None:
        super().__init__(name="fuzz-witness", daemon=True)
        self.addr = addr
        self.vhost = vhost
        self.stop = threading.Event()
        self.hold = threading.Event()  # set: finish the round and wait, holding no message
        self.idle = threading.Event()
        self.rounds = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        sent = 0
        try:
            with RawClient.connect(self.addr, vhost=self.vhost) as client:
                client.declare_queue(1, "witness")
                client.confirm_select(1)
                client.consume(1, "witness")
                while not self.stop.is_set():
                    if self.hold.is_set():
                        if not self.idle.is_set():
                            client.qos(1, 0)  # a round trip: the broker has seen the last ack
                            self.idle.set()
                        time.sleep(0.01)
                        continue
                    self.idle.clear()
                    for _ in range(10):
                        client.publish(1, str(sent).encode(), routing_key="witness")
                        sent += 1
                    confirms = client.wait_for_confirms(1)
                    assert all(confirms.values()), f"nacked: {confirms}"
                    deliveries = client.deliveries(1, 10)
                    bodies = [int(d.body) for d in deliveries]
                    assert bodies == list(range(sent - 10, sent)), bodies
                    client.ack(1, deliveries[-1].method.delivery_tag, multiple=True)
                    self.rounds += 1
        except BaseException as exc:  # reported by the test, in its own thread
            self.error = exc


# ---- what the broker did ----------------------------------------------------------------


class ErrorLog(logging.Handler):
    """Every ERROR record, from any thread: an exception in the broker or its loop."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class Closed:
    tuned: bool
    reason: str


@dataclass
class Reply:
    header: bytes = b""  # the protocol header the broker answers a bad one with
    frames: list[tuple[int, int, bytes]] = field(default_factory=list)
    rest: bytes = b""
    eof: bool = False

    def methods(self) -> Iterator[tuple[int, Any]]:
        for ftype, channel, payload in self.frames:
            if ftype == 1:
                yield channel, decode_method(payload)

    def parse(self, data: bytes) -> None:
        if data.startswith(b"AMQP"):
            self.header, data = data[:8], data[8:]
        while len(data) >= 8:
            ftype, channel, size = struct.unpack_from(">BHI", data)
            if len(data) < 8 + size:
                break
            assert data[7 + size] == 0xCE, f"bad frame end from the broker: {data[:40]!r}"
            self.frames.append((ftype, channel, data[7 : 7 + size]))
            data = data[8 + size :]
        self.rest = data


class FuzzTarget:
    def __init__(self, running: RunningBroker, closed: dict[int, Closed]) -> None:
        self.broker = running
        self.addr = (running.host, running.port)
        self.closed = closed
        self.errors = ErrorLog()
        self.witness = Witness(self.addr, "witness")

    def exchange(self, data: bytes, quiet: float = QUIET) -> tuple[Reply, int]:
        """Send ``data`` on a new connection; read until EOF, connection.close(-ok) or
        ``quiet`` seconds of silence."""
        reply = Reply()
        received = bytearray()
        with socket.create_connection(self.addr, timeout=2) as sock:
            port = sock.getsockname()[1]
            # the port may have served an earlier example whose record nobody read
            self.closed.pop(port, None)
            with contextlib.suppress(OSError):  # the broker may close before reading it all
                sock.sendall(data)
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                ready, _, _ = select.select([sock], [], [], quiet)
                if not ready:
                    break
                try:
                    chunk = sock.recv(1 << 16)
                except OSError:
                    chunk = b""
                if not chunk:
                    reply.eof = True
                    break
                received += chunk
                if b"\x00\x0a\x00" in received:  # maybe a connection.close(-ok): parse and see
                    probe = Reply()
                    probe.parse(bytes(received))
                    last = commands.Connection.Close | commands.Connection.CloseOk
                    if any(isinstance(m, last) for _, m in probe.methods()):
                        # the broker has said its last word; after close it closes on its
                        # own, after close-ok it leaves that to the client, as RabbitMQ does
                        break
        reply.parse(bytes(received))
        return reply, port

    def check(self, data: bytes) -> None:
        before = len(self.errors.records)
        reply, port = self.exchange(data)
        if reply.header:
            assert reply.header == PROTOCOL_HEADER and not reply.frames
        methods = list(reply.methods())
        check_order(methods)
        closes = []
        for channel, method in methods:
            if isinstance(method, commands.Connection.Close):
                check_close(method, CONNECTION_CLOSE_CODES)
                closes.append(method)
            elif isinstance(method, commands.Channel.Close):
                assert channel != 0
                check_close(method, SOFT_CODES)
                event(f"channel.close {method.reply_code}")
        if closes:
            event(f"connection.close {closes[0].reply_code}")
        elif reply.eof and not reply.header:
            said = {type(m) for _, m in methods}
            if commands.Connection.CloseOk not in said:
                closed = self.closed_record(port)
                # silence is RabbitMQ's answer only before tuning, or to the client's close-ok
                assert not closed.tuned or not closed.reason, closed
            event("socket closed")
        else:
            event("still open" if not reply.eof else "bad header")
        time.sleep(0)  # let the broker thread log whatever this input caused
        new = self.errors.records[before:]
        assert not new, [r.getMessage() for r in new]

    def closed_record(self, port: int) -> Closed:
        deadline = time.monotonic() + 2
        while port not in self.closed:
            assert time.monotonic() < deadline, f"no connection_lost for port {port}"
            time.sleep(0.01)
        return self.closed.pop(port)

    # ---- leaks ----

    def census(self) -> dict[str, int]:
        """Objects a connection makes, counted on the broker's loop, the witness at rest."""
        self.witness.idle.clear()
        self.witness.hold.set()
        try:
            assert self.witness.idle.wait(10) or self.witness.error, "the witness did not stop"
            return self._census()
        finally:
            self.witness.hold.clear()

    def _census(self) -> dict[str, int]:

        def count() -> dict[str, int]:
            gc.collect()
            kinds = {"Connection": 0, "Channel": 0, "Consumer": 0, "ProtocolConnection": 0}
            kinds.update({"Queue": 0, "Message": 0})
            for obj in gc.get_objects():
                name = type(obj).__name__
                if name in kinds and type(obj).__module__.split(".")[0] in ("broker", "protocol"):
                    kinds[name] += 1
            server = self.broker.server
            kinds["connections"] = len(server.broker.connections)
            kinds["queues /"] = len(server.broker.vhosts["/"].queues)
            return kinds

        return self.broker.call(count)

    def forget_fuzz_state(self) -> None:
        """Delete what fuzzed sessions declared and left behind (queues, exchanges)."""

        def clear() -> None:
            vhost = self.broker.server.broker.vhosts["/"]
            for queue in list(vhost.queues.values()):
                vhost.delete_queue(queue)
            for name in list(vhost.exchanges):
                if name and not name.startswith("amq."):
                    vhost.delete_exchange(name, False)

        self.broker.call(clear)

    def wait_for_baseline(self, baseline: dict[str, int]) -> None:
        deadline = time.monotonic() + 10
        while True:
            self.forget_fuzz_state()
            now = self.census()
            if now == baseline or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert now == baseline, f"left behind: {now} (baseline {baseline})"


def check_order(methods: list[tuple[int, Any]]) -> None:
    """Nothing after connection.close or close-ok; nothing on a channel after its close."""
    closed: set[int] = set()
    for i, (channel, method) in enumerate(methods):
        if isinstance(method, commands.Connection.Close | commands.Connection.CloseOk):
            assert i == len(methods) - 1, f"{methods[i + 1 :]} after {method.name}"
        elif isinstance(method, commands.Channel.Close | commands.Channel.CloseOk):
            closed.add(channel)
        elif isinstance(method, commands.Channel.OpenOk):
            closed.discard(channel)
        else:
            assert channel not in closed, f"{method.name} on channel {channel} after its close"


def check_close(method: Any, codes: frozenset[int]) -> None:
    code, text = method.reply_code, method.reply_text
    assert code in codes, f"{type(method).__name__} {code} {text}"
    assert code != 541, f"an exception escaped a handler: {text}"
    assert text.startswith(REPLY_NAMES[code] + " - "), text
    for leak in ("Traceback", "Error(", "Exception", 'File "', ".py"):
        assert leak not in text, f"internal detail in the reply text: {text}"


@pytest.fixture(scope="module")
def target() -> Iterator[FuzzTarget]:
    closed: dict[int, Closed] = {}
    original: Callable[[warren.broker.server.amqp_connection.Connection], None] = (
        warren.broker.server.amqp_connection.Connection.connection_lost
    )

    def connection_lost(self: warren.broker.server.amqp_connection.Connection) -> None:
        if self.peer is not None and not self.closed:
            tuned = self.protocol.channel_max != 0  # 0 until a tune-ok is accepted
            closed[self.peer[1]] = Closed(tuned, self.close_reason)
        original(self)

    with (
        pytest.MonkeyPatch.context() as patch,
        run_broker(handshake_timeout=3000, deprecated_features_permit=FUZZ_PERMITS) as running,
    ):
        connection_class = warren.broker.server.amqp_connection.Connection
        patch.setattr(connection_class, "connection_lost", connection_lost)
        running.add_vhost("witness")
        fuzz = FuzzTarget(running, closed)
        logging.getLogger().addHandler(fuzz.errors)
        witness = fuzz.witness
        witness.start()
        try:
            while not witness.rounds and witness.error is None:
                time.sleep(0.01)
            yield fuzz
        finally:
            witness.stop.set()
            witness.join(10)
            logging.getLogger().removeHandler(fuzz.errors)
        assert witness.error is None, f"the second client failed: {witness.error!r}"
        assert witness.rounds >= 5, witness.rounds
        assert not fuzz.errors.records, [r.getMessage() for r in fuzz.errors.records]


def run_examples(target: FuzzTarget, strategy: Any, examples: int) -> None:
    target.forget_fuzz_state()
    baseline = target.census()
    assert baseline["connections"] == 1  # the witness

    @fuzz_settings(examples)
    @given(data=strategy)
    def one(data: bytes) -> None:
        target.forget_fuzz_state()  # examples must not depend on each other's leftovers
        target.check(data)

    one()
    target.wait_for_baseline(baseline)


# ---- the tests -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_seed_sessions_end_cleanly(target: FuzzTarget, name: str) -> None:
    # a seed ends with connection.close: the reading stops at the close-ok it awaits (a
    # loaded machine may pause the broker for longer than QUIET on the way)
    reply, _ = target.exchange(SEEDS[name], quiet=3)
    assert not reply.header
    methods = list(reply.methods())
    check_order(methods)
    assert not [m for _, m in methods if isinstance(m, commands.Connection.Close)]
    assert isinstance(methods[-1][1], commands.Connection.CloseOk), methods[-3:]


def test_mutated_sessions(target: FuzzTarget) -> None:
    run_examples(target, mutated_sessions(SEEDS), 150)


def test_random_streams(target: FuzzTarget) -> None:
    run_examples(target, random_streams(SEEDS), 100)
