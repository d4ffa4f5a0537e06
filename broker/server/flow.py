"""Why a connection's socket is not read, and when it is read again (after uvicorn's FlowControl).

A connection stops reading for five reasons, each set and cleared in one place:

* ``TURN``: it used its share of this event-loop turn (broker/server/amqp_connection.py
  ``_process``); cleared once what was read is handled, so the rest of the
  socket waits for the next turn and the publisher feels TCP back pressure;
* ``COALESCE``: a publisher's small reads come close together, so the next read
  waits ``warren.read_coalescing_interval`` and takes what arrived meanwhile
  (broker/server/amqp_connection.py ``_coalesce``);
* ``ALARM``: a resource alarm blocks publishers (connection.blocked);
* ``UNCONFIRMED``: a channel has ``max_unconfirmed_per_channel`` publishes
  waiting for the disk;
* ``WRITER``: the client does not read what it is sent (the transport's
  ``pause_writing``).

The socket is read again only when no reason is left. ``TURN`` and ``COALESCE``
stop reading only; while any other reason holds, not even what was already read
is handled.
"""

from __future__ import annotations

from typing import Final, Protocol

TURN: Final = 1
COALESCE: Final = 2
# the reasons from here on stop handling too: ``reasons < ALARM`` means handle
ALARM: Final = 4
UNCONFIRMED: Final = 8
WRITER: Final = 16
NAMES: Final = {
    TURN: "turn",
    COALESCE: "coalesce",
    ALARM: "alarm",
    UNCONFIRMED: "unconfirmed",
    WRITER: "writer",
}


class Readable(Protocol):
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def is_closing(self) -> bool: ...


class FlowControl:
    __slots__ = ("_paused", "reasons", "transport")

    def __init__(self, transport: Readable) -> None:
        self.transport = transport
        self.reasons = 0  # the bits above
        self._paused = False  # the transport's reading, as we last set it

    @property
    def stopped(self) -> bool:
        """Nothing is handled, not even what was read already (ALARM or a reason after it)."""
        return self.reasons >= ALARM

    def pause(self, reason: int) -> None:
        self.reasons |= reason
        if not self._paused and not self.transport.is_closing():
            self._paused = True
            self.transport.pause_reading()

    def clear(self, reason: int) -> bool:
        """``reason`` is gone; True when no reason stops handling any more.

        Reading resumes at ``drained``, once what was read meanwhile is handled.
        """
        self.reasons &= ~reason
        return self.reasons < ALARM

    def lift(self, reason: int) -> None:
        """``reason``, which stopped only reading, is gone: read again unless another holds."""
        self.reasons &= ~reason
        if self._paused and not self.reasons:
            self._paused = False
            self.transport.resume_reading()

    def drained(self) -> None:
        """Everything read is handled: read again unless a reason still holds."""
        self.lift(TURN)

    def describe(self) -> list[str]:
        """The reasons in force, by name (for operators and tests)."""
        return [name for bit, name in NAMES.items() if self.reasons & bit]
