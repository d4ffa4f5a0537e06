"""A channel's consumers and their deliveries' settlement: basic.qos, consume, cancel, get,
and basic.ack, nack, reject, recover. Handlers are named after their methods
(``basic_consume``); ``ack``, ``reject`` and ``group_by_queue`` settle deliveries for
them, for tx.commit and for a closing channel. Deliveries themselves go out through
``Channel.deliver``; the prefetch they are counted against is the channel's ``Limiter``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, cast

from pamqp import commands

from warren.broker.engine import reply_to
from warren.broker.engine.arguments import validate_consumer_arguments
from warren.broker.engine.consumer import Consumer, new_consumer_tag
from warren.broker.streams.stream import check_consume
from warren.broker.tracing import firehose
from warren.protocol.constants import (
    ACCESS_REFUSED,
    NOT_ALLOWED,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
)
from warren.protocol.errors import ChannelError, ConnectionError_
from warren.protocol.frames import content_frames
from warren.protocol.methods import BasicAck, BasicNack, BasicReject, get_ok_frame, make

if TYPE_CHECKING:
    from warren.broker.engine.channel import Channel
    from warren.broker.engine.message import Message
    from warren.broker.engine.queue import Queue

FLUSH_AT: Final = 1024 * 1024  # bodies buffered for one connection before writing mid-turn

# ---- consumers ----


def basic_qos(ch: Channel, method: commands.Basic.Qos) -> None:
    if method.prefetch_size:
        raise ConnectionError_(
            NOT_IMPLEMENTED, f"prefetch_size!=0 ({method.prefetch_size})", 60, 10
        )
    # RabbitMQ 4.3 (rabbit_channel, basic.qos): a denied global qos is applied as
    # global=false, with no error to the client
    ch.limiter.qos(
        method.prefetch_count,
        method.global_ and ch.vhost.deprecated.is_permitted("global_qos"),
    )
    ch.reply(commands.Basic.QosOk())
    ch.dispatch_all()


def basic_consume(ch: Channel, method: commands.Basic.Consume) -> None:
    if method.queue == reply_to.REPLY_TO:
        reply_to.basic_consume(ch, method)
        return
    ch.allow("read", "queue", ch.queue_name(method.queue))
    queue = ch.vhost.queue(ch.queue_name(method.queue), ch.conn)
    arguments = method.arguments or {}
    # RabbitMQ's stream consume checks (broker/streams/stream.py)
    if queue.queue_type == "stream":
        check_consume(queue, arguments, method.no_ack, ch.limiter)
    else:
        validate_consumer_arguments(arguments, queue.name, ch.vhost.name)
    tag = method.consumer_tag or new_consumer_tag()
    if tag in ch.consumers:
        raise ConnectionError_(NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'", 60, 20)
    if queue.exclusive_consumer is not None or (
        method.exclusive and (queue.consumers or queue.single_active_consumer)
    ):
        raise ChannelError(
            ACCESS_REFUSED,
            f"queue '{queue.name}' in vhost '{ch.vhost.name}' in exclusive use",
        )
    limit = ch.conn.broker.settings.consumer_max_per_channel
    if limit is not None and len(ch.consumers) >= limit:
        raise ConnectionError_(
            NOT_ALLOWED, f"reached maximum ({limit}) of consumers per channel", 60, 20
        )
    consumer = Consumer(
        tag,
        ch,
        queue,
        method.no_ack,
        method.exclusive,
        ch.limiter.consumer_prefetch(method.no_ack),
        arguments,
    )
    ch.consumers[tag] = consumer
    if not method.nowait:
        ch.reply(make(commands.Basic.ConsumeOk, consumer_tag=tag))
    if (tracer := ch.vhost.tracer) is not None:
        tracer.consumer_added(consumer)
    queue.add_consumer(consumer)


def basic_cancel(ch: Channel, method: commands.Basic.Cancel) -> None:
    if ch.reply_tag is not None and method.consumer_tag == ch.reply_tag:
        ch.reply_tag = None
        if not method.nowait:
            ch.reply(make(commands.Basic.CancelOk, consumer_tag=method.consumer_tag))
        return
    consumer = ch.consumers.pop(method.consumer_tag or "", None)
    if not method.nowait:
        ch.reply(make(commands.Basic.CancelOk, consumer_tag=method.consumer_tag))
    if consumer is not None and (tracer := ch.vhost.tracer) is not None:
        tracer.consumer_cancelled(consumer, "client")
    if consumer is not None:
        consumer.queue.remove_consumer(consumer)


def basic_cancel_ok(ch: Channel, method: commands.Basic.CancelOk) -> None:
    """A client's answer to a broker-sent basic.cancel: the consumer goes (RabbitMQ 4.3)."""
    consumer = ch.consumers.pop(method.consumer_tag or "", None)
    if consumer is not None:
        consumer.queue.remove_consumer(consumer)


def basic_get(ch: Channel, method: commands.Basic.Get) -> None:
    ch.allow("read", "queue", ch.queue_name(method.queue))
    queue = ch.vhost.queue(ch.queue_name(method.queue), ch.conn)
    msg = queue.get()
    if msg is None:
        ch.stats.get_empty += 1
        queue.stats.get_empty += 1
        ch.reply(commands.Basic.GetEmpty())
        return
    ch.next_tag = tag = ch.next_tag + 1
    if (tracer := ch.vhost.tracer) is not None:
        tracer.got(ch, queue, msg, tag)
        if tracer.firehose.bindings:
            firehose.delivered(tracer.firehose, ch, queue.name, msg)
    if msg.redelivered:  # rabbit_channel:record_sent/6 counts a get's as a delivery's
        ch.stats.redelivered += 1
        queue.stats.redeliveries += 1
    if method.no_ack:
        ch.stats.delivered_get_auto += 1
        queue.stats.get_auto += 1
        queue.settled(msg)
    else:
        ch.stats.delivered_get_manual += 1
        queue.stats.get_manual += 1
        msg.tag = tag
        msg.channel = ch
        msg.consumer = None
        ch.unacked[tag] = msg
        timeout = queue.consumer_timeout_for({})
        if timeout is not None:
            queue.lock(msg, ch, tag, timeout)
    ch.conn.write(get_ok_frame(ch.id, tag, msg.redelivered, msg.ex_rk, queue.ready_count))
    conn = ch.conn
    conn.write_many(content_frames(ch.id, msg.properties, msg.body, conn.protocol.frame_max))
    conn.out_bytes += len(msg.body)
    if conn.out_bytes > FLUSH_AT:
        conn.flush()


# ---- settling deliveries: basic.ack, nack, reject, recover ----


def basic_ack(ch: Channel, method: BasicAck) -> None:
    msgs = _take(ch, method.delivery_tag, method.multiple)
    if ch.tx:
        ch.tx_settles.append(("ack", msgs, False))
        return
    ack(ch, msgs)


def basic_nack(ch: Channel, method: BasicNack) -> None:
    msgs = _take(ch, method.delivery_tag, method.multiple)
    if ch.tx:
        ch.tx_settles.append(("nack", msgs, method.requeue))
        return
    reject(ch, msgs, method.requeue)


def basic_reject(ch: Channel, method: BasicReject) -> None:
    msgs = _take(ch, method.delivery_tag, False)
    if ch.tx:
        ch.tx_settles.append(("reject", msgs, method.requeue))
        return
    reject(ch, msgs, method.requeue, rejected=True)


def basic_recover(ch: Channel, method: commands.Basic.Recover) -> None:
    _recover(ch, method.requeue)
    ch.reply(commands.Basic.RecoverOk())


def basic_recover_async(ch: Channel, method: commands.Basic.RecoverAsync) -> None:
    _recover(ch, method.requeue)


def _recover(ch: Channel, requeue: bool) -> None:
    if not requeue:
        raise ConnectionError_(NOT_IMPLEMENTED, "requeue=false", 60, 110)
    reject(ch, ch.unacked.pop_all(), True)


def _take(ch: Channel, tag: int, multiple: bool) -> list[Message]:
    """Remove and return the unacked deliveries a settle names (RabbitMQ's rules)."""
    unacked = ch.unacked
    if ch.timed_out:
        return _take_with_timed_out(ch, tag, multiple)
    if multiple:
        if tag == 0:
            return unacked.pop_all()
        if tag not in unacked:
            raise ChannelError(PRECONDITION_FAILED, f"unknown delivery tag {tag}")
        return unacked.pop_upto(tag)
    msg = unacked.pop(tag, None)
    if msg is None:
        raise ChannelError(PRECONDITION_FAILED, f"unknown delivery tag {tag}")
    return [msg]


def _take_with_timed_out(ch: Channel, tag: int, multiple: bool) -> list[Message]:
    """As ``_take``, where some tags belong to deliveries returned on a timeout."""
    unacked = ch.unacked
    known = tag in unacked or tag in ch.timed_out or (multiple and tag == 0)
    if not known:
        raise ChannelError(PRECONDITION_FAILED, f"unknown delivery tag {tag}")
    if multiple:
        stale = [t for t in ch.timed_out if tag == 0 or t <= tag]
        # 0: every delivery so far, not those the settle below may dispatch
        upto = ch.next_tag if tag == 0 else tag
    else:
        stale = [tag] if tag in ch.timed_out else []
    _settle_timed_out(ch, stale)
    if multiple:
        return unacked.pop_upto(upto)
    msg = unacked.pop(tag, None)
    return [] if msg is None else [msg]


def _settle_timed_out(ch: Channel, tags: list[int]) -> None:
    for tag in tags:
        consumer = ch.timed_out.pop(tag)
        consumer.timed_out -= 1
        if not consumer.timed_out and consumer.tag in ch.consumers:
            consumer.queue.dispatch()  # out of the timeout state


def ack(ch: Channel, msgs: list[Message]) -> None:
    if (tracer := ch.vhost.tracer) is not None:
        tracer.acked(ch, msgs)
    ch.stats.acked += len(msgs)
    touched: list[Queue] = []
    for msg in msgs:
        # the engine's own (message.py names a QueueBase): compiled, the declared type is
        # the same one check as cast(); interpreted, cast() would be a call per message
        queue: Queue = msg.queue  # type: ignore[assignment]
        consumer = msg.consumer
        if consumer is not None:
            consumer.unacked -= 1
            if not touched or touched[-1] is not queue:
                touched.append(queue)
        queue.settled(msg)
    # one multiple ack may settle deliveries from thousands of queues: deduplicated in a
    # dict (a list's `in` made it O(queues^2)), and only then (the usual ack has one)
    redispatch(ch, touched if len(touched) < 2 else list(dict.fromkeys(touched)))


def reject(ch: Channel, msgs: list[Message], requeue: bool, rejected: bool = False) -> None:
    by_queue = group_by_queue(msgs)
    for queue, group in by_queue.items():
        if (tracer := ch.vhost.tracer) is not None:
            tracer.nacked(queue, group, requeue, rejected)
        if requeue:
            # 4.3 counts only a reject toward delivery-limit (rabbit_channel.erl:
            # basic.reject requeue gives settle(true, false), basic.nack gives requeue)
            queue.return_unacked(group, "nack", counted=rejected or ch.nacks_count)
        else:
            for msg in group:
                queue.rejected(msg)
    redispatch(ch, list(by_queue))


def group_by_queue(msgs: list[Message]) -> dict[Queue, list[Message]]:
    """Group deliveries by queue, taking them off their consumers' counts."""
    by_queue: dict[Queue, list[Message]] = {}
    for msg in msgs:
        if msg.consumer is not None:
            msg.consumer.unacked -= 1
        by_queue.setdefault(cast("Queue", msg.queue), []).append(msg)
    return by_queue


def redispatch(ch: Channel, queues: list[Queue]) -> None:
    """Deliveries on ``queues`` were settled: their consumers may take more."""
    if ch.limiter.prefetch_global:  # room on the channel: any consumer of it may take more
        for queue in dict.fromkeys([*queues, *(c.queue for c in ch.consumers.values())]):
            if queue.consumers and not queue.deleted:
                queue.dispatch()
        return
    for queue in queues:
        if queue.consumers and not queue.deleted:
            queue.dispatch_settled()
