"""A queue: ready messages in publish order, consumers, and the message lifecycle.

Ready messages sit in a deque ordered by ``seq`` (their arrival number), so a
requeued message goes back to its original place. A message that leaves the
middle of the deque (expiry) is marked GONE and skipped when it reaches the
head: counts are exact at once, the deque entry goes later.
"""

from __future__ import annotations

from array import array
from collections import deque
from typing import TYPE_CHECKING, Any, Final, cast

from mypy_extensions import mypyc_attr

from warren.broker.engine.arrivals import stamp_arrival
from warren.broker.engine.deadlines import QueueDeadlines
from warren.broker.engine.message import (
    GONE,
    READY,
    UNACKED,
    Message,
    QueueBase,
)
from warren.broker.engine.operator_policy import merge as merge_definitions
from warren.broker.engine.queue_backlog import (
    over_limit,
    page_later,
    read_ahead,
    refill,
)
from warren.broker.engine.queue_consumers import ConsumerUse, QueueConsumers
from warren.broker.engine.queue_restore import restore_messages
from warren.broker.engine.queue_settings import resolve_settings
from warren.broker.engine.ready import PriorityReady, merge_in_order
from warren.broker.engine.reaper import purge_queue
from warren.broker.engine.retry import (
    RetryPolicy,
    count_failed_delivery,
    wait_for_retry,
)
from warren.broker.engine.stats import QueueStats
from warren.broker.store.paged import PagedRun
from warren.protocol.properties import (
    is_persistent,
    priority_of,
)

if TYPE_CHECKING:
    from warren.broker.engine.channel import Channel
    from warren.broker.engine.confirms import Confirms
    from warren.broker.engine.consumer import Consumer
    from warren.broker.engine.exchange import Exchange
    from warren.broker.engine.policy import Policy
    from warren.broker.engine.vhost import VirtualHost
    from warren.broker.store import MessageStore, StoredMessage


# subclasses need not be compiled with it (a build that leaves broker/streams/stream.py out)
@mypyc_attr(allow_interpreted_subclasses=True)
class Queue(QueueBase):
    # the effective settings, from the arguments and the policies (queue_settings.py)
    message_ttl: int | None
    expires: int | None
    max_length: int | None
    max_length_bytes: int | None
    overflow: str
    dead_letter_exchange: str | None
    dead_letter_routing_key: str | None
    _limited: bool
    delivery_limit: int | None
    retry: RetryPolicy
    counts_deliveries: bool
    consumer_timeout_setting: int | None

    def __init__(
        self,
        vhost: VirtualHost,
        name: str,
        *,
        durable: bool = False,
        exclusive_owner: object | None = None,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner  # the owning connection of an exclusive queue
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        max_priority = self.arguments.get("x-max-priority")
        self.max_priority: int = (
            max_priority if isinstance(max_priority, int) and max_priority > 0 else 0
        )
        self.default_priority = 0  # of a message without the priority property
        if self.arguments.get("x-queue-type") == "quorum" and not self.max_priority:
            # RabbitMQ 4.3 (rabbit_fifo:msg_priority/1, rabbit_fifo_pq): quorum queues take
            # priorities 0-31 without x-max-priority; no priority property counts as 4
            self.max_priority, self.default_priority = 31, 4
        self.ready: Any = PriorityReady(self.max_priority) if self.max_priority else deque()
        self.ready_count = 0
        self.ready_bytes = 0
        # Past its memory limit a durable queue's newer ready messages wait in ``tail``, after
        # ``ready`` and all later than it: Messages, and runs of paged-out persistent ones
        # (broker/store/paged.py) that come back a batch at a time when ``ready`` runs dry.
        self.tail: deque[Message | PagedRun] = deque()
        # ready messages (and bytes) on disk only: packed in runs, or paged Messages (TTL, priority)
        self.paged_count = 0
        self.paged_bytes = 0
        self.unacked_count = 0
        # body bytes of the unacked messages (message_bytes_unacknowledged): kept next to
        # unacked_count, one addition where it changes
        self.unacked_bytes = 0
        sac = self.arguments.get("x-single-active-consumer")
        self.single_active_consumer = sac is True
        # the consumers and who gets the next message (broker/engine/queue_consumers.py);
        # ``consumers`` is its list, highest priority first
        self.dispatcher = QueueConsumers(self.single_active_consumer)
        self.consumers: list[Consumer] = self.dispatcher.consumers
        self.next_seq = 0
        # when messages arrived, to the second, with no clock read or value per message: the
        # seq and broker time of the first arrival after each tick of ``vhost.ticks`` (a
        # tick comes at most STAMP_EVERY after the stamp that armed it, so every message
        # between two stamps arrived less than STAMP_EVERY after the first)
        self.stamp_seqs = array("q")
        self.stamp_times = array("d")
        self._ticks = vhost.ticks
        self._stamped = -1  # the tick count at the last stamp
        self.deleted = False
        self.stats = QueueStats()
        # consumer capacity (RabbitMQ's rabbit_queue_consumers use/avg): set while every
        # consumer is blocked with messages ready; its moving average lives in
        # broker/engine/queue_consumers.py
        self.idle = False
        timers = vhost.timers
        self._now = timers.clock()
        self._wall = timers.wall  # the store's deadlines: broker time, as the wall clock
        self.use = ConsumerUse(self._now)
        # TTLs, consumer timeouts, delayed retries and x-expires (broker/engine/deadlines.py)
        self.deadlines = QueueDeadlines(self, timers)
        queue_type = self.arguments.get("x-queue-type", "classic")
        self.queue_type: str = queue_type if isinstance(queue_type, str) else "classic"
        self.store_id = 0  # the queue's id in the store when it keeps persistent messages
        self.trace_ref = 0  # its id in the trace stream (broker/tracing/tracer.py), 0: none yet
        self.message_store: MessageStore | None = None
        self.policy: Policy | None = None
        self.operator_policy: Policy | None = None  # merged over it (effective_definition)
        # exchanges with a binding to this queue (Exchange.bind keeps it): deleting the queue
        # visits them, not every exchange of the vhost
        self.sources: dict[Exchange, None] = {}
        self.delayed_count = 0
        # restored messages whose TTL ran out while the broker was down (expire_restored)
        self.expired_at_start: list[Message] = []
        self.apply_settings()
        self.touch()

    def apply_settings(self) -> None:
        """Effective limits from the arguments and the policy (RabbitMQ's precedence)."""
        old_expires = getattr(self, "expires", None)
        self._apply_settings()
        if self.expires != old_expires:
            self.deadlines.rearm_unused(self.expires, not self.consumers)
        if self._limited and self.overflow == "drop-head":
            self._drop_head_over_limit()  # a lower limit trims the queue at once, as in RabbitMQ

    def _apply_settings(self) -> None:
        resolve_settings(self)

    def effective_definition(self) -> dict[str, Any]:
        """The policy's definition merged with the operator policy's (RabbitMQ's rules)."""
        if self.operator_policy is None:
            return self.policy.definition if self.policy is not None else {}
        return merge_definitions(self.policy, self.operator_policy)

    def consumer_timeout_for(self, consumer_arguments: dict[str, Any]) -> int | None:
        """RabbitMQ 4.3: the consumer's argument, else min(queue argument, policy), else global."""
        if self.queue_type != "quorum":
            return None  # classic queues do not evaluate consumer timeouts
        own = consumer_arguments.get("x-consumer-timeout")
        if isinstance(own, int) and not isinstance(own, bool):
            return own
        if self.consumer_timeout_setting is not None:
            return self.consumer_timeout_setting
        return self.vhost.default_consumer_timeout

    # ---- in ----

    def publish(self, msg: Message, ttl: int | None, confirm: Confirms | None = None) -> bool:
        """Enqueue; False if the queue refused it (overflow reject-publish, or a store that
        cannot write the persistent message whose confirm waits for it). ``confirm``: the
        publisher's confirm token, for the store to count a copy it writes on."""
        if confirm is not None and self.store_id:
            store = self.message_store
            if store is not None and store.error is not None and is_persistent(msg.properties):
                return False  # nacked, and taken by no durable queue (MessageStore._nacked_now)
        if self._limited and self.overflow != "drop-head" and self._full_for(len(msg.body)):
            if self.overflow == "reject-publish-dlx":
                self.dead_letter(msg, "maxlen")
            elif (tracer := self.vhost.tracer) is not None:
                tracer.dropped(self, msg, "overflow")
            return False
        self.next_seq += 1
        msg.seq = self.next_seq
        msg.queue = self
        self.stats.published += 1
        if self._ticks.count != self._stamped:
            stamp_arrival(self)
        if self.max_priority:
            msg.priority = priority_of(msg.properties, self.default_priority)
        queue_ttl = self.message_ttl
        if queue_ttl is not None and (ttl is None or queue_ttl < ttl):
            ttl = queue_ttl
        packed = False  # in a paged run (broker/store/paged.py), not in ready or tail
        if self.store_id and is_persistent(msg.properties):
            store = self.message_store
            assert store is not None
            expires_wall = self._wall() + ttl / 1000 if ttl is not None else 0.0
            store.publish(self.store_id, msg, expires_wall, confirm)
            stats = self.stats
            stats.persistent += 1
            stats.persistent_bytes += len(msg.body)
            stats.disk_writes += 1
            limit = store.pager.page_limit
            if limit is not None and over_limit(self, len(msg.body), limit):
                # over the memory limit: it leaves memory once on disk, packed in a run, or
                # (deadlines and priorities need the object) its body only
                if ttl is None and not self.max_priority:
                    page_later(self, msg, store)
                    packed = True
                else:
                    store.pager.page_later(msg)
        if not packed:
            tail = self.tail
            if len(tail):
                tail.append(msg)
            elif self.max_priority:
                self.ready.append(msg)
            else:  # a deque: its append held as a constant is a direct call compiled
                _append(self.ready, msg)
        self.ready_count += 1
        self.ready_bytes += len(msg.body)
        if self.consumers:
            self.dispatcher.deliver(self)  # a consumer that can take it has it before any limit
        if self._limited:
            self._drop_head_over_limit()
        if ttl is not None:
            # delivered at once or not, the deadline counts from now: a requeue keeps it
            msg.expires_at = self._now() + ttl / 1000
            if msg.state == READY:
                if ttl == 0:
                    self.expire(msg)  # nobody could take it at once: RabbitMQ's immediate
                else:
                    self.deadlines.track_expiry(msg, self.ready_count + self.delayed_count)
        return True

    def append_ready(self, msg: Message) -> None:
        if self.tail:
            self.tail.append(msg)
        else:
            self.ready.append(msg)

    def _full_for(self, size: int) -> bool:
        # delayed messages count towards the limits: they are still in the queue
        if self.max_length is not None and self.ready_count + self.delayed_count >= self.max_length:
            return True
        return self.max_length_bytes is not None and self.ready_bytes + size > self.max_length_bytes

    def _drop_head_over_limit(self) -> None:
        max_len, max_bytes = self.max_length, self.max_length_bytes
        while self.ready_count and (
            (max_len is not None and self.ready_count + self.delayed_count > max_len)
            or (max_bytes is not None and self.ready_bytes > max_bytes)
        ):
            msg = self.pop_ready(deliver=False)
            if msg is None:
                break
            self.gone(msg)
            self.dead_letter(msg, "maxlen")

    def requeue(self, msgs: list[Message], why: str) -> None:
        """Put unacked messages back at their original positions, marked redelivered."""
        now = self._now()
        back: list[Message] = []
        for msg in msgs:
            if msg.state != UNACKED:
                continue
            msg.channel = None
            msg.consumer = None
            msg.tag = 0
            msg.redelivered = True
            if msg.expires_at is not None and msg.expires_at <= now:
                self.expired(msg)
                continue
            msg.state = READY
            back.append(msg)
        if not back:
            return
        if (tracer := self.vhost.tracer) is not None:
            tracer.requeued(self, back, why)
        back.sort(key=_seq)
        if self.max_priority:
            self.ready.reinsert(back)
        else:
            self.ready = merge_in_order(self.ready, back)
        self.ready_count += len(back)
        self.stats.redelivered += len(back)
        for msg in back:
            self.ready_bytes += len(msg.body)
            if msg.expires_at is not None:
                self.deadlines.track_expiry(msg, self.ready_count + self.delayed_count)
        self.dispatcher.deliver(self)

    # ---- out ----

    def pop_ready(self, deliver: bool = True) -> Message | None:
        """The head of the ready messages, taken out of them.

        ``deliver``: for a consumer or basic.get, the one place a message is handed over
        (an expired head expires on the way; the message becomes unacked, counted, and
        its first delivery recorded in the store). The hand-over is here, not in a helper
        of its own, so that a delivery costs no extra call (hot path). Without it (a
        drop-head), the head as it is.
        """
        ready = self.ready
        while ready or (self.tail and refill(self)):
            # a plain queue's ready is a deque: its popleft held as a constant is a direct
            # call compiled (``ready.popleft()`` is looked up by name for each message)
            msg: Message = ready.popleft() if self.max_priority else _popleft(ready)
            if msg.state != READY:
                continue  # expired or otherwise gone while waiting
            if deliver and msg.expires_at is not None and msg.expires_at < self._now():
                self.expire(msg)
                continue
            if self.paged_count and msg.paged_size >= 0:
                read_ahead(self, msg)
            self.ready_count -= 1
            size = len(msg.body)
            self.ready_bytes -= size
            if deliver:
                msg.state = UNACKED
                self.unacked_count += 1
                self.unacked_bytes += size
                self.stats.delivered += 1
                if msg.store_id and not msg.redelivered:
                    self.message_store.delivered(msg)  # type: ignore[union-attr]
            return msg
        return None

    def dispatch(self) -> None:
        """Hand ready messages to consumers with room (broker/engine/queue_consumers.py):
        room may have come back for any consumer."""
        self.dispatcher.dispatch(self)

    def dispatch_settled(self) -> None:
        """Deliveries were settled (the channel has no global prefetch): only their
        consumers gained room, and they are back in turn already (QueueConsumers.unblock)."""
        dispatcher = self.dispatcher
        dispatcher.rescan = False
        try:
            self.dispatch()  # a stream's own (broker/streams/stream.py)
        finally:
            dispatcher.rescan = True

    def get(self) -> Message | None:
        """basic.get: the head message, now unacked (the channel settles it for no-ack)."""
        self.touch()
        return self.pop_ready()

    # ---- settling ----

    def settled(self, msg: Message) -> None:
        """Acked (or delivered with no-ack): the message is done."""
        if self.dispatcher.blocked:
            self.dispatcher.unblock(cast("Consumer | None", msg.consumer))
        if msg.state == UNACKED:
            self.gone(msg)
            self.unacked_count -= 1
            self.unacked_bytes -= msg.body_size()
            self.stats.acked += 1
            if msg.expires_at is not None:
                self.deadlines.expiry.compact(self.ready_count + self.delayed_count)

    def rejected(self, msg: Message) -> None:
        """basic.reject or basic.nack without requeue: dead-letter it (or drop it)."""
        if self.dispatcher.blocked:
            self.dispatcher.unblock(cast("Consumer | None", msg.consumer))
        if msg.state != UNACKED:
            return
        self.gone(msg)
        self.unacked_count -= 1
        self.unacked_bytes -= msg.body_size()
        self.dead_letter(msg, "rejected")

    def return_unacked(
        self, msgs: list[Message], why: str, failed: bool = True, counted: bool = True
    ) -> None:
        """Unacked messages of this queue come back (channel closed, nack, recover, timeout).

        ``why`` is the trace's reason (broker/tracing/tracer.py: nack, channel_closed, ...).
        ``failed`` is False for consumer-timeout returns, which do not count as a failed
        delivery attempt (RabbitMQ 4.3). ``counted`` is False for a nack or basic.recover
        with requeue, a plain requeue that leaves the delivery count alone (RabbitMQ 4.3,
        rabbit_channel.erl handle_method basic.nack: ``requeue``, not ``settle(true, _)``).
        """
        dispatcher = self.dispatcher
        if dispatcher.blocked:
            for msg in msgs:
                dispatcher.unblock(cast("Consumer | None", msg.consumer))
        live = [m for m in msgs if m.state == UNACKED]
        self.unacked_count -= len(live)
        self.unacked_bytes -= sum(m.body_size() for m in live)
        if self.deleted:
            for msg in live:
                self.gone(msg)
            return
        # a nack still counts as an attempt of Warren's delayed retry on other queue types
        if failed and self.counts_deliveries and (counted or self.queue_type != "quorum"):
            live = count_failed_delivery(self, live)
        if self.retry.enabled and self.retry.applies(failed):
            wait_for_retry(self, live, why)
        else:
            self.requeue(live, why)

    def purge(self) -> int:
        """Drop the ready messages and those waiting for a retry; unacked ones stay. The queue
        is empty at once; the reaper lets go of its messages (broker/engine/reaper.py)."""
        return purge_queue(self)

    # ---- consumers ----

    def add_consumer(self, consumer: Consumer) -> None:
        self.dispatcher.add(consumer)
        self.deadlines.unused.cancel()
        self.dispatcher.deliver(self)

    def remove_consumer(self, consumer: Consumer) -> None:
        dispatcher = self.dispatcher
        if not dispatcher.remove(consumer):
            return
        if self.single_active_consumer and self.consumers:
            self.dispatch()  # the next consumer takes over
        if not self.consumers:
            if self.auto_delete and dispatcher.had_consumers:
                self.vhost.delete_queue(self)
                return
            self.touch()

    @property
    def exclusive_consumer(self) -> Consumer | None:
        return self.dispatcher.exclusive

    def lock(self, msg: Message, channel: Channel, tag: int, timeout_ms: int) -> None:
        """Start the clock on an unacked delivery (a consumer timeout, QueueDeadlines)."""
        self.deadlines.lock(msg, channel, tag, timeout_ms, self.unacked_count)

    # ---- leaving ----

    def gone(self, msg: Message) -> None:
        """The message leaves the queue for good (acked, expired, dropped, dead-lettered)."""
        msg.state = GONE
        if msg.store_id:
            stats = self.stats
            stats.persistent -= 1
            stats.persistent_bytes -= msg.body_size()
            store = self.message_store
            assert store is not None
            if self.deleted:
                store.forget(msg)  # the queue's definition is gone: no record needed
            else:
                store.remove(msg)

    def expire(self, msg: Message, withdrawn: bool = False) -> None:
        """Remove a ready message wherever it is: its TTL ran out, or (``withdrawn``) its
        publish was nacked as the store cannot write it (MessageStore._nacked_now), and it
        leaves as if never published, neither expired nor dead-lettered."""
        self.ready_count -= 1
        self.ready_bytes -= msg.body_size()
        if self.ready and self.ready[0] is msg:
            self.ready.popleft()
        if withdrawn:
            self.gone(msg)
        else:
            self.expired(msg)
        if not self.ready_count:
            self.ready.clear()

    def page_in(self, msg: Message) -> bytes:
        """``msg``'s paged-out body, read back (Message.body)."""
        assert self.message_store is not None
        return self.message_store.pager.page_in(msg)

    def expired(self, msg: Message) -> None:
        """Its TTL ran out (ready, waiting for a retry, or coming back unacked): it leaves
        the queue, counted, for the dead-letter exchange if there is one."""
        self.gone(msg)
        self.stats.expired += 1
        self.count_node("expired")
        self.dead_letter(msg, "expired")

    def count_node(self, counter: str) -> None:
        stats = self.vhost.stats
        if stats is not None:
            setattr(stats, counter, getattr(stats, counter) + 1)

    def dead_letter(self, msg: Message, reason: str) -> None:
        if (tracer := self.vhost.tracer) is not None:
            tracer.dead_lettered(self, msg, reason)
        if self.dead_letter_exchange is not None:
            self.stats.dead_lettered[reason] = self.stats.dead_lettered.get(reason, 0) + 1
            if self.vhost.stats is not None:
                node = self.vhost.stats.dead_lettered
                node[reason] = node.get(reason, 0) + 1
            self.vhost.dead_letter(self, msg, reason)
        msg.body = b""  # free the memory now; a GONE deque entry may linger until the head

    # ---- recovery ----

    def restore_messages(
        self, records: list[StoredMessage], now_wall: float, now_mono: float
    ) -> list[Message]:
        """Take back persistent messages after a restart (broker/engine/queue_restore.py)."""
        return restore_messages(self, records, now_wall, now_mono)

    # ---- x-expires ----

    def touch(self) -> None:
        """A use that restarts the x-expires timer (declare, get, last consumer gone)."""
        self.deadlines.touch(self.expires, not self.consumers)

    def unused_expired(self) -> None:
        """Unused for its x-expires (QueueDeadlines): the queue goes."""
        self.vhost.log.info(
            "queue expired", queue=self.name, vhost=self.vhost.name, expires_ms=self.expires
        )
        if (tracer := self.vhost.tracer) is not None:
            tracer.queue_expired(self)
        self.vhost.delete_queue(self)

    def close(self) -> None:
        """Deleted: stop the timers and drop the messages."""
        self.deleted = True
        node = self.vhost.stats
        if node is not None:  # its disk counts stay in the node's (management overview)
            node.deleted_disk_reads += self.stats.disk_reads
            node.deleted_disk_writes += self.stats.disk_writes
        self.deadlines.close()
        self.purge()
        self.dispatcher.clear()
        self.deadlines.release()


_popleft: Final = deque.popleft
_append: Final = deque.append


def fan_out(
    queues: list[Queue], msg: Message, ttl: int | None, confirm: Confirms | None = None
) -> int:
    """Enqueue ``msg`` in each of ``queues``; returns how many took it.

    Every place that routes one message to several queues goes through here. All the
    copies are made before any queue sees the message: a queue may dead-letter or drop
    it at once (TTL 0, a length limit), which frees its body. One queue takes the
    message itself, with no copy.
    """
    if len(queues) == 1:
        return 1 if queues[0].publish(msg, ttl, confirm) else 0
    copies = [msg, *(msg.copy() for _ in range(len(queues) - 1))]
    taken = 0
    for queue, copy in zip(queues, copies, strict=True):
        if queue.publish(copy, ttl, confirm):
            taken += 1
    return taken


def _seq(msg: Message) -> int:
    return msg.seq
