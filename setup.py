"""Optional compiled build: ``WARREN_COMPILE=1`` compiles the message path with mypyc.

Without it (``pip install -e .``, ``make run``) Warren is pure Python and needs no C
compiler. With it, the modules in ``COMPILED`` become C extensions next to their .py
files, which stay as the source and the fallback; behaviour is the same, the suite runs
on both (``make test``). Needs mypy (a test dependency) in the building environment:

    WARREN_COMPILE=1 pip install --no-build-isolation .      # or: make compile
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

from setuptools import setup

# The message path: framing, routing, queues, streams, channels, the messages themselves,
# the tracing hooks and the message store's loop side. Subclasses are compiled with their
# bases (Queue also admits interpreted ones). Not compiled: the store's threads
# (broker/store/writer.py), the trace writer, timers (the test kit's ManualLoop subclasses
# them), management.
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
    "warren/broker/engine/exchange.py",
    "warren/broker/engine/exchange_plugins.py",
    "warren/broker/engine/vhost.py",
    "warren/broker/engine/channel.py",
    "warren/broker/engine/consumer.py",
    "warren/broker/server/amqp_connection.py",
    "warren/broker/engine/queue.py",
    "warren/broker/engine/stats.py",
    "warren/broker/engine/message.py",
    "warren/broker/streams/stream.py",
    "warren/broker/tracing/events.py",
    "warren/broker/tracing/tracer.py",
    "warren/broker/testkit/recorder.py",
    "warren/broker/store/records.py",
    "warren/broker/store/segments.py",
]

# mypyc trusts every annotation it sees and checks values against them at run time.
# pamqp's are not always what it returns (connection.start-ok's response is bytes,
# annotated str), so the compiled build reads pamqp as untyped; `make typecheck` still
# checks Warren against pamqp's annotations with --strict.
MYPYC_CONFIG = """\
[mypy]
python_version = 3.11
[mypy-pamqp.*]
follow_imports = skip
follow_imports_for_stubs = True
[mypy-uvloop,pyarrow.*]
ignore_missing_imports = True
"""


def ext_modules() -> list[Any]:
    if os.environ.get("WARREN_COMPILE", "0") in ("", "0"):
        return []
    if {"egg_info", "dist_info"} & set(sys.argv[1:]):
        return []  # pip asks for the metadata first: no need to compile for that
    from mypyc.build import mypycify

    config = os.path.join(tempfile.mkdtemp(prefix="warren-mypyc-"), "mypy.ini")
    with open(config, "w", encoding="ascii") as f:
        f.write(MYPYC_CONFIG)
    return mypycify(["--config-file", config, *COMPILED], opt_level="3", debug_level="0")


setup(ext_modules=ext_modules())
