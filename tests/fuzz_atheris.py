"""Coverage-guided fuzzing with atheris, for long runs: ``make fuzz`` (not part of CI).

    python tests/fuzz_atheris.py protocol [-max_total_time=600] [libFuzzer options]
    python tests/fuzz_atheris.py broker   [...]

``protocol`` feeds each input to protocol/ through ``fuzz_support.Driver``,
which asserts what the hypothesis suite asserts (only AMQPErrors of the
right scope, bounded buffering, well-formed properties). ``broker`` feeds it
to a real ``broker.connection.Connection`` on an in-memory transport (no
sockets, so thousands of inputs a second) and fails on anything logged at
ERROR, a 541 INTERNAL_ERROR, or a connection that is not released.

The corpus starts from the recorded client sessions (tests/fuzz_seeds) and
grows in build/fuzz-corpus/<target>; crashes are written to build/fuzz-crashes/.
An input's first octet picks how it is read: 0 = the bytes as they are,
otherwise a recorded handshake followed by the rest, so the fuzzer spends
its time past the handshake.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import struct
import sys
from pathlib import Path
from typing import Any

import structlog

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import atheris  # noqa: E402

with atheris.instrument_imports():
    from fuzz_support import (
        CONNECTION_CLOSE_CODES,
        FUZZ_PERMITS,
        Driver,
        handshake_length,
        load_seeds,
        split_frames,
    )

    import warren.broker.server.amqp_connection
    import warren.protocol.connection  # noqa: F401
    from warren.broker.engine.broker import Broker
    from warren.broker.engine.timers import Timers
    from warren.broker.server.amqp_connection import Connection
    from warren.config import Settings

SEEDS = load_seeds()
HANDSHAKES = []
for _data in SEEDS.values():
    _head, _frames, _ = split_frames(_data)
    HANDSHAKES.append(_head + b"".join(f.encode() for f in _frames[: handshake_length(_frames)]))


def stream(data: bytes) -> bytes:
    if not data or data[0] == 0:
        return data[1:]
    return HANDSHAKES[data[0] % len(HANDSHAKES)] + data[1:]


def fuzz_protocol(data: bytes) -> None:
    driver = Driver()
    raw = stream(data)
    cut = len(raw) // 2  # two reads, so a frame is split at least once
    driver.feed(raw[:cut])
    driver.feed(raw[cut:])


class MemoryTransport:
    def __init__(self) -> None:
        self.out = bytearray()
        self.closing = False

    def write(self, data: bytes) -> None:
        self.out += data

    def close(self) -> None:
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


class Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


LOOP = asyncio.new_event_loop()
ERRORS = Errors()
logging.getLogger().addHandler(ERRORS)
logging.getLogger().setLevel(logging.WARNING)
# the broker's log through the standard library, warnings and up: errors reach ERRORS
structlog.configure(
    processors=[structlog.processors.add_log_level, structlog.processors.KeyValueRenderer()],
    logger_factory=structlog.stdlib.LoggerFactory(),
    wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    cache_logger_on_first_use=True,
)
SETTINGS = Settings(
    data_dir=None,
    management_port=None,
    prometheus_port=None,
    deprecated_features_permit=FUZZ_PERMITS,  # as test_fuzz_broker.py's broker
)


def _turns(n: int = 3) -> None:
    for _ in range(n):
        LOOP.run_until_complete(asyncio.sleep(0))


def fuzz_broker(data: bytes) -> None:
    engine = Broker(SETTINGS, Timers(LOOP))
    transport = MemoryTransport()
    conn = Connection(engine, transport, ("127.0.0.1", 40000))
    engine.connections.add(conn)
    raw = stream(data)
    for start in range(0, len(raw), 4096):
        conn.data_received(raw[start : start + 4096])
        _turns()
    conn.connection_lost()
    _turns()
    if ERRORS.records:
        raise AssertionError([r.getMessage() for r in ERRORS.records])
    check_output(bytes(transport.out))
    assert not engine.connections, "a closed connection is still registered"
    assert all(not q.consumers for v in engine.vhosts.values() for q in v.queues.values())


def check_output(out: bytes) -> None:
    if out.startswith(b"AMQP"):
        out = out[8:]
    while len(out) >= 8:
        ftype, channel, size = struct.unpack_from(">BHI", out)
        payload = out[7 : 7 + size]
        assert out[7 + size] == 0xCE
        if ftype == 1 and channel == 0 and payload[:4] == b"\x00\x0a\x00\x32":
            (code,) = struct.unpack_from(">H", payload, 4)
            assert code in CONNECTION_CLOSE_CODES and code != 541, payload
        out = out[8 + size :]


TARGETS: dict[str, Any] = {"protocol": fuzz_protocol, "broker": fuzz_broker}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: {sys.argv[0]} {{{','.join(TARGETS)}}} [libFuzzer options] [corpus]")
    name = sys.argv.pop(1)
    corpus = HERE.parent / "build" / "fuzz-corpus" / name
    crashes = HERE.parent / "build" / "fuzz-crashes"
    corpus.mkdir(parents=True, exist_ok=True)
    crashes.mkdir(parents=True, exist_ok=True)
    for seed, data in SEEDS.items():  # whole sessions, and their handshake-prefixed tails
        (corpus / f"seed-{seed}").write_bytes(b"\x00" + data)
        _, frames, _ = split_frames(data)
        tail = b"".join(f.encode() for f in frames[handshake_length(frames) :])
        (corpus / f"seed-{seed}-tail").write_bytes(b"\x01" + tail)
    if not any(a.startswith("-artifact_prefix") for a in sys.argv):
        sys.argv.append(f"-artifact_prefix={crashes}/{name}-")
    if not any(not a.startswith("-") for a in sys.argv[1:]):
        sys.argv.append(str(corpus))
    gc.freeze()  # the seeds and modules: not scanned again on every input
    atheris.Setup(sys.argv, TARGETS[name])
    atheris.Fuzz()


if __name__ == "__main__":
    main()
