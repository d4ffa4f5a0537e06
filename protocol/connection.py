"""The sans-IO side of an AMQP connection: bytes in, events out.

``receive_data`` takes whatever the socket gave; ``next_event`` returns the
next complete thing the client said, or ``NEED_DATA``. Like h11, the caller
handles each event before asking for the next, so a channel.close the broker
sends (``close_channel``) takes effect for the very next frame.

This module owns the protocol state: the connection's lifecycle
(``ConnectionState``), which channel numbers are open or closing
(``ChannelState``, one table: the broker's Channel objects hang on it as
``owner``), the negotiated frame_max, channel_max and heartbeat, and the
framing rules (sizes, frame-end octets, content assembly). As in h11, the
broker's outgoing methods that change state go through ``send``, which
returns their bytes and applies the change, and refuses (LocalProtocolError)
what the state forbids; what the client sends out of turn is refused with
RabbitMQ's error. What the methods mean is the broker's business.

The message path (basic.deliver, acks, content frames) does not go through
``send``: those frames change no state and are encoded by hand and written
directly.
"""

from __future__ import annotations

from enum import Enum, auto
from typing import Any, Final, Generic, TypeVar

from librt.strings import read_i16_be, read_i32_be, read_i64_be
from pamqp import commands

from warren.protocol.constants import (
    CHANNEL_ERROR,
    CHANNEL_MIN,
    FRAME_BODY,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_MIN_SIZE,
    NOT_ALLOWED,
    PRECONDITION_FAILED,
    PROTOCOL_HEADER,
    SYNTAX_ERROR,
    UNEXPECTED_FRAME,
)
from warren.protocol.errors import (
    ChannelError,
    ConnectionError_,
    LocalProtocolError,
    erlang_binary,
)
from warren.protocol.methods import INTERPRETED, BasicPublish, Method, decode_method, method_frame
from warren.protocol.properties import PropertiesError, check_properties


class Sentinel(Enum):
    NEED_DATA = auto()  # nothing complete yet
    PROTOCOL_HEADER = auto()  # a valid AMQP 0-9-1 header arrived: send connection.start
    BAD_PROTOCOL_HEADER = auto()  # send PROTOCOL_HEADER back and close
    HEARTBEAT = auto()


NEED_DATA: Final = Sentinel.NEED_DATA


class Content:
    """A complete basic.publish: its channel's number, method, raw property bytes, body,
    and its channel's record (whose owner the broker hands it to, without looking the
    channel up again). An event of its own, not in a (channel, method) tuple: a message
    costs no tuple."""

    __slots__ = ("body", "channel", "method", "properties", "record")

    def __init__(
        self,
        channel: int,
        method: BasicPublish,
        properties: bytes,
        body: bytes,
        record: ChannelRecord[Any],
    ) -> None:
        self.channel = channel
        self.method = method
        self.properties = properties
        self.body = body
        self.record = record


Event = tuple[int, Method] | Content | Sentinel

OwnerT = TypeVar("OwnerT")  # what the broker keeps per open channel (its Channel)


class ConnectionState(Enum):
    """Where a connection is in its life. Every state change is in this module."""

    HEADER = auto()  # the 8-octet protocol header is read, then connection.start is owed
    STARTING = auto()  # connection.start sent: start-ok comes, the login is checked
    TUNING = auto()  # connection.tune sent: tune-ok comes
    OPENING = auto()  # tune-ok accepted: connection.open comes
    OPEN = auto()  # connection.open-ok sent: channels may be used
    CLOSING = auto()  # connection.close sent or received: only close and close-ok are read
    CLOSED = auto()  # the transport is gone: nothing is read or sent


class ChannelState(Enum):
    OPENING = auto()  # channel.open received, open-ok owed
    OPEN = auto()
    CLOSE_SENT = auto()  # the broker sent channel.close: all but close and close-ok is dropped
    CLOSE_RECEIVED = auto()  # the client sent channel.close: close-ok owed, which frees the id


HEADER: Final = ConnectionState.HEADER
STARTING: Final = ConnectionState.STARTING
TUNING: Final = ConnectionState.TUNING
OPENING: Final = ConnectionState.OPENING
OPEN: Final = ConnectionState.OPEN
CLOSING: Final = ConnectionState.CLOSING
CLOSED: Final = ConnectionState.CLOSED
_CH_OPENING: Final = ChannelState.OPENING
_CH_OPEN: Final = ChannelState.OPEN
_CH_CLOSE_SENT: Final = ChannelState.CLOSE_SENT
_CH_CLOSE_RECEIVED: Final = ChannelState.CLOSE_RECEIVED

# RabbitMQ's names for the states in its "unexpected method in connection state" texts
STATE_NAMES: Final = {
    HEADER: "starting",
    STARTING: "starting",
    TUNING: "tuning",
    OPENING: "opening",
    OPEN: "running",
    CLOSING: "closing",
    CLOSED: "closed",
}

_StartOk = commands.Connection.StartOk
_TuneOk = commands.Connection.TuneOk
_ConnOpen = commands.Connection.Open
_ConnClose = commands.Connection.Close
_ConnCloseOk = commands.Connection.CloseOk
_ChOpen = commands.Channel.Open
_ChClose = commands.Channel.Close
_ChCloseOk = commands.Channel.CloseOk

# what the client may send on channel 0 in each state (rabbit_reader:handle_method0/2);
# anything else is 504 CHANNEL_ERROR; in CLOSING only close and close-ok are read
_RECEIVABLE: dict[ConnectionState, tuple[type, ...]] = {
    HEADER: (),
    STARTING: (_StartOk,),
    TUNING: (_TuneOk,),
    OPENING: (_ConnOpen,),
    OPEN: (_ConnClose, commands.Connection.UpdateSecret),
}


class _OutOfTurn(ConnectionError_):
    """A well-framed connection method in the wrong state: the stream is still in step,
    so reading goes on (the client's close-ok ends the connection)."""


class ChannelRecord(Generic[OwnerT]):
    """One channel number: its state, its content being assembled, and the broker's owner."""

    __slots__ = (
        "body_size",
        "checked",
        "owner",
        "parts",
        "pending",
        "properties",
        "received",
        "state",
    )

    def __init__(self) -> None:
        self.state = _CH_OPENING
        self.owner: OwnerT | None = None  # set by the broker when it answers channel.open
        self.pending: BasicPublish | None = None  # publish waiting for its content
        self.properties = b""
        self.body_size = 0
        self.received = 0
        self.parts: list[bytes] = []
        # the properties of the channel's last content header, checked: a publisher mostly
        # repeats them, and the next header that carries the same octets reuses them
        self.checked = b""

    def drop_content(self) -> None:
        self.pending = None
        self.properties = b""
        self.body_size = 0
        self.received = 0
        self.parts = []


def _negotiated(field: str, least: int, offered: int, value: int) -> None:
    """rabbit_reader:validate_negotiated_integer_value/3: at least ``least`` (0 is no
    limit) and at most what the broker offered (unless it offered 0, no limit)."""
    if value != 0 and value < least:
        side, bound = "lower", "minimum"
    elif offered != 0 and (value == 0 or value > offered):
        side, bound, least = "higher", "maximum", offered
    else:
        return
    detail = " (no limit)" if field == "channel_max" and value == 0 else ""
    raise ConnectionError_(
        NOT_ALLOWED,
        f"negotiated {field} = {value}{detail} is {side} than the {bound} allowed value ({least})",
        10,
        30,  # rabbit_reader names connection.tune, not tune-ok
    )


class ProtocolConnection(Generic[OwnerT]):
    def __init__(
        self, frame_max: int, max_message_size: int, frame_min: int = FRAME_MIN_SIZE
    ) -> None:
        self._frame_min = frame_min  # the least frame_max a tune-ok may ask for
        self._buf = b""
        self._off = 0
        # Reads that arrive while a frame is incomplete wait here and are joined onto
        # _buf only once they complete it: a frame sent an octet per read then costs
        # O(size), not a copy of the partial frame per read (O(size^2), minutes of CPU
        # for a 1 MiB frame). _want is how many more octets the parser needs.
        self._more = bytearray()
        self._want = 0
        self.state = HEADER
        self.header_done = False  # framing: the 8-octet header was read, frames follow
        self.failed = False  # framing: the stream is out of step (or the peer is ignored)
        # a content header was accepted: the peer publishes, even if no message completed
        # yet (RabbitMQ's alarms block a connection on its first content frame)
        self.content_seen = False
        self.frame_max = frame_max  # the parse limit; negotiated at tune-ok
        self.channel_max = 0  # 0 = no limit until tuned
        self.heartbeat = 0  # seconds, as tune-ok asked; 0 = none
        self.max_message_size = max_message_size
        self._offer = (0, 0)  # channel_max and frame_max the broker's connection.tune proposed
        # changed in place only, never rebound: the broker keeps a reference to read it
        self.channels: dict[int, ChannelRecord[OwnerT]] = {}
        # the record of the channel last looked up: a message's three frames come on one
        # channel. Reset wherever a record leaves the table.
        self._rec: ChannelRecord[OwnerT] | None = None
        self._rec_channel = 0
        # the last basic.publish decoded, its exchange and routing key as received and its
        # bits: a publisher mostly repeats them, and the object is read-only, so it is reused
        self._publish: BasicPublish | None = None
        self._publish_key = b""
        self._publish_bits = 0

    # ---- the broker's side: what it sends, and how it gives up ----

    def send(self, channel: int, method: Method) -> bytes:
        """``method``'s frame, with its state change applied (h11's ``send``).

        Raises LocalProtocolError, and changes nothing, if the state forbids it.
        """
        data = method_frame(channel, method)
        if channel:
            self._sent_on_channel(channel, method)
        else:
            self._sent_on_connection(method)
        return data

    def _sent_on_connection(self, method: Method) -> None:
        kind = type(method)
        state = self.state
        if kind is commands.Connection.Start:
            _require(state is HEADER and self.header_done, state, method)
            self.state = STARTING
        elif isinstance(method, commands.Connection.Tune):
            _require(state is STARTING, state, method)
            self._offer = (method.channel_max, method.frame_max)
            self.state = TUNING
        elif kind is commands.Connection.OpenOk:
            _require(state is OPENING, state, method)
            self.state = OPEN
        elif kind is _ConnClose:
            # before tuning only a refused login is reported (authentication_failure_close)
            _require(state is not HEADER and state is not CLOSING and state is not CLOSED,
                     state, method)  # fmt: skip
            self.state = CLOSING
        elif kind is _ConnCloseOk:
            _require(state is CLOSING, state, method)  # the answer to a close received
        else:
            _require(state is OPEN, state, method)

    def _sent_on_channel(self, channel: int, method: Method) -> None:
        record = self.channels.get(channel)
        if self.state is not OPEN or record is None:
            raise LocalProtocolError(
                f"{method.name} on channel {channel}: "
                + ("no such channel" if record is None else f"connection {self.state.name}")
            )
        kind = type(method)
        state = record.state
        if kind is commands.Channel.OpenOk:
            _require(state is _CH_OPENING, state, method)
            record.state = _CH_OPEN
        elif kind is _ChClose:
            _require(state is _CH_OPEN, state, method)
            record.state = _CH_CLOSE_SENT
            record.drop_content()  # its frames are dropped until close-ok
        elif kind is _ChCloseOk:
            if state is _CH_CLOSE_RECEIVED:
                del self.channels[channel]  # the id is free again
                self._rec = None
            else:  # the answer to a close that crossed ours: ours still waits for close-ok
                _require(state is _CH_CLOSE_SENT, state, method)
        else:
            _require(state is _CH_OPEN, state, method)

    def stop(self) -> None:
        """The broker ignores this peer (a refused login): drop all it sends from now on."""
        self.failed = True
        self._buf, self._off, self._more = b"", 0, bytearray()

    def abort(self) -> None:
        """The broker closes the socket without a word (an error before tuning, as RabbitMQ)."""
        self.stop()
        if self.state is not CLOSED:
            self.state = CLOSING

    def connection_lost(self) -> None:
        """The transport is gone: nothing is read or sent any more."""
        self.stop()
        self.state = CLOSED
        self.channels.clear()
        self._rec = None

    # ---- bytes in ----

    @property
    def buffered(self) -> int:
        """Octets received and not yet parsed (at most one frame's worth after NEED_DATA)."""
        return len(self._buf) - self._off + len(self._more)

    def receive_data(self, data: bytes) -> None:
        if self.failed:
            return  # the stream is out of step: nothing after the error can be read
        if self._off >= len(self._buf) and not self._more:
            self._buf, self._off = data, 0  # the usual case: whole frames, nothing to copy
        else:
            self._more += data

    def next_event(self) -> Event:
        if self.failed:
            return NEED_DATA
        if len(self._more):  # compiled, a bytearray's truth is a generic call; its length is not
            if len(self._more) < self._want:
                return NEED_DATA
            self._buf = self._buf[self._off :] + self._more
            self._off = 0
            self._more = bytearray()
        try:
            event = self._next_event()
        except _OutOfTurn:
            raise
        except ConnectionError_:
            self.failed = True
            self._buf, self._off, self._more = b"", 0, bytearray()
            raise
        if event is not NEED_DATA:
            self._want = 0  # complete frames may be waiting: join the next read at once
        return event

    def _next_event(self) -> Event:
        if not self.header_done:
            return self._read_protocol_header()
        buf = self._buf
        while True:
            off = self._off
            avail = len(buf) - off
            if avail < 7:
                self._want = 7 - avail
                return NEED_DATA
            # librt's reads: compiled, each is one load (struct's unpack_from builds a tuple
            # and boxes its ints); interpreted, about as fast as unpack_from. Read signed,
            # so the unsigned fields are masked.
            ftype = buf[off]
            channel: int = read_i16_be(buf, off + 1)
            channel &= 0xFFFF
            size: int = read_i32_be(buf, off + 3)
            size &= 0xFFFFFFFF
            if size > self.frame_max:
                # RabbitMQ allows a payload of frame_max octets and names frame_max - 8 as the limit
                self.failed = True
                raise ConnectionError_(
                    FRAME_ERROR,
                    f"type {ftype}, all octets = <<>>: "
                    f"{{frame_too_large,{size},{self.frame_max - 8}}}",
                )
            start = off + 7
            end = start + size
            if avail < 8 + size:
                self._want = 8 + size - avail
                return NEED_DATA
            if buf[end] != 0xCE:
                raise ConnectionError_(
                    FRAME_ERROR,
                    f"type {ftype}, all octets = {erlang_binary(buf[start:end])}: "
                    f"{{invalid_frame_end_marker,{buf[end]}}}",
                )
            self._off = end + 1
            state = self.state
            # method and header frames are read in place: only the body is sliced
            if state is OPEN and channel:
                if ftype == FRAME_METHOD:
                    event = self._method(channel, buf, start, end)
                elif ftype == FRAME_BODY:
                    event = self._body(channel, buf[start:end])
                elif ftype == FRAME_HEADER:
                    event = self._header(channel, buf, start, end)
                else:
                    raise _bad_frame(ftype, buf[start:end], channel)
                if event is not None:
                    return event
                continue
            payload = buf[start:end]
            if state is CLOSING:
                # rabbit_reader:handle_frame/4 when stopping: only channel 0's methods are read
                event = self._method0(payload) if ftype == FRAME_METHOD and not channel else None
            elif ftype == FRAME_METHOD and not channel:
                event = self._method0(payload)
            elif ftype == FRAME_HEARTBEAT and not payload and not channel:
                event = None
            else:  # a channel frame before open, a content frame on channel 0, or garbage
                raise _bad_frame(ftype, payload, channel)
            if event is not None:
                return event

    def _read_protocol_header(self) -> Event:
        if len(self._buf) - self._off < 8:
            if PROTOCOL_HEADER.startswith(self._buf[self._off : self._off + 8]):
                self._want = 1  # every octet of the header is checked as it comes
                return NEED_DATA
            self.failed = True
            return Sentinel.BAD_PROTOCOL_HEADER
        header = self._buf[self._off : self._off + 8]
        self._off += 8
        if header != PROTOCOL_HEADER:
            self.failed = True
            return Sentinel.BAD_PROTOCOL_HEADER
        self.header_done = True
        return Sentinel.PROTOCOL_HEADER

    def _method0(self, payload: bytes) -> Event | None:
        """A method on channel 0: the handshake in order, then close (or update-secret)."""
        method = _decode(payload)
        kind = type(method)
        state = self.state
        if state is CLOSING:
            return (0, method) if kind is _ConnClose or kind is _ConnCloseOk else None
        if kind not in _RECEIVABLE[state]:
            # RabbitMQ's wording with its name for the state: a close (or update-secret)
            # before connection.open is refused too; before tune-ok the socket just closes
            raise _OutOfTurn(
                CHANNEL_ERROR,
                f"unexpected method in connection state {STATE_NAMES[state]}",
                method.index >> 16,
                method.index & 0xFFFF,
            )
        if isinstance(method, _TuneOk):
            self._tune(method)
        elif kind is _ConnClose:
            self.state = CLOSING  # close-ok is owed; nothing but close and close-ok is read
        return (0, method)

    def _tune(self, method: commands.Connection.TuneOk) -> None:
        """Accept the client's tune-ok if it stays within the broker's connection.tune."""
        offered_channel_max, offered_frame_max = self._offer
        _negotiated("frame_max", self._frame_min, offered_frame_max, method.frame_max)
        _negotiated("channel_max", CHANNEL_MIN, offered_channel_max, method.channel_max)
        # 0 means "no limit", which the checks above allow only where the broker offered 0
        frame_max = method.frame_max or 2**32 - 1
        channel_max = method.channel_max or 65535
        self.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat = method.heartbeat
        self.state = OPENING

    def _method(self, channel: int, buf: bytes, start: int, end: int) -> Event | None:
        size = end - start
        if size >= 7 and buf[start + 1] == 60 and buf[start + 3] == 40 and not buf[start + 2]:
            method = self._decode_publish(buf, start, end)  # class 60 < 256: octet 0 is 0
        else:
            method = _decode(buf[start:end])
        record = self._rec
        if record is None or self._rec_channel != channel:
            record = self.channels.get(channel)
            if record is not None:
                self._rec = record
                self._rec_channel = channel
        if record is None:
            if type(method) is _ChOpen:
                if self.channel_max and len(self.channels) >= self.channel_max:
                    raise ConnectionError_(
                        NOT_ALLOWED,
                        f"number of channels opened ({len(self.channels)}) has reached the "
                        f"negotiated channel_max ({self.channel_max})",
                    )
                self.channels[channel] = ChannelRecord()
                return (channel, method)
            raise ConnectionError_(
                CHANNEL_ERROR, "expected 'channel.open'", method.index >> 16, method.index & 0xFFFF
            )
        if record.state is not _CH_OPEN and record.state is not _CH_OPENING:
            return self._closing_channel_method(channel, record, method)
        if record.pending is not None:
            raise _content_error(record)
        kind = type(method)
        if kind is BasicPublish:
            # the type test above, not isinstance: one comparison on every publish
            record.pending = method  # type: ignore[assignment]
            return None
        if kind is _ChOpen:
            raise ConnectionError_(CHANNEL_ERROR, "second 'channel.open' seen", 20, 10)
        if kind is _ChClose:
            record.state = _CH_CLOSE_RECEIVED  # close-ok owed
        return (channel, method)

    def _decode_publish(self, buf: bytes, start: int, end: int) -> Method:
        """basic.publish (class 60, method 40, at least 7 octets), as decode_method reads it;
        the previous one's object again when its exchange, routing key and bits repeat."""
        size = end - start
        rk_end = 8 + buf[start + 6]  # after the exchange and the routing key's length octet
        if rk_end <= size:
            rk_end += buf[start + rk_end - 1]
            if rk_end + 1 == size:  # the bits end the payload: decode_method's own test
                bits = buf[start + rk_end]
                last = self._publish
                if last is not None and bits == self._publish_bits:
                    known = self._publish_key
                    if INTERPRETED:  # a slice costs less than a comparison in place
                        if buf[start + 6 : start + rk_end] == known:
                            return last
                    elif rk_end - 6 == len(known) and _same(buf, start + 6, known):
                        return last
                key = buf[start + 6 : start + rk_end]
                method = _decode(buf[start:end])
                if isinstance(method, BasicPublish):
                    self._publish = method
                    self._publish_key = key
                    self._publish_bits = bits
                return method
        return _decode(buf[start:end])  # malformed: decode_method's error

    def _closing_channel_method(
        self, channel: int, record: ChannelRecord[OwnerT], method: Method
    ) -> Event | None:
        kind = type(method)
        if kind is _ChOpen:  # RabbitMQ checks this one first
            raise ConnectionError_(CHANNEL_ERROR, "second 'channel.open' seen", 20, 10)
        if record.state is _CH_CLOSE_SENT:
            if kind is _ChCloseOk:
                del self.channels[channel]  # the id is free again
                self._rec = None
                return (channel, method)
            if kind is _ChClose:
                return (channel, method)  # the closes crossed: close-ok is owed all the same
        return None  # after a close, all but close and close-ok is dropped

    def _header(self, channel: int, buf: bytes, start: int, end: int) -> Event | None:
        state = self._rec
        if state is None or self._rec_channel != channel:
            state = self.channels.get(channel)
        if state is None or state.pending is None:
            _check_no_publish(state)
            return None
        if len(state.properties):
            raise _content_error(state)
        if end - start < 14:
            raise ConnectionError_(
                FRAME_ERROR,
                f"type 2, all octets = {erlang_binary(buf[start:end])}: unknown_frame",
            )
        class_id: int = read_i16_be(buf, start)  # then the weight, then the body size
        class_id &= 0xFFFF
        if buf[start + 2] or buf[start + 3]:
            # RabbitMQ 4.3 (rabbit_command_assembler.erl, process/2) matches only weight 0
            # as a content header; any other frame there is this error
            raise ConnectionError_(
                UNEXPECTED_FRAME,
                "expected content header for class 60, got non content header frame instead",
                60,
                40,
            )
        body_size: int = read_i64_be(buf, start + 4)
        if body_size < 0:  # an unsigned 64-bit size past 2**63
            body_size += 1 << 64
        if class_id != 60:
            raise ConnectionError_(
                UNEXPECTED_FRAME,
                f"expected content header for class 60, got one for class {class_id} instead",
                60,
                40,
            )
        if body_size > self.max_message_size:
            state.pending = None  # the broker closes the channel; the body frames are dropped
            error = ChannelError(
                PRECONDITION_FAILED,
                # RabbitMQ 4.x (rabbit_channel:check_msg_size/2): "configured" unless the
                # limit is its 512 MiB ceiling
                f"message size {body_size} is larger than "
                f"{'' if self.max_message_size == 536870912 else 'configured '}max size "
                f"{self.max_message_size}",
                60,
                40,
            )
            error.channel = channel
            raise error
        checked = state.checked
        if INTERPRETED:  # a slice costs less than a comparison in place, interpreted
            properties = buf[start + 12 : end]
            if properties == checked:
                properties = checked
        elif end - start - 12 == len(checked) and _same(buf, start + 12, checked):
            properties = checked  # the previous header's: no slice, nor a check again
        else:
            properties = buf[start + 12 : end]
        if properties is not checked:
            try:
                check_properties(properties)
            except PropertiesError as exc:
                raise ConnectionError_(
                    SYNTAX_ERROR, f"content header properties: {exc}", 60, 40
                ) from None
            state.checked = properties
        state.properties = properties
        self.content_seen = True
        if body_size == 0:
            return self._complete(channel, state, b"")
        state.body_size = body_size
        return None

    def _body(self, channel: int, payload: bytes) -> Event | None:
        state = self._rec
        if state is None or self._rec_channel != channel:
            state = self.channels.get(channel)
        if state is None or state.pending is None:
            _check_no_publish(state)
            return None
        if not len(state.properties):
            raise _content_error(state)
        received = state.received + len(payload)
        if received > state.body_size:
            raise ConnectionError_(
                FRAME_ERROR,
                f"type 3, all octets = <<>>: {{body_too_large,{received},{state.body_size}}}",
                60,
                40,
            )
        if received == state.body_size:
            if state.parts:
                state.parts.append(payload)
                body = b"".join(state.parts)
                state.parts = []
            else:
                body = payload
            return self._complete(channel, state, body)
        state.parts.append(payload)
        state.received = received
        return None

    @staticmethod
    def _complete(channel: int, state: ChannelRecord[OwnerT], body: bytes) -> Event:
        method = state.pending
        assert method is not None
        content = Content(channel, method, state.properties, body, state)
        state.pending = None
        state.properties = b""
        state.received = 0
        state.body_size = 0
        return content


def _same(buf: bytes, pos: int, known: bytes) -> bool:
    """``buf[pos : pos + len(known)] == known`` without the slice (which the caller has
    checked is within ``buf``). Compiled, each of librt's reads is one load."""
    n = len(known)
    if n >= 8:
        last = n - 8  # the last 8 octets are read whole, overlapping the ones before
        i = 0
        while i < last:
            if read_i64_be(buf, pos + i) != read_i64_be(known, i):
                return False
            i += 8
        return read_i64_be(buf, pos + last) == read_i64_be(known, last)
    if n >= 4:  # the first 4 octets and the last 4, overlapping
        if read_i32_be(buf, pos) != read_i32_be(known, 0):
            return False
        return read_i32_be(buf, pos + n - 4) == read_i32_be(known, n - 4)
    if n >= 2:
        first = read_i16_be(buf, pos) == read_i16_be(known, 0)
        if n == 2 or not first:  # 2 octets: a content header's flags, no property set
            return first
        return read_i16_be(buf, pos + 1) == read_i16_be(known, 1)  # 3: overlapping
    return n == 0 or buf[pos] == known[0]


def _check_no_publish(state: ChannelRecord[OwnerT] | None) -> None:
    """A content frame with no publish before it: dropped on a closing channel, else 505."""
    if state is not None and (state.state is _CH_CLOSE_SENT or state.state is _CH_CLOSE_RECEIVED):
        return  # its publish was dropped with the channel's other frames
    raise ConnectionError_(UNEXPECTED_FRAME, "expected method frame, got non method frame instead")


def _decode(payload: bytes) -> Method:
    if len(payload) < 4:
        raise ConnectionError_(
            FRAME_ERROR, f"type 1, all octets = {erlang_binary(payload)}: unknown_frame"
        )
    return decode_method(payload)


def _bad_frame(ftype: int, payload: bytes, channel: int) -> ConnectionError_:
    if ftype in (FRAME_METHOD, FRAME_BODY, FRAME_HEADER) or (
        ftype == FRAME_HEARTBEAT and not payload
    ):
        # a known frame type on the wrong channel, or a channel frame before open
        return ConnectionError_(
            UNEXPECTED_FRAME, f"type {ftype}, all octets = {erlang_binary(payload)}"
        )
    return ConnectionError_(
        FRAME_ERROR, f"type {ftype}, all octets = {erlang_binary(payload)}: unknown_frame"
    )


def _require(allowed: bool, state: ConnectionState | ChannelState, method: Method) -> None:
    if not allowed:
        raise LocalProtocolError(f"{method.name} cannot be sent in state {state.name}")


def _content_error(state: ChannelRecord[OwnerT]) -> ConnectionError_:
    """A frame out of place while a publish waits for its content header or body."""
    if not state.properties:
        text = "expected content header for class 60, got non content header frame instead"
    else:
        text = "expected content body, got non content body frame instead"
    return ConnectionError_(UNEXPECTED_FRAME, text, 60, 40)
