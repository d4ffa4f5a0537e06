"""How throughput changes with the number of consumers on one queue, Warren and RabbitMQ
side by side (alternating, one run each per point).

    python tests/benchmarks/scale_curves.py consumers --points 1,10,100 [--seconds 10]

One producer (unlimited rate, 16-byte transient messages, a durable queue) and N consumers
(each its own connection, prefetch 100, manual acks) on one queue, with amqp-perf; the consume
rate is reported for a fresh Warren (started here) and the RabbitMQ on 127.0.0.1:5672.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from with_broker import warren

PORT = 5682


def run(binary: str, port: int, consumers: int, seconds: int) -> float:
    out = subprocess.run(
        [binary, "--uri", f"amqp://guest:guest@127.0.0.1:{port}/", "--queue",
         f"scale-consumers-{consumers}", "--durable", "--purge", "--producers", "1",
         "--consumers", str(consumers),
         "--prefetch", "100", "--time", str(seconds), "--json", "--quiet"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return float(json.loads(out.stdout)["consume_rate"])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("curve", choices=["consumers"])
    parser.add_argument("--points", default="1,10,100")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--perf", default="/tmp/perf-" + os.environ.get("USER", "x") + "/amqp-perf")
    args = parser.parse_args()
    rows = []
    with warren(PORT):
        for point in (int(p) for p in args.points.split(",")):
            ours = run(args.perf, PORT, point, args.seconds)
            theirs = run(args.perf, 5672, point, args.seconds)
            rows.append({"consumers": point, "warren": round(ours), "rabbitmq": round(theirs),
                         "ratio": round(ours / theirs, 2) if theirs else None})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    import pika  # the test dependencies have it

    conn = pika.BlockingConnection(pika.URLParameters("amqp://guest:guest@127.0.0.1:5672/"))
    channel = conn.channel()
    for point in args.points.split(","):
        channel.queue_delete(f"scale-consumers-{point}")
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
