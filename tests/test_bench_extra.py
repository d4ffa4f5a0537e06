"""The benchmarks' own clients and endpoints: the S10 idle-connection client of
tests/benchmarks/compare_extra.py against a real broker, and the null broker."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from pamqp import commands

from tests.amqp_raw import (
    FRAME_METHOD,
    RawClient,
    build,
    frame_bytes,
    method_payload,
    publish_frames,
)
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


# ---- tests/benchmarks/null_broker.py, the S7 ceiling's endpoint ----

NULL_BROKER = Path(__file__).resolve().parent / "benchmarks" / "null_broker.py"


@contextlib.contextmanager
def null_broker(interval_ms: float) -> Iterator[tuple[str, int]]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    proc = subprocess.Popen(
        [sys.executable, str(NULL_BROKER), "--port", str(port), "--interval", str(interval_ms)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("null broker on")
        yield "127.0.0.1", port
    finally:
        proc.kill()
        proc.wait()


def test_the_null_broker_takes_publishes_and_answers_the_close_after_them() -> None:
    """What a load generator does: declare, publish (bodies holding channel.close's class
    and method ids, which must not end the run), then close the channel and the connection."""
    with null_broker(1) as addr, RawClient.connect(addr) as c:
        c.send_method(1, build(commands.Queue.Declare, queue="ceiling"))
        assert c.expect_method(commands.Queue.DeclareOk, 1).queue == "ceiling"
        body = b"\x00\x14\x00\x28\x00\xc8" * 4
        c.send(publish_frames("ceiling", body) * 5000)
        c.send_method(1, commands.Channel.Close(reply_code=0, reply_text="done"))
        c.expect_method(commands.Channel.CloseOk, 1)
        c.send(publish_frames("ceiling", body))  # publishing again, then a connection.close
        c.send_method(0, commands.Connection.Close(reply_code=200, reply_text="bye"))
        c.expect_method(commands.Connection.CloseOk, 0)
        c.expect_eof()


def test_the_null_broker_finds_a_close_split_over_two_reads() -> None:
    with null_broker(1) as addr, RawClient.connect(addr) as c:
        c.send(publish_frames("ceiling", b"x" * 16) * 100)
        close = frame_bytes(
            FRAME_METHOD, 1, method_payload(commands.Channel.Close(reply_code=200, reply_text="ok"))
        )
        for cut in (3, 9):  # in the size field; in the class and method ids
            c.send(close[:cut])
            time.sleep(0.05)  # the broker reads once a millisecond: the halves come apart
            c.send(close[cut:])
            c.expect_method(commands.Channel.CloseOk, 1)
            c.send(publish_frames("ceiling", b"x" * 16))


def test_delete_stall_times_a_delete_and_what_others_waited(tmp_path: Path) -> None:
    script = SCRIPT.parent / "delete_stall.py"
    with run_broker(data_dir=str(tmp_path)) as b:
        for extra in ([], ["--persistent", "--op", "purge"]):
            result = subprocess.run(
                [sys.executable, str(script), "--url", b.url, "--messages", "3000",
                 "--runs", "1", *extra],
                capture_output=True, text=True, timeout=120, check=True,
            )  # fmt: skip
            run = json.loads(result.stdout.splitlines()[0])
            assert run["url"] == b.url and run["reply_ms"] > 0
            assert run["probe_longest_ms"] > 0 and run["probe_before_ms"] > 0
            assert "of 3,000 " in result.stdout
