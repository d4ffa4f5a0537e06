"""Publisher confirms of one channel, from publish to basic.ack or basic.nack (RabbitMQ's
rabbit_confirms).

The lifecycle of a confirm:

* ``published()`` numbers a publish; ``route(seq)`` hands its routing the token the
  queues pass on to the message store: the store counts on it each copy it takes to write
  (``stored``) and a stream chunk that holds it (``chunk``);
* ``routed(seq, accepted, store)`` decides once every queue has seen it: a nack now, an
  ack (behind earlier publishes), or a wait for the disk, registered with the store;
* the store reports through four methods, its only way in: ``on_written(seqs)`` (copies
  on disk), ``on_gone(seq)`` (a copy left its queue before it was written: it never will
  be), ``on_synced(batch)`` (a batch is on disk) and ``on_failed()`` (nothing will be);
* when acks or nacks become due, ``on_due`` (the channel's) schedules them, and the channel
  writes the frames ``due()`` returns.

Everything that decides the order of basic.ack and basic.nack lives here too:

* a publish is confirmed once every queue took it, and once it is on disk if a
  queue stored it: ``accepted(seq)`` or ``wait_disk(seq, batch, copies)``, then
  ``synced(batch)`` when the store's fsync of that batch returns, and ``settled(seq)``
  for each stored copy once it is on disk or gone from its queue unwritten (acked
  before its write: RabbitMQ confirms it then too);
* an ack says ``multiple=true`` whenever it covers more than one publish, so
  acks coalesce: one frame per loop turn for a whole window;
* a refused publish is nacked at once (``nacked(seq)``), even while earlier
  publishes still wait for the disk, as RabbitMQ does; the acks that follow
  step around it, since an ack with multiple=true must not cover a nacked one;
* a publish accepted while earlier ones wait for the disk waits behind them,
  because its ack would cover them.

``due()`` returns the frames to send, in order, as (ack or nack, first, last):
one frame with delivery tag ``last``, multiple=true when ``last > first``.
Nothing here writes, so every ordering is unit-tested without a socket
(tests/test_confirms.py).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from warren.broker.store.reports import ConfirmToken

if TYPE_CHECKING:
    from warren.broker.store.segments import MessageStore

ACK = True
NACK = False
# what routed() decided (Final: compiled, read as constants, not looked up by name)
NACKED: Final = 0  # a nack is due now
DUE: Final = 1  # an ack may go out (behind earlier publishes still waiting for the disk)
WAITING: Final = 2  # waits for the disk


def _first(entry: list[int]) -> int:
    return entry[0]


class Confirms(ConfirmToken):
    __slots__ = (
        "_disk",
        "_nacked",
        "_out",
        "_synced",
        "batch",
        "chunk_store",
        "confirmed",
        "copies",
        "gone",
        "on_due",
        "ready",
        "routing",
        "seq",
    )

    def __init__(self) -> None:
        self.seq = 0  # the last publish's sequence number
        self.confirmed = 0  # every publish up to here was acked or nacked to the client
        self.ready = 0  # every publish up to here may be acked (save the nacked ones)
        # waiting, in order: [first seq, last seq, store batch (-1: none), copies unsettled]
        self._disk: deque[list[int]] = deque()
        self._synced = -1  # the store's last batch on disk
        self._nacked: list[int] = []  # nacked ahead of publishes waiting for the disk
        self._out: list[tuple[bool, int, int]] = []  # frames owed ahead of the acks, in order
        # the publish being routed (0: none), the copies the store took to write for it, those
        # of them gone unwritten since, and whether a stream chunk holds it (in which store)
        self.routing = 0
        self.copies = 0
        self.gone = 0
        self.batch = False
        self.chunk_store: MessageStore | None = None
        self.on_due: Callable[[], None] | None = None  # acks or nacks became due (the channel)

    def published(self) -> int:
        """The next publish's sequence number."""
        self.seq += 1
        return self.seq

    # ---- routing: the token the store is handed ----

    def route(self, seq: int) -> Confirms:
        """``seq`` is being routed: the token its queues hand the message store."""
        self.routing = seq
        self.copies = self.gone = 0
        self.batch = False
        return self

    def stored(self) -> int:
        """The store takes a copy of the publish being routed to write; it reports the copy
        written (``on_written``) or gone (``on_gone``) by the seq returned."""
        self.copies += 1
        return self.routing

    def chunk(self, store: MessageStore) -> None:
        """A stream's chunk in ``store``'s open batch holds the publish being routed: the
        broker's store, or without a data directory the streams' private one (the broker
        then has no store of its own, so a publish never waits for two)."""
        self.batch = True
        self.chunk_store = store

    def routed(self, seq: int, accepted: bool, store: MessageStore | None) -> int:
        """Every queue has seen ``seq`` (``accepted``: all took it): NACKED, DUE or WAITING,
        for the disk's batch (a chunk) and the copies that neither were written nor left."""
        self.routing = 0
        copies, batch = self.copies, self.batch
        if batch:
            store = self.chunk_store
        if accepted and store is not None and store.error is not None:
            accepted = not (copies or batch)  # never on disk now: a nack
        if not accepted:
            self.nacked(seq)  # RabbitMQ too nacks at once, acks the rest later
            return NACKED
        if batch or copies != self.gone:
            assert store is not None  # only a store counts on the token
            self.wait_disk(seq, store.open_batch if batch else -1, copies - self.gone)
            store.waiters.add(self)
            return WAITING
        self.accepted(seq)  # waits behind earlier publishes' disk writes
        return DUE

    # ---- the store's reports ----

    def on_written(self, seqs: list[int]) -> None:
        """Copies of ``seqs`` are on disk (one batch's, in order)."""
        due = False
        for seq in seqs:
            if self.settled(seq):
                due = True
        if due and self.on_due is not None:
            self.on_due()

    def on_gone(self, seq: int) -> None:
        """A copy of ``seq`` left its queue before it was written, so it never will be:
        RabbitMQ confirms it then too."""
        if seq == self.routing:
            self.gone += 1  # still being routed: routed() counts it out
        elif self.settled(seq) and self.on_due is not None:
            self.on_due()

    def on_synced(self, batch: int) -> bool:
        """The store made batches up to ``batch`` durable; True while publishes still wait
        for the disk (the store keeps telling this token)."""
        if self.synced(batch) and self.on_due is not None:
            self.on_due()
        return bool(self._disk)

    def on_failed(self) -> None:
        """The store stopped writing: every publish waiting for it is nacked."""
        if self._disk:
            self.disk_failed()  # acks already due go first, then the nacks in order
            if self.on_due is not None:
                self.on_due()

    # ---- the order of acks and nacks ----

    @property
    def unconfirmed(self) -> int:
        """Publishes not yet acked or nacked to the client."""
        return self.seq - self.confirmed

    @property
    def waiting_for_disk(self) -> bool:
        return bool(self._disk)

    def waiting(self) -> int:
        """Publishes whose confirm waits for the disk (max_unconfirmed_per_channel counts them)."""
        return self.seq - max(self.ready, self.confirmed)

    def accepted(self, seq: int) -> None:
        """Every queue took ``seq`` and none has to store it."""
        if self._disk:
            self._disk[-1][1] = seq  # its ack would cover those still waiting
        else:
            self.ready = seq

    def wait_disk(self, seq: int, batch: int, copies: int = 0) -> None:
        """``seq`` (and everything before it) is confirmed once ``batch`` is on disk (-1:
        no batch) and ``settled(seq)`` came for each of its ``copies``."""
        disk = self._disk
        if not copies and disk and disk[-1][2] == batch and not disk[-1][3]:
            disk[-1][1] = seq
        else:
            disk.append([seq, seq, batch, copies])

    def synced(self, batch: int) -> bool:
        """The store made batches up to ``batch`` durable; True if acks became due."""
        self._synced = batch
        return self._advance()

    def settled(self, seq: int) -> bool:
        """One stored copy of ``seq`` is on disk, or left its queue before it was written;
        True if acks became due."""
        disk = self._disk
        if not disk:
            return False  # nacked already (the store failed)
        entry = disk[0]  # settles come mostly in publish order
        if not entry[0] <= seq <= entry[1]:
            # the entries' ranges ascend and do not overlap: the last one starting at or
            # before seq is the only one that can hold it
            i = bisect_right(disk, seq, key=_first) - 1
            if i < 0 or disk[i][1] < seq:
                return False  # nacked already
            entry = disk[i]
        entry[3] -= 1
        return not entry[3] and self._advance()

    def waits(self, seq: int) -> bool:
        """``seq`` waits for the disk: neither acked nor nacked yet."""
        disk = self._disk
        if not disk or seq < disk[0][0] or seq > disk[-1][1]:
            return False
        i = bisect_right(disk, seq, key=_first) - 1
        return disk[i][1] >= seq and seq not in self._nacked

    def _advance(self) -> bool:
        disk = self._disk
        synced = self._synced
        upto = 0
        while disk:
            head = disk[0]
            if head[3] or head[2] > synced:
                break
            upto = head[1]
            disk.popleft()
        if upto > self.ready:
            self.ready = upto
            return True
        return False

    def nacked(self, seq: int) -> None:
        """A queue refused ``seq``: the acks due now go first, then its nack."""
        self._out.extend(self._acks())
        self._out.append((NACK, seq, seq))
        if self._disk:
            self._nacked.append(seq)  # later acks step around it
        else:
            self.confirmed = seq  # everything before it is settled
            self._nacked.clear()

    def disk_failed(self) -> None:
        """The store cannot write: nack every publish that waits for it, in order."""
        self._out.extend(self._acks())
        disk = self._disk
        while disk:
            last = disk.popleft()[1]
            first = self.confirmed + 1
            for nacked in [n for n in self._nacked if n <= last]:
                if nacked > first:
                    self._out.append((NACK, first, nacked - 1))
                self._nacked.remove(nacked)
                first = nacked + 1
            if last >= first:
                self._out.append((NACK, first, last))
            self.confirmed = last
        self.ready = max(self.ready, self.confirmed)

    def due(self) -> list[tuple[bool, int, int]]:
        """(ack or nack, first, last) to send now, in order."""
        out = self._out
        if out:
            self._out = []
            out.extend(self._acks())
            return out
        return self._acks()

    def _acks(self) -> list[tuple[bool, int, int]]:
        upto = self.ready
        if upto <= self.confirmed:
            return []
        acks = []
        nacked = self._nacked
        while nacked and nacked[0] <= upto:
            skip = nacked.pop(0)
            if skip - 1 > self.confirmed:
                acks.append((ACK, self.confirmed + 1, skip - 1))
            self.confirmed = skip
        if upto > self.confirmed:
            acks.append((ACK, self.confirmed + 1, upto))
            self.confirmed = upto
        while nacked and nacked[0] == self.confirmed + 1:  # nacked already: settled
            self.confirmed = nacked.pop(0)
        return acks
