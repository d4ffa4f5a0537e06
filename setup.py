"""Warren's build: the message path compiled with mypyc by default, pure Python as the fallback.

``pip install .`` (and an sdist, and ``make wheel``) compiles the modules in ``COMPILED``
into C extensions beside their .py files, which stay the source and the fallback: the
behaviour is the same and the suite runs on both (``make test``). The build requirements in
pyproject.toml bring a pinned mypy, whose mypyc does the compiling; gcc and the Python
headers are needed. Where the compiler or headers are missing, or compiling fails, the
install goes on pure and says so in one line. ``WARREN_NO_EXTENSIONS=1`` forces pure.
docs/building.md has the costs.
"""

from __future__ import annotations

import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

# The message path: framing, routing, queues, streams, channels, the messages themselves,
# the tracing hooks and the message store's loop side (its log, paging, compaction, and the
# read of the log at start-up). Subclasses are compiled with their bases (Queue also admits
# interpreted ones). Not compiled: the store's threads (broker/store/writer.py), the trace
# writer, timers (the test kit's ManualLoop subclasses them), management.
COMPILED = [
    "warren/protocol/constants.py",
    "warren/protocol/errors.py",
    "warren/protocol/frames.py",
    "warren/protocol/tables.py",
    "warren/protocol/properties.py",
    "warren/protocol/methods.py",
    "warren/protocol/connection.py",
    "warren/broker/server/flow.py",
    "warren/broker/engine/confirms.py",
    "warren/broker/engine/limiter.py",
    "warren/broker/engine/exchange.py",
    "warren/broker/engine/exchange_plugins.py",
    "warren/broker/engine/vhost.py",
    "warren/broker/engine/equivalence.py",
    "warren/broker/engine/channel.py",
    "warren/broker/engine/channel_consumers.py",
    "warren/broker/engine/channel_publish.py",
    "warren/broker/engine/channel_topology.py",
    "warren/broker/engine/channel_tx.py",
    "warren/broker/engine/unacked.py",
    "warren/broker/engine/reply_to.py",
    "warren/broker/engine/consumer.py",
    "warren/broker/server/amqp_connection.py",
    "warren/broker/engine/queue.py",
    "warren/broker/engine/queue_consumers.py",
    "warren/broker/engine/queue_settings.py",
    "warren/broker/engine/arrivals.py",
    "warren/broker/engine/deadlines.py",
    "warren/broker/engine/queue_backlog.py",
    "warren/broker/engine/stats.py",
    "warren/broker/engine/message.py",
    "warren/broker/streams/log.py",
    "warren/broker/streams/stream.py",
    "warren/broker/tracing/events.py",
    "warren/broker/tracing/tracer.py",
    "warren/broker/testkit/recorder.py",
    "warren/broker/store/records.py",
    "warren/broker/store/reports.py",
    "warren/broker/store/segments.py",
    "warren/broker/store/paging.py",
    "warren/broker/store/compaction.py",
    "warren/broker/store/recovery.py",
]

# mypyc trusts every annotation it sees and checks values against them at run time.
# pamqp's are not always what it returns (connection.start-ok's response is bytes,
# annotated str), so the compiled build reads pamqp as untyped; `make typecheck` still
# checks Warren against pamqp's annotations with --strict.
# pip builds in an environment with only the build requirements: the run-time dependencies
# that modules outside the message path import (aiohttp, structlog) are read as untyped
# there (librt, whose types the message path needs, comes with mypy).
MYPYC_CONFIG = """\
[mypy]
python_version = 3.11
ignore_missing_imports = True
[mypy-pamqp.*]
follow_imports = skip
follow_imports_for_stubs = True
[mypy-uvloop,pyarrow.*]
ignore_missing_imports = True
"""


FALLBACK = (
    "warren: building pure Python, {why}; for the fast compiled build install gcc and the "
    "Python headers (Debian: apt-get install gcc python3-dev) and reinstall"
)


def _pure(why: str) -> list[Any]:
    print(FALLBACK.format(why=why), file=sys.stderr)
    return []


def ext_modules() -> list[Any]:
    if os.environ.get("WARREN_NO_EXTENSIONS", "0") not in ("", "0"):
        return []
    if {"egg_info", "dist_info", "sdist", "editable_wheel"} & set(sys.argv[1:]):
        return []  # metadata, an sdist or an editable install: nothing to compile here
    try:
        from mypyc.build import mypycify
    except ImportError:
        return _pure("mypy (mypyc) is not installed in the build environment")
    config = os.path.join(tempfile.mkdtemp(prefix="warren-mypyc-"), "mypy.ini")
    with open(config, "w", encoding="ascii") as f:
        f.write(MYPYC_CONFIG)
    try:
        # one C file per module (multi_file), so that both cores compile (OptionalBuildExt)
        return list(
            mypycify(
                ["--config-file", config, *COMPILED],
                opt_level="3",
                debug_level="0",
                multi_file=True,
            )
        )
    except BaseException as exc:  # mypyc's own checks failed: the source still runs
        if isinstance(exc, KeyboardInterrupt):
            raise
        return _pure(f"mypyc failed ({type(exc).__name__}: {exc})")


class OptionalBuildExt(build_ext):
    """Compiles a library's C files on every core, and falls back to pure Python if the
    compiler is missing or fails (the extensions are then left out of the build)."""

    def build_extensions(self) -> None:
        compiler = self.compiler
        serial = compiler.compile

        def parallel(sources: list[str], *args: Any, **kwargs: Any) -> list[str]:
            if len(sources) < 2:
                return serial(sources, *args, **kwargs)
            with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
                parts = pool.map(lambda source: serial([source], *args, **kwargs), sources)
                return [obj for part in parts for obj in part]

        compiler.compile = parallel
        try:
            super().build_extensions()
        except Exception as exc:
            self.extensions = []
            _pure(f"the C compiler failed ({type(exc).__name__}: {exc})")

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all (setuptools' CompileError and others)
            self.extensions = []
            _pure(f"no working C compiler ({type(exc).__name__}: {exc})")


setup(ext_modules=ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
