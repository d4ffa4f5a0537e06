"""How fast Warren is ready: ``python tests/benchmarks/startup.py [-n 20] [--rabbitmq]``.

* in-process: entering ``broker.testkit.run_broker()`` until a TCP connect
  to its port succeeds (what a test fixture waits for);
* fresh process: spawning ``warren-server`` until the first AMQP
  connection.start arrives in reply to the protocol header (what a CI job
  or a container health check waits for);
* with ``--rabbitmq``: ``rabbitmqctl stop_app`` then ``start_app`` until
  connection.start on 127.0.0.1:5672, for comparison. start_app is always
  run again, so the local RabbitMQ is left running.

Prints median and p95 in milliseconds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def connection_start(port: int, deadline: float) -> bool:
    """Connect, send the protocol header and wait for a method frame (connection.start)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(PROTOCOL_HEADER)
            head = b""
            while len(head) < 7 and time.monotonic() < deadline:
                chunk = sock.recv(7 - len(head))
                if not chunk:
                    return False
                head += chunk
            return head[:1] == b"\x01"  # a method frame on channel 0
    except OSError:
        return False


def wait_for_amqp(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not connection_start(port, deadline):
        if time.monotonic() > deadline:
            raise SystemExit(f"nothing answered AMQP on port {port} within {timeout} s")
        time.sleep(0.002)


def in_process() -> float:
    from warren.broker.testkit import run_broker

    started = time.perf_counter()
    with run_broker() as b, socket.create_connection((b.host, b.port), timeout=1):
        took = time.perf_counter() - started
    return took


# the first broker of a test session also pays for importing Warren
COLD = """
import socket, time
started = time.perf_counter()
from warren.broker.testkit import run_broker
with run_broker() as b, socket.create_connection((b.host, b.port), timeout=1):
    took = time.perf_counter() - started
print("startup", took)
"""


def in_process_cold() -> float:
    out = subprocess.run(
        [sys.executable, "-c", COLD], check=True, capture_output=True, text=True, cwd=ROOT
    )
    return float(out.stdout.rsplit("startup", 1)[1])


def fresh_process(server: list[str], config: str) -> Callable[[], float]:
    def measure() -> float:
        port = free_port()
        started = time.perf_counter()
        proc = subprocess.Popen(
            [*server, "--config", config, "--port", str(port), "--bind", "127.0.0.1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for_amqp(port)
            return time.perf_counter() - started
        finally:
            proc.terminate()
            proc.wait(10)

    return measure


def rabbitmq_restart(ctl: str) -> float:
    subprocess.run([ctl, "-q", "stop_app"], check=True, capture_output=True)
    started = time.perf_counter()
    try:
        subprocess.run([ctl, "-q", "start_app"], check=True, capture_output=True)
        wait_for_amqp(5672, timeout=60)
    finally:
        # whatever happened, leave RabbitMQ running
        subprocess.run([ctl, "-q", "start_app"], capture_output=True)
    return time.perf_counter() - started


def report(name: str, measure: Callable[[], float], runs: int) -> None:
    measure()  # warm the page cache and bytecode cache; not counted
    times = sorted(measure() * 1000 for _ in range(runs))
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    print(
        f"{name:<34} median {statistics.median(times):7.1f} ms   p95 {p95:7.1f} ms   "
        f"min {times[0]:7.1f} ms   (n={runs})",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--runs", type=int, default=20)
    parser.add_argument("--rabbitmq", action="store_true", help="also time a RabbitMQ restart")
    parser.add_argument("--rabbitmq-runs", type=int, default=3)
    args = parser.parse_args()
    from warren.broker.server.logging import configure_logging

    configure_logging("none")  # the in-process brokers' connection logs are noise here
    server_script = shutil.which("warren-server", path=os.path.dirname(sys.executable))
    with tempfile.TemporaryDirectory() as tmp:
        # no HTTP endpoints: their default ports may be taken (by a local RabbitMQ);
        # a data_dir, so that opening the (empty) store is part of the start
        config = os.path.join(tmp, "rabbitmq.conf")
        with open(config, "w") as f:
            f.write("management.tcp.port = none\nprometheus.tcp.port = none\n")
            f.write(f"data_dir = {os.path.join(tmp, 'data')}\n")
        report("in-process run_broker()", in_process, args.runs)
        report("in-process, first (with imports)", in_process_cold, args.runs)
        if server_script:
            server = fresh_process([server_script], config)
            report("fresh process: warren-server", server, args.runs)
        report(
            "fresh process: python -m warren",
            fresh_process([sys.executable, "-m", "warren"], config),
            args.runs,
        )
    ctl = shutil.which("rabbitmqctl")
    if args.rabbitmq and ctl:
        report("RabbitMQ stop_app/start_app", lambda: rabbitmq_restart(ctl), args.rabbitmq_runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
