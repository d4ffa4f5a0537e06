"""The sans-IO side of an AMQP connection: bytes in, events out.

``receive_data`` takes whatever the socket gave; ``next_event`` returns the
next complete thing the client said, or ``NEED_DATA``. Like h11, the caller
handles each event before asking for the next, so a channel.close the broker
sends (``close_channel``) takes effect for the very next frame.

This module owns the framing rules (sizes, frame-end octets, content
assembly, frames on unopened or closing channels). What the methods mean
is the broker's business.
"""

from __future__ import annotations

from enum import Enum, auto
from struct import Struct

from pamqp import commands

from warren.protocol.constants import (
    CHANNEL_ERROR,
    FRAME_BODY,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    NOT_ALLOWED,
    PRECONDITION_FAILED,
    PROTOCOL_HEADER,
    SYNTAX_ERROR,
    UNEXPECTED_FRAME,
)
from warren.protocol.errors import ChannelError, ConnectionError_, erlang_binary
from warren.protocol.methods import BasicPublish, Method, decode_method
from warren.protocol.properties import PropertiesError, check_properties

_frame_head = Struct(">BHI")
_content_head = Struct(">HHQ")


class Sentinel(Enum):
    NEED_DATA = auto()  # nothing complete yet
    PROTOCOL_HEADER = auto()  # a valid AMQP 0-9-1 header arrived: send connection.start
    BAD_PROTOCOL_HEADER = auto()  # send PROTOCOL_HEADER back and close
    HEARTBEAT = auto()


NEED_DATA = Sentinel.NEED_DATA


class Content:
    """A complete basic.publish: method, raw property bytes, body."""

    __slots__ = ("body", "method", "properties")

    def __init__(self, method: BasicPublish, properties: bytes, body: bytes) -> None:
        self.method = method
        self.properties = properties
        self.body = body


Event = tuple[int, Method | Content] | Sentinel


class _Channel:
    __slots__ = ("body_size", "closing", "parts", "pending", "properties", "received")

    def __init__(self) -> None:
        self.closing = False
        self.pending: BasicPublish | None = None  # publish waiting for its content
        self.properties = b""
        self.body_size = 0
        self.received = 0
        self.parts: list[bytes] = []


class ProtocolConnection:
    def __init__(self, frame_max: int, max_message_size: int) -> None:
        self._buf = b""
        self._off = 0
        # Reads that arrive while a frame is incomplete wait here and are joined onto
        # _buf only once they complete it: a frame sent an octet per read then costs
        # O(size), not a copy of the partial frame per read (O(size^2), minutes of CPU
        # for a 1 MiB frame). _want is how many more octets the parser needs.
        self._more = bytearray()
        self._want = 0
        self.header_done = False
        self.failed = False
        self.closing = False  # the broker sent connection.close
        self.opened = False  # connection.open-ok sent: channel frames are allowed
        # a content header was accepted: the peer publishes, even if no message completed
        # yet (RabbitMQ's alarms block a connection on its first content frame)
        self.content_seen = False
        self.frame_max = frame_max
        self.channel_max = 0  # 0 = no limit until tuned
        self.max_message_size = max_message_size
        self.channels: dict[int, _Channel] = {}

    # ---- driven by the broker ----

    def open(self) -> None:
        """The broker sent connection.open-ok."""
        self.opened = True

    def tuned(self, frame_max: int, channel_max: int) -> None:
        self.frame_max = frame_max
        self.channel_max = channel_max

    def close_channel(self, channel: int) -> None:
        """The broker sent channel.close: drop everything on it until close-ok."""
        state = self.channels.get(channel)
        if state is not None:
            state.closing = True
            state.pending = None
            state.parts = []

    def channel_closed(self, channel: int) -> None:
        """The broker sent channel.close-ok: the id is free again."""
        self.channels.pop(channel, None)

    def close(self) -> None:
        """The broker sent connection.close: only close/close-ok matter from now on."""
        self.closing = True

    def stop(self) -> None:
        """The broker is done with this peer (a refused login): drop all it sends from now on."""
        self.failed = True
        self._buf, self._off, self._more = b"", 0, bytearray()

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
        if self._more:
            if len(self._more) < self._want:
                return NEED_DATA
            self._buf = self._buf[self._off :] + self._more
            self._off = 0
            self._more = bytearray()
        try:
            event = self._next_event()
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
            ftype, channel, size = _frame_head.unpack_from(buf, off)
            if size > self.frame_max:
                # RabbitMQ allows a payload of frame_max octets and names frame_max - 8 as the limit
                self.failed = True
                raise ConnectionError_(
                    FRAME_ERROR,
                    f"type {ftype}, all octets = <<>>: "
                    f"{{frame_too_large,{size},{self.frame_max - 8}}}",
                )
            end = off + 7 + size
            if avail < 8 + size:
                self._want = 8 + size - avail
                return NEED_DATA
            payload = buf[off + 7 : end]
            if buf[end] != 0xCE:
                raise ConnectionError_(
                    FRAME_ERROR,
                    f"type {ftype}, all octets = {erlang_binary(payload)}: "
                    f"{{invalid_frame_end_marker,{buf[end]}}}",
                )
            self._off = end + 1
            if ftype == FRAME_METHOD and (channel == 0 or self.opened):
                event = self._method(channel, payload)
            elif ftype == FRAME_BODY and channel and self.opened:
                event = self._body(channel, payload)
            elif ftype == FRAME_HEADER and channel and self.opened:
                event = self._header(channel, payload)
            elif ftype == FRAME_HEARTBEAT and not payload and channel == 0:
                event = None
            elif ftype in (FRAME_METHOD, FRAME_BODY, FRAME_HEADER) or (
                ftype == FRAME_HEARTBEAT and not payload
            ):
                # a known frame type on the wrong channel, or a channel frame before open
                raise ConnectionError_(
                    UNEXPECTED_FRAME, f"type {ftype}, all octets = {erlang_binary(payload)}"
                )
            else:
                raise ConnectionError_(
                    FRAME_ERROR,
                    f"type {ftype}, all octets = {erlang_binary(payload)}: unknown_frame",
                )
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

    def _method(self, channel: int, payload: bytes) -> Event | None:
        if len(payload) < 4:
            raise ConnectionError_(
                FRAME_ERROR, f"type 1, all octets = {erlang_binary(payload)}: unknown_frame"
            )
        method = decode_method(payload)
        if channel == 0:
            if self.closing and not isinstance(
                method, commands.Connection.Close | commands.Connection.CloseOk
            ):
                return None
            return (0, method)
        if self.closing:
            return None
        state = self.channels.get(channel)
        if state is None:
            if isinstance(method, commands.Channel.Open):
                if self.channel_max and len(self.channels) >= self.channel_max:
                    raise ConnectionError_(
                        NOT_ALLOWED,
                        f"number of channels opened ({len(self.channels)}) has reached the "
                        f"negotiated channel_max ({self.channel_max})",
                    )
                self.channels[channel] = _Channel()
                return (channel, method)
            raise ConnectionError_(
                CHANNEL_ERROR, "expected 'channel.open'", method.index >> 16, method.index & 0xFFFF
            )
        if state.closing:
            if isinstance(method, commands.Channel.CloseOk):
                del self.channels[channel]
                return (channel, method)
            if isinstance(method, commands.Channel.Close):
                return (channel, method)
            if isinstance(method, commands.Channel.Open):  # RabbitMQ checks this one first
                raise ConnectionError_(CHANNEL_ERROR, "second 'channel.open' seen", 20, 10)
            return None
        if state.pending is not None:
            raise _content_error(state)
        if isinstance(method, BasicPublish):
            state.pending = method
            return None
        if isinstance(method, commands.Channel.Open):
            raise ConnectionError_(CHANNEL_ERROR, "second 'channel.open' seen", 20, 10)
        return (channel, method)

    def _header(self, channel: int, payload: bytes) -> Event | None:
        state = self.channels.get(channel)
        if self.closing or (state is not None and state.closing):
            return None
        if state is None or state.pending is None:
            raise ConnectionError_(
                UNEXPECTED_FRAME, "expected method frame, got non method frame instead"
            )
        if state.properties:
            raise _content_error(state)
        if len(payload) < 14:
            raise ConnectionError_(
                FRAME_ERROR, f"type 2, all octets = {erlang_binary(payload)}: unknown_frame"
            )
        class_id, _weight, body_size = _content_head.unpack_from(payload, 0)
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
        properties = payload[12:]
        try:
            check_properties(properties)
        except PropertiesError as exc:
            raise ConnectionError_(
                SYNTAX_ERROR, f"content header properties: {exc}", 60, 40
            ) from None
        state.properties = properties
        self.content_seen = True
        if body_size == 0:
            return self._complete(channel, state, b"")
        state.body_size = body_size
        return None

    def _body(self, channel: int, payload: bytes) -> Event | None:
        state = self.channels.get(channel)
        if self.closing or (state is not None and state.closing):
            return None
        if state is None or state.pending is None:
            raise ConnectionError_(
                UNEXPECTED_FRAME, "expected method frame, got non method frame instead"
            )
        if not state.properties:
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
    def _complete(channel: int, state: _Channel, body: bytes) -> Event:
        method = state.pending
        assert method is not None
        content = Content(method, state.properties, body)
        state.pending = None
        state.properties = b""
        state.received = 0
        state.body_size = 0
        return (channel, content)


def _content_error(state: _Channel) -> ConnectionError_:
    """A frame out of place while a publish waits for its content header or body."""
    if not state.properties:
        text = "expected content header for class 60, got non content header frame instead"
    else:
        text = "expected content body, got non content body frame instead"
    return ConnectionError_(UNEXPECTED_FRAME, text, 60, 40)
