"""How long each consumer's oldest unsettled delivery has waited, for /api/consumers and
the console's "What is stuck" (a classic-queue consumer holding its deliveries is never
timed out: RabbitMQ 4.3's classic queues evaluate no consumer timeout).

The message path stamps no time on a delivery. Each statistics sample
(``collect_statistics_interval``) notes instead, per channel, the last delivery tag it had
given out by then: a delivery was made before the first sample whose mark reaches its tag.
A consumer's oldest unsettled delivery is its first entry in its channel's unacked map
(tags grow, the map keeps their order). Ages are exact to one interval, in broker time."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from warren.broker.engine.broker import Broker
    from warren.broker.engine.channel import Channel
    from warren.broker.engine.consumer import Consumer


class UnackedAges:
    def __init__(self) -> None:
        # channel -> (last delivery tag given out, broker time of that sample), oldest first
        self._marks: dict[Channel, deque[tuple[int, float]]] = {}
        # consumer -> broker time by which its oldest unsettled delivery had been made
        self._since: dict[Consumer, float] = {}

    def sample(self, broker: Broker) -> None:
        now = broker.clock.now()  # broker time: the test kit's manual clock moves it
        marks: dict[Channel, deque[tuple[int, float]]] = {}
        since: dict[Consumer, float] = {}
        for conn in broker.connections:
            for channel in conn.channels.values():
                unacked = channel.unacked
                if not unacked:
                    continue
                seen = self._marks.get(channel) or deque()
                if not seen or seen[-1][0] != channel.next_tag:
                    seen.append((channel.next_tag, now))
                oldest = next(iter(unacked.values())).tag
                while seen[0][0] < oldest:  # marks before the oldest delivery: not needed
                    seen.popleft()
                marks[channel] = seen
                waiting = {c for c in channel.consumers.values() if c.unacked}
                for msg in unacked.values():  # oldest first
                    if not waiting:
                        break
                    consumer = msg.consumer
                    if consumer in waiting:
                        waiting.discard(consumer)
                        since[consumer] = next(t for mark, t in seen if mark >= msg.tag)
        self._marks = marks
        self._since = since

    def age_ms(self, consumer: Consumer, now: float) -> int:
        """How long (ms) the consumer's oldest unsettled delivery has waited; 0 if none."""
        since = self._since.get(consumer)
        if since is None or not consumer.unacked:
            return 0
        return int((now - since) * 1000)
