"""The engine's clock and timers, injectable so tests can drive time.

Times are monotonic seconds (the event loop's clock). The engine arms at
most one timer per queue and purpose, always at the earliest deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Timers:
    """Timers on an asyncio loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def now(self) -> float:
        return self.loop.time() if self._loop is not None else time.monotonic()

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        return self.loop.call_at(when, callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        return self.loop.call_later(delay, callback)

    def call_soon(self, callback: Callable[[], None]) -> TimerHandle:
        return self.loop.call_soon(callback)


class Deadline:
    """One rearmable timer that always fires at the earliest deadline asked for."""

    __slots__ = ("_at", "_callback", "_handle", "_timers")

    def __init__(self, timers: Timers, callback: Callable[[], None]) -> None:
        self._timers = timers
        self._callback = callback
        self._handle: TimerHandle | None = None
        self._at = 0.0

    def arm(self, when: float) -> None:
        if self._handle is not None:
            if when >= self._at:
                return
            self._handle.cancel()
        self._at = when
        self._handle = self._timers.call_at(when, self._fire)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        self._callback()
