"""Which build the suite runs on: pure Python, or the mypyc build (`make test-compiled` sets
WARREN_EXPECT_COMPILED=1 and puts build/compiled first on the path). A run meant for the
compiled modules that silently imported the .py files would prove nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES

import warren
import warren.broker.engine.channel
import warren.broker.engine.exchange
import warren.broker.engine.message
import warren.broker.engine.queue
import warren.broker.engine.vhost
import warren.broker.tracing.tracer
import warren.protocol.connection
import warren.protocol.methods

COMPILED = os.environ.get("WARREN_EXPECT_COMPILED") == "1"


def test_the_message_path_runs_as_the_build_says() -> None:
    modules = (
        warren.protocol.connection,
        warren.broker.engine.exchange,
        warren.broker.engine.vhost,
        warren.broker.engine.channel,
        warren.broker.engine.message,
        warren.broker.engine.queue,
    )
    for module in modules:
        assert str(module.__file__).endswith(tuple(EXTENSION_SUFFIXES)) == COMPILED
    compiled = warren.compiled_modules()
    if COMPILED:
        names = {"protocol.connection", "broker.engine.exchange", "broker.engine.vhost",
                 "broker.engine.channel", "broker.server.amqp_connection", "broker.engine.consumer",
                 "broker.engine.message", "broker.engine.queue", "broker.engine.stats",
                 "broker.store.records", "broker.store.segments"}  # fmt: skip
        assert names <= set(compiled)
    else:
        assert compiled == []


def test_tracing_writes_records_as_the_build_does_best() -> None:
    """Compiled, a record's fields are stores into the buffer; interpreted, one struct.pack
    (broker/tracing/tracer.py InterpretedTracer). test_tracing.py runs on both builds."""
    assert warren.broker.tracing.tracer.INTERPRETED != COMPILED


def test_deliveries_are_encoded_as_the_build_does_best() -> None:
    """Compiled, a delivery's head is written field by field into one buffer; interpreted,
    packed with struct. Both give the same octets, whichever build runs them."""
    methods = warren.protocol.methods
    assert methods.INTERPRETED != COMPILED
    for channel in (1, 255, 256, 40000, 65535):
        for tag in (1, 2**32 + 5, 2**63 - 1):
            for body_size, one_frame in ((0, False), (16, True), (2**31 - 1, True), (2**40, False)):
                args = (channel, b"\x04ctag", tag, tag % 2 == 0, b"\x00\x01q", b"\x90\x00\x01x",
                        body_size, one_frame)  # fmt: skip
                written = methods.delivery_head(*args, packed=False)
                assert written == methods.delivery_head(*args, packed=True)
                assert written == methods.delivery_head(*args)


def test_version_names_the_build() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "from warren.broker.server.main import main; main(['--version'])"],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(warren.__file__)),  # the build under test
    )
    assert out.stdout.startswith(f"warren-server {warren.__version__} (")
    if COMPILED:
        assert "compiled with mypyc: " in out.stdout and "broker.engine.exchange" in out.stdout
    else:
        assert "(pure Python)" in out.stdout
