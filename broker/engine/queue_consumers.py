"""The consumers of one queue and which of them gets the next message.

RabbitMQ's rabbit_queue_consumers: the queue (broker/engine/queue.py) owns its messages and
asks this for a consumer; this owns the consumers' order, their turns and who waits at its
limit (prefetch, a paused socket, a consumer timeout). The queue passes itself to the calls
that hand out messages: no reference back, so a deleted queue is freed by refcounting.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from warren.broker.engine.consumer import Consumer
    from warren.broker.engine.queue import Queue


class QueueConsumers:
    def __init__(self, single_active: bool) -> None:
        # highest priority first, registration order within a priority (the management
        # API's consumer lists and single active consumer read it in this order)
        self.consumers: list[Consumer] = []
        self.exclusive: Consumer | None = None
        self.single_active = single_active
        self.had_consumers = False
        # Plain dispatch (no priorities, no single active consumer) offers messages to the
        # consumers of ``turns`` in turn; one found at its limit (prefetch, a paused socket,
        # a timeout) waits in ``blocked`` until a settle of its own delivery or a change
        # that may concern any consumer (dispatch()) brings it back: a delivery costs the
        # same however many consumers wait at their limit (RabbitMQ's blocked consumers).
        self.turns: deque[Consumer] = deque()
        self.blocked: dict[Consumer, None] = {}
        # Prioritised dispatch (consumers of more than one x-priority, or single active
        # consumer) keeps the consumers in turn by priority, in ``levels``, and ``order``
        # lists the priorities that have any, lowest first; ``turns`` then only holds the
        # consumers that arrived or came back since the last delivery, filed by priority
        # (_file_turns) before the next. One at its limit waits in ``blocked`` as above, and
        # a priority whose consumers all wait leaves ``order``: a delivery costs the same
        # however many wait. (RabbitMQ 4.3, rabbit_queue_consumers:deliver/6: the head of a
        # priority queue of consumers takes the message and goes back last of its priority;
        # block_consumer/2 moves one at its limit aside, unblock/2 joins it back last.)
        # A consumer is in exactly one of ``turns``, ``levels`` and ``blocked``.
        self.levels: dict[int, deque[Consumer]] = {}
        self.order: list[int] = []
        self.rescan = True  # dispatch() rechecks the blocked ones (dispatch_settled: not)
        self.plain = not single_active  # no SAC, equal priorities

    # ---- joining and leaving ----

    def add(self, consumer: Consumer) -> None:
        consumers = self.consumers
        consumers.insert(bisect.bisect_right(consumers, -consumer.priority, key=_rank), consumer)
        self._choose_dispatch()
        self.turns.append(consumer)
        if consumer.exclusive:
            self.exclusive = consumer
        self.had_consumers = True

    def remove(self, consumer: Consumer) -> bool:
        """False if ``consumer`` was not one of them."""
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return False
        if consumer in self.blocked:
            del self.blocked[consumer]
        elif self.plain:
            self.turns.remove(consumer)
        else:
            self._file_turns()
            priority = consumer.priority
            turns = self.levels[priority]
            turns.remove(consumer)
            if not turns:
                del self.levels[priority]
                self.order.remove(priority)
        if self.exclusive is consumer:
            self.exclusive = None
        self._choose_dispatch()
        return True

    def clear(self) -> None:
        """The queue is deleted: the consumers go (vhost.delete_queue cancels them)."""
        self.turns.clear()
        self.levels.clear()
        self.order.clear()
        self.blocked.clear()

    def _choose_dispatch(self) -> None:
        """Plain dispatch while the consumers share one priority and there is no single
        active consumer, prioritised otherwise. Going prioritised, ``turns`` is filed by
        priority at the next delivery; going plain, the one priority left goes back first."""
        consumers = self.consumers
        plain = not self.single_active and (
            not consumers or consumers[0].priority == consumers[-1].priority
        )
        if plain == self.plain:
            return
        self.plain = plain
        if plain:  # one priority left, if any: its turns, then those not filed yet
            for priority in self.order:
                self.turns.extendleft(reversed(self.levels[priority]))
            self.levels.clear()
            self.order.clear()

    # ---- room again ----

    def dispatch(self, queue: Queue) -> None:
        """Capacity may have come back for any consumer (qos, flow, a drained socket, the
        end of a timeout): the blocked ones are offered messages again."""
        if self.blocked and self.rescan:
            self.turns.extend(self.blocked)
            self.blocked.clear()
        self.deliver(queue)

    def unblock(self, consumer: Consumer | None) -> None:
        """One of ``consumer``'s deliveries is settled: it may take more. (With a channel-wide
        limit, the room is any of the channel's consumers': dispatch() offers it in turn.)"""
        if (
            consumer is not None and consumer in self.blocked
            and not consumer.channel.limiter.prefetch_global
        ):  # fmt: skip
            del self.blocked[consumer]
            self.turns.append(consumer)

    # ---- who gets the next message ----

    def deliver(self, queue: Queue) -> None:
        """Hand ``queue``'s ready messages to consumers with room, in turn."""
        if not self.plain:
            self._dispatch_ordered(queue)
            return
        turns = self.turns
        consumers = self.consumers
        while queue.ready_count and len(turns):
            # The queue's only consumer, not waiting aside, is the one in turn (each is in
            # exactly one of ``turns`` and ``blocked`` here): read from the list, natively
            # compiled, where indexing the deque is a generic call.
            consumer = consumers[0] if len(consumers) == 1 and not self.blocked else turns[0]
            if not consumer.channel.can_deliver(consumer):
                turns.popleft()
                self.blocked[consumer] = None
                continue
            if queue.idle:
                queue.use.unblocked(queue)
            msg = queue.pop_ready()
            if msg is None:
                return
            # its turn is over (before the delivery, which may cancel it); one consumer
            # alone has the only turn
            if len(consumers) > 1 and len(turns) > 1:
                turns.rotate(-1)
            consumer.channel.deliver(consumer, msg)
        if queue.ready_count and self.consumers and not turns:
            queue.use.blocked(queue)

    def _file_turns(self) -> None:
        """Prioritised dispatch: the consumers of ``turns`` take their turns, each last of
        its priority."""
        levels = self.levels
        arrived = self.turns
        while arrived:
            consumer = arrived.popleft()
            priority = consumer.priority
            turns = levels.get(priority)
            if turns is None:
                levels[priority] = turns = deque()
                bisect.insort(self.order, priority)
            turns.append(consumer)

    def _dispatch_ordered(self, queue: Queue) -> None:
        """Consumer priorities: the highest priority with a consumer in turn gets the
        message, round-robin among its equals; one found at its limit waits aside
        (``blocked``), and its priority leaves ``order`` once none of it is in turn."""
        if self.single_active:
            self._dispatch_single(queue)
            return
        levels = self.levels
        order = self.order  # changed in place only: a delivery may add or cancel consumers
        while queue.ready_count:
            if self.turns:
                if self.plain:  # a delivery cancelled the last of other priorities
                    self.deliver(queue)
                    return
                self._file_turns()
            if not order:
                break
            priority = order[-1]
            turns = levels[priority]
            consumer = turns[0]
            if not consumer.channel.can_deliver(consumer):
                turns.popleft()
                self.blocked[consumer] = None
                if not turns:
                    del levels[priority]
                    order.pop()
                continue
            # the same steps as deliver's, inline in both: a shared helper would be one
            # more call per message on the plain path
            if queue.idle:
                queue.use.unblocked(queue)
            msg = queue.pop_ready()
            if msg is None:
                return
            turns.rotate(-1)  # its turn is over (before the delivery, which may cancel it)
            consumer.channel.deliver(consumer, msg)
        if queue.ready_count and self.consumers and not order:
            queue.use.blocked(queue)

    def _dispatch_single(self, queue: Queue) -> None:
        """Single active consumer: only the first consumer is ever offered messages."""
        consumers = self.consumers
        while queue.ready_count and consumers:
            active = consumers[0]
            if not active.channel.can_deliver(active):
                queue.use.blocked(queue)
                return
            if queue.idle:
                queue.use.unblocked(queue)
            msg = queue.pop_ready()
            if msg is None:
                return
            active.channel.deliver(active, msg)


def _rank(consumer: Consumer) -> int:
    return -consumer.priority  # the consumers' order: highest priority first


# rabbit_queue_consumers' ?USE_AVG_HALF_LIFE: one second (here in seconds, not microseconds)
USE_HALF_LIFE: Final = 1.0


class ConsumerUse:
    """A queue's consumer capacity, as RabbitMQ's rabbit_queue_consumers:capacity/1 keeps it.

    The queue is *active* while its consumers can take what it has, *inactive* from the
    moment every consumer is blocked (prefetch full, connection not writable, timeout
    state) with messages ready, until it delivers again. The capacity is a moving average
    of the active share of time (half-life 1 s), updated at each change and read at a
    scrape. The queue calls in only on a change (Queue.idle); with every consumer's
    prefetch full and a backlog, each ack is one, so the clock is the loop's own."""

    __slots__ = ("active_time", "avg", "clock", "since")

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.since = clock()  # start of the current (active or inactive) period
        self.active_time = 0.0  # length of the active period before the current inactive one
        self.avg = 1.0

    def blocked(self, queue: Queue) -> None:
        if not queue.idle:
            now = self.clock()
            queue.idle = True
            self.active_time, self.since = now - self.since, now

    def unblocked(self, queue: Queue) -> None:
        now = self.clock()
        queue.idle = False
        self.avg = _use_avg(self.active_time, now - self.since, self.avg)
        self.since = now

    def capacity(self, queue: Queue) -> float:
        now = self.clock()
        if queue.idle:
            return _use_avg(self.active_time, now - self.since, self.avg)
        return _use_avg(now - self.since, 0.0, self.avg)


def _use_avg(active: float, inactive: float, avg: float) -> float:
    """rabbit_queue_consumers:use_avg/3 with rabbit_misc:moving_average/4."""
    time = active + inactive
    if time <= 0:
        return avg
    weight = math.exp(time * math.log(0.5) / USE_HALF_LIFE)
    return (active / time) * (1 - weight) + avg * weight
