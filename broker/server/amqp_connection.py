"""One client connection: handshake, channels, heartbeats and the output buffer.

The server feeds it bytes (``data_received``) and gives it a transport to
write to; everything else is here. Output is collected and written once per
event-loop turn, so a burst of deliveries costs one transport write.
"""

from __future__ import annotations

import platform
from typing import TYPE_CHECKING, Any, Final, Protocol

from pamqp import commands

from warren.broker.engine.channel import HANDLERS, Channel
from warren.broker.engine.channel_consumers import basic_ack
from warren.broker.engine.channel_publish import basic_publish
from warren.broker.engine.users import INTERNAL_USER
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
    ACCESS_REFUSED,
    COMMAND_INVALID,
    CONNECTION_FORCED,
    INTERNAL_ERROR,
    NOT_ALLOWED,
    PROTOCOL_HEADER,
)
from warren.protocol.errors import AMQPError, ChannelError, ConnectionError_, truncate_reply_text
from warren.protocol.frames import HEARTBEAT_FRAME
from warren.protocol.methods import BasicAck, make
from warren.protocol.tables import TableError, decode_table

if TYPE_CHECKING:
    from warren.broker.engine.broker import Broker
    from warren.broker.engine.queue import Queue
    from warren.broker.engine.timers import TimerHandle
    from warren.broker.engine.vhost import VirtualHost

VERSION: Final = "0.1.0"
LOGIN_REFUSAL_DELAY: Final = 1.0  # seconds before a refused login is answered (RabbitMQ waits too)
EVENTS_PER_TURN: Final = 256  # client events handled before other connections get a turn
# a publisher's share is smaller: with 256 its messages outran the consumers' acks on
# other connections and queues grew (S6 in the README); acks and consumers go first
PUBLISH_EVENTS_PER_TURN: Final = 64
# Read coalescing (``_coalesce``): a publisher's read counts as quick when it follows the
# previous one within this many seconds, and as small below this many bytes. A read that
# large already carries hundreds of messages, and reading it sooner keeps TCP's window open.
QUICK_READ: Final = 0.0001
SMALL_READ: Final = 65536
# after close-ok the client closes the socket, within the heartbeat interval or this many
# seconds, whichever is shorter (rabbit_reader:close_connection's ?CLOSING_TIMEOUT)
CLOSING_TIMEOUT: Final = 30.0


class Transport(Protocol):
    def write(self, data: bytes) -> None: ...
    def close(self) -> None: ...
    def is_closing(self) -> bool: ...
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...


def server_properties(product: str = "Warren", version: str | None = None) -> dict[str, Any]:
    """``product`` and ``version`` are product.name / product.version (Warren's by default)."""
    return {
        "product": product,
        "version": version or VERSION,
        "platform": f"Python {platform.python_version()}",
        "copyright": "The Warren authors",
        "information": "An AMQP 0-9-1 broker in Python",
        "cluster_name": "warren@" + platform.node(),
        "capabilities": {
            "publisher_confirms": True,
            "exchange_exchange_bindings": True,
            "basic.nack": True,
            "consumer_cancel_notify": True,
            "connection.blocked": True,
            "consumer_priorities": True,
            "authentication_failure_close": True,
            "per_consumer_qos": True,
            "direct_reply_to": True,
        },
    }


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
        self.client_properties: dict[str, Any] = {}
        self.capabilities: dict[str, Any] = {}
        self.exclusive_queues: dict[str, Queue] = {}
        self.pending_confirms: set[Channel] = set()
        self.writable = True
        self.connected_at = broker.timers.now()
        # when connection.open-ok went out; None while (or if) the handshake never finished.
        # A record for accounting and logs, which need it after the state has moved on.
        self.opened_at: float | None = None
        self._close_reason = ""
        self._refusal: TimerHandle | None = None
        self._out: list[bytes] = []
        self.out_bytes = 0  # message bodies in _out: past a limit they are written at once
        # socket reads and writes (Prometheus' connection_{incoming,outgoing}_*): one
        # increment per read or per flush, not per message
        self.recv_oct = self.recv_cnt = self.send_oct = self.send_cnt = 0
        self._flush_scheduled = False
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
        self._received = True
        self._sent = False
        self._silent_ticks = 0
        self._heartbeat_handle: TimerHandle | None = None
        self._close_timer: TimerHandle | None = None
        self._handshake_timer: TimerHandle | None = broker.timers.call_later(
            settings.handshake_timeout / 1000, self._handshake_timed_out
        )
        broker.handshaking += 1  # until it authenticates or goes (warren.handshake_max)
        self._handshaking = True

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
            self.broker.timers.call_soon(self.flush)

    def write_many(self, parts: list[bytes]) -> None:
        self._out.extend(parts)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.broker.timers.call_soon(self.flush)

    def write_content(self, head: bytes, body: bytes) -> None:
        """A message whose body fits in one frame: ``head`` ends with the body frame's head."""
        out = self._out
        out.append(head)
        out.append(body)
        out.append(b"\xce")
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.broker.timers.call_soon(self.flush)

    def schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.broker.timers.call_soon(self.flush)

    def send_method(self, channel: int, method: Any) -> None:
        """A method off the message path: the protocol encodes it and applies its state change."""
        self.write(self.protocol.send(channel, method))

    def flush(self) -> None:
        self._flush_scheduled = False
        self.out_bytes = 0
        if self.pending_confirms:
            pending = self.pending_confirms
            self.pending_confirms = set()
            for channel in pending:
                channel.flush_confirms()
        if self._out and self.protocol.state is not CLOSED:
            data = b"".join(self._out)
            self._out.clear()
            self._sent = True
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
        self._received = True
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
        self._continue_scheduled = False
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
                        self._block()  # this publish goes through, the next waits
                if event is Sentinel.NEED_DATA:
                    flow.drained()
                    break
                if isinstance(event, tuple):
                    channel_id, method = event
                    if channel_id:
                        self._channel_event(channel_id, method)
                    else:
                        self._connection_method(method)
                elif event is Sentinel.PROTOCOL_HEADER:
                    self._send_start()
                elif event is Sentinel.BAD_PROTOCOL_HEADER:
                    self.transport.write(PROTOCOL_HEADER)
                    self._close_transport()
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
                self.broker.timers.call_soon(self._process)
                break
        self.flush()

    def _continue(self) -> None:
        """Handle, next turn, what was read while handling was stopped."""
        if not self._continue_scheduled and self.protocol.state is not CLOSED:
            self._continue_scheduled = True
            self.broker.timers.call_soon(self._process)

    # ---- resource alarms (connection.blocked) ----

    def alarms_changed(self) -> None:
        if self.broker.alarms and self.publisher and not self.blocked:
            self._block()
        elif not self.broker.alarms and self.blocked:
            self._unblock()

    def _block(self) -> None:
        """Stop reading a publishing connection while an alarm is on (RabbitMQ's blocking)."""
        self.blocked = True
        if self.capabilities.get("connection.blocked") is True and self.protocol.state is OPEN:
            reason = "low on memory" if "memory" in self.broker.alarms else "low on disk"
            self.send_method(0, commands.Connection.Blocked(reason=reason))
        self.flow.pause(ALARM)

    def _unblock(self) -> None:
        self.blocked = False
        if self.capabilities.get("connection.blocked") is True and self.protocol.state is OPEN:
            self.send_method(0, commands.Connection.Unblocked())
        if self.flow.clear(ALARM):
            self._continue()  # what was read before the block

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
            self._continue()

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
                self._check_user_channels(limit)
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

    def _check_user_channels(self, limit: int) -> None:
        """rabbit_reader:is_over_limits/1: the user's open channels on every connection; a
        refusal closes the connection (530, no method named)."""
        user = self.user
        count = sum(
            1
            for c in self.broker.connections
            if c.user == user
            for ch in c.channels.values()
            if not ch.closed
        )
        if count >= limit:
            raise ConnectionError_(
                NOT_ALLOWED,
                f"number of channels opened for user '{user}' has reached "
                f"the maximum allowed user limit of {limit}",
            )

    @property
    def name(self) -> str:
        """RabbitMQ names a connection by its two ends: ``127.0.0.1:50000 -> 127.0.0.1:5672``."""
        host, port = self.peer if self.peer else ("?", 0)
        local_host, local_port = transport_address(self.transport, "sockname")
        return f"{host}:{port} -> {local_host}:{local_port}"

    def _describe(self) -> dict[str, Any]:
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
            "channel error", channel=channel.id, code=exc.code, text=exc.text, **self._describe()
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
        self._close_reason = f"{exc.code} {exc.text}"
        self.broker.log.info("connection error", code=exc.code, text=exc.text, **self._describe())
        if not report and state is not OPENING and state is not OPEN:
            # RabbitMQ says nothing before the connection is tuned: it just closes the socket
            self.protocol.abort()
            self._release()
            self._close_transport()
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
        self._release()
        # a client that never answers close-ok loses its socket anyway
        self._close_timer = self.broker.timers.call_later(1.0, self._close_transport)

    # ---- connection class ----

    def _send_start(self) -> None:
        self.send_method(
            0,
            commands.Connection.Start(
                version_major=0,
                version_minor=9,
                server_properties=server_properties(
                    self.broker.settings.product_name, self.broker.settings.product_version
                ),
                mechanisms="AMQPLAIN PLAIN",
                locales="en_US",
            ),
        )

    def _connection_method(self, method: Any) -> None:
        # the protocol lets each handshake step through once, in order, and refuses the rest
        if isinstance(method, commands.Connection.StartOk):
            self._on_start_ok(method)
        elif isinstance(method, commands.Connection.TuneOk):
            if self.protocol.heartbeat:  # the protocol has checked and applied the tuning
                self._schedule_heartbeat()
        elif isinstance(method, commands.Connection.Open):
            self._on_open(method)
        elif isinstance(method, commands.Connection.Close):
            self._close_reason = f"client closed: {method.reply_code} {method.reply_text}"
            for channel in self.channels.values():
                channel.flush_confirms()  # owed confirms go before close-ok
            self.send_method(0, commands.Connection.CloseOk())
            self._release()
            self.flush()
            self._await_client_close()
        elif isinstance(method, commands.Connection.CloseOk):
            self._close_transport()
        elif isinstance(method, commands.Connection.UpdateSecret):
            self.send_method(0, commands.Connection.UpdateSecretOk())

    def _await_client_close(self) -> None:
        """Leave closing the socket to the client, as RabbitMQ does after close-ok.

        A client that closes one connection from several threads at once then sees no
        reset or EOF error. Only connection.close (answered again) and close-ok are
        read meanwhile; a client that never closes loses the socket after the bound.
        """
        if self._close_timer is None:
            beat = self.heartbeat
            bound = beat if 0 < beat < CLOSING_TIMEOUT else CLOSING_TIMEOUT
            self._close_timer = self.broker.timers.call_later(bound, self._close_transport)

    def _on_start_ok(self, method: commands.Connection.StartOk) -> None:
        self.client_properties = method.client_properties or {}
        caps = self.client_properties.get("capabilities")
        self.capabilities = caps if isinstance(caps, dict) else {}
        mechanism = method.mechanism
        response = method.response if isinstance(method.response, bytes) else b""
        if mechanism == "PLAIN":
            parts = response.split(b"\x00")
            user, password = (parts[1], parts[2]) if len(parts) == 3 else (b"", b"")
        elif mechanism == "AMQPLAIN":
            try:
                table, _ = decode_table(len(response).to_bytes(4, "big") + response)
            except TableError:
                table = {}
            user, password = _as_bytes(table.get("LOGIN")), _as_bytes(table.get("PASSWORD"))
        else:
            raise ConnectionError_(
                ACCESS_REFUSED, f"unsupported authentication mechanism '{mechanism}'", 10, 11
            )
        name = user.decode(errors="replace")
        stats = self.broker.stats
        address = self.peer[0] if self.peer else ""
        # rabbit_reader:auth_fail/5 (4.3) tells a client with authentication_failure_close
        # only this text, whatever the reason (a wrong password, or a loopback user from
        # another address, checked after the password: rabbit_reader:auth_phase/2); the
        # reason goes to the log. The same answer both ways lets no remote client learn
        # whether a loopback user's password was right.
        refused = (
            f"Login was refused using authentication mechanism {mechanism}. "
            "For details see the broker logfile."
        )
        if self.direct:
            # rabbit_direct:connect/2: no password; a user named must exist, and without one
            # it is RabbitMQ's internal "none" user, allowed everything
            if name and name not in self.broker.access.users:
                self._refuse_login(refused, name, "no such user")
                return
            self._logged_in(name or INTERNAL_USER)
            return
        if not self.broker.authenticate(name, password.decode(errors="replace")):
            stats.auth_attempt(False, address, name)
            self._refuse_login(refused, name, "invalid credentials")
            return
        if name in self.broker.settings.loopback_users and not self._from_loopback():
            stats.auth_attempt(False, address, name)
            self._refuse_login(refused, name, f"user '{name}' can only connect via localhost")
            return
        stats.auth_attempt(True, address, name)
        self._logged_in(name)

    def _logged_in(self, name: str) -> None:
        self.user = name
        self._authenticated()
        settings = self.broker.settings
        self.send_method(
            0,
            commands.Connection.Tune(
                channel_max=settings.channel_max,
                frame_max=settings.frame_max,
                heartbeat=settings.heartbeat,
            ),
        )

    def _authenticated(self) -> None:
        if self._handshaking:
            self._handshaking = False
            self.broker.handshaking -= 1

    def _refuse_login(self, detail: str, user: str, reason: str) -> None:
        """Log why, ignore the peer, and answer ``detail`` only after a delay that slows
        guessing down."""
        self.broker.log.warning(f"login refused for user '{user}'", peer=self.peer, reason=reason)
        self.protocol.stop()
        self._refusal = self.broker.timers.call_later(
            LOGIN_REFUSAL_DELAY, lambda: self._refuse(detail)
        )

    def _refuse(self, detail: str) -> None:
        if self.protocol.state is CLOSED:
            return
        if self.capabilities.get("authentication_failure_close") is True:
            # the one error RabbitMQ reports before tuning
            self.connection_error(ConnectionError_(ACCESS_REFUSED, detail), report=True)
            self.flush()
        self._close_transport()

    def _from_loopback(self) -> bool:
        host = self.peer[0] if self.peer else ""
        return (
            host.startswith("127.")
            or host in ("::1", "localhost")
            or host.startswith("::ffff:127.")
        )

    def _on_open(self, method: commands.Connection.Open) -> None:
        vhost = self.broker.vhosts.get(method.virtual_host)
        if vhost is None:
            raise ConnectionError_(NOT_ALLOWED, f"vhost {method.virtual_host} not found", 10, 40)
        node_limit = self.broker.settings.connection_max
        if node_limit is not None and len(self.broker.connections) > node_limit:
            # rabbit_reader:is_over_node_connection_limit/1: every connection counts,
            # this one too, and the check comes before the vhost's
            raise ConnectionError_(
                NOT_ALLOWED,
                f"connection refused: node connection limit ({node_limit}) is reached",
                10,
                40,
            )
        limit = vhost.limits.get("max-connections")
        if limit is not None and limit >= 0:
            open_here = sum(
                1 for c in self.broker.connections if c.protocol.state is OPEN and c.vhost is vhost
            )
            if open_here >= limit:
                raise ConnectionError_(
                    NOT_ALLOWED,
                    f"access to vhost '{vhost.name}' refused for user '{self.user}': "
                    f"connection limit ({limit}) is reached",
                    10,
                    40,
                )
        user_limit = self.broker.access.user_limit(self.user, "max-connections")
        if user_limit is not None:
            # rabbit_reader:is_over_user_connection_limit/1, after the vhost's limit
            own = sum(
                1
                for c in self.broker.connections
                if c.protocol.state is OPEN and c.user == self.user
            )
            if own >= user_limit:
                raise ConnectionError_(
                    NOT_ALLOWED,
                    f"connection refused for user '{self.user}': "
                    f"user connection limit ({user_limit}) is reached",
                    10,
                    40,
                )
        if not self.broker.access.can_access_vhost(self.user, vhost.name):
            raise ConnectionError_(
                NOT_ALLOWED,
                f"access to vhost '{vhost.name}' refused for user '{self.user}'",
                10,
                40,
            )
        self.vhost = vhost
        self.opened_at = self.broker.timers.now()
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        self.send_method(0, commands.Connection.OpenOk())
        self.broker.connection_opened(self)
        self.broker.log.info("connection opened", **self._describe())

    def _handshake_timed_out(self) -> None:
        self._handshake_timer = None
        if self.opened_at is None and self.protocol.state is not CLOSED:
            self.broker.log.info("handshake timeout", peer=self.peer)
            self._close_transport()

    # ---- heartbeats ----

    def _schedule_heartbeat(self) -> None:
        # tick twice per interval: send when we were quiet, count the client's quiet ticks
        self._heartbeat_handle = self.broker.timers.call_later(
            self.heartbeat / 2, self._heartbeat_tick
        )

    def _heartbeat_tick(self) -> None:
        if self.protocol.state is CLOSED:
            return
        if self._received or self.flow.stopped:  # what we do not read, we cannot hear
            self._silent_ticks = 0
            self._received = False
        else:
            self._silent_ticks += 1
            if self._silent_ticks >= 4:  # two whole intervals without a byte
                self._close_reason = "missed heartbeats"
                self._close_transport()
                return
        if not self._sent:
            self.transport.write(HEARTBEAT_FRAME)
        self._sent = False
        self._schedule_heartbeat()

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
            self._continue()  # resumes reading once caught up

    # ---- shutdown ----

    def force_close(
        self, text: str = "broker forced connection closure with reason 'shutdown'"
    ) -> None:
        """Broker shutdown: connection.close 320 CONNECTION_FORCED."""
        self.connection_error(ConnectionError_(CONNECTION_FORCED, text))
        self.flush()

    def _release(self) -> None:
        """Give back what the connection held: unacked messages, consumers, exclusive queues."""
        channels = list(self.channels.values())
        for channel in channels:
            channel.close()
        for queue in list(self.exclusive_queues.values()):
            queue.vhost.delete_queue(queue)
        self.exclusive_queues.clear()
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        if self._heartbeat_handle is not None:
            self._heartbeat_handle.cancel()
            self._heartbeat_handle = None
        if self._refusal is not None:
            self._refusal.cancel()
            self._refusal = None

    @property
    def close_reason(self) -> str:
        """Why it is ending: "" while open, or when the socket just dropped; read by tracing."""
        return self._close_reason

    def _close_transport(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self) -> None:
        self._authenticated()  # it no longer counts as one in its handshake
        if self.protocol.state is CLOSED:
            return
        self._release()
        self.protocol.connection_lost()  # CLOSED; its channel table, with our Channels, empties
        if self.opened_at is not None:
            self.broker.log.info(
                "connection closed",
                reason=self._close_reason or "socket closed",
                duration_s=round(self.broker.timers.now() - self.opened_at, 3),
                **self._describe(),
            )
        self._out.clear()
        if self._close_timer is not None:
            self._close_timer.cancel()
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


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value or "").encode()
