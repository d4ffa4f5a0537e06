"""Memory and disk alarms, checked once a second off the message path.

Above ``vm_memory_high_watermark`` or below ``disk_free_limit`` the broker
raises an alarm; connections that publish get connection.blocked and are not
read until every alarm clears, while consumers keep draining (RabbitMQ's
flow control, on a single process).

A check that fails (no descriptor left, a /proc read that breaks) is logged and the
next one is scheduled all the same: the monitor never stops. It also counts the
process's open descriptors, for the listeners to keep a reserve (broker/server/shell.py).

The memory alarm compares the resident set size with the watermark. Memory Python frees
goes back to glibc's malloc, which keeps freed pages in its heap (a fragmented heap is not
trimmed from the top), so the RSS would stay high after a purge and the alarm with it.
When the RSS is over the watermark the check first asks glibc to hand free pages back
(``malloc_trim(0)``, through ctypes; nothing on another libc) and measures again: the alarm
then reflects memory that is in use.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import shutil
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from warren.broker.engine.broker import Broker
    from warren.broker.engine.timers import TimerHandle

CHECK_INTERVAL = 1.0  # seconds


def total_memory() -> int:
    """Physical memory, or the cgroup limit when the container has a smaller one."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as fh:
                value = fh.read().strip()
        except OSError:
            continue
        if value.isdigit() and 0 < int(value) < total:
            total = int(value)
    return total


def resident_memory() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _malloc_trim() -> Callable[[], object] | None:
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


release_free_memory = _malloc_trim()  # None where the C library has no malloc_trim


def descriptor_limit() -> int:
    """The soft RLIMIT_NOFILE: descriptors this process may hold."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def open_descriptors() -> int:
    """Descriptors open now (one more is used for the count itself while it runs)."""
    return len(os.listdir("/proc/self/fd")) - 1


class ResourceMonitor:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        settings = broker.settings
        if settings.vm_memory_high_watermark_absolute is not None:
            self.memory_limit = settings.vm_memory_high_watermark_absolute
        else:
            relative = settings.vm_memory_high_watermark_relative
            self.memory_limit = int(total_memory() * (relative if relative is not None else 0.6))
        self.disk_limit = settings.disk_free_limit_absolute
        self.memory_used = 0
        self.disk_free: int | None = None
        self._handle: TimerHandle | None = None
        self.failures = 0  # checks in a row that raised
        self.descriptor_limit = descriptor_limit()
        self.descriptors_used = 0  # at the last check, counted on by the listeners meanwhile

    def start(self) -> None:
        self.check()
        self._handle = self.broker.timers.call_later(CHECK_INTERVAL, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self) -> None:
        try:
            self.check()
            if self.failures:
                self.broker.log.info("resource check works again", failed=self.failures)
                self.failures = 0
        except Exception as exc:  # the next check must come all the same
            self.failures += 1
            if self.failures == 1:  # once a run of failures, not once a second
                self.broker.log.error(
                    "resource check failed", error=f"{exc.__class__.__name__}: {exc}"
                )
            if isinstance(exc, OSError) and exc.errno == errno.EMFILE:
                self.descriptors_used = self.descriptor_limit  # none left: so it is
        finally:
            self._handle = self.broker.timers.call_later(CHECK_INTERVAL, self._tick)

    def check(self) -> None:
        self.descriptors_used = open_descriptors()
        self.memory_used = resident_memory()
        if self.memory_used > self.memory_limit and release_free_memory is not None:
            release_free_memory()  # freed pages glibc kept count no more
            self.memory_used = resident_memory()
        self.broker.set_alarm("memory", self.memory_used > self.memory_limit)
        data_dir = self.broker.settings.data_dir
        if data_dir and os.path.isdir(data_dir):
            self.disk_free = shutil.disk_usage(data_dir).free
            self.broker.set_alarm("disk", self.disk_free < self.disk_limit)
