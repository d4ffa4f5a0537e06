"""Run a command against a Warren started for it: ``with_broker.py --port N -- CMD ARGS``.

Starts ``python -m warren`` on 127.0.0.1:N, waits for its ready line, runs
CMD with WARREN_PID set, stops the broker with SIGTERM and exits with CMD's status.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def warren(
    port: int, extra: list[str] | None = None, management_port: str = "none"
) -> Iterator[subprocess.Popen[str]]:
    """A fresh broker with its own temporary data directory."""
    data_dir = tempfile.mkdtemp(prefix="warren-bench-")
    command = [sys.executable, "-m", "warren", "--port", str(port), "--bind", "127.0.0.1"]
    # by default no HTTP ports: a RabbitMQ on the same machine may hold 15672 and 15692
    proc = subprocess.Popen(
        [
            *command,
            "--data-dir",
            data_dir,
            "--management-port",
            management_port,
            "--prometheus-port",
            "none",
            *(extra or []),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "ready" in line:
                break
        else:
            raise SystemExit(f"broker exited before it was ready (status {proc.wait()})")
        # keep draining its log: a full pipe would block the broker on its next log line
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=5679)
    parser.add_argument("--management-port", default="none")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    with warren(args.port, management_port=args.management_port) as proc:
        env = dict(os.environ, WARREN_PID=str(proc.pid))
        return subprocess.call(command, env=env)


if __name__ == "__main__":
    sys.exit(main())
