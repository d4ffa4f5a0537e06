"""One client connection: its events, channels, flow, closing and the output buffer.

The server feeds it bytes (``data_received``) and gives it a transport to
write to. The handshake (start, start-ok, tune, open) and the heartbeats are
broker/server/handshake.py's; channel methods go to the handlers channel.py's
HANDLERS names. Output is collected and written once per event-loop turn, so a
burst of deliveries costs one transport write; a stream of them, while a publisher
has events left for the next turn, one write for several turns (``_flush_later``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Protocol

from pamqp import commands

from warren.broker.engine.channel import HANDLERS, Channel
from warren.broker.engine.channel_consumers import basic_ack
from warren.broker.engine.channel_publish import basic_publish
from warren.broker.server import handshake
from warren.broker.server.flow import ALARM, COALESCE, TURN, UNCONFIRMED, WRITER, FlowControl
from warren.broker.server.listen import transport_address
from warren.protocol.connection import (
    CLOSED,
    CLOSING,
    OPEN,
    OPENING,
    ChannelState,
    Content,
    ProtocolConnection,
    Sentinel,
)
from warren.protocol.constants import (
    COMMAND_INVALID,
    CONNECTION_FORCED,
    INTERNAL_ERROR,
    PROTOCOL_HEADER,
)
from warren.protocol.errors import AMQPError, ChannelError, ConnectionError_, truncate_reply_text
from warren.protocol.methods import BasicAck, make

if TYPE_CHECKING:
    from warren.broker.engine.broker import Broker
    from warren.broker.engine.queue import Queue
    from warren.broker.engine.timers import TimerHandle
    from warren.broker.engine.vhost import VirtualHost

EVENTS_PER_TURN: Final = 256  # client events handled before other connections get a turn
# a publisher's share is smaller: with 256 its messages outran the consumers' acks on
# other connections and queues grew (S6 in the README); acks and consumers go first
PUBLISH_EVENTS_PER_TURN: Final = 64
# Read coalescing (``_coalesce``): a publisher's read counts as quick when it follows the
# previous one within this many seconds, and as small below this many bytes. A read that
# large already carries hundreds of messages, and reading it sooner keeps TCP's window open.
QUICK_READ: Final = 0.0001
SMALL_READ: Final = 65536
# Output held over turns (``_flush_later``): a connection given at least STREAM_PARTS pieces
# of output since its last look is fed a stream, and while another connection has events
# left for the next turn its output waits for that turn too, at most HOLD_TURNS turns and
# HOLD_PARTS pieces.
STREAM_PARTS: Final = 32
HOLD_PARTS: Final = 2048
HOLD_TURNS: Final = 16


class Transport(Protocol):
    def write(self, data: bytes) -> None: ...
    def close(self) -> None: ...
    def is_closing(self) -> bool: ...
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...


class Connection:
    def __init__(self, broker: Broker, transport: Transport, peer: tuple[str, int] | None) -> None:
        self.broker = broker
        self.transport = transport
        self.peer = peer
        settings = broker.settings
        # the lifecycle, the channel table and the negotiated limits (protocol/connection.py)
        self.protocol: ProtocolConnection[Channel] = ProtocolConnection(
            settings.frame_max or 2**31, settings.max_message_size, settings.frame_min_size
        )
        # the protocol's own table, read here on every event (only the protocol changes it)
        self._channels = self.protocol.channels
        self.user = ""
        # in process, without a socket of its own: a shovel's amqp:// URI (broker/ops/shovel)
        self.direct = False
        self.vhost: VirtualHost = broker.default_vhost_obj()
        # read on every publish: kept here, as the broker's attributes are not compiled
        # (both are set once, when the broker is made)
        self.access_changes = broker.access.changes
        self.intercept = broker.intercept
        self.client_properties: dict[str, Any] = {}
        self.capabilities: dict[str, Any] = {}
        self.exclusive_queues: dict[str, Queue] = {}
        self.pending_confirms: set[Channel] = set()
        self.writable = True
        self.connected_at = broker.timers.now()
        # when connection.open-ok went out; None while (or if) the handshake never finished.
        # A record for accounting and logs, which need it after the state has moved on.
        self.opened_at: float | None = None
        # why it is ending: "" while open, or when the socket just dropped; read by tracing
        self.close_reason = ""
        self.refusal: TimerHandle | None = None
        self._out: list[bytes] = []
        self.out_bytes = 0  # message bodies in _out: past a limit they are written at once
        # socket reads and writes (Prometheus' connection_{incoming,outgoing}_*): one
        # increment per read or per flush, not per message
        self.recv_oct = self.recv_cnt = self.send_oct = self.send_cnt = 0
        self._flush_scheduled = False
        self._soon = broker.timers.soon()  # the loop's call_soon: a turn's writes and events
        # pieces of _out at the previous _flush_later that held it, and how many turns it has
        self._held_parts = 0
        self._held_turns = 0
        self.flow = FlowControl(transport)  # why the socket is not read (broker/server/flow.py)
        self._coalescing = broker.read_coalescing  # seconds, 0 = off
        self._last_read = -1.0  # broker.timers.instant() of the previous read
        self._sends_at_read = 0  # send_cnt at the previous read: more means it was answered
        self.coalesced = 0  # times _coalesce held the socket (read by tests)
        self._continue_scheduled = False
        self.publisher = False  # has published: an alarm blocks it
        self.blocked = False  # not read while a resource alarm is on
        # channels past max_unconfirmed_per_channel: not read until their confirms drain
        self.held: set[Channel] = set()
        self.holds = 0  # times that happened (for operators and tests)
        self.received = True
        self.sent = False
        self.silent_ticks = 0
        self.heartbeat_handle: TimerHandle | None = None
        self.close_timer: TimerHandle | None = None
        self.handshake_timer: TimerHandle | None = broker.timers.call_later(
            settings.handshake_timeout / 1000, lambda: handshake.timed_out(self)
        )
        broker.handshaking += 1  # until it authenticates or goes (warren.handshake_max)
        self.handshaking = True

    # ---- views of the protocol's state (protocol/connection.py owns it) ----

    @property
    def channels(self) -> dict[int, Channel]:
        """Open and closing channels by number: the owners in the protocol's table."""
        return {n: r.owner for n, r in self._channels.items() if r.owner is not None}

    @property
    def opened(self) -> bool:
        """connection.open-ok was sent (it may be closing since)."""
        return self.opened_at is not None

    @property
    def closing(self) -> bool:
        """connection.close was sent or received; the socket may still be open."""
        return self.protocol.state is CLOSING

    @property
    def closed(self) -> bool:
        """The transport is gone."""
        return self.protocol.state is CLOSED

    @property
    def frame_max(self) -> int:
        return self.protocol.frame_max

    @property
    def channel_max(self) -> int:
        return self.protocol.channel_max

    @property
    def heartbeat(self) -> int:
        return self.protocol.heartbeat

    # ---- output ----

    def write(self, data: bytes) -> None:
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._soon(self._flush_later)

    def write_many(self, parts: list[bytes]) -> None:
        self._out.extend(parts)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._soon(self._flush_later)

    def write_content(self, head: bytes, body: bytes) -> None:
        """A message whose body fits in one frame: ``head`` ends with the body frame's head."""
        out = self._out
        out.append(head)
        out.append(body)
        out.append(b"\xce")
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._soon(self._flush_later)

    def schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._soon(self._flush_later)

    def send_method(self, channel: int, method: Any) -> None:
        """A method off the message path: the protocol encodes it and applies its state change."""
        self.write(self.protocol.send(channel, method))

    def _flush_later(self) -> None:
        """The scheduled write of what this connection was given during a turn (deliveries).

        Under a publisher past its share of a turn, written at every turn, its consumer's
        deliveries cost a socket write for each 64 messages: on loopback, one of the
        largest costs of a message in the broker's CPU. So while that stream goes on (at
        least STREAM_PARTS new pieces since the previous turn) and some connection has
        events left for the next turn, the output waits for that turn, up to HOLD_TURNS
        turns and HOLD_PARTS pieces; then one write carries it all. A consumer that gets
        little (a prefetch window filled, a reply) is written at once, as are confirms.
        """
        if not self._flush_scheduled:  # written since (a direct flush)
            return
        parts = len(self._out)
        if (
            self.broker.backlog
            and parts - self._held_parts >= STREAM_PARTS
            and parts < HOLD_PARTS
            and self._held_turns < HOLD_TURNS
            and not self.pending_confirms
        ):
            self._held_parts = parts
            self._held_turns += 1
            self._soon(self._flush_later)  # _flush_scheduled stays True
            return
        self.flush()

    def flush(self) -> None:
        self._flush_scheduled = False
        self._held_parts = self._held_turns = 0
        self.out_bytes = 0
        if self.pending_confirms:
            pending = self.pending_confirms
            self.pending_confirms = set()
            for channel in pending:
                channel.flush_confirms()
        if self._out and self.protocol.state is not CLOSED:
            data = b"".join(self._out)
            self._out.clear()
            self.sent = True
            self.send_oct += len(data)
            self.send_cnt += 1
            self.transport.write(data)
            if self.flow.reasons & COALESCE:  # the client may be about to answer this
                self.flow.lift(COALESCE)
        elif self._out:
            self._out.clear()

    # ---- input ----

    def data_received(self, data: bytes) -> None:
        self.recv_oct += len(data)
        self.recv_cnt += 1
        self.received = True
        self.protocol.receive_data(data)
        self._process()
        if self.publisher and self._coalescing:
            self._coalesce(len(data))

    def _coalesce(self, size: int) -> None:
        """Under a stream of small publishes, read the socket once per interval, not per segment.

        A client that publishes without waiting for an answer (no confirms, nothing
        consumed on this connection) sends one TCP segment per message. Read as each one
        arrives, every message costs a wake-up, a read and a write to the consumer, on
        both sides of both sockets. Paused, the segments queue in the kernel; the next
        read takes them all, the sender's writes stop waking us, and the consumer gets them
        in one write. Nothing is held once this connection was sent anything since the
        previous read: a client that waits for a confirm or a reply must not wait longer.
        """
        now = self.broker.timers.instant()
        quick = now - self._last_read < QUICK_READ
        self._last_read = now
        if self.send_cnt != self._sends_at_read:
            self._sends_at_read = self.send_cnt
        elif quick and size < SMALL_READ and not self.flow.reasons & COALESCE:
            self.flow.pause(COALESCE)
            self.coalesced += 1
            self.broker.timers.call_later(self._coalescing, self._read_again)

    def _read_again(self) -> None:
        if self.protocol.state is not CLOSED:
            self.flow.lift(COALESCE)

    def _process(self) -> None:
        """Handle what the client sent, at most EVENTS_PER_TURN events per event-loop turn.

        A publisher's socket can hold thousands of messages; handling them all in one go
        would starve every other connection (the consumers' acks above all). Past the
        budget the socket is paused and the rest waits for the next turn, which also
        pushes back on the publisher through TCP.
        """
        if self._continue_scheduled:
            self._continue_scheduled = False
            self.broker.backlog -= 1
        proto = self.protocol
        budget = PUBLISH_EVENTS_PER_TURN if self.publisher else EVENTS_PER_TURN
        flow = self.flow
        while proto.state is not CLOSED and flow.reasons < ALARM:  # not flow.stopped, inlined
            try:
                event = proto.next_event()
                if not self.publisher and proto.content_seen:
                    # partial bodies count: they too fill memory while an alarm is on
                    self.publisher = True
                    if self.broker.alarms:
                        handshake.block(self)  # this publish goes through, the next waits
                if event is Sentinel.NEED_DATA:
                    flow.drained()
                    break
                if isinstance(event, Content):
                    self._content(event)
                elif isinstance(event, tuple):
                    channel_id, method = event
                    if channel_id:
                        self._channel_event(channel_id, method)
                    else:
                        handshake.connection_method(self, method)
                elif event is Sentinel.PROTOCOL_HEADER:
                    handshake.send_start(self)
                elif event is Sentinel.BAD_PROTOCOL_HEADER:
                    self.transport.write(PROTOCOL_HEADER)
                    self.close_transport()
                    break
            except ConnectionError_ as exc:
                self.connection_error(exc)
                break
            except ChannelError as chan_exc:  # raised by the framing layer for one channel
                # (one name per exception type: mypyc types a name by its first binding)
                record = self._channels.get(chan_exc.channel)
                channel = record.owner if record is not None else None
                if channel is None or channel.closed:
                    text = chan_exc.text.split(" - ", 1)[1]
                    self.connection_error(ConnectionError_(chan_exc.code, text))
                    break
                self.channel_error(channel, chan_exc)
            except Exception:  # a bug must not take the broker down: close this connection
                self.broker.log.exception("internal error", peer=self.peer)
                # the client learns that it was us; the details are for the operator's log
                self.connection_error(ConnectionError_(INTERNAL_ERROR, "internal error"))
                break
            budget -= 1
            if not budget:
                flow.pause(TURN)
                self._continue_scheduled = True
                self.broker.backlog += 1
                self._soon(self._process)
                break
        self.flush()

    def resume(self) -> None:
        """Handle, next turn, what was read while handling was stopped."""
        if not self._continue_scheduled and self.protocol.state is not CLOSED:
            self._continue_scheduled = True
            self.broker.backlog += 1
            self._soon(self._process)

    # ---- resource alarms (connection.blocked) ----

    def alarms_changed(self) -> None:
        if self.broker.alarms and self.publisher and not self.blocked:
            handshake.block(self)
        elif not self.broker.alarms and self.blocked:
            handshake.unblock(self)

    # ---- too many unconfirmed publishes (max_unconfirmed_per_channel) ----

    def hold(self, channel: Channel) -> None:
        """Stop reading while ``channel`` has too many publishes waiting for their confirms.

        RabbitMQ's credit flow does the same to a publisher that outruns the disk: no
        error, just TCP back pressure; a client with a bounded window never notices.
        """
        self.held.add(channel)
        self.holds += 1
        self.flow.pause(UNCONFIRMED)

    def release(self, channel: Channel) -> None:
        """``channel``'s confirms drained (or it closed): read again once none is held."""
        if channel not in self.held:
            return
        self.held.discard(channel)
        if not self.held and self.flow.clear(UNCONFIRMED):
            self.resume()

    def _content(self, content: Content) -> None:
        """A message: its record came with it (no look-up of the handler or the channel)."""
        owner: Channel | None = content.record.owner
        if owner is None:
            self._channel_event(content.channel, content)
            return
        try:
            basic_publish(owner, content)
        except ChannelError as exc:
            self.channel_error(owner, exc.at(60, 40))
        except ConnectionError_ as conn_exc:
            raise conn_exc.at(60, 40) from None

    def _channel_event(self, channel_id: int, method: Any) -> None:
        kind = type(method)
        handler = HANDLERS.get(kind)
        if handler is not None:
            # the protocol passes such methods only on open channels, which have their owner
            channel = self._channels[channel_id].owner
            if channel is not None:
                try:
                    # the two of every message called directly: natively when compiled
                    if kind is Content:
                        basic_publish(channel, method)
                    elif kind is BasicAck:
                        basic_ack(channel, method)
                    else:
                        handler(channel, method)
                except ChannelError as exc:
                    self.channel_error(channel, exc.at(*_ids(method)))
                except ConnectionError_ as conn_exc:
                    raise conn_exc.at(*_ids(method)) from None
                return
        self._channel_lifecycle(channel_id, method)

    def _channel_lifecycle(self, channel_id: int, method: Any) -> None:
        """channel.open, close and close-ok; the protocol has applied what they change."""
        record = self._channels.get(channel_id)
        if record is None:  # close-ok: the protocol freed the number; its Channel has closed
            return
        if isinstance(method, commands.Channel.Open):
            limit = self.broker.access.user_limit(self.user, "max-channels")
            if limit is not None:
                handshake.check_user_channels(self, limit)
            record.owner = Channel(self, channel_id)
            # RabbitMQ leaves the reserved field empty; pamqp insists on "0"
            self.send_method(channel_id, make(commands.Channel.OpenOk, channel_id=""))
            return
        channel = record.owner
        if isinstance(method, commands.Channel.Close):
            if record.state is ChannelState.CLOSE_RECEIVED and channel is not None:
                channel.flush_confirms()  # what it is owed goes before close-ok
                channel.close()
            # else the closes crossed: ours waits for its close-ok, theirs gets one now
            self.send_method(channel_id, commands.Channel.CloseOk())
            return
        # connection methods, or methods only a server sends
        raise ConnectionError_(COMMAND_INVALID, "unimplemented method").at(*_ids(method))

    @property
    def name(self) -> str:
        """RabbitMQ names a connection by its two ends: ``127.0.0.1:50000 -> 127.0.0.1:5672``."""
        host, port = self.peer if self.peer else ("?", 0)
        local_host, local_port = transport_address(self.transport, "sockname")
        return f"{host}:{port} -> {local_host}:{local_port}"

    def describe(self) -> dict[str, Any]:
        props = self.client_properties
        return {
            "peer": f"{self.peer[0]}:{self.peer[1]}" if self.peer else None,
            "user": self.user or None,
            "vhost": self.vhost.name if self.opened_at is not None else None,
            "client": props.get("product"),
            "client_version": props.get("version"),
        }

    def channel_error(self, channel: Channel, exc: AMQPError) -> None:
        self.broker.log.info(
            "channel error", channel=channel.id, code=exc.code, text=exc.text, **self.describe()
        )
        channel.flush_confirms()
        self.send_method(
            channel.id,
            commands.Channel.Close(
                reply_code=exc.code,
                reply_text=truncate_reply_text(exc.text),
                class_id=exc.class_id,
                method_id=exc.method_id,
            ),
        )
        channel.close()

    def connection_error(self, exc: AMQPError, report: bool = False) -> None:
        """Close the connection for ``exc``: connection.close once tuned (or if ``report``)."""
        state = self.protocol.state
        if state is CLOSING or state is CLOSED:
            return
        for channel in self.channels.values():
            channel.flush_confirms()  # owed confirms go before connection.close
        self.close_reason = f"{exc.code} {exc.text}"
        self.broker.log.info("connection error", code=exc.code, text=exc.text, **self.describe())
        if not report and state is not OPENING and state is not OPEN:
            # RabbitMQ says nothing before the connection is tuned: it just closes the socket
            self.protocol.abort()
            self.release_all()
            self.close_transport()
            return
        self.send_method(
            0,
            commands.Connection.Close(
                reply_code=exc.code,
                reply_text=truncate_reply_text(exc.text),
                class_id=exc.class_id,
                method_id=exc.method_id,
            ),
        )
        self.release_all()
        # a client that never answers close-ok loses its socket anyway
        self.close_timer = self.broker.timers.call_later(1.0, self.close_transport)

    # ---- flow control from the transport ----

    def pause_writing(self) -> None:
        """The client does not read: stop delivering, and stop reading what it asks for."""
        self.writable = False
        self.flow.pause(WRITER)

    def resume_writing(self) -> None:
        self.writable = True
        for channel in list(self.channels.values()):
            channel.dispatch_all()
        if self.flow.clear(WRITER):
            self.resume()  # resumes reading once caught up

    # ---- shutdown ----

    def force_close(
        self, text: str = "broker forced connection closure with reason 'shutdown'"
    ) -> None:
        """Broker shutdown: connection.close 320 CONNECTION_FORCED."""
        self.connection_error(ConnectionError_(CONNECTION_FORCED, text))
        self.flush()

    def release_all(self) -> None:
        """Give back what the connection held: unacked messages, consumers, exclusive queues."""
        channels = list(self.channels.values())
        for channel in channels:
            channel.close()
        for queue in list(self.exclusive_queues.values()):
            queue.vhost.delete_queue(queue)
        self.exclusive_queues.clear()
        if self.handshake_timer is not None:
            self.handshake_timer.cancel()
            self.handshake_timer = None
        if self.heartbeat_handle is not None:
            self.heartbeat_handle.cancel()
            self.heartbeat_handle = None
        if self.refusal is not None:
            self.refusal.cancel()
            self.refusal = None

    def close_transport(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self) -> None:
        handshake.authenticated(self)  # it no longer counts as one in its handshake
        if self.protocol.state is CLOSED:
            return
        self.release_all()
        self.protocol.connection_lost()  # CLOSED; its channel table, with our Channels, empties
        if self.opened_at is not None:
            self.broker.log.info(
                "connection closed",
                reason=self.close_reason or "socket closed",
                duration_s=round(self.broker.timers.now() - self.opened_at, 3),
                **self.describe(),
            )
        self._out.clear()
        if self.close_timer is not None:
            self.close_timer.cancel()
        self.broker.connection_closed(self)


def _ids(method: Any) -> tuple[int, int]:
    if isinstance(method, Content):
        return 60, 40
    index = getattr(method, "index", None)
    if index is None:
        name = getattr(method, "name", "")
        return {"Basic.Ack": (60, 80), "Basic.Nack": (60, 120), "Basic.Reject": (60, 90)}.get(
            name, (0, 0)
        )
    return index >> 16, index & 0xFFFF
