"""Run a command against a Warren started for it: ``with_broker.py --port N -- CMD ARGS``.

Starts ``python -m broker`` on 127.0.0.1:N, waits for its ready line, runs
CMD with WARREN_PID set, stops the broker with SIGTERM and exits with CMD's status.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def warren(port: int, extra: list[str] | None = None) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "broker",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
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
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=5679)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    with warren(args.port) as proc:
        env = dict(os.environ, WARREN_PID=str(proc.pid))
        return subprocess.call(command, env=env)


if __name__ == "__main__":
    sys.exit(main())
