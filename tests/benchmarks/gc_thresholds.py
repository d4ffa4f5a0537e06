"""What warren-server's collector thresholds give: bench.py against Warren with
broker/server/main.py's GC_THRESHOLDS and with Python's default (700, 10, 10).

    python tests/benchmarks/gc_thresholds.py [--seconds 4] [--rounds 3] [--against 700,10,10]

Each run gets a fresh broker (publish-only runs leave millions of messages queued),
alternating between the two settings. Prints the median rates and their ratio. Run from
outside the repository with ``PYTHONPATH=build/compiled`` for the compiled build.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from run_bench import free_port  # noqa: E402
from with_broker import warren  # noqa: E402

SCENARIOS = [
    ("1p/1c 16 B autoack", ["--autoack"], "consume_rate"),
    ("1p/1c 16 B prefetch 100, one ack each", ["--prefetch", "100", "--multi-ack", "1"],
     "consume_rate"),
    ("1p/1c 16 B prefetch 100, confirms 100", ["--prefetch", "100", "--confirm", "100"],
     "consume_rate"),
    ("publish only (a backlog builds)", ["--consumers", "0"], "broker_ingress_rate"),
]  # fmt: skip


def run(port: int, seconds: float, flags: list[str], metric: str) -> float:
    command = [sys.executable, os.path.join(HERE, "bench.py"), "--quiet", "--queue", "gc"]
    command += ["--url", f"amqp://guest:guest@127.0.0.1:{port}/", "--seconds", str(seconds)]
    out = subprocess.run([*command, *flags], capture_output=True, text=True, check=False)
    try:
        return float(json.loads(out.stdout.strip().splitlines()[-1])[metric])
    except (IndexError, KeyError, ValueError):
        raise SystemExit(f"bench.py failed: {out.stderr.strip()[-400:]}") from None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", default="700,10,10", help="the other thresholds")
    args = parser.parse_args()
    modes = {"warren": None, args.against: {"WARREN_GC_THRESHOLDS": args.against}}
    print(f"| scenario | Warren's thresholds | {args.against} | ratio |\n|---|---|---|---|")
    for label, flags, metric in SCENARIOS:
        rates: dict[str, list[float]] = {mode: [] for mode in modes}
        for round_ in range(args.rounds):
            for mode in list(modes) if round_ % 2 == 0 else list(modes)[::-1]:
                port = free_port()
                with warren(port, ["--config", os.path.join(HERE, "..", "rabbitmq-3.x.conf")],
                            env=modes[mode]):  # fmt: skip
                    rates[mode].append(run(port, args.seconds, flags, metric))
        ours, theirs = (statistics.median(rates[mode]) for mode in modes)
        print(f"| {label} | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
