"""Run a command against a Warren started for it: ``with_broker.py --port N -- CMD ARGS``.

Starts ``python -m warren`` on 127.0.0.1:N, waits for its ready line, runs
CMD with WARREN_PID set, stops the broker with SIGTERM and exits with CMD's status.
``--config FILE`` starts it with a rabbitmq.conf, ``--set KEY=VALUE`` (repeatable) adds
lines after it, e.g. ``--set deprecated_features.permit.global_qos=true``.
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
from pathlib import Path


@contextmanager
def warren(
    port: int,
    extra: list[str] | None = None,
    management_port: str = "none",
    env: dict[str, str] | None = None,
) -> Iterator[subprocess.Popen[str]]:
    """A fresh broker with its own temporary data directory (``env``: added variables)."""
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
        env={**os.environ, **env} if env else None,
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


def config_file(path: str | None, settings: list[str]) -> str | None:
    """A temporary rabbitmq.conf: the file given, then the ``KEY=VALUE`` settings."""
    if path is None and not settings:
        return None
    text = Path(path).read_text(encoding="utf-8") if path else ""
    lines = [f"{key.strip()} = {value.strip()}" for key, _, value in map(str.partition, settings)]
    fd, conf = tempfile.mkstemp(prefix="warren-", suffix=".conf")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text.rstrip("\n") + "\n" + "\n".join(lines) + "\n")
    return conf


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=5679)
    parser.add_argument("--management-port", default="none")
    parser.add_argument("--config", metavar="FILE", help="rabbitmq.conf to start Warren with")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    conf = config_file(args.config, args.set)
    extra = ["--config", conf] if conf else []
    try:
        with warren(args.port, extra, management_port=args.management_port) as proc:
            env = dict(os.environ, WARREN_PID=str(proc.pid))
            return subprocess.call(command, env=env)
    finally:
        if conf:
            os.unlink(conf)


if __name__ == "__main__":
    sys.exit(main())
