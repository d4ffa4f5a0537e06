"""A consumer: one basic.consume on one channel for one queue."""

from __future__ import annotations

import base64
import os
from typing import TYPE_CHECKING, Any

from warren.broker.engine.message import ConsumerBase
from warren.protocol.methods import DeliveryPrefix, shortstr

if TYPE_CHECKING:
    from warren.broker.engine.channel import Channel
    from warren.broker.engine.queue import Queue


def new_consumer_tag() -> str:
    """A server-named consumer tag, as RabbitMQ makes them."""
    return "amq.ctag-" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


class Consumer(ConsumerBase):
    __slots__ = (
        "arguments",
        "channel",
        "exclusive",
        "no_ack",
        "prefetch",
        "prefix",
        "priority",
        "queue",
        "tag_enc",
        "timed_out",
        "timeout",
        "trace_ref",
    )

    def __init__(
        self,
        tag: str,
        channel: Channel,
        queue: Queue,
        no_ack: bool,
        exclusive: bool,
        prefetch: int,
        arguments: dict[str, Any],
    ) -> None:
        self.tag = tag
        self.tag_enc = shortstr(tag)  # encoded once, sent in every basic.deliver
        # its basic.deliver's octets around the delivery tag (protocol/methods.py)
        self.prefix = DeliveryPrefix(channel.id, self.tag_enc)
        self.channel = channel
        self.queue = queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.prefetch = prefetch  # per-consumer limit taken from basic.qos(global=false)
        self.arguments = arguments
        priority = arguments.get("x-priority", 0)
        self.priority = priority if isinstance(priority, int) else 0
        self.unacked = 0
        self.timeout: int | None = queue.consumer_timeout_for(arguments)  # ms, quorum queues
        self.timed_out = 0  # deliveries returned on timeout and not yet settled by the client
        self.trace_ref = 0  # its id in the trace stream (broker/tracing/tracer.py), 0: none yet
