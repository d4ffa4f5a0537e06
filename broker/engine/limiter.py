"""Prefetch of one channel: how many unacked deliveries its consumers may hold (RabbitMQ's
rabbit_limiter).

basic.qos sets it, here only: ``global=false`` is the limit of each consumer created
afterwards (a consumer keeps the one it was created with, ``Consumer.prefetch``);
``global=true`` is one limit shared by the channel's consumers. The channel, its queues
and the stream queue type ask this object; none of them reads basic.qos itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from warren.broker.engine.consumer import Consumer
    from warren.broker.engine.unacked import Unacked


class Limiter:
    __slots__ = ("prefetch_count", "prefetch_global")

    def __init__(self) -> None:
        self.prefetch_count = 0  # basic.qos global=false: for consumers created later
        self.prefetch_global = 0  # basic.qos global=true: shared by the channel

    def qos(self, prefetch_count: int, global_: bool) -> None:
        """basic.qos. ``global_``: asked for and permitted (a denied global qos is applied
        as global=false, RabbitMQ 4.3 rabbit_channel, basic.qos)."""
        if global_:
            self.prefetch_global = prefetch_count
        else:
            self.prefetch_count = prefetch_count
            self.prefetch_global = 0  # rabbit_limiter:unlimit_prefetch/1, as 3.10 does too

    def consumer_prefetch(self, no_ack: bool) -> int:
        """The limit of a consumer created now: none without acks."""
        return 0 if no_ack else self.prefetch_count

    def may_take(self, consumer: Consumer, channel_unacked: Unacked) -> bool:
        """``consumer`` may take one more delivery, with ``channel_unacked`` the deliveries
        unacked on its channel (counted only under a channel-wide limit)."""
        prefetch = consumer.prefetch
        if prefetch and consumer.unacked >= prefetch:
            return False
        limit = self.prefetch_global
        return not limit or consumer.no_ack or len(channel_unacked) < limit
