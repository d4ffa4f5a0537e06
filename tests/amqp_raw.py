"""A small raw-socket AMQP 0-9-1 client for black-box broker tests.

It speaks the wire protocol directly so that tests can observe exactly what a
broker sends: frame boundaries, content-header bytes, reply codes and texts.
pamqp is used to encode and decode method arguments, but framing is done here
(pamqp cannot parse partial input) and methods are encoded without pamqp's
name validation so that names with arbitrary characters can be sent.
"""

from __future__ import annotations

import contextlib
import inspect
import select
import socket
import struct
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pamqp import base, commands, encode, frame, header

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
DEFAULT_TIMEOUT = 5.0

DEFAULT_CAPABILITIES: dict[str, Any] = {
    "authentication_failure_close": True,
    "basic.nack": True,
    "connection.blocked": True,
    "consumer_cancel_notify": True,
    "exchange_exchange_bindings": True,
    "publisher_confirms": True,
    "per_consumer_qos": True,
}

M = TypeVar("M", bound=base.Frame)

# Methods a broker may send at any time, interleaved with synchronous replies.
ASYNC_METHODS = (
    commands.Basic.Deliver,
    commands.Basic.Return,
    commands.Basic.Ack,
    commands.Basic.Nack,
    commands.Basic.Cancel,
    commands.Channel.Flow,
    commands.Connection.Blocked,
    commands.Connection.Unblocked,
)


class BrokerClosedSocket(AssertionError):
    """The broker closed the TCP connection while a frame was expected."""


class Timeout(AssertionError):
    """Nothing (or not enough) arrived before the deadline."""


@dataclass
class Frame:
    type: int
    channel: int
    payload: bytes

    def method(self) -> base.Frame:
        assert self.type == FRAME_METHOD, f"not a method frame: {self!r}"
        return decode_method(self.payload)

    def __repr__(self) -> str:
        if self.type == FRAME_METHOD:
            try:
                m = self.method()
                return f"<Frame ch={self.channel} {m.name} {dict(m)}>"
            except Exception:  # pragma: no cover - diagnostic only
                pass
        kind = {1: "method", 2: "header", 3: "body", 8: "heartbeat"}.get(self.type, self.type)
        return f"<Frame {kind} ch={self.channel} {len(self.payload)}B {self.payload[:40]!r}>"


@dataclass
class Delivery:
    """A complete message as delivered by basic.deliver / basic.get-ok / basic.return."""

    channel: int
    method: Any
    header_payload: bytes
    body: bytes
    body_frame_sizes: list[int] = field(default_factory=list)

    @property
    def properties(self) -> commands.Basic.Properties:
        ch = header.ContentHeader()
        ch.unmarshal(self.header_payload)
        return ch.properties

    @property
    def body_size(self) -> int:
        return int(struct.unpack(">Q", self.header_payload[4:12])[0])


def describe(data: bytes) -> list[Frame | bytes]:
    """Split raw bytes into frames, for readable assertion messages."""
    out: list[Frame | bytes] = []
    while len(data) >= 8:
        frame_type, channel, size = struct.unpack(">BHI", data[:7])
        if len(data) < 8 + size:
            break
        out.append(Frame(frame_type, channel, data[7 : 7 + size]))
        data = data[8 + size :]
    if data:
        out.append(data)
    return out


def build(cls: type[M], **kw: Any) -> M:
    """Instantiate a pamqp method without its name validation.

    pamqp validates queue/exchange names against a narrow pattern in
    ``__init__``; brokers accept any UTF-8, so tests need to bypass it.
    """
    obj = cls.__new__(cls)
    params = inspect.signature(cls.__init__).parameters
    for arg in cls.__slots__:
        if arg in kw:
            value = kw.pop(arg)
        else:
            p = params.get(arg)
            value = None if p is None or p.default is inspect.Parameter.empty else p.default
        setattr(obj, arg, value)
    if kw:
        raise TypeError(f"{cls.name} has no arguments {sorted(kw)}")
    return obj


def method_payload(method: base.Frame) -> bytes:
    """Encode a pamqp method (class/method id + arguments) without validation."""
    out: list[bytes] = [struct.pack(">I", method.index)]
    byte, offset, in_bits = 0, 0, False
    for arg in method.__slots__:
        data_type = method.amqp_type(arg)
        value: Any = getattr(method, arg, None)
        if value is None:
            value = {"table": {}, "shortstr": "", "longstr": ""}.get(data_type, 0)
        if data_type == "bit":
            if not in_bits:
                byte, offset, in_bits = 0, 0, True
            byte |= int(bool(value)) << offset
            offset += 1
            if offset == 8:
                out.append(bytes([byte]))
                in_bits = False
            continue
        if in_bits:
            out.append(bytes([byte]))
            in_bits = False
        if data_type == "shortstr":
            raw = value.encode() if isinstance(value, str) else bytes(value or b"")
            out.append(bytes([len(raw)]) + raw)
        elif data_type == "longstr":
            raw = value.encode() if isinstance(value, str) else bytes(value or b"")
            out.append(struct.pack(">I", len(raw)) + raw)
        else:
            out.append(encode.by_type(value, data_type))
    if in_bits:
        out.append(bytes([byte]))
    return b"".join(out)


def decode_method(payload: bytes) -> base.Frame:
    return frame._unmarshal_method_frame(payload)


def frame_bytes(frame_type: int, channel: int, payload: bytes, end: int = FRAME_END) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([end])


def header_payload(body_size: int, properties: commands.Basic.Properties | None = None) -> bytes:
    props = properties or commands.Basic.Properties()
    return struct.pack(">HHQ", 60, 0, body_size) + props.marshal()


def publish_frames(
    queue: str, body: bytes, properties: commands.Basic.Properties | None = None
) -> bytes:
    """One basic.publish to the default exchange on channel 1, body in one frame, as bytes
    to send together with others (one segment: the broker reads them in one go)."""
    method = method_payload(build(commands.Basic.Publish, exchange="", routing_key=queue))
    return (
        frame_bytes(FRAME_METHOD, 1, method)
        + frame_bytes(FRAME_HEADER, 1, header_payload(len(body), properties))
        + frame_bytes(FRAME_BODY, 1, body)
    )


def field_table(table: Mapping[str, Any]) -> bytes:
    """pamqp's field-table encoding (length-prefixed)."""
    return bytes(encode.field_table(dict(table)))


def close_tuple(m: commands.Connection.Close | commands.Channel.Close) -> tuple[int, str, int, int]:
    return int(m.reply_code or 0), str(m.reply_text), int(m.class_id or 0), int(m.method_id or 0)


_FIXED = {
    "t": ">B",
    "b": ">b",
    "B": ">B",
    "s": ">h",
    "u": ">H",
    "I": ">i",
    "i": ">I",
    "l": ">q",
    "f": ">f",
    "d": ">d",
    "T": ">Q",
}


def shortstr(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return bytes([len(raw)]) + raw


def longstr(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return struct.pack(">I", len(raw)) + raw


def fv(tag: str, value: Any = None) -> bytes:
    """One explicitly typed field value: type octet + encoding.

    ``D`` takes (scale, unscaled); ``S``/``x`` take str/bytes; ``F`` takes the
    output of :func:`raw_table`; ``A`` a list of :func:`fv` results; ``V`` nothing.
    """
    if tag in _FIXED:
        return tag.encode() + struct.pack(_FIXED[tag], value)
    if tag == "D":
        scale, unscaled = value
        return b"D" + struct.pack(">Bi", scale, unscaled)
    if tag in ("S", "x"):
        return tag.encode() + longstr(value)
    if tag == "F":
        return b"F" + bytes(value)
    if tag == "A":
        inner = b"".join(value)
        return b"A" + struct.pack(">I", len(inner)) + inner
    if tag == "V":
        return b"V"
    raise ValueError(f"unknown field type {tag!r}")


def raw_table(items: Iterable[tuple[str, bytes]]) -> bytes:
    """A length-prefixed field table from (key, fv(...)) pairs, in order."""
    inner = b"".join(shortstr(k) + v for k, v in items)
    return struct.pack(">I", len(inner)) + inner


def header_with_table(body_size: int, table: bytes) -> bytes:
    """Content-header payload whose only property is ``headers`` = ``table``."""
    return struct.pack(">HHQH", 60, 0, body_size, 0x2000) + table


def reply_text(text: str) -> str:
    """A reply text as it fits a shortstr: RabbitMQ cuts texts longer than
    255 bytes to their first 252 bytes followed by "..."."""
    raw = text.encode()
    if len(raw) <= 255:
        return text
    return raw[:252].decode(errors="ignore") + "..."


def sasl_plain(user: str, password: str) -> bytes:
    return b"\x00" + user.encode() + b"\x00" + password.encode()


def sasl_amqplain(user: str, password: str) -> bytes:
    # AMQPLAIN response: a field table without its 4-byte length prefix.
    return field_table({"LOGIN": user, "PASSWORD": password})[4:]


class RawClient:
    """A blocking AMQP client with explicit framing; one per TCP connection."""

    def __init__(self, addr: tuple[str, int], timeout: float = DEFAULT_TIMEOUT) -> None:
        self.addr = addr
        self.timeout = timeout
        self.sock = socket.create_connection(addr, timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.eof = False
        self.frame_max = 131072
        self.channel_max = 0
        self.heartbeat = 0
        self.start: commands.Connection.Start | None = None
        self.tune: commands.Connection.Tune | None = None
        self.pending: list[Frame] = []
        self.opened = False
        self.open_channels: set[int] = set()
        self.publish_seq: dict[int, int] = {}  # channel -> last publish seq (confirm mode)
        self.settled: dict[int, dict[int, bool]] = {}  # channel -> {seq: acked?}

    # -- context manager -------------------------------------------------
    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- low level I/O ---------------------------------------------------
    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(
        self, frame_type: int, channel: int, payload: bytes, end: int = FRAME_END
    ) -> None:
        self.send(frame_bytes(frame_type, channel, payload, end))

    def send_method(self, channel: int, method: base.Frame) -> None:
        self.send_frame(FRAME_METHOD, channel, method_payload(method))

    def send_method_raw(self, channel: int, class_id: int, method_id: int, args: bytes) -> None:
        self.send_frame(FRAME_METHOD, channel, struct.pack(">HH", class_id, method_id) + args)

    def send_heartbeat(self) -> None:
        self.send_frame(FRAME_HEARTBEAT, 0, b"")

    def _fill(self, deadline: float) -> bool:
        """Read more bytes into the buffer; False on timeout, sets eof on EOF."""
        if self.eof:
            return False
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        ready, _, _ = select.select([self.sock], [], [], remaining)
        if not ready:
            return False
        try:
            chunk = self.sock.recv(1 << 20)
        except OSError:  # e.g. connection reset
            chunk = b""
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        return True

    def _wait_for(self, n: int, deadline: float) -> None:
        """Block until the buffer holds at least ``n`` bytes (nothing is consumed)."""
        while len(self.buf) < n:
            if not self._fill(deadline):
                if self.eof:
                    raise BrokerClosedSocket(f"EOF after {bytes(self.buf)!r}, wanted {n} bytes")
                raise Timeout(f"timed out waiting for {n} bytes, have {bytes(self.buf[:64])!r}")

    def recv_exact(self, n: int, timeout: float | None = None) -> bytes:
        self._wait_for(n, time.monotonic() + (self.timeout if timeout is None else timeout))
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def read_until_eof(self, timeout: float | None = None) -> bytes:
        """Everything the broker sends until it closes the socket."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self.eof:
            if not self._fill(deadline) and not self.eof:
                raise Timeout(f"socket still open after {bytes(self.buf)!r}")
        data = bytes(self.buf)
        self.buf.clear()
        return data

    def expect_eof(self, timeout: float | None = None) -> None:
        """The broker closes the socket, ignoring heartbeat frames meanwhile."""
        rest = self.read_until_eof(timeout)
        while rest:
            assert len(rest) >= 8 and rest[0] == FRAME_HEARTBEAT, f"unexpected bytes {rest!r}"
            rest = rest[8:]

    def read_frame(self, timeout: float | None = None) -> Frame:
        """The next frame (heartbeats included). A timeout never loses data: the
        buffer is only consumed once a whole frame has arrived."""
        if self.pending:
            return self.pending.pop(0)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        self._wait_for(7, deadline)
        frame_type, channel, size = struct.unpack(">BHI", self.buf[:7])
        # once a frame has started, give its remaining bytes a little longer
        self._wait_for(7 + size + 1, max(deadline, time.monotonic() + 1.0))
        end = self.buf[7 + size]
        payload = bytes(self.buf[7 : 7 + size])
        del self.buf[: 7 + size + 1]
        assert end == FRAME_END, f"bad frame end {end:#x}"
        return Frame(frame_type, channel, payload)

    def next_frame(self, timeout: float | None = None) -> Frame:
        """Next frame that is not a heartbeat."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            f = self.read_frame(max(0.0, deadline - time.monotonic()))
            if f.type != FRAME_HEARTBEAT:
                return f

    def frames_within(self, seconds: float) -> list[Frame]:
        """All non-heartbeat frames that arrive within ``seconds``."""
        out: list[Frame] = []
        deadline = time.monotonic() + seconds
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return out
            try:
                f = self.read_frame(remaining)
            except Timeout:
                return out
            except BrokerClosedSocket:
                return out
            if f.type != FRAME_HEARTBEAT:
                out.append(f)

    def assert_silent(self, seconds: float = 0.25) -> None:
        got = self.frames_within(seconds)
        assert not got, f"expected nothing, got {got!r}"

    def read_method(self, timeout: float | None = None) -> tuple[int, base.Frame]:
        f = self.next_frame(timeout)
        assert f.type == FRAME_METHOD, f"expected a method frame, got {f!r}"
        return f.channel, f.method()

    def expect_method(
        self, method_type: type[M], channel: int | None = None, timeout: float | None = None
    ) -> M:
        ch, m = self.read_method(timeout)
        if not isinstance(m, method_type):
            detail = dict(m)
            raise AssertionError(f"expected {method_type.name}, got {m.name} {detail} on ch {ch}")
        if channel is not None:
            assert ch == channel, f"{m.name} on channel {ch}, expected {channel}"
        return m

    def expect_close(
        self, timeout: float | None = None, reply: bool = True, wait_eof: bool = False
    ) -> tuple[int, str, int, int]:
        """Expect connection.close on channel 0 and answer close-ok.

        With ``wait_eof`` also require the broker to close the socket afterwards
        (RabbitMQ delays that by seconds after framing errors, so it is opt-in).
        """
        m = self.expect_method(commands.Connection.Close, 0, timeout)
        self.opened = False  # nothing more to say on this connection
        if reply:
            # The broker may already have dropped the socket.
            with contextlib.suppress(OSError):
                self.send_method(0, commands.Connection.CloseOk())
            if wait_eof:
                self.expect_eof()
        return close_tuple(m)

    def expect_channel_close(
        self, channel: int, timeout: float | None = None, reply: bool = True
    ) -> tuple[int, str, int, int]:
        """Expect channel.close on ``channel``; answer close-ok."""
        m = self.expect_method(commands.Channel.Close, channel, timeout)
        self.open_channels.discard(channel)
        if reply:
            self.send_method(channel, commands.Channel.CloseOk())
        return close_tuple(m)

    # -- handshake -------------------------------------------------------
    def begin(self) -> commands.Connection.Start:
        """Send the protocol header and read connection.start."""
        self.send(PROTOCOL_HEADER)
        self.start = self.expect_method(commands.Connection.Start, 0)
        return self.start

    def send_start_ok(
        self,
        *,
        user: str = "guest",
        password: str = "guest",
        mechanism: str = "PLAIN",
        client_properties: Mapping[str, Any] | None = None,
        capabilities: Mapping[str, Any] | None = None,
    ) -> None:
        caps = dict(DEFAULT_CAPABILITIES if capabilities is None else capabilities)
        props: dict[str, Any] = {
            "product": "warren-tests",
            "version": "0",
            "platform": "python",
            "capabilities": caps,
        }
        props.update(client_properties or {})
        if mechanism == "AMQPLAIN":
            response = sasl_amqplain(user, password)
        else:
            response = sasl_plain(user, password)
        args = field_table(props) + shortstr(mechanism) + longstr(response) + shortstr("en_US")
        self.send_method_raw(0, 10, 11, args)

    def tune_ok(
        self,
        channel_max: int | None = None,
        frame_max: int | None = None,
        heartbeat: int | None = 0,
    ) -> commands.Connection.Tune:
        """Read connection.tune and answer tune-ok (None = accept the proposal)."""
        self.tune = self.expect_method(commands.Connection.Tune, 0)
        self.channel_max = self.tune.channel_max if channel_max is None else channel_max
        self.frame_max = self.tune.frame_max if frame_max is None else frame_max
        self.heartbeat = self.tune.heartbeat if heartbeat is None else heartbeat
        self.send_method(
            0,
            commands.Connection.TuneOk(
                channel_max=self.channel_max, frame_max=self.frame_max, heartbeat=self.heartbeat
            ),
        )
        return self.tune

    def open(self, vhost: str = "/") -> None:
        self.send_method(0, build(commands.Connection.Open, virtual_host=vhost))
        self.expect_method(commands.Connection.OpenOk, 0)
        self.opened = True

    def handshake(
        self,
        *,
        user: str = "guest",
        password: str = "guest",
        vhost: str = "/",
        mechanism: str = "PLAIN",
        client_properties: Mapping[str, Any] | None = None,
        capabilities: Mapping[str, Any] | None = None,
        channel_max: int | None = None,
        frame_max: int | None = None,
        heartbeat: int | None = 0,
        open_vhost: bool = True,
    ) -> None:
        """Protocol header, start/start-ok, tune/tune-ok and (optionally) open.

        ``None`` for a tune value means "accept what the server proposes".
        """
        self.begin()
        self.send_start_ok(
            user=user,
            password=password,
            mechanism=mechanism,
            client_properties=client_properties,
            capabilities=capabilities,
        )
        self.tune_ok(channel_max, frame_max, heartbeat)
        if open_vhost:
            self.open(vhost)

    @classmethod
    def connect(cls, addr: tuple[str, int], *, channel: int | None = 1, **kw: Any) -> RawClient:
        """Connected, handshaken client with ``channel`` opened (if not None)."""
        c = cls(addr)
        try:
            c.handshake(**kw)
            if channel is not None:
                c.channel_open(channel)
        except BaseException:
            c.sock.close()
            raise
        return c

    def close(self) -> None:
        """Polite connection.close when possible; always closes the socket."""
        try:
            if self.opened and not self.eof:
                self.send_method(0, commands.Connection.Close(reply_code=200, reply_text="bye"))
                deadline = time.monotonic() + 2.0
                while time.monotonic() < deadline:
                    f = self.read_frame(max(0.0, deadline - time.monotonic()))
                    if f.type == FRAME_METHOD and f.channel == 0:
                        m = f.method()
                        if isinstance(m, commands.Connection.CloseOk | commands.Connection.Close):
                            if isinstance(m, commands.Connection.Close):
                                self.send_method(0, commands.Connection.CloseOk())
                            break
        except (AssertionError, OSError):
            pass
        finally:
            self.sock.close()

    def abort(self) -> None:
        """Drop the TCP connection without any AMQP close."""
        self.sock.close()

    # -- channel level helpers ---------------------------------------------
    def channel_open(self, channel: int = 1) -> None:
        self.publish_seq.pop(channel, None)  # a new channel starts outside confirm mode
        self.settled.pop(channel, None)
        self.send_method(channel, commands.Channel.Open())
        self.expect_method(commands.Channel.OpenOk, channel)
        self.open_channels.add(channel)

    def channel_close(self, channel: int = 1) -> None:
        self.send_method(channel, commands.Channel.Close(reply_code=200, reply_text="bye"))
        self.expect_method(commands.Channel.CloseOk, channel)
        self.open_channels.discard(channel)

    def call(self, channel: int, method: base.Frame, ok_type: type[M]) -> M:
        """Send a synchronous method and return its reply.

        Asynchronous traffic that arrives before the reply (deliveries, returns,
        confirms, cancel notifications, flow) is kept, in order, for later reads.
        """
        self.send_method(channel, method)
        stash: list[Frame] = []
        try:
            while True:
                f = self.next_frame()
                if f.type in (FRAME_HEADER, FRAME_BODY):
                    stash.append(f)
                    continue
                if f.type == FRAME_METHOD:
                    m = f.method()
                    if isinstance(m, ASYNC_METHODS) and not isinstance(m, ok_type):
                        stash.append(f)
                        continue
                    if not isinstance(m, ok_type):
                        raise AssertionError(
                            f"expected {ok_type.name}, got {m.name} {dict(m)} on ch {f.channel}"
                        )
                    assert f.channel == channel, f"{m.name} on channel {f.channel}"
                    return m
                raise AssertionError(f"expected {ok_type.name}, got {f!r}")
        finally:
            self.pending[:0] = stash

    def declare_queue(self, channel: int, queue: str, **kw: Any) -> commands.Queue.DeclareOk:
        """Durable unless said otherwise: RabbitMQ 4.3 refuses transient non-exclusive queues
        (rabbit_amqqueue:is_queue_args_combination_permitted/1); tests of that refusal pass
        durable=False themselves."""
        if not kw.get("exclusive") and not kw.get("passive"):
            kw.setdefault("durable", True)
        return self.call(
            channel, build(commands.Queue.Declare, queue=queue, **kw), commands.Queue.DeclareOk
        )

    def new_queue(self, channel: int, **kw: Any) -> str:
        """Declare a server-named queue and return its name."""
        return str(self.declare_queue(channel, "", **kw).queue)

    def delete_queue(self, channel: int, queue: str) -> None:
        self.call(channel, build(commands.Queue.Delete, queue=queue), commands.Queue.DeleteOk)

    def declare_exchange(
        self, channel: int, exchange: str, exchange_type: str = "direct", **kw: Any
    ) -> None:
        self.call(
            channel,
            build(commands.Exchange.Declare, exchange=exchange, exchange_type=exchange_type, **kw),
            commands.Exchange.DeclareOk,
        )

    def delete_exchange(self, channel: int, exchange: str) -> None:
        self.call(
            channel, build(commands.Exchange.Delete, exchange=exchange), commands.Exchange.DeleteOk
        )

    def bind_queue(
        self,
        channel: int,
        queue: str,
        exchange: str,
        routing_key: str = "",
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        self.call(
            channel,
            build(
                commands.Queue.Bind,
                queue=queue,
                exchange=exchange,
                routing_key=routing_key,
                arguments=dict(arguments or {}),
            ),
            commands.Queue.BindOk,
        )

    def bind_queue_raw(
        self, channel: int, queue: str, exchange: str, routing_key: str, table: bytes
    ) -> None:
        """queue.bind whose arguments are the given pre-encoded field table."""
        args = (
            b"\x00\x00"
            + shortstr(queue)
            + shortstr(exchange)
            + shortstr(routing_key)
            + b"\x00"
            + table
        )
        self.send_method_raw(channel, 50, 20, args)
        self.expect_method(commands.Queue.BindOk, channel)

    def drain(self, channel: int, queue: str) -> list[bytes]:
        """Bodies of all ready messages, fetched with basic.get (no-ack)."""
        out: list[bytes] = []
        while (d := self.get(channel, queue, no_ack=True)) is not None:
            out.append(d.body)
        return out

    def consume(
        self, channel: int, queue: str, consumer_tag: str = "", no_ack: bool = False, **kw: Any
    ) -> str:
        ok = self.call(
            channel,
            build(
                commands.Basic.Consume, queue=queue, consumer_tag=consumer_tag, no_ack=no_ack, **kw
            ),
            commands.Basic.ConsumeOk,
        )
        return str(ok.consumer_tag)

    def confirm_select(self, channel: int) -> None:
        self.call(channel, commands.Confirm.Select(), commands.Confirm.SelectOk)
        self.publish_seq.setdefault(channel, 0)
        self.settled.setdefault(channel, {})

    def wait_for_confirms(self, channel: int, timeout: float | None = None) -> dict[int, bool]:
        """Read confirms until every publish so far on ``channel`` is settled.

        Returns the confirms that arrived during this call as {sequence number:
        True for ack / False for nack}, with ``multiple`` expanded. Other frames
        that arrive meanwhile are kept for later reads, in order.
        """
        last = self.publish_seq[channel]
        settled = self.settled.setdefault(channel, {})
        new: dict[int, bool] = {}
        stash: list[Frame] = []
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        try:
            while len(settled) < last:
                f = self.next_frame(max(0.0, deadline - time.monotonic()))
                m = f.method() if f.type == FRAME_METHOD else None
                if f.channel == channel and isinstance(m, commands.Basic.Ack | commands.Basic.Nack):
                    ok = isinstance(m, commands.Basic.Ack)
                    tags = range(1, m.delivery_tag + 1) if m.multiple else [m.delivery_tag]
                    for tag in tags:
                        assert tag <= last, f"confirm for unpublished seq {tag}"
                        if tag not in settled:
                            settled[tag] = new[tag] = ok
                        else:
                            assert m.multiple, f"seq {tag} confirmed twice"
                    continue
                if isinstance(m, commands.Channel.Close | commands.Connection.Close):
                    raise AssertionError(f"closed while waiting for confirms: {f!r}")
                stash.append(f)
        finally:
            self.pending[:0] = stash
        return new

    def qos(self, channel: int, prefetch_count: int, global_: bool = False) -> None:
        self.call(
            channel,
            commands.Basic.Qos(prefetch_count=prefetch_count, global_=global_),
            commands.Basic.QosOk,
        )

    def ack(self, channel: int, delivery_tag: int, multiple: bool = False) -> None:
        self.send_method(channel, commands.Basic.Ack(delivery_tag=delivery_tag, multiple=multiple))

    def publish(
        self,
        channel: int,
        body: bytes = b"",
        exchange: str = "",
        routing_key: str = "",
        *,
        properties: commands.Basic.Properties | None = None,
        mandatory: bool = False,
        immediate: bool = False,
        frame_size: int | None = None,
        raw_header: bytes | None = None,
    ) -> None:
        """basic.publish + content header + body frames (of at most ``frame_size`` bytes).

        ``raw_header`` replaces the content-header payload verbatim.
        """
        if channel in self.publish_seq:
            self.publish_seq[channel] += 1
        chunk = frame_size if frame_size is not None else self.frame_max - 8
        parts = [
            frame_bytes(
                FRAME_METHOD,
                channel,
                method_payload(
                    build(
                        commands.Basic.Publish,
                        exchange=exchange,
                        routing_key=routing_key,
                        mandatory=mandatory,
                        immediate=immediate,
                    )
                ),
            ),
            frame_bytes(
                FRAME_HEADER,
                channel,
                raw_header if raw_header is not None else header_payload(len(body), properties),
            ),
        ]
        for i in range(0, len(body), max(1, chunk)):
            parts.append(frame_bytes(FRAME_BODY, channel, body[i : i + chunk]))
        self.send(b"".join(parts))

    def read_content(self, channel: int, method: Any, timeout: float | None = None) -> Delivery:
        hdr = self.next_frame(timeout)
        assert hdr.type == FRAME_HEADER and hdr.channel == channel, f"expected header, got {hdr!r}"
        size = int(struct.unpack(">Q", hdr.payload[4:12])[0])
        body = bytearray()
        sizes: list[int] = []
        while len(body) < size:
            b = self.next_frame(timeout)
            assert b.type == FRAME_BODY and b.channel == channel, f"expected body, got {b!r}"
            body += b.payload
            sizes.append(len(b.payload))
        assert len(body) == size, f"body {len(body)} bytes, header said {size}"
        return Delivery(channel, method, hdr.payload, bytes(body), sizes)

    def read_delivery(self, channel: int | None = None, timeout: float | None = None) -> Delivery:
        """Next basic.deliver (with its content) on ``channel``."""
        ch, m = self.read_method(timeout)
        if not isinstance(m, commands.Basic.Deliver):
            raise AssertionError(f"expected Basic.Deliver, got {m.name} {dict(m)} on ch {ch}")
        if channel is not None:
            assert ch == channel, f"deliver on channel {ch}, expected {channel}"
        return self.read_content(ch, m, timeout)

    def read_return(self, channel: int | None = None, timeout: float | None = None) -> Delivery:
        m = self.expect_method(commands.Basic.Return, channel, timeout)
        return self.read_content(channel if channel is not None else 1, m, timeout)

    def get(self, channel: int, queue: str, no_ack: bool = False) -> Delivery | None:
        """basic.get: a Delivery (method is GetOk) or None for get-empty."""
        self.send_method(channel, build(commands.Basic.Get, queue=queue, no_ack=no_ack))
        ch, m = self.read_method()
        assert ch == channel, f"{m.name} on channel {ch}"
        if isinstance(m, commands.Basic.GetEmpty):
            return None
        assert isinstance(m, commands.Basic.GetOk), f"expected get-ok/empty, got {m.name} {dict(m)}"
        return self.read_content(channel, m)

    def deliveries(
        self, channel: int | None, n: int, timeout: float | None = None
    ) -> list[Delivery]:
        return [self.read_delivery(channel, timeout) for _ in range(n)]


class Janitor:
    """Deletes the queues and exchanges a test registered, on a fresh connection."""

    def __init__(self, addr: tuple[str, int]) -> None:
        self.addr = addr
        self.queues: list[str] = []
        self.exchanges: list[str] = []

    def queue(self, name: str) -> str:
        self.queues.append(name)
        return name

    def exchange(self, name: str) -> str:
        self.exchanges.append(name)
        return name

    def clean(self) -> None:
        if not self.queues and not self.exchanges:
            return
        c = RawClient.connect(self.addr)
        try:
            todo: list[base.Frame] = [build(commands.Queue.Delete, queue=q) for q in self.queues]
            todo += [build(commands.Exchange.Delete, exchange=e) for e in self.exchanges]
            for m in todo:
                c.send_method(1, m)
                _, reply = c.read_method()
                if isinstance(reply, commands.Channel.Close):  # e.g. still exclusive elsewhere
                    c.send_method(1, commands.Channel.CloseOk())
                    c.channel_open(1)
        finally:
            c.close()
