"""What the message store reports to: a publisher's confirms, as the store sees them.

The engine's ``Confirms`` (broker/engine/confirms.py) derives from ``ConfirmToken``: a
publish's routing hands the token to the queues and the store, and these methods are the
store's only way back in. A base class here, not an import of the engine, keeps the store
below the engine (docs/architecture.md); compiled, each call is a call through the class,
as on ``Confirms`` itself.
"""

from __future__ import annotations


class ConfirmToken:
    __slots__ = ()

    def stored(self) -> int:
        """The store takes a copy of the publish being routed to write; it reports the copy
        written (``on_written``) or gone (``on_gone``) by the seq returned."""
        raise NotImplementedError

    def on_written(self, seqs: list[int]) -> None:
        """Copies of ``seqs`` are on disk (one batch's, in order)."""
        raise NotImplementedError

    def on_gone(self, seq: int) -> None:
        """A copy of ``seq`` left its queue before it was written: it never will be."""
        raise NotImplementedError

    def on_synced(self, batch: int) -> bool:
        """Batches up to ``batch`` are durable; True while publishes still wait for the disk."""
        raise NotImplementedError

    def on_failed(self) -> None:
        """The store stopped writing: nothing waiting for it will be written."""
        raise NotImplementedError

    def waits(self, seq: int) -> bool:
        """``seq`` waits for the disk: neither acked nor nacked yet."""
        raise NotImplementedError
