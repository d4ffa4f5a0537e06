"""The trace stream: what the broker's loop hands to the writer process, shared by both ends.

The frequent events (published, delivered, acked, confirmed) travel as runs of native
int64s; the rare ones as tuples on a side list, marked in their place in the int stream
(``OBJ``, index). Channels, consumers, queues and (exchange, routing key) pairs are small
ids defined once in the stream (``DEFINE``, ``DEFINE_NAME``) and dropped when they end
(``UNDEFINE``, ``FORGET``). A batch on the pipe is ``HEAD`` (bytes of ints, bytes of
the marshalled side list, whether the broker waits for a reply), then those bytes.
"""

from __future__ import annotations

import struct

# event kinds: the first item of every tuple, an index into FORMATS
(
    PUBLISHED,
    ROUTED,
    CONFIRMED,
    DELIVERED,
    ACKED,
    NACKED,
    REQUEUED,
    RETRY,
    DEAD,
    ADOPTED,
    CONSUMER_ADDED,
    CONSUMER_TIMED_OUT,
    CONSUMER_CANCELLED,
    QUEUE_EXPIRED,
    QUEUE_DELETED,
    DELAYED,  # an x-delayed-message exchange took the message (broker/exchange_plugins.py)
    RELEASED,  # ... and routed it when its delay was over
    MARK,
    DROPPED,
    CHANNEL_CLOSED,  # not written: the writer process forgets the channel's deliveries
    ACKS,  # in the int stream only: tags acked on a channel, written as one "acked" each
    ACK_RANGE,  # the same for the tags first..last
    CONFIRMS,  # in the int stream only: a publisher confirm, written as "confirmed"
) = range(23)
HEAD = struct.Struct("=II?")  # a batch: bytes of ints, bytes of marshalled side list, sync
# markers in the int stream: a side-list tuple follows; then, as side tuples: an object's
# id, a name's id, all names forgotten, an object's id forgotten
OBJ, DEFINE, DEFINE_NAME, FORGET, UNDEFINE = 100, 101, 102, 103, 104
# The int stream is native int64s (the child reads it as array("q")), packed by struct:
# array.extend() of a tuple converts and grows item by item, several times slower. They
# are packed as C longs ("l", 8 bytes where Warren runs): struct converts an int too big
# for one internal digit (a trace id, a clock reading) to a "q" through a generic
# byte-array routine, to an "l" in a short loop, a fifth of the instructions.
INT = "l" if struct.calcsize("l") == 8 else "q"
INTS = [struct.Struct(f"{n}{INT}").pack for n in range(16)]  # by count of ints
pack2 = INTS[2]
# the frequent events, written at an offset into a buffer (no bytes object per event)
into5, into6, into7, into11 = (struct.Struct(f"{n}{INT}").pack_into for n in (5, 6, 7, 11))
