"""A channel's unsettled deliveries by delivery tag, oldest first (``Unacked``).

A channel gives out delivery tags 1, 2, 3... (no-ack deliveries and basic.get use tags
too), so the compiled build keeps the deliveries waiting for a settle in a list indexed
by ``tag - base``: a delivery appends, an ack is an index and a store of None. A dict
keyed by tag cost more there (the tag a client sends is a new int, so the lookup
compares by value, then hashes it again to pop).

Settled slots stay as None holes. Those before the oldest live one are dropped from the
front, once the list has doubled since it was last trimmed (one slice, amortised over
that many deliveries). One delivery left unsettled while millions pass would pin every
hole after it, so when live deliveries are under a quarter of the list, they move to a
side dict (``_old``, tags below ``base``) and the list starts again empty: the list is
never more than eight slots for each live delivery (or ``MIN_LIMIT``), and the
stragglers cost a dict look-up each when they are settled.

Interpreted, every call of a Python method costs a frame, and a dict's own operations
are C: the pure build keeps the dict (``DictUnacked``, what the channel held before),
behind the same interface. ``new_unacked`` picks; tests/test_unacked.py holds both to
the same model.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Final, cast

from mypy_extensions import mypyc_attr

from warren.broker.engine.message import Message

MIN_LIMIT: Final = 1024  # the list's length that makes a delivery trim it


class Unacked:
    """Delivery tag -> the message delivered with it, for a channel's unsettled deliveries:
    ``unacked[tag] = msg``, ``pop(tag, None)``, ``pop_upto``, ``pop_all``, ``restore``,
    ``values()`` in tag order, ``tag in``, ``len``."""

    __slots__ = ("_base", "_count", "_head", "_limit", "_old", "_slots")

    def __init__(self) -> None:
        self._slots: list[Message | None] = []  # slot i: tag base + i; None: settled or no-ack
        self._base = 1  # the tag of slot 0
        self._head = 0  # every slot below is None
        self._count = 0  # live entries, in the list and in _old
        self._limit = MIN_LIMIT  # the list's length at which a delivery trims it
        # stragglers moved off the list, every tag below base, in tag order
        self._old: dict[int, Message] = {}

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __contains__(self, tag: int) -> bool:
        i = tag - self._base
        if i >= 0:
            return i < len(self._slots) and self._slots[i] is not None
        return tag in self._old

    def values(self) -> Iterator[Message]:
        """The messages in tag order (the caller must not change the map meanwhile)."""
        yield from self._old.values()
        slots = self._slots
        for i in range(self._head, len(slots)):
            msg = slots[i]
            if msg is not None:
                yield msg

    def __setitem__(self, tag: int, msg: Message) -> None:
        """``msg`` was delivered with ``tag``, above every tag before it."""
        slots = self._slots
        n = len(slots)
        if tag - self._base == n and n < self._limit:
            slots.append(msg)
            self._count += 1
            return
        self._put(tag, msg)

    def _put(self, tag: int, msg: Message) -> None:
        i = tag - self._base
        slots = self._slots
        n = len(slots)
        if i >= n:
            if i > n:  # tags given to no-ack deliveries between: holes
                if self._count == len(self._old):  # nothing live on the list: start it here
                    self._base = tag
                    slots.clear()
                    self._head = 0
                    i = n = 0
                else:
                    slots.extend([None] * (i - n))
                    n = i
            slots.append(msg)
            self._count += 1
            if n + 1 >= self._limit:
                self._trim()
            return
        if i >= 0:  # a tx rollback's
            if slots[i] is None:
                self._count += 1
            slots[i] = msg
            if i < self._head:
                self._head = i
            return
        old = self._old
        if tag not in old:
            self._count += 1
        old[tag] = msg
        if tag < max(old):  # put under a higher tag's: the dict keeps tag order
            self._old = dict(sorted(old.items()))

    def _trim(self) -> None:
        """The list reached its limit: drop the holes at its front, and move the live
        entries off it when holes dominate (see the module's docstring)."""
        slots = self._slots
        head = self._head
        if head:
            del slots[:head]
            self._base += head
            self._head = 0
        n = len(slots)
        if (self._count - len(self._old)) * 4 < n:
            old = self._old
            base = self._base
            for i in range(n):
                msg = slots[i]
                if msg is not None:
                    old[base + i] = msg
            slots.clear()
            self._base = base + n
            n = 0
        self._limit = max(MIN_LIMIT, 2 * n)

    def restore(self, msgs: list[Message]) -> None:
        """Settled deliveries come back under their own tags (tx.rollback)."""
        for msg in msgs:
            self[msg.tag] = msg

    def pop(self, tag: int, default: None) -> Message | None:
        """The message delivered with ``tag``, no longer unsettled; None if it is not."""
        i = tag - self._base
        slots = self._slots
        n = len(slots)
        if 0 <= i < n:
            msg = slots[i]
            if msg is None:
                return None
            slots[i] = None
            self._count -= 1
            if i == self._head:
                i += 1
                while i < n and slots[i] is None:
                    i += 1
                self._head = i
            return msg
        if i < 0 and self._old:
            found = self._old.pop(tag, None)
            if found is not None:
                self._count -= 1
            return found
        return None

    def pop_upto(self, tag: int) -> list[Message]:
        """Every message with a tag up to ``tag`` (basic.ack multiple), in tag order."""
        taken: list[Message] = []
        if self._old:
            old = self._old
            tags: list[int] = []
            for t in old:  # in tag order: stop at the first above
                if t > tag:
                    break
                tags.append(t)
            for t in tags:
                taken.append(old.pop(t))
        slots = self._slots
        n = len(slots)
        end = min(tag - self._base + 1, n)
        i = self._head
        if i < end:
            while i < end:
                msg = slots[i]
                if msg is not None:
                    taken.append(msg)
                    slots[i] = None
                i += 1
            while i < n and slots[i] is None:
                i += 1
            self._head = i
        self._count -= len(taken)
        return taken

    def pop_all(self) -> list[Message]:
        """Every message, in tag order (recover, a closing channel, ack multiple of tag 0)."""
        taken = list(self._old.values())
        slots = self._slots
        for i in range(self._head, len(slots)):
            msg = slots[i]
            if msg is not None:
                taken.append(msg)
        self._base += len(slots)
        self._slots = []
        self._old = {}
        self._head = 0
        self._count = 0
        self._limit = MIN_LIMIT
        return taken


@mypyc_attr(native_class=False)  # the pure build's only: a plain class in the compiled one
class DictUnacked(dict[int, Message]):
    """``Unacked``'s interface on a dict, whose insertion order is tag order: the pure
    build's (its settling, lookups and inserts are C calls there)."""

    __slots__ = ("low_tag",)

    def __init__(self) -> None:
        super().__init__()
        self.low_tag = 1  # every tag below is settled: where pop_upto starts looking

    def restore(self, msgs: list[Message]) -> None:
        for msg in msgs:
            self[msg.tag] = msg
        entries = sorted(self.items())
        self.clear()
        self.update(entries)
        self.low_tag = entries[0][0] if entries else self.low_tag

    def pop_upto(self, tag: int) -> list[Message]:
        # tags from the lowest that may be unsettled up: iterating the dict instead would
        # step over every entry popped from its front since it was last rebuilt
        taken = []
        for t in range(self.low_tag, tag + 1):
            msg = self.pop(t, None)
            if msg is not None:
                taken.append(msg)
        self.low_tag = max(self.low_tag, tag + 1)
        return taken

    def pop_all(self) -> list[Message]:
        taken = list(self.values())
        self.clear()
        return taken


def new_unacked() -> Unacked:
    """A channel's map: ``Unacked`` compiled, ``DictUnacked`` interpreted."""
    if INTERPRETED:
        return cast(Unacked, DictUnacked())
    return Unacked()


INTERPRETED: Final = isinstance(new_unacked, types.FunctionType)
