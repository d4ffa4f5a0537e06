"""Which build the suite runs on: pure Python, or the mypyc build (`make test` sets
WARREN_EXPECT_COMPILED=1 and puts build/compiled first on the path). A run meant for the
compiled modules that silently imported the .py files would prove nothing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

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
                 "broker.engine.channel", "broker.engine.channel_publish",
                 "broker.engine.channel_consumers", "broker.engine.limiter",
                 "broker.engine.unacked",
                 "broker.server.amqp_connection", "broker.engine.consumer",
                 "broker.engine.message", "broker.engine.queue", "broker.engine.stats",
                 "broker.store.records", "broker.store.segments", "broker.store.paging",
                 "broker.store.compaction", "broker.store.recovery"}  # fmt: skip
        assert names <= set(compiled)
    else:
        assert compiled == []


def test_tracing_writes_records_as_the_build_does_best() -> None:
    """Compiled, a record's fields are stores into the buffer; interpreted, one struct.pack
    (broker/tracing/tracer.py InterpretedTracer). test_tracing.py runs on both builds."""
    assert warren.broker.tracing.tracer.INTERPRETED != COMPILED


def test_deliveries_are_encoded_as_the_build_does_best() -> None:
    """Compiled, a delivery's head is written into one buffer; interpreted, packed with
    struct. Both give the same octets, whichever build runs them, written field by field
    (a consumer's first delivery of an exchange and routing key) or from the consumer's
    prefix (built at the second, used from then on)."""
    methods = warren.protocol.methods
    assert methods.INTERPRETED != COMPILED
    for channel in (1, 255, 256, 40000, 65535):
        for tag in (1, 2**32 + 5, 2**63 - 1):
            for body_size, one_frame in ((0, False), (16, True), (2**31 - 1, True), (2**40, False)):
                for packed in (False, True):
                    fields = (channel, b"\x04ctag", tag, tag % 2 == 0, b"\x00\x01q",
                              b"\x90\x00\x01x", body_size, one_frame)  # fmt: skip
                    args = fields[2:]
                    written = methods.delivery_head_fields(*fields, packed=False)
                    assert written == methods.delivery_head_fields(*fields, packed=True)
                    assert written == methods.delivery_head_fields(*fields)
                    prefix = methods.DeliveryPrefix(channel, b"\x04ctag")
                    for _ in range(3):  # by field, then the prefix built, then used
                        assert methods.delivery_head(prefix, *args, packed=packed) == written
                    assert prefix.ex_rk == b"\x00\x01q"
                    if one_frame:  # a small body copied in: the head, the body, the frame's end
                        whole = methods.delivery_head(prefix, *args, b"0123", packed=packed)
                        assert whole == written + b"0123\xce"
                        first = methods.DeliveryPrefix(channel, b"\x04ctag")
                        assert methods.delivery_head(first, *args, b"0123", packed=packed) == whole
                    # another exchange and routing key: by field again, the prefix kept
                    other = (*args[:2], b"\x03amq\x00", *args[3:])
                    again = methods.delivery_head(prefix, *other, packed=packed)
                    assert again == methods.delivery_head_fields(channel, b"\x04ctag", *other)
                    assert prefix.ex_rk == b"\x00\x01q" and prefix.seen == b"\x03amq\x00"


def test_a_consumers_repeated_content_header_is_kept_whole() -> None:
    """A consumer's deliveries of one properties object and body size in a row write the
    content header and the body frame's head kept whole from the second on (compiled);
    another size, other properties (even of equal octets) or a body of several frames are
    written by field: every way gives the octets of ``delivery_head_fields``."""
    methods = warren.protocol.methods
    props = b"\x90\x00\x01x"
    equal = bytes(bytearray(props))  # the same octets, another object
    assert equal is not props
    prefix = methods.DeliveryPrefix(300, b"\x04ctag")
    steps = [(props, 16, True), (props, 16, True), (props, 16, True), (props, 17, True),
             (props, 17, True), (equal, 17, True), (props, 17, True), (props, 2**40, False),
             (props, 17, True), (props, 17, True)]  # fmt: skip
    for tag, (properties, size, one_frame) in enumerate(steps, 1):
        args = (tag, False, b"\x00\x01q", properties, size, one_frame)
        expected = methods.delivery_head_fields(300, b"\x04ctag", *args, packed=True)
        assert methods.delivery_head(prefix, *args) == expected, (tag, size)
        if one_frame:
            whole = methods.delivery_head(prefix, *args, b"x" * 4)
            assert whole == expected + b"xxxx\xce"
    if not methods.INTERPRETED:  # interpreted, heads are packed with struct: none kept
        assert prefix.header_for is props and prefix.header_size == 17


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


def test_the_first_log_line_the_api_and_warrenctl_name_the_build(tmp_path: Path) -> None:
    root = os.path.dirname(os.path.dirname(warren.__file__))  # the build under test
    config = tmp_path / "rabbitmq.conf"
    # a key the engine warns about as it starts: the build's line still comes first
    config.write_text("deprecated_features.permit.classic_queue_mirroring = true\n")
    env = {**os.environ, "PYTHONPATH": root, "RABBITMQ_CONFIG_FILE": str(config)}
    argv = ["--port", "0", "--bind", "127.0.0.1", "--management-port", "0",
            "--prometheus-port", "none", "--data-dir", str(tmp_path / "data")]  # fmt: skip
    server = subprocess.Popen(
        [sys.executable, "-m", "warren", *argv], cwd=root, env=env, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert server.stderr is not None
        first = server.stderr.readline()
        assert "starting warren-server" in first
        assert f"build={'compiled' if COMPILED else 'pure'}" in first, first
        management = ""
        while not management:  # the readiness lines, in the order the server writes them
            line = server.stderr.readline()
            assert line, "the server exited"
            if "management API listening" in line:
                management = re.search(r"address=(\S+)", line)[1]  # type: ignore[index]
        request = urllib.request.Request(f"http://{management}/api/overview")
        request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
        with urllib.request.urlopen(request, timeout=10) as reply:
            overview = json.loads(reply.read())
        assert overview["warren_build"] == ("compiled" if COMPILED else "pure")
        status = subprocess.run(
            [sys.executable, "-m", "warren.broker.tools.warrenctl", "--url",
             f"http://guest:guest@{management}", "status"],
            cwd=root, env=env, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert status.returncode == 0, status.stderr
        assert f"Build: {'compiled' if COMPILED else 'pure'}" in status.stdout
    finally:
        server.terminate()
        server.wait(timeout=10)
