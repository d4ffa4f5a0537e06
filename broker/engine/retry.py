"""Delayed retry: how long a returned message waits before it is ready again.

RabbitMQ 4.3's keys (``x-delayed-retry-type``, ``-min``, ``-max``: delay = min x
attempt, capped), LavinMQ's ``x-delayed-retry-multiplier`` (min x multiplier^(attempt-1),
capped) and Warren's ``x-delayed-retry-schedule`` (an explicit list; the last delay
repeats), which wins over the others.

And what a queue does with a returned message: it waits for its retry delay
(``wait_for_retry``, its clock in broker/engine/deadlines.py), then joins the tail
(``release_delayed``); a quorum queue counts the failed delivery first
(``count_failed_delivery``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from warren.broker.engine.message import DELAYED, READY, UNACKED, Message
from warren.protocol.properties import set_header

if TYPE_CHECKING:
    from warren.broker.engine.queue import Queue

RETRY_TYPES = ("disabled", "all", "failed", "returned")

# RocketMQ's push-consumer retry levels (consumption-retry spec): 16 steps, then the last again
ROCKETMQ_SCHEDULE_MS = (
    10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000,
    420_000, 480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000,
)  # fmt: skip

_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
_DELAY = re.compile(r"^\s*(\d+)\s*(ms|s|m|h)?\s*$")


class RetryConfigError(ValueError):
    """A schedule or delay that does not parse; the text says what is accepted."""


def parse_schedule(value: str) -> tuple[int, ...]:
    """``10s,30s,1m,2m`` (units ms, s, m, h; bare numbers are ms) or ``rocketmq``."""
    if value.strip().lower() == "rocketmq":
        return ROCKETMQ_SCHEDULE_MS
    delays = []
    for part in value.split(","):
        match = _DELAY.match(part)
        if match is None:
            raise RetryConfigError(
                f"bad delay '{part.strip()}': expected a number with an optional unit "
                "ms, s, m or h, e.g. '10s,30s,1m', or 'rocketmq'"
            )
        delays.append(int(match.group(1)) * _UNITS[match.group(2) or "ms"])
    return tuple(delays)


@dataclass(frozen=True)
class RetryPolicy:
    kind: str = "disabled"  # disabled | all | failed | returned
    min_ms: int = 0
    max_ms: int | None = None
    multiplier: int | None = None
    schedule: tuple[int, ...] = ()

    @property
    def enabled(self) -> bool:
        return self.kind != "disabled"

    def applies(self, failed: bool) -> bool:
        """``failed``: the return counted as a failed delivery (nack, reject, lost channel)."""
        if self.kind == "all":
            return True
        return self.kind == ("failed" if failed else "returned")

    def delay_ms(self, attempt: int) -> int:
        """The wait before the ``attempt``-th retry (1-based)."""
        if self.schedule:
            return self.schedule[min(attempt, len(self.schedule)) - 1]
        if self.multiplier is None:
            delay = self.min_ms * attempt
        else:
            delay = self.min_ms * self.multiplier ** (attempt - 1)
        return delay if self.max_ms is None else min(delay, self.max_ms)


# ---- a queue's returned messages ----


def wait_for_retry(queue: Queue, msgs: list[Message], why: str) -> None:
    """Returned messages wait, invisible, for their retry delay (RocketMQ's WaitingRetry)."""
    now = queue._now()
    for msg in msgs:
        if msg.state != UNACKED:
            continue
        msg.channel = None
        msg.consumer = None
        msg.tag = 0
        msg.redelivered = True
        msg.retries += 1
        msg.state = DELAYED
        queue.delayed_count += 1
        queue.stats.retried += 1
        queue.count_node("retried")
        delay = queue.retry.delay_ms(msg.retries) / 1000
        if (tracer := queue.vhost.tracer) is not None:
            tracer.retry_scheduled(queue, msg, round(delay * 1000), why)
        queue.deadlines.delay(msg, now + delay, queue.delayed_count)
        if msg.expires_at is not None:  # it may expire while it waits
            queue.deadlines.track_expiry(msg, queue.ready_count + queue.delayed_count)
        if msg.store_id:
            queue.message_store.state(msg, queue._wall() + delay)  # type: ignore[union-attr]


def release_delayed(queue: Queue, msgs: list[Message], now: float) -> None:
    """Their delays are over (QueueDeadlines): they join the tail of the queue, redelivered."""
    released = False
    for msg in msgs:
        if msg.state != DELAYED:
            continue
        queue.delayed_count -= 1
        if msg.expires_at is not None and msg.expires_at <= now:
            queue.expired(msg)
            continue
        queue.next_seq += 1
        msg.seq = queue.next_seq  # the tail, not its old place
        msg.state = READY
        queue.append_ready(msg)
        queue.ready_count += 1
        queue.ready_bytes += len(msg.body)
        if msg.expires_at is not None:
            queue.deadlines.track_expiry(msg, queue.ready_count + queue.delayed_count)
        released = True
    if released:
        queue.dispatcher.deliver(queue)


def count_failed_delivery(queue: Queue, msgs: list[Message]) -> list[Message]:
    """Quorum semantics: a failed delivery counts; past the limit it is dead-lettered."""
    limit = queue.delivery_limit
    back = []
    for msg in msgs:
        msg.delivery_count += 1
        if limit is not None and msg.delivery_count > limit:
            queue.gone(msg)
            queue.dead_letter(msg, "delivery_limit")
            continue
        msg.properties = set_header(msg.properties, "x-delivery-count", msg.delivery_count)
        if msg.store_id:
            queue.message_store.state(msg, 0.0)  # type: ignore[union-attr]
        back.append(msg)
    return back
