"""The S10 idle-connection client of tests/benchmarks/compare_extra.py against a real broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from warren.broker.testkit import run_broker

SCRIPT = Path(__file__).resolve().parent / "benchmarks" / "compare_extra.py"


def s10(port: int, connections: int, idle: float) -> dict[str, object]:
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "s10",
            "--url",
            f"amqp://guest:guest@127.0.0.1:{port}/",
            "--pid",
            str(os.getpid()),
            "--connections",
            str(connections),
            "--idle",
            str(idle),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    doc: dict[str, object] = json.loads(result.stdout)
    return doc


def test_idle_connections_are_opened_and_stay_open() -> None:
    with run_broker() as b:
        doc = s10(b.port, 300, 0.5)
    assert doc["ok"] is True, doc
    assert doc["alive_after_idle"] == 300
    assert doc["heartbeat"] == 60
    assert isinstance(doc["rss_kib"], int) and doc["rss_kib"] > 0


def test_the_client_answers_heartbeats() -> None:
    # with a 1 s heartbeat the broker closes a connection that stays silent for 2 s
    with run_broker(heartbeat=1) as b:
        doc = s10(b.port, 50, 3.5)
    assert doc["heartbeat"] == 1
    assert doc["alive_after_idle"] == 50, doc
