"""The trace stream: what the broker's loop hands to the writer process, which writes it
to the trace files as it is; shared by the broker and the decoder (broker/tracing/format.py).

The frequent events (published, delivered, acked, confirmed) travel as fixed-size binary
records (``REC_*``: a kind, then 64-bit integers, a flag last as a byte, little-endian),
each at the time of the last ``TIME`` record before it; the rare ones as tuples on a side
list, with their own time, marked in their place in the record stream (``OBJ``, index).
Channels, consumers, queues and (exchange, routing key) pairs are small ids defined once
in the stream (``DEFINE``, ``DEFINE_NAME``) and dropped when they end (``UNDEFINE``,
``FORGET``). A batch on the pipe is ``HEAD`` (bytes of records, bytes of the marshalled
side list, whether the broker waits for a reply), then those bytes; a trace file is
``trace_format.FILE_HEAD``, then such batches.
"""

from __future__ import annotations

import struct
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

from librt.strings import BytesWriter, write_f64_le, write_i64_le

if TYPE_CHECKING:
    import asyncio

# event kinds: the first item of every tuple, an index into FORMATS
PUBLISHED: Final = 0
ROUTED: Final = 1
CONFIRMED: Final = 2
DELIVERED: Final = 3
ACKED: Final = 4
NACKED: Final = 5
REQUEUED: Final = 6
RETRY: Final = 7
DEAD: Final = 8
ADOPTED: Final = 9
CONSUMER_ADDED: Final = 10
CONSUMER_TIMED_OUT: Final = 11
CONSUMER_CANCELLED: Final = 12
QUEUE_EXPIRED: Final = 13
QUEUE_DELETED: Final = 14
# an x-delayed-message exchange took the message (broker/engine/exchange_plugins.py)
DELAYED: Final = 15
RELEASED: Final = 16  # ... and routed it when its delay was over
MARK: Final = 17
DROPPED: Final = 18
CHANNEL_CLOSED: Final = 19  # not decoded into a line: the decoder forgets its deliveries
ACKS: Final = 20  # in the int stream only: tags acked on a channel, written as one "acked" each
ACK_RANGE: Final = 21  # the same for the tags first..last
CONFIRMS: Final = 22  # in the int stream only: a publisher confirm, written as "confirmed"
PUBLISHED1: Final = 23  # in the record stream only: published to exactly one queue (the usual case)
# a side tuple (PROPS, trace id, property bytes) before a publish whose properties hold a
# message-id, a correlation-id or persistence, which the decoder reads from them
PROPS: Final = 24
TIME: Final = 25  # in the record stream only: the time of the records after it (TraceClock)
HEAD = struct.Struct("=II?")  # a batch: bytes of records, bytes of marshalled side list, sync
# markers in the record stream: a side-list tuple follows; then, as side tuples: an object's
# id, a name's id, all names forgotten, an object's id forgotten
OBJ: Final = 100
DEFINE: Final = 101
DEFINE_NAME: Final = 102
FORGET: Final = 103
UNDEFINE: Final = 104
# Records are little-endian 64-bit integers (a double for TIME), then a flag byte, unpadded: the
# broker writes them a field at a time into a ``librt.strings.BytesWriter``
# (broker/tracing/tracer.py), which the compiled build turns into stores into the buffer, with
# no Python object made for a record or its fields.
# The clock is time.monotonic(), a float; the decoder turns it back into nanoseconds
# (exact while the machine has been up for less than 104 days, to the microsecond the
# files hold after that).
clock = time.monotonic


class TraceClock:
    """The time every event carries: the clock, read at most once per event-loop iteration.

    Reading the clock for each event, and a double in each record, would add almost as
    much again as the rest of tracing (trace_path.py --callgrind), and a client sees
    nothing finer than an iteration anyway: what the loop handled after one wait for the
    sockets was read at the same moment, and what it sends goes out together. So the
    first event reads the clock, writes it into the stream as a ``TIME`` record, and
    queues, with ``call_soon``, the callback that makes the next event read it again.
    While a callback is queued the loop does not wait, so an event's time is never older
    than the work the loop did since: within an iteration at full load (a fraction of a
    millisecond), exact when the broker is not busy. The stream's order is the events'
    order; their times never go back.
    """

    __slots__ = ("_loop", "_records", "_stale", "fresh", "now")

    def __init__(self, loop: asyncio.AbstractEventLoop, records: BytesWriter) -> None:
        self._loop = loop
        self._records = records
        self.now = 0.0
        self.fresh = False
        self._stale = self._expire  # bound once: call_soon gets the same object every time

    def read(self) -> None:
        """Read the clock: the records until the loop's next round of callbacks share it."""
        self.now = now = clock()
        self.fresh = True
        b = self._records
        write_i64_le(b, TIME)
        write_f64_le(b, now)
        self._loop.call_soon(self._stale)

    def ns(self) -> int:
        """The time as the side tuples carry it: integer nanoseconds."""
        if not self.fresh:
            self.read()
        return round(self.now * 1e9)

    def _expire(self) -> None:
        self.fresh = False


class TraceIds:
    """The message ids a writer's tracers hand out (one sequence for every vhost). Compiled,
    ``last + 1`` is native arithmetic, where next() on an itertools.count looked up the
    builtin and called twice: 500 instructions a publish (trace_path.py --callgrind)."""

    __slots__ = ("last",)

    def __init__(self, first: int) -> None:
        self.last = first - 1


REC_PUBLISHED1 = struct.Struct("<7q?")
"""kind, trace id, channel, route, size, seq, queue, mandatory"""
REC_PUBLISHED = struct.Struct("<7q?")
"""kind, trace id, channel, route, size, seq, count, mandatory; then count queues"""
REC_DELIVERED = struct.Struct("<5q?")
"""kind, trace id, consumer, tag, delivery count, redelivered"""
REC_ACK_RANGE = struct.Struct("<4q")
"""kind, channel, first tag, last tag: every tag first..last acked"""
REC_ACKS = struct.Struct("<3q")
"""kind, channel, n; then n tags"""
REC_CONFIRMS = struct.Struct("<4q?")
"""kind, channel, first, last, ack (false: a nack)"""
REC_TIME = struct.Struct("<qd")
"""TIME, the clock (time.monotonic()) for the records after it"""
REC_OBJ = struct.Struct("<2q")
"""OBJ, index into the side list"""
REC_KIND = struct.Struct("<q")
# struct packs an int too big for one of CPython's internal digits (a trace id) into a
# native long in a short loop, into a "<q" through a generic byte-array routine, at a fifth
# of the speed: the interpreted broker packs with native longs where they are these bytes.
NATIVE = sys.byteorder == "little" and struct.calcsize("l") == 8


def packer(record: struct.Struct) -> struct.Struct:
    """``record``'s layout, for packing on the interpreted build (broker/tracing/tracer.py)."""
    return struct.Struct(record.format.replace("<", "@").replace("q", "l")) if NATIVE else record


RECORDS = {
    PUBLISHED1: REC_PUBLISHED1,
    PUBLISHED: REC_PUBLISHED,
    DELIVERED: REC_DELIVERED,
    ACK_RANGE: REC_ACK_RANGE,
    ACKS: REC_ACKS,
    CONFIRMS: REC_CONFIRMS,
    OBJ: REC_OBJ,
    TIME: REC_TIME,
}


def walk(data: bytes, at: int) -> Iterator[tuple[int, int, int]]:
    """Kind, start and end of each record in ``data`` from offset ``at`` on."""
    n = len(data)
    while at < n:
        kind = REC_KIND.unpack_from(data, at)[0]
        end = at + RECORDS[kind].size
        if kind == PUBLISHED:
            end += 8 * REC_PUBLISHED.unpack_from(data, at)[6]
        elif kind == ACKS:
            end += 8 * REC_ACKS.unpack_from(data, at)[2]
        yield kind, at, end
        at = end
