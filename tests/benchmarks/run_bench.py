"""``make bench``: Warren's throughput in the common scenarios, measured with bench.py.

Starts a Warren on a free port, runs each scenario once for ``--seconds``
and prints a table. For side-by-side ratios against RabbitMQ use compare.sh.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from with_broker import warren  # noqa: E402

SCENARIOS = [
    ("S1 1p/1c 16 B autoack", ["--autoack"], "consume_rate"),
    ("S2 1p/1c 16 B prefetch 100", ["--prefetch", "100"], "consume_rate"),
    ("S3 S2 + confirms 100", ["--prefetch", "100", "--confirm", "100"], "consume_rate"),
    ("S5 1p/1c 1 KiB autoack", ["--autoack", "--size", "1024"], "consume_rate"),
    ("S7 publish only", ["--consumers", "0"], "publish_rate"),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    port = free_port()
    rows = []
    with warren(port):
        for i, (label, flags, metric) in enumerate(SCENARIOS):
            out = subprocess.run(
                [
                    sys.executable,
                    os.path.join(HERE, "bench.py"),
                    "--url",
                    f"amqp://guest:guest@127.0.0.1:{port}/",
                    "--seconds",
                    str(args.seconds),
                    "--queue",
                    f"bench-{i}",
                    "--quiet",
                    *flags,
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            try:
                result = json.loads(out.stdout.strip().splitlines()[-1])
                rows.append((label, f"{result[metric]:,.0f} msg/s"))
            except (IndexError, KeyError, ValueError):
                rows.append((label, f"failed: {out.stderr.strip()[-200:]}"))
    print("| scenario | Warren |\n|---|---|")
    for label, value in rows:
        print(f"| {label} | {value} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
