"""The message log's writer thread: batches written in order, one fsync per round.

A round that fails with an OSError (ENOSPC, EMFILE, EIO) is undone (every file it
appended to is cut back to where the round started) and tried again every RETRY_DELAY
seconds, in order, so no record is lost or written twice; the store is told once when the
writer stalls and once when it writes again (its ``message_store`` alarm). Any other
exception ends the thread for good (``failed``).

Kept apart from the store (broker/store/segments.py), which runs on the event loop and
is compiled with the message path (setup.py): a thread class cannot be compiled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from warren.broker.engine.stats import IOStats

T = TypeVar("T")

RETRY_DELAY = 0.5  # seconds between two tries of a round that failed with an OSError


def private(path: str, flags: int) -> int:
    """An ``opener`` for open(): a file it creates is the broker's user's only (0600)."""
    return os.open(path, flags, 0o600)


def segment_name(number: int) -> str:
    return f"{number:010d}.seg"


class Writer(threading.Thread):
    """Writes batches in order, one fsync per round of batches, then reports on the loop
    (a round of stream chunks only: reported once written, synced by the _Syncer)."""

    def __init__(
        self,
        directory: str,
        loop: asyncio.AbstractEventLoop,
        synced: Callable[[int], None],
        sync: bool,
        failed: Callable[[BaseException], None],
        stalled: Callable[[OSError | None], None] | None = None,
    ) -> None:
        super().__init__(name="warren-store-writer", daemon=True)
        self.directory = directory
        self.loop = loop
        self.synced = synced
        self.failed = failed
        # told (on the loop) with the error when a round fails, with None once one succeeds
        self.stalled = stalled
        self.closing = threading.Event()  # the store closes: a failing round is given up
        self.sync = sync
        self.jobs: queue.SimpleQueue[tuple[str, int, Any, int]] = queue.SimpleQueue()
        self._syncer = Syncer(self._syncer_failed)
        self.files: dict[int, Any] = {}
        self.error: BaseException | None = None
        self.io = IOStats()  # the store's, shared: counted here per write and fsync

    def _file(self, segment: int) -> Any:
        handle = self.files.get(segment)
        if handle is None:
            path = os.path.join(self.directory, segment_name(segment))
            handle = self.files[segment] = open(path, "ab", buffering=0, opener=private)  # noqa: SIM115
        return handle

    def _syncer_failed(self, exc: BaseException) -> None:
        self.error = exc
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.failed, exc)

    def run(self) -> None:
        if self.sync:
            self._syncer.start()
        try:
            self._run()
        except BaseException as exc:  # surfaced by the store on the loop
            self.error = exc
            with contextlib.suppress(RuntimeError):  # the loop may be closed already
                self.loop.call_soon_threadsafe(self.failed, exc)

    def _run(self) -> None:
        while True:
            jobs = _round(self.jobs)
            failing = False
            while True:
                try:
                    stop = self._write_round(jobs)
                    break
                except OSError as exc:
                    if self.closing.is_set():
                        return  # what it held is lost, as in a crash at this moment
                    if not failing and self.stalled is not None:
                        failing = True
                        self._tell(self.stalled, exc)
                    self.closing.wait(RETRY_DELAY)
            if failing and self.stalled is not None:
                self._tell(self.stalled, None)
            if stop:
                return

    def _tell(self, callback: Callable[[Any], None], arg: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop may be closed already
            self.loop.call_soon_threadsafe(callback, arg)

    def _write_round(self, jobs: list[tuple[str, int, Any, int]]) -> bool:
        """Write, sync and report one round; True if it holds the stop job. On an OSError
        every file it appended to is cut back to its size before the round, so the round
        can be tried again as a whole."""
        starts: dict[Any, int] = {}  # file -> its size before this round
        try:
            return self._write_round_once(jobs, starts)
        except OSError:
            for handle, size in starts.items():
                with contextlib.suppress(OSError, ValueError):
                    handle.truncate(size)
            raise

    def _write_round_once(
        self, jobs: list[tuple[str, int, Any, int]], starts: dict[Any, int]
    ) -> bool:
        io = self.io
        written: set[int] = set()
        last_batch = -1
        unlinks: list[int] = []
        others: list[Any] = []  # files of other logs (streams) written in this round
        closing: list[Any] = []
        stop = False
        for kind, segment, data, batch in jobs:
            if kind == "write":
                started = time.perf_counter()
                handle = self._file(segment)
                if handle not in starts:
                    starts[handle] = handle.tell()
                io.write_ops += _write_all(handle, data)
                io.write_bytes += len(data)
                io.write_time += time.perf_counter() - started
                written.add(segment)
                last_batch = max(last_batch, batch)
            elif kind == "external":  # [(file, bytes, close once synced)], or with records
                if segment:  # the store's records of the same batch: (records, [...])
                    data, external = data
                    handle = self._file(segment)
                    if handle not in starts:
                        starts[handle] = handle.tell()
                    io.write_ops += _write_all(handle, data)
                    io.write_bytes += len(data)
                    written.add(segment)
                    data = external
                for handle, chunk, close in data:
                    started = time.perf_counter()
                    if chunk and handle not in starts:
                        starts[handle] = handle.tell()
                    io.write_ops += _write_all(handle, chunk)
                    io.write_bytes += len(chunk)
                    io.write_time += time.perf_counter() - started
                    if handle not in others:
                        others.append(handle)
                    if close:
                        closing.append(handle)
                last_batch = max(last_batch, batch)
            elif kind == "rmtree":
                shutil.rmtree(data, ignore_errors=True)
            elif kind == "unlink":
                unlinks.append(segment)
            elif kind == "stop":
                stop = True
        reported = False
        if self.sync and not written and (others or closing):
            # only stream chunks this round: confirmed once handed to the operating system
            # (they survive kill -9), as osiris confirms (osiris_writer:handle_batch/2 and
            # osiris_log:write_chunk/6 never sync); the syncer thread fdatasyncs them at
            # once while this thread writes the next round
            if last_batch >= 0:
                self.loop.call_soon_threadsafe(self.synced, last_batch)
                reported = True
            self._syncer.jobs.put(others)
            others = []
            # a file done with (a full segment, a deleted stream) is synced and closed
            # here, now (its descriptor goes with its directory), under the syncer's lock
            with self._syncer.lock:
                for handle in closing:
                    os.fdatasync(handle.fileno())
                    handle.close()
            io.sync_ops += len(closing)  # the syncer's are not counted: off the confirm path
            closing = []
        if self.sync and (written or others):
            started = time.perf_counter()
            for segment in written:
                os.fsync(self.files[segment].fileno())
            for handle in others:
                # appends only: fdatasync also makes the new size durable (POSIX), at a
                # fraction of fsync's cost (ext4 here: 0.3 ms against 1.6 ms)
                os.fdatasync(handle.fileno())
            io.sync_ops += len(written) + len(others)
            io.sync_time += time.perf_counter() - started
        if closing:
            with self._syncer.lock:  # it may have the file in a round still to sync
                for handle in closing:
                    handle.close()
        for segment in unlinks:
            handle = self.files.pop(segment, None)
            if handle is not None:
                handle.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.directory, segment_name(segment)))
        # keep only the newest file open
        for segment in sorted(self.files)[:-1]:
            self.files.pop(segment).close()
        if last_batch >= 0 and not reported:
            self.loop.call_soon_threadsafe(self.synced, last_batch)
        if stop:
            if self.sync:
                self._syncer.jobs.put(None)
                self._syncer.join()
            for handle in self.files.values():
                handle.close()
            return True
        return False


class Syncer(threading.Thread):
    """fdatasyncs stream files the writer has written and confirmed (see Writer._run), all
    that queued up in one round; the writer closes a file only under ``lock``."""

    def __init__(self, failed: Callable[[BaseException], None]) -> None:
        super().__init__(name="warren-store-syncer", daemon=True)
        self.jobs: queue.SimpleQueue[list[Any] | None] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.failed = failed

    def run(self) -> None:
        try:
            while True:
                jobs = _round(self.jobs)
                handles: dict[Any, None] = {}
                for job in jobs:
                    if job is not None:
                        handles.update(dict.fromkeys(job))
                for handle in handles:
                    with self.lock:
                        if not handle.closed:  # else the writer synced it before closing
                            os.fdatasync(handle.fileno())
                if None in jobs:
                    return
        except BaseException as exc:  # surfaced by the store on the loop
            self.failed(exc)


def _round(jobs: queue.SimpleQueue[T]) -> list[T]:
    """The next job, waited for, and every job queued behind it: one round of work."""
    taken = [jobs.get()]
    while True:
        try:
            taken.append(jobs.get_nowait())
        except queue.Empty:
            return taken


def _write_all(handle: Any, data: bytes) -> int:
    """An unbuffered write may take only part of the data (a file size limit, a signal).
    Returns the number of write calls."""
    view = memoryview(data)
    calls = 0
    while view:
        view = view[handle.write(view) :]
        calls += 1
    return calls
