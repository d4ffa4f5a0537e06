"""A backlog of persistent messages: broker memory per message, recovery time, and the
delivery rate of one consumer from the first message to the last.

    python tests/benchmarks/backlog_curve.py --messages 1000000 [--rabbitmq] [--perf PATH]

Warren: a fresh broker (own data directory, default settings: queue_body_memory_limit
64 MiB) takes N persistent 16-byte messages into one durable queue (amqp-perf, 2
producers, confirms); its RSS before and after gives the memory per queued message.
It is then stopped (SIGTERM) and started again: the start-up time and the RSS after
recovery (and the peak during it) are measured. Last, one consumer (prefetch 1000,
acks every 100) drains the queue; the rate is reported per tenth of the backlog.

``--rabbitmq`` runs the same publish and drain against the RabbitMQ on 127.0.0.1:5672
(its queue is deleted afterwards; RabbitMQ is shared, so it is not restarted; its memory
per message is the growth of the beam.smp RSS).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

PORT = 5681
QUEUE = "backlog-curve"


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def start_warren(data_dir: str) -> tuple[subprocess.Popen[str], float, list[str]]:
    started = time.monotonic()
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "warren", "--port", str(PORT), "--bind", "127.0.0.1",
            "--data-dir", data_dir, "--management-port", "none", "--prometheus-port", "none",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    lines: list[str] = []
    for line in proc.stderr:
        lines.append(line)
        if "ready" in line:
            break
    else:
        raise SystemExit(f"warren exited: {proc.wait()}")
    took = time.monotonic() - started
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    return proc, took, lines


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)


def perf(binary: str, port: int, *args: str) -> tuple[dict[str, Any], list[float]]:
    """Run amqp-perf; its JSON summary and the per-second receive rates."""
    out = subprocess.run(
        [binary, "--uri", f"amqp://guest:guest@127.0.0.1:{port}/", "--queue", QUEUE,
         "--durable", "--json", *args],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    rates = [float(m) for m in re.findall(r"received\s+(\d+) msg/s", out.stderr)]
    return json.loads(out.stdout), rates


def publish(binary: str, port: int, n: int) -> float:
    summary, _ = perf(
        binary, port, "--producers", "2", "--consumers", "0", "--persistent",
        "--pmessages", str(n // 2), "--confirm", "2000", "--time", "3600", "--quiet",
    )  # fmt: skip
    return float(summary.get("publish_rate", summary.get("sent_rate", 0.0)))


def drain(binary: str, port: int, n: int) -> list[float]:
    """Rates per tenth of the backlog, from the per-second receive rates."""
    _, rates = perf(
        binary, port, "--producers", "0", "--consumers", "1", "--prefetch", "1000",
        "--multi-ack", "100", "--time", str(30 + n // 8000),
    )  # fmt: skip
    slices: list[float] = []
    done = 0.0
    seconds = 0
    edge = n / 10
    for rate in rates:
        done += rate
        seconds += 1
        while done >= edge and len(slices) < 10:
            slices.append(n / 10 / max(seconds, 1))
            seconds = 0
            edge += n / 10
    return slices


def rabbit_delete() -> None:
    import pika  # the test dependencies have it

    conn = pika.BlockingConnection(pika.URLParameters("amqp://guest:guest@127.0.0.1:5672/"))
    conn.channel().queue_delete(QUEUE)
    conn.close()


def beam_pid() -> int:
    return int(subprocess.run(["pgrep", "-x", "beam.smp"], capture_output=True, text=True,
                              check=True).stdout.split()[0])  # fmt: skip


def note(what: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--perf", default="/tmp/perf-" + os.environ.get("USER", "x") + "/amqp-perf")
    parser.add_argument("--rabbitmq", action="store_true")
    args = parser.parse_args()
    n = args.messages
    report: dict[str, Any] = {"messages": n}
    with tempfile.TemporaryDirectory(prefix="warren-backlog-") as data_dir:
        proc, _, _ = start_warren(data_dir)
        before = rss_kib(proc.pid)
        note("warren: publishing")
        report["warren_publish_rate"] = round(publish(args.perf, PORT, n))
        note("warren: published")
        time.sleep(2)  # the last batches are packed once written
        after = rss_kib(proc.pid)
        report["warren_rss_mib"] = round(after / 1024)
        report["warren_bytes_per_message"] = round((after - before) * 1024 / n)
        stop(proc)
        note("warren: restarting")
        proc, took, lines = start_warren(data_dir)
        report["warren_start_seconds"] = round(took, 2)
        recovered = [line for line in lines if "store recovered" in line]
        if recovered:
            seconds = re.search(r"seconds=([\d.]+)", recovered[-1])
            if seconds:
                report["warren_recovery_seconds_per_million"] = round(
                    float(seconds.group(1)) * 1e6 / n, 2
                )
        report["warren_rss_after_recovery_mib"] = round(rss_kib(proc.pid) / 1024)
        report["warren_peak_rss_mib"] = round(rss_kib(proc.pid, "VmHWM") / 1024)
        report["warren_recovered_bytes_per_message"] = round(
            (rss_kib(proc.pid) - before) * 1024 / n
        )
        note("warren: draining")
        report["warren_drain_rate_per_tenth"] = [round(r) for r in drain(args.perf, PORT, n)]
        stop(proc)
    print(json.dumps(report, indent=1), flush=True)
    if args.rabbitmq:
        report = {"messages": n}
        rabbit_delete()
        pid = beam_pid()
        before = rss_kib(pid)
        note("rabbitmq: publishing")
        report["rabbitmq_publish_rate"] = round(publish(args.perf, 5672, n))
        time.sleep(2)
        report["rabbitmq_bytes_per_message"] = round((rss_kib(pid) - before) * 1024 / n)
        note("rabbitmq: draining")
        report["rabbitmq_drain_rate_per_tenth"] = [round(r) for r in drain(args.perf, 5672, n)]
        rabbit_delete()
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
