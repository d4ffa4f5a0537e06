"""S7 (publish only) against Warren, RabbitMQ and the null broker, alternating.

    python tests/benchmarks/publish_ceiling.py --warren URL [--rabbit URL] [--runs 5]
        [--time 5] [--warren-pid N] [--rabbit-pid N] [--also NAME=URL ...] [--amqp-perf PATH]

Starts tests/benchmarks/null_broker.py on a free port and runs amqp-perf's S7
(``--consumers 0``) against each endpoint in turn, ``--runs`` times, deleting the queue
on the brokers after each run. ``--also`` adds endpoints, e.g. a second Warren started
with other settings. Prints per endpoint the median publish rate,
broker ingress, the publishing thread's CPU and the broker's CPU, and the ratios of the
medians. The null broker stores and routes nothing: its rate is what amqp-perf's
publishing thread can send on this machine, the most S7 can show for any broker.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from compare_extra import delete_queue  # noqa: E402
from run_bench import free_port  # noqa: E402

QUEUE = "publish-ceiling"


def s7(amqp_perf: str, url: str, seconds: float, pid: int | None) -> dict[str, float]:
    command = [amqp_perf, "--uri", url, "--time", str(seconds), "--queue", QUEUE]
    command += ["--consumers", "0", "--json", "--quiet"]
    if pid:
        command += ["--broker-pid", str(pid)]
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    try:
        result = json.loads(out.stdout)
    except ValueError:
        raise SystemExit(f"amqp-perf failed: {out.stderr.strip()[-400:]}") from None
    return {
        "publish": float(result["publish_rate"]),
        "ingress": float(result["broker_ingress_rate"] or 0),
        "publisher_cpu": float(result["threads"][0]["cpu_pct"]),
        "broker_cpu": float(result["broker_cpu_pct"] or 0),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warren", required=True, help="Warren's AMQP URL")
    parser.add_argument("--rabbit", help="RabbitMQ's AMQP URL")
    parser.add_argument("--warren-pid", type=int)
    parser.add_argument("--rabbit-pid", type=int)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--time", type=float, default=5.0)
    parser.add_argument("--also", nargs="*", default=[], help="more endpoints, as NAME=URL")
    parser.add_argument("--amqp-perf", default=os.environ.get("AMQP_PERF", "/tmp/perf/amqp-perf"))
    args = parser.parse_args()

    port = free_port()
    null = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "null_broker.py"), "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert null.stdout is not None
        null.stdout.readline()  # listening
        endpoints: dict[str, tuple[str, int | None]] = {
            "Warren": (args.warren, args.warren_pid),
            "null broker": (f"amqp://guest:guest@127.0.0.1:{port}/", null.pid),
        }
        if args.rabbit:
            endpoints["RabbitMQ"] = (args.rabbit, args.rabbit_pid)
        for extra in args.also:
            name, _, url = extra.partition("=")
            endpoints[name] = (url, None)
        results: dict[str, list[dict[str, float]]] = {name: [] for name in endpoints}
        for run in range(args.runs):
            for name, (url, pid) in endpoints.items():
                result = s7(args.amqp_perf, url, args.time, pid)
                results[name].append(result)
                print(f"run {run + 1} {name}: {json.dumps(result)}", file=sys.stderr)
                if name != "null broker":
                    delete_queue(url, QUEUE)  # a million messages, gone before the next run
                time.sleep(1)
    finally:
        null.terminate()
        null.wait()

    def median(name: str, field: str) -> float:
        return statistics.median(r[field] for r in results[name])

    print(f"S7, amqp-perf --consumers 0 --time {args.time:g}, medians of {args.runs} runs")
    print("| endpoint | published msg/s | broker ingress msg/s | publisher thread CPU | "
          "broker CPU |\n|---|---:|---:|---:|---:|")  # fmt: skip
    for name in results:
        print(
            f"| {name} | {median(name, 'publish'):,.0f} | {median(name, 'ingress'):,.0f} "
            f"| {median(name, 'publisher_cpu'):.0f}% | {median(name, 'broker_cpu'):.0f}% |"
        )
    ceiling = median("null broker", "publish")
    warren = median("Warren", "publish")
    print(f"Warren / null broker: {warren / ceiling:.2f}")
    if args.rabbit:
        rabbit = median("RabbitMQ", "publish")
        print(f"Warren / RabbitMQ: {warren / rabbit:.2f}; null broker / RabbitMQ: "
              f"{ceiling / rabbit:.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
