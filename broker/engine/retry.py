"""Delayed retry: how long a returned message waits before it is ready again.

RabbitMQ 4.3's keys (``x-delayed-retry-type``, ``-min``, ``-max``: delay = min x
attempt, capped), LavinMQ's ``x-delayed-retry-multiplier`` (min x multiplier^(attempt-1),
capped) and Warren's ``x-delayed-retry-schedule`` (an explicit list; the last delay
repeats), which wins over the others.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
