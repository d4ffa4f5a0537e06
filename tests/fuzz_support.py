"""Shared by the fuzzers: recorded seeds, frame-level mutations, and a sans-IO driver.

Seeds are byte streams that pika and aio-pika sent to a broker
(``tests/fuzz_capture.py`` records them). The strategies here cut a seed
into frames and mutate it the ways a broken or hostile peer would: wrong
lengths and frame types, frames moved to other channels, truncated frames,
field tables nested past the limit, huge and non-UTF-8 strings, random
methods with random arguments, and plain random bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from pamqp import commands

from warren.protocol.connection import (
    CLOSING,
    NEED_DATA,
    OPEN,
    OPENING,
    Content,
    ProtocolConnection,
    Sentinel,
)
from warren.protocol.constants import PROTOCOL_HEADER, REPLY_NAMES
from warren.protocol.errors import AMQPError, ChannelError, ConnectionError_
from warren.protocol.methods import make
from warren.protocol.properties import read_properties
from warren.protocol.tables import MAX_DEPTH

SEEDS_DIR = Path(__file__).resolve().parent / "fuzz_seeds"

# The seeds are sessions of 3.x-era clients (transient queues), and 541 in a fuzz run means
# an escaped exception: RabbitMQ 4.3's 541 refusals of deprecated features are permitted
# away for the fuzzed brokers (test_fuzz_broker.py and fuzz_atheris.py's broker target)
FUZZ_PERMITS = (("transient_nonexcl_queues", True), ("queue_master_locator", True))

# hard errors close the connection, soft ones a channel (AMQP 0-9-1, section 1.2)
HARD_CODES = frozenset({320, 402, 501, 502, 503, 504, 505, 506, 530, 540, 541})
SOFT_CODES = frozenset({311, 312, 313, 403, 404, 405, 406})
# what a broker may put in connection.close: RabbitMQ refuses a login with 403 there
CONNECTION_CLOSE_CODES = HARD_CODES | {403}


def load_seeds() -> dict[str, bytes]:
    seeds = {p.stem: p.read_bytes() for p in sorted(SEEDS_DIR.glob("*.amqp"))}
    assert seeds, f"no seeds in {SEEDS_DIR}: run tests/fuzz_capture.py"
    return seeds


# ---- frames ------------------------------------------------------------------------


@dataclass(frozen=True)
class RawFrame:
    type: int
    channel: int
    payload: bytes
    end: int = 0xCE
    size_delta: int = 0  # a length field that lies by this much

    def encode(self) -> bytes:
        size = max(0, min(2**32 - 1, len(self.payload) + self.size_delta))
        return struct.pack(">BHI", self.type, self.channel, size) + self.payload + bytes([self.end])


def split_frames(data: bytes) -> tuple[bytes, list[RawFrame], bytes]:
    """A recorded stream as (protocol header, frames, bytes after the last whole frame)."""
    head, rest = data[:8], data[8:]
    frames: list[RawFrame] = []
    while len(rest) >= 8:
        ftype, channel, size = struct.unpack_from(">BHI", rest)
        if len(rest) < 8 + size:
            break
        frames.append(RawFrame(ftype, channel, rest[7 : 7 + size], rest[7 + size]))
        rest = rest[8 + size :]
    return head, frames, rest


def handshake_length(frames: list[RawFrame]) -> int:
    """How many leading frames are the handshake (start-ok, tune-ok, open)."""
    for i, frame in enumerate(frames):
        if frame.type == 1 and frame.channel == 0 and frame.payload[:4] == b"\x00\x0a\x00\x28":
            return i + 1
    return 0


def frame(ftype: int, channel: int, payload: bytes) -> bytes:
    return RawFrame(ftype, channel, payload).encode()


# ---- field values, tables and methods ------------------------------------------------


def shortstr(raw: bytes) -> bytes:
    return bytes([len(raw)]) + raw


def longstr(raw: bytes) -> bytes:
    return struct.pack(">I", len(raw)) + raw


def table_bytes(entries: list[tuple[bytes, bytes]]) -> bytes:
    body = b"".join(shortstr(k) + v for k, v in entries)
    return struct.pack(">I", len(body)) + body


def nested_table(levels: int, arrays: bool = False) -> bytes:
    """A table with ``levels`` containers in all, the table itself included.

    With ``arrays``, every other container below the top is an array.
    """
    value = b"t\x01"
    for level in range(levels - 1, 0, -1):  # innermost first
        if arrays and level % 2:
            value = b"A" + longstr(value)
        else:
            value = b"F" + table_bytes([(b"k", value)])
    return table_bytes([(b"k", value)])


_text = st.binary(max_size=40) | st.text(max_size=20).map(str.encode)
_scalar_values = st.one_of(
    st.tuples(st.just(b"t"), st.binary(min_size=1, max_size=1)),
    st.tuples(st.sampled_from([b"b", b"B"]), st.binary(min_size=1, max_size=1)),
    st.tuples(st.sampled_from([b"s", b"u"]), st.binary(min_size=2, max_size=2)),
    st.tuples(st.sampled_from([b"I", b"i", b"f"]), st.binary(min_size=4, max_size=4)),
    st.tuples(st.sampled_from([b"l", b"L", b"d", b"T"]), st.binary(min_size=8, max_size=8)),
    st.tuples(st.just(b"D"), st.binary(min_size=5, max_size=5)),
    st.tuples(st.sampled_from([b"S", b"x"]), _text.map(longstr)),
    st.tuples(st.just(b"V"), st.just(b"")),
    # a type octet no decoder knows
    st.tuples(st.sampled_from([b"Z", b"\x00", b"\xff", b"c"]), st.binary(max_size=4)),
).map(lambda pair: pair[0] + pair[1])


def _containers(children: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    tables = st.lists(st.tuples(_text.map(lambda b: b[:255]), children), max_size=4).map(
        lambda entries: b"F" + table_bytes(entries)
    )
    arrays = st.lists(children, max_size=4).map(lambda items: b"A" + longstr(b"".join(items)))
    return tables | arrays


field_values: st.SearchStrategy[bytes] = st.recursive(_scalar_values, _containers, max_leaves=12)


@st.composite
def field_tables(draw: st.DrawFn) -> bytes:
    """An encoded table: usually well formed, sometimes deep, huge or cut short."""
    kind = draw(st.sampled_from(["random", "random", "random", "deep", "huge", "cut"]))
    if kind == "deep":
        levels = draw(st.integers(MAX_DEPTH - 1, MAX_DEPTH + 3))
        return nested_table(levels, draw(st.booleans()))
    entries = draw(st.lists(st.tuples(_text.map(lambda b: b[:255]), field_values), max_size=5))
    if kind == "huge":
        entries.append((b"h" * 255, b"S" + longstr(b"\xf0" * draw(st.integers(256, 20_000)))))
    raw = table_bytes(entries)
    if kind == "cut":
        cut = draw(st.integers(0, max(0, len(raw) - 1)))
        raw = raw[:cut]
    return raw


_ARG_STRATEGIES: dict[str, st.SearchStrategy[bytes]] = {
    "octet": st.integers(0, 255).map(lambda n: struct.pack(">B", n)),
    "short": st.integers(0, 2**16 - 1).map(lambda n: struct.pack(">H", n)),
    "long": st.integers(0, 2**32 - 1).map(lambda n: struct.pack(">I", n)),
    "longlong": st.integers(0, 2**64 - 1).map(lambda n: struct.pack(">Q", n)),
    "timestamp": st.integers(0, 2**64 - 1).map(lambda n: struct.pack(">Q", n)),
    "shortstr": st.one_of(
        st.sampled_from([b"", b"amq.direct", b"amq.topic", b"amq.fanout", b"q", b"x"]),
        st.binary(max_size=255),
        st.just(b"\xff" * 255),
    ).map(shortstr),
    "longstr": st.one_of(st.binary(max_size=64), st.just(b"\x00guest\x00guest")).map(longstr),
    "table": field_tables(),
}
METHOD_CLASSES = sorted(commands.INDEX_MAPPING.items())


@st.composite
def method_payloads(draw: st.DrawFn) -> bytes:
    """A method frame payload: a known method with random arguments, or an unknown one."""
    if draw(st.integers(0, 9)) == 0:
        return struct.pack(">HH", *draw(st.tuples(st.integers(0, 65535), st.integers(0, 65535))))
    index, cls = draw(st.sampled_from(METHOD_CLASSES))
    out = [struct.pack(">I", index)]
    bits: list[bool] = []
    for attr in cls.__slots__:
        kind = getattr(cls, "_" + attr)
        if kind == "bit":
            bits.append(draw(st.booleans()))
            continue
        if bits:
            out.append(bytes([sum(b << i for i, b in enumerate(bits))]))
            bits = []
        out.append(draw(_ARG_STRATEGIES[kind]))
    if bits:
        out.append(bytes([sum(b << i for i, b in enumerate(bits))]))
    return b"".join(out)


@st.composite
def content_header_payloads(draw: st.DrawFn) -> bytes:
    body_size = draw(st.sampled_from([0, 1, 10, 4096, 2**20, 2**63]) | st.integers(0, 2**64 - 1))
    class_id = draw(st.sampled_from([60, 60, 60, 10, 0]))
    flags = draw(st.sampled_from([0, 0x2000, 0x9000, 0xFFFC, 0x0001]) | st.integers(0, 0xFFFF))
    props = struct.pack(">H", flags)
    if flags & 0x2000 and draw(st.booleans()):
        props += draw(field_tables())
    props += draw(st.binary(max_size=40))
    return struct.pack(">HHQ", class_id, 0, body_size) + props


# ---- mutations ------------------------------------------------------------------------

Mutation = Callable[[st.DrawFn, list[RawFrame], int], list[RawFrame]]
CHANNELS = st.sampled_from([0, 1, 1, 2, 3, 65535]) | st.integers(0, 65535)


def _index(draw: st.DrawFn, frames: list[RawFrame], first: int) -> int:
    # mostly after the handshake: a broken handshake only ever meets a closed socket
    low = first if first < len(frames) and draw(st.integers(0, 7)) else 0
    return draw(st.integers(low, len(frames) - 1))


def _flip(draw: st.DrawFn, frames: list[RawFrame], first: int) -> list[RawFrame]:
    i = _index(draw, frames, first)
    payload = bytearray(frames[i].payload)
    for _ in range(draw(st.integers(1, 4))):
        if payload:
            pos = draw(st.integers(0, len(payload) - 1))
            payload[pos] = draw(st.sampled_from([0, 1, 0x7F, 0x80, 0xFF]) | st.integers(0, 255))
    frames[i] = replace(frames[i], payload=bytes(payload))
    return frames


def _resize(draw: st.DrawFn, frames: list[RawFrame], first: int) -> list[RawFrame]:
    i = _index(draw, frames, first)
    payload = frames[i].payload
    if draw(st.booleans()):
        payload = payload[: draw(st.integers(0, len(payload)))]
    else:
        payload += draw(st.binary(min_size=1, max_size=64))
    frames[i] = replace(frames[i], payload=payload)
    return frames


def _lie_about_size(draw: st.DrawFn, frames: list[RawFrame], first: int) -> list[RawFrame]:
    i = _index(draw, frames, first)
    delta = draw(st.sampled_from([-1, 1, -8, 8, 2**31, 2**32]) | st.integers(-100, 100))
    frames[i] = replace(frames[i], size_delta=delta)
    return frames


def _retype(draw: st.DrawFn, frames: list[RawFrame], first: int) -> list[RawFrame]:
    i = _index(draw, frames, first)
    frames[i] = replace(frames[i], type=draw(st.sampled_from([0, 1, 2, 3, 4, 8, 9, 0xCE, 255])))
    return frames


def _rechannel(draw: st.DrawFn, frames: list[RawFrame], first: int) -> list[RawFrame]:
    i = _index(draw, frames, first)
    frames[i] = replace(frames[i], channel=draw(CHANNELS))
    return frames


def _bad_end(draw: st.DrawFn, frames: list[RawFrame], first: int) -> list[RawFrame]:
    i = _index(draw, frames, first)
    frames[i] = replace(frames[i], end=draw(st.integers(0, 255)))
    return frames


def _drop(draw: st.DrawFn, frames: list[RawFrame], first: int) -> list[RawFrame]:
    del frames[_index(draw, frames, first)]
    return frames


def _duplicate(draw: st.DrawFn, frames: list[RawFrame], first: int) -> list[RawFrame]:
    i = _index(draw, frames, first)
    frames.insert(i, frames[i])
    return frames


def _move(draw: st.DrawFn, frames: list[RawFrame], first: int) -> list[RawFrame]:
    """Take a frame out and put it elsewhere: interleaves contents and channels."""
    item = frames.pop(_index(draw, frames, first))
    frames.insert(draw(st.integers(min(first, len(frames)), len(frames))), item)
    return frames


def _insert(draw: st.DrawFn, frames: list[RawFrame], first: int) -> list[RawFrame]:
    kind = draw(st.sampled_from(["method", "method", "header", "body", "heartbeat"]))
    channel = draw(CHANNELS)
    if kind == "method":
        new = RawFrame(1, channel, draw(method_payloads()))
    elif kind == "header":
        new = RawFrame(2, channel, draw(content_header_payloads()))
    elif kind == "body":
        new = RawFrame(3, channel, draw(st.binary(max_size=300)))
    else:
        new = RawFrame(8, channel, b"")
    frames.insert(draw(st.integers(min(first, len(frames)), len(frames))), new)
    return frames


def _huge_string(draw: st.DrawFn, frames: list[RawFrame], first: int) -> list[RawFrame]:
    """A publish whose exchange and routing key are 255 octets of non-UTF-8."""
    channel = draw(st.sampled_from([1, 2]))
    payload = b"\x00\x3c\x00\x28\x00\x00" + shortstr(b"\xfe" * 255) + shortstr(b"\xc3" * 255)
    publish = [
        RawFrame(1, channel, payload + b"\x00"),
        RawFrame(2, channel, struct.pack(">HHQH", 60, 0, 1, 0)),
        RawFrame(3, channel, b"x"),
    ]
    at = draw(st.integers(min(first, len(frames)), len(frames)))
    frames[at:at] = publish
    return frames


MUTATIONS: tuple[Mutation, ...] = (
    _flip,
    _resize,
    _lie_about_size,
    _retype,
    _rechannel,
    _bad_end,
    _drop,
    _duplicate,
    _move,
    _insert,
    _insert,
    _huge_string,
)


@st.composite
def mutated_sessions(draw: st.DrawFn, seeds: dict[str, bytes]) -> bytes:
    """A recorded session with a few frame-level and byte-level mutations."""
    name = draw(st.sampled_from(sorted(seeds)))
    head, frames, tail = split_frames(seeds[name])
    first = handshake_length(frames)
    for _ in range(draw(st.integers(0, 4))):
        if not frames:
            break
        frames = draw(st.sampled_from(MUTATIONS))(draw, frames, first)
    start = len(head) + sum(len(f.encode()) for f in frames[:first])
    data = head + b"".join(f.encode() for f in frames) + tail
    after = st.integers(min(start, len(data) - 1), len(data) - 1)  # past the handshake
    if draw(st.integers(0, 5)) == 0:  # a few raw byte edits, ignoring frame boundaries
        raw = bytearray(data)
        for _ in range(draw(st.integers(1, 3))):
            raw[draw(after)] = draw(st.integers(0, 255))
        data = bytes(raw)
    if draw(st.integers(0, 5)) == 0:  # the peer stops mid-frame
        data = data[: draw(after)]
    return data


@st.composite
def random_streams(draw: st.DrawFn, seeds: dict[str, bytes]) -> bytes:
    """A valid handshake from a seed, then random frames; or random bytes from the start."""
    if draw(st.integers(0, 4)) == 0:
        prefix = draw(st.sampled_from([b"", PROTOCOL_HEADER, b"AMQP", b"AMQP\x01\x01\x00\x09"]))
        return prefix + draw(st.binary(max_size=200))
    head, frames, _ = split_frames(seeds[draw(st.sampled_from(sorted(seeds)))])
    first = handshake_length(frames)
    out = [head, *(f.encode() for f in frames[:first])]
    open_channels = draw(st.lists(st.sampled_from([1, 2, 3]), max_size=3, unique=True))
    out += [frame(1, ch, b"\x00\x14\x00\x0a\x00") for ch in open_channels]  # channel.open
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["method", "method", "method", "publish", "frame"]))
        channel = draw(st.sampled_from([*open_channels, 0, 1, 9]))
        if kind == "method":
            out.append(frame(1, channel, draw(method_payloads())))
        elif kind == "publish":
            out.append(frame(1, channel, b"\x00\x3c\x00\x28\x00\x00\x00\x01q\x00"))
            out.append(frame(2, channel, draw(content_header_payloads())))
            bodies = draw(st.lists(st.binary(max_size=50), max_size=3))
            out += [frame(3, channel, body) for body in bodies]
        else:
            out.append(
                RawFrame(draw(st.integers(0, 255)), channel, draw(st.binary(max_size=30))).encode()
            )
    return b"".join(out)


# ---- the sans-IO driver ------------------------------------------------------------------


class Finished(Exception):
    """The connection is over: the broker would close it now."""


@dataclass
class Outcome:
    events: list[str]
    error: AMQPError | None  # the connection-level error that ended it, if any
    channel_errors: list[tuple[int, int]]  # (channel, code)


class Driver:
    """Feeds bytes to a ProtocolConnection and plays the broker's part, as the broker does.

    Each event is checked as it comes: the properties a fuzz test states
    about ``protocol/`` are asserted here, so every test shares them.
    """

    def __init__(self, frame_max: int = 131072, max_message_size: int = 1 << 20) -> None:
        self.server_frame_max = frame_max
        self.proto: ProtocolConnection[None] = ProtocolConnection(frame_max, max_message_size)
        self.max_message_size = max_message_size
        self.opened: set[int] = set()
        self.events: list[str] = []
        self.channel_errors: list[tuple[int, int]] = []
        self.error: AMQPError | None = None
        self.done = False

    def feed(self, data: bytes) -> None:
        proto = self.proto
        if self.done:
            if proto.failed:
                before = proto.buffered
                proto.receive_data(data)
                # past a framing error nothing that still arrives is kept
                assert proto.buffered <= before, "a failed connection buffers input"
            return  # otherwise the broker has closed the socket
        proto.receive_data(data)
        while not self.done:
            try:
                event = proto.next_event()
            except ConnectionError_ as exc:
                self._connection_error(exc)
                break
            except ChannelError as exc:
                self._channel_error(exc)
                continue
            except Exception as exc:  # the one thing a fuzzer must never see
                raise AssertionError(f"{type(exc).__name__} escaped protocol/: {exc!r}") from exc
            if event is NEED_DATA:
                break
            try:
                self._event(event)
            except Finished:
                self.done = True
        self._check_bounds()

    def _event(self, event: Any) -> None:
        proto = self.proto
        if event is Sentinel.PROTOCOL_HEADER:
            self.events.append("header")
            proto.send(0, commands.Connection.Start(mechanisms="PLAIN", locales="en_US"))
            return
        if event is Sentinel.BAD_PROTOCOL_HEADER:
            self.events.append("bad-header")
            raise Finished
        if isinstance(event, Content):
            channel, item = event.channel, event
        else:
            assert isinstance(event, tuple), event
            channel, item = event
        assert 0 <= channel <= 65535
        if isinstance(item, Content):
            assert channel in self.opened, "content on a channel that was never opened"
            assert len(item.body) <= self.max_message_size
            read_properties(item.properties)  # the broker may trust what protocol/ passes on
            self.events.append(f"{channel}:content:{len(item.body)}")
            return
        name = getattr(item, "name", type(item).__name__)
        self.events.append(f"{channel}:{name}")
        if channel == 0:
            # the protocol lets each handshake step through once, in order, and tunes itself
            if isinstance(item, commands.Connection.StartOk):
                tune = commands.Connection.Tune(2047, self.server_frame_max, 0)
                proto.send(0, tune)
            elif isinstance(item, commands.Connection.Open):
                proto.send(0, commands.Connection.OpenOk())
            elif isinstance(item, commands.Connection.Close):
                proto.send(0, commands.Connection.CloseOk())
                raise Finished
            elif isinstance(item, commands.Connection.CloseOk):
                raise Finished
            return
        if isinstance(item, commands.Channel.Open):
            assert channel not in self.opened or channel not in proto.channels
            self.opened.add(channel)
            proto.send(channel, make(commands.Channel.OpenOk, channel_id=""))
        elif isinstance(item, commands.Channel.Close):
            proto.send(channel, commands.Channel.CloseOk())
            self.opened.discard(channel)
        elif isinstance(item, commands.Channel.CloseOk):
            self.opened.discard(channel)
        elif isinstance(item, commands.Queue.Declare) and item.passive:
            # stands in for any method the broker refuses with channel.close
            proto.send(channel, commands.Channel.Close(404, "NOT_FOUND - no queue", 50, 10))

    def _connection_error(self, exc: ConnectionError_) -> None:
        check_error(exc, HARD_CODES)
        proto = self.proto
        if proto.failed:
            # the stream cannot be trusted past a framing error: nothing more comes out
            assert proto.next_event() is NEED_DATA
        else:  # a method out of turn on channel 0: the broker closes, close-ok may follow
            assert exc.code == 504 and "unexpected method in connection state" in exc.text
            if proto.state is OPENING or proto.state is OPEN:
                proto.send(0, commands.Connection.Close(exc.code, exc.text[:255], 0, 0))
            else:
                proto.abort()
            assert proto.state is CLOSING
        self.error = exc
        self.events.append(f"connection-error:{exc.code}")
        self.done = True

    def _channel_error(self, exc: ChannelError) -> None:
        check_error(exc, SOFT_CODES)
        assert exc.channel in self.proto.channels, "channel error on a channel that is not open"
        self.channel_errors.append((exc.channel, exc.code))
        self.events.append(f"channel-error:{exc.channel}:{exc.code}")
        self.proto.send(exc.channel, commands.Channel.Close(exc.code, exc.text[:255], 60, 40))

    def _check_bounds(self) -> None:
        proto = self.proto
        if self.done:
            return
        # nothing beyond one frame waits unparsed, nor more than one message per channel
        assert proto.buffered <= proto.frame_max + 8, proto.buffered
        for state in proto.channels.values():
            held = sum(len(p) for p in state.parts)
            assert held <= state.body_size <= self.max_message_size

    def outcome(self) -> Outcome:
        return Outcome(self.events, self.error, self.channel_errors)


def check_error(exc: AMQPError, codes: frozenset[int]) -> None:
    assert exc.code in codes, f"{type(exc).__name__} with code {exc.code}: {exc.text}"
    assert exc.text.startswith(REPLY_NAMES[exc.code] + " - "), exc.text
    assert 0 <= exc.class_id <= 65535 and 0 <= exc.method_id <= 65535
    assert "Traceback" not in exc.text


def drive(data: bytes, chunks: list[int] | None = None, **kw: Any) -> Outcome:
    """Run ``data`` through a Driver, cut at the given chunk sizes (the rest in one piece)."""
    driver = Driver(**kw)
    pos = 0
    for size in chunks or []:
        driver.feed(data[pos : pos + size])
        pos += size
    driver.feed(data[pos:])
    return driver.outcome()
