"""A channel (``Channel``), and ``HANDLERS``: which function handles each method a client sends.

The handlers live by concern, each named after its method: basic.publish and
confirm.select in ``channel_publish`` (``basic_publish``), consumers and settling in
``channel_consumers`` (``basic_consume``, ``basic_ack``), exchange.* and queue.* in
``channel_topology`` (``queue_declare``), tx.* in ``channel_tx``, direct reply-to in
``reply_to``. ``Channel`` keeps the channel's state and what others ask of it: the queues
deliver through it, the store reports confirms to it, its connection closes it.

Errors are raised as ``ChannelError``/``ConnectionError_`` anywhere below and
turned into channel.close or connection.close by the connection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, cast

from pamqp import commands

from warren.broker.engine import channel_consumers, channel_publish, channel_topology, channel_tx
from warren.broker.engine.channel_consumers import FLUSH_AT
from warren.broker.engine.confirms import Confirms
from warren.broker.engine.consumer import Consumer
from warren.broker.engine.exchange import Exchange
from warren.broker.engine.limiter import Limiter
from warren.broker.engine.message import ChannelBase, Message
from warren.broker.engine.stats import (
    ChannelStats,
    ConfirmedByExchange,
)
from warren.broker.engine.unacked import new_unacked
from warren.broker.tracing import firehose
from warren.protocol.connection import Content
from warren.protocol.constants import (
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
)
from warren.protocol.errors import ChannelError, ConnectionError_
from warren.protocol.frames import body_frames
from warren.protocol.methods import (
    AccessRequest,
    BasicAck,
    BasicNack,
    BasicPublish,
    BasicReject,
    access_request_ok_frame,
    ack_frame,
    cancel_frame,
    deliver_frame,
    delivery_head,
    nack_frame,
)

if TYPE_CHECKING:
    from warren.broker.engine.queue import Queue
    from warren.broker.engine.topic_permissions import TopicRule
    from warren.broker.server.amqp_connection import Connection
    from warren.broker.store import MessageStore


INLINE_BODY: Final = 2048  # bodies up to this size are copied into their delivery's frames


class Channel(ChannelBase):
    """One AMQP channel's state, and what its connection, queues and store ask of it.

    The methods a client sends are handled by the functions ``HANDLERS`` names (below).
    """

    def __init__(self, connection: Connection, channel_id: int) -> None:
        self.id = channel_id
        self.conn = connection
        self.vhost = connection.vhost
        self.stats = ChannelStats()  # added to the broker's when the channel closes
        connection.broker.stats.channels_opened += 1
        self.consumers: dict[str, Consumer] = {}
        self.unacked = new_unacked()  # delivery tag -> message, for deliveries not yet settled
        # tags of deliveries returned on a consumer timeout: settling them is a no-op
        self.timed_out: dict[int, Consumer] = {}
        self.next_tag = 0
        self.limiter = Limiter()  # prefetch: basic.qos's, asked by consumers and queues
        self.flow_active = True  # never false: RabbitMQ refuses channel.flow(active=false)
        self.closed = False
        self.last_queue = ""  # the queue name an empty name stands for
        # consumer tags whose basic.cancel waits for this channel's queue.delete-ok (RabbitMQ's
        # order: the queue's deletion reaches the channel after the method it is busy with)
        self.cancels_after: list[str] | None = None
        self.trace_ref = 0  # its id in the trace stream (broker/tracing/tracer.py), 0: none yet
        self._allowed: set[tuple[str, str, str]] = set()  # permission checks that passed
        self.allowed_version = -1
        self.published_to: str | None = None  # the exchange of the last publish allowed
        # the last publish routed, while the protocol hands the same (read-only) method
        # again: the exchange it named and whether it was a direct reply-to
        self.last_publish: BasicPublish | None = None
        self.publish_exchange: Exchange | None = None
        self.publish_reply = False
        # its topic permission, when the user has one (broker/engine/topic_permissions.py)
        self.topic_rule: TopicRule | None = None
        # direct reply-to: the no-ack consumer of the pseudo-queue amq.rabbitmq.reply-to
        self.reply_tag: str | None = None
        self.reply_token = ""
        # publisher confirms: the order of acks and nacks is Confirms' (broker/engine/confirms.py)
        self.confirm = False
        self.confirms = Confirms()
        self.confirms.on_due = self.confirms_due
        self.confirmed_by_exchange = ConfirmedByExchange()
        # transactions
        self.tx = False
        self.tx_publishes: list[tuple[Exchange, Message, bool, int | None]] = []
        self.tx_settles: list[tuple[str, list[Message], bool]] = []
        persistence = connection.broker.persistence
        self.store: MessageStore | None = persistence.messages if persistence else None
        self.max_unconfirmed = connection.broker.settings.max_unconfirmed_per_channel
        self.nacks_count = connection.broker.settings.delivery_limit_counts_nacks  # 3.x

    def reply(self, method: Any) -> None:
        self.conn.send_method(self.id, method)

    def allow(self, kind: str, resource: str, name: str) -> None:
        """RabbitMQ's permission check: configure, write or read on a queue or exchange."""
        access = self.conn.broker.access
        key = (kind, resource, name)
        if self.allowed_version == access.version and key in self._allowed:
            return
        access.check(self.conn.user, self.vhost.name, kind, resource, name)
        if self.allowed_version != access.version:
            self._allowed.clear()
            self.allowed_version = access.version
        if len(self._allowed) < 1024:
            self._allowed.add(key)

    def allow_any(self, resource: str, name: str) -> None:
        """A passive declare: any of read, write or configure will do, and a refusal reads as
        a declare's (RabbitMQ 4.3, rabbit_channel.erl check_any_resource_access_permitted/3
        tries configure last)."""
        for kind in ("read", "write"):
            try:
                self.allow(kind, resource, name)
            except ChannelError:
                continue
            return
        self.allow("configure", resource, name)

    def queue_name(self, name: str) -> str:
        """An empty name means the queue this channel declared last."""
        name = name or self.last_queue
        if not name:
            raise ChannelError(NOT_FOUND, "no previously declared queue")
        return name

    # ---- delivery (called by queues) ----

    def can_deliver(self, consumer: Consumer) -> bool:
        return (
            self.conn.writable
            and not consumer.timed_out
            and self.limiter.may_take(consumer, self.unacked)
        )

    def deliver(self, consumer: Consumer, msg: Message, content: bytes | None = None) -> None:
        """``content``: the content frames already encoded (streams share them among readers)."""
        self.next_tag = tag = self.next_tag + 1
        if (tracer := self.vhost.tracer) is not None:
            tracer.delivered(self, consumer, msg, tag)
            if tracer.firehose.bindings:
                firehose.delivered(tracer.firehose, self, consumer.queue.name, msg)
        stats = self.stats
        if msg.redelivered:
            stats.redelivered += 1
            consumer.queue.stats.redeliveries += 1
        if consumer.no_ack:
            stats.delivered_consume_auto += 1
            queue = consumer.queue
            queue.stats.delivered_auto += 1
            queue.settled(msg)
        else:
            stats.delivered_consume_manual += 1
            msg.tag = tag
            msg.channel = self
            msg.consumer = consumer
            self.unacked[tag] = msg
            consumer.unacked += 1
            if consumer.timeout is not None:
                consumer.queue.lock(msg, self, tag, consumer.timeout)
        conn = self.conn
        if content is not None:
            conn.write(deliver_frame(self.id, consumer.tag_enc, tag, msg.redelivered, msg.ex_rk))
            conn.write(content)
            size = len(msg.body)
        else:
            body = msg.body
            size = len(body)
            whole = 0 < size <= conn.protocol.frame_max - 8
            # a small body is copied into the delivery's one piece: one write, not three
            inline = whole and size <= INLINE_BODY
            head = delivery_head(
                consumer.prefix, tag, msg.redelivered, msg.ex_rk, msg.properties, size, whole,
                body if inline else b"",
            )  # fmt: skip
            if inline:
                conn.write(head)
            elif whole:
                conn.write_content(head, body)
            else:
                conn.write(head)
                if size:
                    conn.write_many(body_frames(self.id, body, conn.protocol.frame_max))
        conn.out_bytes += size
        if conn.out_bytes > FLUSH_AT:
            conn.flush()  # lets the transport say "stop" (pause_writing) before more piles up

    def dispatch_all(self) -> None:
        """Capacity came back for every consumer (qos, flow, a drained socket): offer messages."""
        # each queue once, in consumer order (a dict: a list's `in` made this O(consumers^2))
        for queue in dict.fromkeys(consumer.queue for consumer in self.consumers.values()):
            if queue.consumers and not queue.deleted:
                queue.dispatch()

    def deliveries_timed_out(
        self, consumer: Consumer | None, msgs: list[Message], timeout: int
    ) -> None:
        """RabbitMQ 4.3: return only what timed out, then cancel the consumer or close the channel.

        A consumer that is still registered and whose client understands basic.cancel
        gets one (nowait) and stays, in the timeout state, until the client cancels it or
        settles every timed-out tag. Anything else (basic.get, an already cancelled
        consumer, a client without consumer_cancel_notify) closes the channel with 406.
        """
        if self.closed:
            return
        tags = [msg.tag for msg in msgs]
        for tag in tags:
            self.unacked.pop(tag, None)
        registered = consumer is not None and self.consumers.get(consumer.tag) is consumer
        if consumer is not None:
            consumer.unacked -= len(msgs)
            if registered:
                consumer.timed_out += len(msgs)  # before the requeue: none comes straight back
                for tag in tags:
                    self.timed_out[tag] = consumer
        queue = cast("Queue", msgs[0].queue)
        queue.stats.consumer_timeouts += 1
        self.stats.consumer_timeouts += 1
        if (tracer := self.vhost.tracer) is not None:
            tracer.consumer_timed_out(self, consumer, msgs, timeout)
        queue.return_unacked(msgs, "consumer_timeout", failed=False)
        notify = registered and self.conn.capabilities.get("consumer_cancel_notify") is True
        self.conn.broker.log.warning(
            "consumer timeout",
            consumer_tag=consumer.tag if consumer is not None else None,
            channel=self.id,
            queue=queue.name,
            vhost=self.vhost.name,
            delivery_tags=tags,
            timeout_ms=timeout,
            action="cancel" if notify else "channel close",
        )
        if notify and consumer is not None:
            self.conn.write(cancel_frame(self.id, consumer.tag))
        else:
            self.conn.channel_error(
                self,
                ChannelError(
                    PRECONDITION_FAILED,
                    f"delivery acknowledgement on channel {self.id} timed out. Timeout value "
                    f"used: {timeout} ms. This timeout value can be configured, see consumers "
                    "doc guide to learn more",
                ),
            )

    def consumer_cancelled_by_broker(self, consumer: Consumer) -> None:
        """The queue went away: tell clients that understand basic.cancel."""
        if self.consumers.pop(consumer.tag, None) is None:
            return
        if self.conn.capabilities.get("consumer_cancel_notify") is True and not self.closed:
            if self.cancels_after is not None:
                self.cancels_after.append(consumer.tag)
            else:
                self.conn.write(cancel_frame(self.id, consumer.tag))

    # ---- publisher confirms: scheduling and writing what is due ----

    def confirms_due(self) -> None:
        """The store's reports made acks or nacks due (Confirms.on_due): out this turn."""
        if self.closed:
            return
        self.conn.pending_confirms.add(self)
        self.conn.schedule_flush()
        limit = self.max_unconfirmed
        if limit is not None and self.confirms.waiting() < limit and self in self.conn.held:
            self.conn.release(self)

    def flush_confirms(self) -> None:
        """Write the acks and nacks that are due, each covering a run of publishes."""
        due = self.confirms.due()
        if not due:
            return
        tracer = self.vhost.tracer
        for ack, first, last in due:
            if tracer is not None:
                tracer.confirmed(self, first, last, ack)
            if ack:
                self.stats.confirmed += last - first + 1
                self.confirmed_by_exchange.confirmed(first, last)
                self.conn.write(ack_frame(self.id, last, last > first))
            else:
                self.conn.write(nack_frame(self.id, last, last > first))
        if self.confirmed_by_exchange.runs:
            self.confirmed_by_exchange.settled(self.confirms.confirmed)

    # ---- closing ----

    def close(self) -> None:
        """The channel ends (closed by either side, or its connection went): requeue its work."""
        if self.closed:
            return
        self.closed = True
        node = self.conn.broker.stats
        node.add(self.stats)  # the node's totals keep what this channel counted
        if self.confirm:
            node.received_confirm += self.confirms.seq
        node.channels_closed += 1
        why = "channel_closed"  # only the trace tells the kinds of closing apart
        if (tracer := self.vhost.tracer) is not None:
            why = tracer.channel_closed(self)
        if self.store is not None:
            self.store.waiters.discard(self.confirms)
        self.conn.release(self)
        if self.reply_token:
            self.conn.broker.reply_channels.pop(self.reply_token, None)
            self.reply_tag = None
        consumers = list(self.consumers.values())
        self.consumers.clear()
        for consumer in consumers:
            consumer.queue.remove_consumer(consumer)
        msgs = self.unacked.pop_all()
        for _, settled, _ in self.tx_settles:  # never committed: still unacked
            msgs.extend(settled)
        self.tx_publishes = []
        self.tx_settles = []
        if msgs:
            for queue, group in channel_consumers.group_by_queue(msgs).items():
                queue.return_unacked(group, why)


# ---- channel.flow, access.request ----


def channel_flow(ch: Channel, method: commands.Channel.Flow) -> None:
    # RabbitMQ 4.3 (rabbit_channel.erl, handle_method channel.flow): a client may not
    # stop deliveries this way, only prefetch limits them
    if not method.active:
        raise ConnectionError_(NOT_IMPLEMENTED, "active=false", 20, 20)
    ch.reply(commands.Channel.FlowOk(active=True))


def access_request(ch: Channel, method: AccessRequest) -> None:
    ch.conn.write(access_request_ok_frame(ch.id))  # ticket 1, as RabbitMQ


def ignored(ch: Channel, method: Any) -> None:
    pass


# What handles each method a client may send on a channel (connection.py looks it up by type):
# each handler is named after its method, in the module of its concern.
HANDLERS: dict[type, Callable[[Channel, Any], None]] = {
    Content: channel_publish.basic_publish,
    AccessRequest: access_request,
    BasicAck: channel_consumers.basic_ack,
    BasicNack: channel_consumers.basic_nack,
    BasicReject: channel_consumers.basic_reject,
    commands.Basic.Qos: channel_consumers.basic_qos,
    commands.Basic.Consume: channel_consumers.basic_consume,
    commands.Basic.Cancel: channel_consumers.basic_cancel,
    commands.Basic.CancelOk: channel_consumers.basic_cancel_ok,
    commands.Basic.Get: channel_consumers.basic_get,
    commands.Basic.Recover: channel_consumers.basic_recover,
    commands.Basic.RecoverAsync: channel_consumers.basic_recover_async,
    commands.Channel.Flow: channel_flow,
    commands.Channel.FlowOk: ignored,
    commands.Exchange.Declare: channel_topology.exchange_declare,
    commands.Exchange.Delete: channel_topology.exchange_delete,
    commands.Exchange.Bind: channel_topology.exchange_bind,
    commands.Exchange.Unbind: channel_topology.exchange_unbind,
    commands.Queue.Declare: channel_topology.queue_declare,
    commands.Queue.Bind: channel_topology.queue_bind,
    commands.Queue.Unbind: channel_topology.queue_unbind,
    commands.Queue.Purge: channel_topology.queue_purge,
    commands.Queue.Delete: channel_topology.queue_delete,
    commands.Confirm.Select: channel_publish.confirm_select,
    commands.Tx.Select: channel_tx.tx_select,
    commands.Tx.Commit: channel_tx.tx_commit,
    commands.Tx.Rollback: channel_tx.tx_rollback,
}
