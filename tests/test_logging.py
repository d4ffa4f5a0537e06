"""log.console.level and log.console.formatter, end to end: config file -> warren-server -> stderr.

Each test runs the broker (or configure_logging) in a subprocess: logging
is process-wide state that must not leak into the other tests.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pika

from warren.broker.tools.healthcheck import Unhealthy, check

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def server(tmp_path: Path, config: str, port: int = 0) -> Iterator[subprocess.Popen[str]]:
    """warren-server with ``config`` on loopback (a free port by default), stopped with SIGTERM."""
    conf = tmp_path / "rabbitmq.conf"
    conf.write_text(
        f"listeners.tcp.default = 127.0.0.1:{port}\n"
        "management.tcp.port = none\n"
        "prometheus.tcp.port = none\n" + config
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "warren", "--config", str(conf)],
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop(proc: subprocess.Popen[str]) -> list[str]:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    return err.splitlines()


def lines_until(proc: subprocess.Popen[str], marker: str) -> list[str]:
    """stderr lines up to and including the first that contains ``marker``."""
    assert proc.stderr is not None
    lines: list[str] = []
    for line in proc.stderr:
        lines.append(line)
        if marker in line:
            return lines
    raise AssertionError(f"no {marker!r} in {lines}")


def port_of(ready: dict[str, object]) -> int:
    return int(str(ready["address"]).rsplit(":", 1)[1])


def test_json_lines_a_shipper_can_ingest(tmp_path: Path) -> None:
    config = "log.console.formatter = json\nlog.console.level = debug\ncluster_name = c1\n"
    with server(tmp_path, config) as proc:
        lines = lines_until(proc, '"event": "ready"')
        ready = json.loads(lines[-1])
        conn = pika.BlockingConnection(
            pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{port_of(ready)}/")
        )
        conn.close()
        lines += stop(proc)
    events = [json.loads(line) for line in lines]  # every line is one JSON object
    starting, warning = events[:2]  # the first says which build runs (docs/building.md)
    assert starting["event"] == "starting warren-server"
    assert starting["build"] in ("compiled", "pure")
    for event in events:
        assert {"timestamp", "level", "event"} <= set(event), event
        assert event["timestamp"].endswith("Z")  # ISO 8601, UTC
    assert warning["level"] == "warning"
    assert warning["event"] == "config key not used by Warren"
    assert warning["key"] == "cluster_name"
    assert ready["level"] == "info" and ready["event"] == "ready"
    names = [e["event"] for e in events]
    assert "connection closed" in names and names[-1] == "shutting down"


def test_level_filters_events(tmp_path: Path) -> None:
    config = "log.console.formatter = json\nlog.console.level = warning\ncluster_name = c1\n"
    with server(tmp_path, config) as proc:
        warning = json.loads(lines_until(proc, "config key")[0])
        lines = stop(proc)
    assert warning["event"] == "config key not used by Warren"
    assert lines == []  # "ready", "shutting down" and the rest are info


def test_plaintext_for_people(tmp_path: Path) -> None:
    with server(tmp_path, "log.console.formatter = plaintext\n") as proc:
        ready = lines_until(proc, "] ready")[-1]
        stop(proc)
    assert "[info     ] ready" in ready and "address=127.0.0.1:" in ready
    assert not ready.startswith("{")


def test_none_and_console_off_log_nothing(tmp_path: Path) -> None:
    for config in ("log.console.level = none\n", "log.console = false\n"):
        port = free_port()
        with server(tmp_path, config + "cluster_name = c1\n", port) as proc:
            # no "ready" line comes: wait for a handshake instead
            deadline = time.monotonic() + 10
            while True:
                try:
                    check("127.0.0.1", port, timeout=1)
                    break
                except Unhealthy:
                    assert time.monotonic() < deadline and proc.poll() is None
                    time.sleep(0.02)
            lines = stop(proc)
        assert lines == [], config


STDLIB = """
import logging, sys
from warren.broker.server.logging import configure_logging
configure_logging("info", sys.argv[1])
logging.getLogger("asyncio").debug("filtered out")
try:
    1 / 0
except ZeroDivisionError:
    logging.getLogger("asyncio").exception("Task exception was never retrieved")
"""


def test_standard_library_records_use_the_same_format() -> None:
    out = subprocess.run(
        [sys.executable, "-c", STDLIB, "json"], capture_output=True, text=True, cwd=ROOT
    )
    (line,) = out.stderr.splitlines()  # the traceback stays inside the one line
    event = json.loads(line)
    assert event["event"] == "Task exception was never retrieved"
    assert event["level"] == "error" and event["logger"] == "asyncio"
    assert "ZeroDivisionError" in event["exception"]
    plain = subprocess.run(
        [sys.executable, "-c", STDLIB, "plaintext"], capture_output=True, text=True, cwd=ROOT
    )
    assert "[error    ] Task exception was never retrieved" in plain.stderr
    assert "ZeroDivisionError" in plain.stderr
