"""Direct reply-to: the pseudo-queue ``amq.rabbitmq.reply-to`` (RabbitMQ 4.3's
rabbit_volatile_queue and its part of rabbit_channel).

A channel consumes from the pseudo-queue with no acks (``basic_consume``); a publish
that names it as reply_to gets this channel's address (``amq.rabbitmq.reply-to.<token>``)
instead, and a publish to that address through the default exchange goes straight to the
waiting consumer (``publish``), never through a queue. The address exists while its
channel is open (``Broker.reply_channels``).
"""

from __future__ import annotations

import base64
import os
from typing import TYPE_CHECKING, Final

from pamqp import commands

from warren.broker.engine.consumer import new_consumer_tag
from warren.protocol.constants import NOT_ALLOWED, NOT_FOUND, PRECONDITION_FAILED
from warren.protocol.errors import ChannelError, ConnectionError_
from warren.protocol.frames import content_frames
from warren.protocol.methods import deliver_frame, make, shortstr

if TYPE_CHECKING:
    from warren.broker.engine.channel import Channel
    from warren.broker.engine.exchange import Exchange
    from warren.broker.engine.message import Message

REPLY_TO: Final = "amq.rabbitmq.reply-to"
REPLY_TO_PREFIX: Final = REPLY_TO + "."


def queue_declare(ch: Channel, method: commands.Queue.Declare) -> None:
    """The pseudo-queue is always there, with its one (virtual) consumer; a reply address
    exists while the channel that owns it is open."""
    name = method.queue
    token = name[len(REPLY_TO_PREFIX) :]
    if name != REPLY_TO and token not in ch.conn.broker.reply_channels:
        raise ChannelError(NOT_FOUND, f"no queue '{name}' in vhost '{ch.vhost.name}'")
    if not method.nowait:
        ch.reply(make(commands.Queue.DeclareOk, queue=name, message_count=0, consumer_count=1))


def basic_consume(ch: Channel, method: commands.Basic.Consume) -> None:
    if not method.no_ack:
        raise ChannelError(PRECONDITION_FAILED, "reply consumer cannot acknowledge")
    if ch.reply_tag is not None:
        raise ChannelError(PRECONDITION_FAILED, "reply consumer already set")
    tag = method.consumer_tag or new_consumer_tag()
    if tag in ch.consumers:
        raise ConnectionError_(NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'", 60, 20)
    ch.reply_tag = tag
    if not ch.reply_token:
        ch.reply_token = base64.urlsafe_b64encode(os.urandom(18)).decode()
        ch.conn.broker.reply_channels[ch.reply_token] = ch
    if not method.nowait:
        ch.reply(make(commands.Basic.ConsumeOk, consumer_tag=tag))


def publish(ch: Channel, exchange: Exchange, msg: Message) -> None:
    """A reply to a direct reply-to address goes straight to the waiting consumer."""
    target = ch.conn.broker.reply_channels.get(msg.routing_key[len(REPLY_TO_PREFIX) :])
    seq = ch.confirms.published() if ch.confirm else 0
    if seq and exchange is not ch.confirmed_by_exchange.last:
        ch.confirmed_by_exchange.switch(seq, exchange)
    if target is not None and target.reply_tag is not None and not target.closed:
        target.next_tag = tag = target.next_tag + 1
        out = target.conn
        out.write(deliver_frame(target.id, shortstr(target.reply_tag), tag, False, msg.ex_rk))
        out.write_many(content_frames(target.id, msg.properties, msg.body, out.protocol.frame_max))
    # else dropped, never returned: 4.3 routes it to the volatile queue named by the
    # address (rabbit_volatile_queue), so even a mandatory publish counts as routed
    if seq:
        ch.confirms.accepted(seq)
        ch.conn.pending_confirms.add(ch)
