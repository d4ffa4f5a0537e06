"""The writer process, and the decoding of what it writes.

``python -m warren.broker.tracing.format DIR ROTATE_BYTES ROTATE_SECONDS OFFSET_NS``, started by
broker/tracing/handover.py, reads batches of the stream (broker/tracing/events.py) on its stdin
and appends them as they came to ``warren-trace-*.wtrace`` files, rotated by size and age:
it formats nothing, so that at full load it takes almost no CPU from the broker. It runs
at the lowest CPU priority. The rest of the module turns the files into the JSON lines
broker/tracing/schema.py declares: the report job (pipeline/job.py) decodes each file
on its own, in parallel, and ``python -m warren.broker.tracing.format decode DIR`` prints a
whole trace as JSON lines.
"""

from __future__ import annotations

import json
import marshal
import os
import struct
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from warren.broker.tracing.events import (
    ACK_RANGE,
    ACKS,
    CHANNEL_CLOSED,
    CONFIRMS,
    CONSUMER_TIMED_OUT,
    DEFINE,
    DEFINE_NAME,
    DELIVERED,
    FORGET,
    HEAD,
    NACKED,
    OBJ,
    PROPS,
    PUBLISHED,
    PUBLISHED1,
    REC_ACK_RANGE,
    REC_ACKS,
    REC_CONFIRMS,
    REC_DELIVERED,
    REC_KIND,
    REC_OBJ,
    REC_PUBLISHED,
    REC_PUBLISHED1,
    REC_TIME,
    TIME,
    UNDEFINE,
)
from warren.broker.tracing.schema import BOOL, BY_NAME, FIELDS, INT, LONG, LONGS, STRING, STRINGS
from warren.protocol.properties import TRACED_FLAGS_HI, TRACED_FLAGS_LO, split_properties

CHILD_NICENESS = 19  # the writer process runs on CPU the broker leaves: busy, it drops
MAGIC = b"WRNTRC03"  # a trace file's first bytes: the format's name, then its version
FILE_HEAD = struct.Struct("=8sqqq")
"""magic, session (the writer process's start, ns since the epoch), the file's number in its
session, nanoseconds from the broker's monotonic clock to the epoch"""
SUFFIX = ".wtrace"


class _Files:
    """The child's side: the batches as the broker sent them, in files rotated by size and
    age. Each file starts with the ids it needs (a batch defining every channel, consumer,
    queue and route alive at its start), so that it can be decoded without the others."""

    def __init__(
        self, directory: str, rotate_bytes: int, rotate_seconds: float, offset: int
    ) -> None:
        self.directory = directory
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self.offset = offset
        self.session = time.time_ns()
        self.file: IO[bytes] | None = None
        self.size = 0
        self.opened = 0.0
        self.seq = 0
        self.defs: dict[int, tuple[Any, ...]] = {}  # DEFINE tuples of live ids
        self.names: dict[int, tuple[Any, ...]] = {}  # DEFINE_NAME tuples

    def write(self, data: bytes, packed: bytes, side: list[Any]) -> None:
        if self.file is None or self.size >= self.rotate_bytes:
            self._open()
        assert self.file is not None
        self._batch(data, packed)
        defs, names = self.defs, self.names
        for event in side:  # the rare events only: the frequent ones are in ``data``
            if event is None:
                continue  # dropped by the broker (trace_writer.TraceWriter._trim)
            what = event[0]
            if what == DEFINE:
                defs[event[1]] = event
            elif what == UNDEFINE:
                defs.pop(event[1], None)
            elif what == DEFINE_NAME:
                names[event[1]] = event
            elif what == FORGET:
                names.clear()

    def _batch(self, data: bytes, packed: bytes) -> None:
        assert self.file is not None
        self.file.write(HEAD.pack(len(data), len(packed), False))
        self.file.write(data)
        self.file.write(packed)
        self.size += HEAD.size + len(data) + len(packed)

    def _open(self) -> None:
        self.close()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        while True:  # a writer process started in the same second may have taken the name
            self.seq += 1
            name = f"warren-trace-{stamp}-{os.getppid()}-{self.seq:04d}{SUFFIX}"
            try:
                self.file = open(os.path.join(self.directory, name), "xb")  # noqa: SIM115
                break
            except FileExistsError:
                continue
        self.file.write(FILE_HEAD.pack(MAGIC, self.session, self.seq, self.offset))
        self.size = FILE_HEAD.size
        self.opened = time.monotonic()
        known = [*self.defs.values(), *self.names.values()]
        if known:
            self._batch(
                b"".join([REC_OBJ.pack(OBJ, i) for i in range(len(known))]), marshal.dumps(known)
            )

    def tick(self) -> None:
        if self.file is not None:
            self.file.flush()
            if time.monotonic() - self.opened >= self.rotate_seconds:
                self.close()  # the next batch starts a new file

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


class _Decoder:
    """The reading side of the stream: records and side tuples back into JSON lines.

    The frequent events (published, delivered, acked) are formatted here from pieces of
    JSON made once per channel, consumer, queue and route as they are defined; the rest
    go back into tuples for the ``FORMATS``. It keeps each channel's unacked deliveries
    (tag -> message id and the consumer's pieces) to turn the broker's acks, which carry
    only tags, into one "acked" line per message.
    """

    def __init__(self, session: int = 0, partial: bool = False) -> None:
        # partial: one file of a session decoded alone (the report job decodes files in
        # parallel). A delivery then says which channel it is on ("chan", unique in the
        # session), and an ack whose delivery is in an earlier file comes out as
        # {"ev":"acked","chan":..,"tag":..} for the job to join with that delivery.
        self.partial = partial
        self.session = session
        self.pieces: dict[int, tuple[Any, ...]] = {}  # def id -> its JSON pieces
        self.names: dict[int, tuple[str, str]] = {}
        self.routes: dict[int, str] = {}  # name id -> ',"exchange":..,"rk":..'
        # (peer, ch) -> tag -> (message id, ',"ev":"acked",...,"msg":', ',"queue":..,"tag":')
        self.unacked: dict[tuple[Any, int], dict[int, tuple[int, str, str]]] = {}
        self.props: tuple[int, bytes] | None = None  # (trace id, properties) of the next publish
        self.ts = 0  # microseconds since the epoch: the last TIME record's

    def _define(self, n: int, definition: tuple[Any, ...]) -> None:
        vhost = _s(definition[0])
        if len(definition) == 2:  # a queue: (vhost, name)
            self.pieces[n] = (_s(definition[1]),)
        elif len(definition) == 3:  # a channel: (vhost, peer, ch)
            _, peer, ch = definition
            self.pieces[n] = (vhost, f',"conn":{_peer(peer)},"ch":{ch}', (peer, ch))
        else:  # a consumer: (vhost, queue, ctag, no_ack, peer, ch, its channel's id)
            _, queue, ctag, no_ack, peer, ch, channel = definition
            self.pieces[n] = (
                f',"ev":"delivered","vhost":{vhost},"msg":',
                f',"queue":{_s(queue)},"consumer":{_s(ctag)},"tag":',
                f',"no_ack":{_B[no_ack]},"conn":{_peer(peer)},"ch":{ch}{self._chan(channel)}}}\n',
                f',"ev":"acked","vhost":{vhost},"msg":',
                no_ack,
                (peer, ch),
            )

    def _chan(self, channel: int) -> str:
        """A delivery's channel, for the report job (partial decoding only)."""
        return f',"chan":"{self.session}.{channel}"' if self.partial else ""

    def _delivered(self, e: tuple[Any, ...], off: int) -> Iterator[str]:
        # basic.get: (DELIVERED, t, vhost, tid, queue, ctag, tag, redelivered, count, no_ack,
        # peer, ch, the channel's id)
        line = _delivered(e, off)
        yield f"{line[:-2]}{self._chan(e[12])}}}\n" if self.partial else line
        ack = f',"ev":"acked","vhost":{_s(e[2])},"msg":'
        rest = f',"queue":{_s(e[4])},"consumer":{_s(e[5])},"tag":'
        if e[9]:  # no-ack: settled as it is delivered
            yield f'{{"ts":{(e[1] + off) // 1000}{ack}{e[3]}{rest}{e[6]}}}\n'
        else:
            self.unacked.setdefault((e[10], e[11]), {})[e[6]] = (e[3], ack, rest)

    def _settled(self, peer: Any, ch: int, tags: Iterable[int]) -> None:
        channel = self.unacked.get((peer, ch))
        if channel is not None:
            for tag in tags:
                channel.pop(tag, None)

    def _side(self, event: tuple[Any, ...], off: int) -> Iterator[str]:
        what = event[0]
        if what == DEFINE:
            self._define(event[1], event[2])
        elif what == DEFINE_NAME:
            exchange, key = self.names[event[1]] = event[2]
            self.routes[event[1]] = f',"exchange":{_s(exchange)},"rk":{_s(key)}'
        elif what == FORGET:
            self.names.clear()
            self.routes.clear()
        elif what == UNDEFINE:
            self.pieces.pop(event[1], None)
        elif what == PROPS:
            self.props = (event[1], event[2])
        elif what == DELIVERED:  # basic.get
            yield from self._delivered(event, off)
        elif what == CHANNEL_CLOSED:
            self.unacked.pop((event[3], event[4]), None)
        else:
            if what == NACKED:
                self._settled(event[8], event[9], (event[6],))
            elif what == CONSUMER_TIMED_OUT:
                self._settled(event[5], event[6], event[7])
            yield FORMATS[what](event, off)

    def lines(self, data: bytes, side: list[Any], off: int) -> Iterator[str]:
        """The JSON lines of one batch: ``data``, the records; ``side``, the side list;
        ``off``, nanoseconds from the monotonic clock to the epoch."""
        pieces, unacked, ts = self.pieces, self.unacked, self.ts
        kind_of, i, n = REC_KIND.unpack_from, 0, len(data)
        while i < n:
            kind = kind_of(data, i)[0]
            if kind == DELIVERED:
                _, tid, consumer, tag, count, redelivered = REC_DELIVERED.unpack_from(data, i)
                i += REC_DELIVERED.size
                head, mid, tail, ack, no_ack, channel = pieces[consumer]
                yield (
                    f'{{"ts":{ts}{head}{tid}{mid}{tag},"redelivered":{_BOOL[redelivered]},'
                    f'"count":{count}{tail}'
                )
                if no_ack:
                    yield f'{{"ts":{ts}{ack}{tid}{mid}{tag}}}\n'
                else:
                    open_tags = unacked.get(channel)
                    if open_tags is None:
                        open_tags = unacked[channel] = {}
                    open_tags[tag] = (tid, ack, mid)
            elif kind in (PUBLISHED1, PUBLISHED):
                if kind == PUBLISHED1:
                    _, tid, channel_id, route, size, seq, queue, mandatory = (
                        REC_PUBLISHED1.unpack_from(data, i)
                    )
                    i += REC_PUBLISHED1.size
                    queues = f"[{pieces[queue][0]}]"
                else:
                    _, tid, channel_id, route, size, seq, count, mandatory = (
                        REC_PUBLISHED.unpack_from(data, i)
                    )
                    i += REC_PUBLISHED.size
                    ids = struct.unpack_from(f"<{count}q", data, i)
                    i += 8 * count
                    queues = "[" + ",".join(pieces[q][0] for q in ids) + "]"
                vhost, conn, _ = pieces[channel_id]
                head = f'{{"ts":{ts},"ev":"'
                common = f'","vhost":{vhost},"msg":{tid}{self.routes[route]}'
                props = ""
                if self.props is not None:  # the properties of this message, or a dropped one
                    if self.props[0] == tid:
                        props = _props(self.props[1])
                    self.props = None
                yield (
                    f'{head}published{common},"size":{size}{props}{conn},"seq":{seq}}}\n'
                    f'{head}routed{common},"queues":{queues},"mandatory":{_BOOL[mandatory]},'
                    f'"dead_letter":false}}\n'
                )
            elif kind in (ACK_RANGE, ACKS):
                tags: Iterable[int]
                if kind == ACK_RANGE:
                    _, channel_id, first, last = REC_ACK_RANGE.unpack_from(data, i)
                    i += REC_ACK_RANGE.size
                    tags = range(first, last + 1)
                else:
                    _, channel_id, count = REC_ACKS.unpack_from(data, i)
                    i += REC_ACKS.size
                    tags = struct.unpack_from(f"<{count}q", data, i)
                    i += 8 * count
                open_tags = unacked.get(pieces[channel_id][2], {})
                stamp = f'{{"ts":{ts}'
                for tag in tags:
                    delivery = open_tags.pop(tag, None)
                    if delivery is not None:
                        tid, ack, mid = delivery
                        yield f"{stamp}{ack}{tid}{mid}{tag}}}\n"
                    elif self.partial:  # delivered in an earlier file (or before tracing)
                        yield f'{stamp},"ev":"acked"{self._chan(channel_id)},"tag":{tag}}}\n'
            elif kind == CONFIRMS:
                _, channel_id, first, last, ack = REC_CONFIRMS.unpack_from(data, i)
                i += REC_CONFIRMS.size
                vhost, conn, _ = pieces[channel_id]
                yield (
                    f'{{"ts":{ts},"ev":"confirmed","vhost":{vhost}'
                    f'{conn},"first":{first},"seq":{last},"ack":{_BOOL[ack]}}}\n'
                )
            elif kind == TIME:
                ts = self.ts = (round(REC_TIME.unpack_from(data, i)[1] * 1e9) + off) // 1000
                i += REC_TIME.size
            elif kind == OBJ:
                yield from self._side(side[REC_OBJ.unpack_from(data, i)[1]], off)
                i += REC_OBJ.size
            else:
                raise ValueError(f"unknown event kind {kind} in the trace stream")


def _child_main(argv: list[str]) -> int:
    """The writer process's main loop (argv as the module docstring says)."""
    directory, rotate_bytes, rotate_seconds, offset = argv
    # below the broker: on a saturated machine the broker keeps the CPU, this process falls
    # behind, the broker's buffers fill and events are dropped (and counted)
    os.nice(CHILD_NICENESS)
    files = _Files(directory, int(rotate_bytes), float(rotate_seconds), int(offset))
    source, reply = sys.stdin.buffer, sys.stdout.buffer
    while True:
        head = source.read(HEAD.size)
        if len(head) < HEAD.size:
            break  # the broker closed the pipe (or died): everything received is written
        n_data, n_side, sync = HEAD.unpack(head)
        data = source.read(n_data)
        packed = source.read(n_side)
        if data or n_side > _EMPTY:
            files.write(data, packed, marshal.loads(packed))
        files.tick()
        if sync:
            reply.write(b"\x01")
            reply.flush()
    files.close()
    return 0


_EMPTY = len(marshal.dumps([]))


# ---- reading the files (the report job, tools, tests) ----


def _batches(data: bytes, at: int) -> Iterator[tuple[bytes, list[Any]]]:
    """The batches of a trace file from ``at``, up to a batch cut short by a crash."""
    n = len(data)
    while at + HEAD.size <= n:
        n_data, n_side, _ = HEAD.unpack_from(data, at)
        end = at + HEAD.size + n_data + n_side
        if end > n:
            return
        records = data[at + HEAD.size : at + HEAD.size + n_data]
        yield records, marshal.loads(data[end - n_side : end])
        at = end


def file_lines(data: bytes, decoder: _Decoder | None = None) -> Iterator[str]:
    """The JSON lines of one trace file's bytes, one per item. Without a ``decoder`` the
    file is decoded alone (partially: see _Decoder). A file that is already JSON lines
    comes out as it is."""
    if data[: len(MAGIC)] != MAGIC:
        if data[:6] == MAGIC[:6]:
            raise ValueError(f"trace file format {data[6:8]!r}: this Warren reads {MAGIC[6:]!r}")
        yield from data.decode("utf-8", "replace").splitlines(keepends=True)
        return
    if len(data) < FILE_HEAD.size:
        return  # a crash as the file was opened
    _, session, _, offset = FILE_HEAD.unpack_from(data)
    if decoder is None:
        decoder = _Decoder(session, partial=True)
    for records, side in _batches(data, FILE_HEAD.size):
        # one line per item (the decoder makes some two at a time)
        yield from "".join(decoder.lines(records, side, offset)).splitlines(keepends=True)


def file_number(data: bytes) -> int:
    """A trace file's number in its session (0: a file of JSON lines, or cut short)."""
    if data[: len(MAGIC)] == MAGIC and len(data) >= FILE_HEAD.size:
        return int(FILE_HEAD.unpack_from(data)[2])
    return 0


def trace_files(directory: str) -> list[str]:
    """The trace files in ``directory``, each session's in the order they were written."""
    order = []
    for name in os.listdir(directory):
        if not name.startswith("warren-trace-"):
            continue
        path = os.path.join(directory, name)
        with open(path, "rb") as file:
            head = file.read(FILE_HEAD.size)
        if len(head) == FILE_HEAD.size and head[: len(MAGIC)] == MAGIC:
            _, session, seq, _ = FILE_HEAD.unpack(head)
            order.append(((session, seq, name), path))
        else:
            order.append(((0, 0, name), path))
    return [path for _, path in sorted(order)]


def lines(paths: Iterable[str]) -> Iterator[str]:
    """The JSON lines of whole sessions' files (``trace_files``' order), each session
    decoded as one stream (an ack always finds its delivery)."""
    decoders: dict[int, _Decoder] = {}
    for path in paths:
        with open(path, "rb") as file:
            data = file.read()
        binary = data[: len(MAGIC)] == MAGIC and len(data) >= FILE_HEAD.size
        session = FILE_HEAD.unpack_from(data)[1] if binary else 0
        decoder = decoders.get(session)
        if decoder is None:
            decoder = decoders[session] = _Decoder(session)
        yield from file_lines(data, decoder)


def events(directory: str) -> list[dict[str, Any]]:
    """Every event in ``directory``'s trace files, as dicts (tools and tests)."""
    return [json.loads(line) for line in lines(trace_files(directory))]


def _decode_main(argv: list[str]) -> int:
    """``decode PATH...``: the JSON lines of trace files (or of every one in a directory)."""
    paths: list[str] = []
    for path in argv:
        paths += trace_files(path) if os.path.isdir(path) else [path]
    out = sys.stdout
    for line in lines(paths):
        out.write(line)
    return 0


# ---- formatting (as the files are read) ----

_strings: dict[str, str] = {}  # names repeat: each is JSON-encoded once


def _s(value: str | None) -> str:
    if value is None:
        return "null"
    out = _strings.get(value)
    if out is None:
        out = json.dumps(value, ensure_ascii=False)
        if len(_strings) < 100_000:
            _strings[value] = out
    return out


def _list(values: Iterable[str]) -> str:
    return "[" + ",".join(_s(v) for v in values) + "]"


def _peer(peer: tuple[str, int] | None) -> str:
    return "null" if peer is None else _s(f"{peer[0]}:{peer[1]}")


_B = {True: "true", False: "false"}
_BOOL = ("false", "true")  # by a 0 or 1 from the int stream


def _props(raw: bytes) -> str:
    """message-id, correlation-id and persistence, read from the publisher's bytes."""
    if len(raw) < 2 or not (raw[0] & TRACED_FLAGS_HI or raw[1] & TRACED_FLAGS_LO):
        return ""
    try:
        fields = split_properties(raw)
    except ValueError:
        return ""
    out = ""
    for name, key in (("message_id", "mid"), ("correlation_id", "cid")):
        field = fields.get(name)
        if field is not None:
            out += f',"{key}":{json.dumps(field[1:].decode("utf-8", "replace"))}'
    mode = fields.get("delivery_mode")
    if mode is not None and mode[:1] == b"\x02":
        out += ',"persistent":true'
    return out


def _head(e: tuple[Any, ...], off: int, name: str) -> str:
    return f'{{"ts":{(e[1] + off) // 1000},"ev":"{name}","vhost":{_s(e[2])}'


def _published(e: tuple[Any, ...], off: int) -> str:
    # (K, t, vhost, tid, exchange, rk, size, props, peer, ch, seq, names, mandatory)
    head = f'{{"ts":{(e[1] + off) // 1000},"ev":"%s","vhost":{_s(e[2])},"msg":{e[3]}'
    ex_rk = f',"exchange":{_s(e[4])},"rk":{_s(e[5])}'
    names = e[11]
    queues = f"[{_s(names)}]" if isinstance(names, str) else _list(names)
    return (
        f'{head % "published"}{ex_rk},"size":{e[6]}{_props(e[7])},"conn":{_peer(e[8])},'
        f'"ch":{e[9]},"seq":{e[10]}}}\n'
        f'{head % "routed"}{ex_rk},"queues":{queues},"mandatory":{_B[e[12]]},'
        f'"dead_letter":false}}\n'
    )


def _longs(values: Iterable[int]) -> str:
    return "[" + ",".join(map(str, values)) + "]"


_ENCODE: dict[str, Callable[[Any], str]] = {
    LONG: str,
    INT: str,
    STRING: _s,
    BOOL: _B.__getitem__,
    STRINGS: _list,
    LONGS: _longs,
}


def _formatter(name: str) -> Callable[[tuple[Any, ...], int], str]:
    """The line of a rare event from its tuple: (K, t, vhost, then its fields in the order
    broker/tracing/schema.py declares them; more items after those are not written)."""
    keys = [
        (f',"{field}":', _peer if field == "conn" else _ENCODE[FIELDS[field]])
        for field in BY_NAME[name].fields
    ]

    def line(e: tuple[Any, ...], off: int) -> str:
        values = "".join([key + encode(v) for (key, encode), v in zip(keys, e[3:], strict=False)])
        return f"{_head(e, off, name)}{values}}}\n"

    return line


def _delivered(e: tuple[Any, ...], off: int) -> str:
    # (K, t, vhost, tid, queue, ctag, tag, redelivered, count, no_ack, peer, ch): by hand,
    # as pipeline/generate.py formats one a message
    return (
        f'{{"ts":{(e[1] + off) // 1000},"ev":"delivered","vhost":{_s(e[2])},"msg":{e[3]},'
        f'"queue":{_s(e[4])},"consumer":{_s(e[5])},"tag":{e[6]},"redelivered":{_B[e[7]]},'
        f'"count":{e[8]},"no_ack":{_B[e[9]]},"conn":{_peer(e[10])},"ch":{e[11]}}}\n'
    )


def _acked(e: tuple[Any, ...], off: int) -> str:
    # (K, t, vhost, tid, queue, ctag, tag): by hand, as _delivered
    return (
        f'{{"ts":{(e[1] + off) // 1000},"ev":"acked","vhost":{_s(e[2])},"msg":{e[3]},'
        f'"queue":{_s(e[4])},"consumer":{_s(e[5])},"tag":{e[6]}}}\n'
    )


_routed_line = _formatter("routed")


def _routed(e: tuple[Any, ...], off: int) -> str:
    # (K, t, vhost, tid, exchange, rk, names): a dead-lettered copy
    return _routed_line((*e, False, True), off)  # mandatory false, dead_letter true


_expired, _dead_lettered, _dropped_msg = (
    _formatter(name) for name in ("expired", "dead_lettered", "dropped")
)


def _dead(e: tuple[Any, ...], off: int) -> str:
    # (K, t, vhost, tid, queue, reason, dlx, dlrk)
    reason = e[5]
    out = _expired(e, off) if reason == "expired" else ""
    if e[6] is not None:
        return out + _dead_lettered(e, off)
    return out if reason == "expired" else _dropped_msg(e, off)


def _mark(e: tuple[Any, ...], off: int) -> str:
    return f"{_head(e, off, e[3])}}}\n"


FORMATS: tuple[Callable[[tuple[Any, ...], int], str], ...] = (
    _published,
    _routed,
    _formatter("confirmed"),
    _delivered,
    _acked,
    _formatter("nacked"),
    _formatter("requeued"),
    _formatter("retry_scheduled"),
    _dead,
    _formatter("adopted"),
    _formatter("consumer_added"),
    _formatter("consumer_timed_out"),
    _formatter("consumer_cancelled"),
    _formatter("queue_expired"),
    _formatter("queue_deleted"),
    _formatter("delayed"),
    _formatter("released"),
    _mark,
    _formatter("trace_dropped"),
)


if __name__ == "__main__":
    if sys.argv[1:2] == ["decode"]:
        sys.exit(_decode_main(sys.argv[2:]))
    sys.exit(_child_main(sys.argv[1:]))
