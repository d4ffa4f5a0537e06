"""What message-lifecycle tracing costs at full load: bench.py against Warren, tracing off and on.

    python tests/benchmarks/trace_overhead.py [--seconds 10] [--rounds 3] [--port N]

Starts one broker per mode (``trace.enabled = false`` / ``true`` in a config file), runs
each scenario ``--rounds`` times alternating the modes, and prints the median rates, the
ratio, and how many events the traced runs wrote and dropped (the buffer is never allowed
to slow the broker: when the writer falls behind, events are dropped and counted). Each
round's two runs are back to back, so its ratio sees the same load from the rest of the
machine: the table gives the median and the worst of these per-round ratios too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from run_bench import free_port  # noqa: E402
from with_broker import warren  # noqa: E402

SCENARIOS = [
    ("1p/1c 16 B prefetch 100", ["--prefetch", "100"]),
    ("1p/1c 16 B prefetch 100, confirms 100", ["--prefetch", "100", "--confirm", "100"]),
    ("1p/1c 1 KiB autoack", ["--autoack", "--size", "1024"]),
]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of a process onto ``cpus``."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), cpus)


def run(
    port: int, seconds: float, queue: str, flags: list[str], cpus: set[int] | None = None
) -> tuple[float, int]:
    command = [sys.executable, os.path.join(HERE, "bench.py")]
    command += ["--url", f"amqp://guest:guest@127.0.0.1:{port}/", "--seconds", str(seconds)]
    command += ["--queue", queue, "--quiet", *flags]
    if cpus:
        command = ["taskset", "-c", ",".join(map(str, sorted(cpus))), *command]
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    try:
        result = json.loads(out.stdout.strip().splitlines()[-1])
        return float(result["consume_rate"]), int(result["received"])
    except (IndexError, KeyError, ValueError):
        raise SystemExit(f"bench.py failed: {out.stderr.strip()[-400:]}") from None


def trace_counts(directory: str) -> tuple[int, int]:
    """(events written, events dropped) in a trace directory."""
    written = 0
    dropped: dict[str, int] = {}  # per broker process: its writer counts from 0
    for name in os.listdir(directory):
        pid = name.split("-")[3]  # warren-trace-<time>-<pid>-<n>.ndjson
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            for line in f:
                written += 1
                if '"ev":"trace_dropped"' in line:
                    dropped[pid] = max(dropped.get(pid, 0), json.loads(line)["dropped"])
    return written, sum(dropped.values())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--pin",
        action="store_true",
        help="broker on CPU 0; load generator and trace writer on CPU 1 (a dedicated core)",
    )
    parser.add_argument("--port", type=int, help="AMQP port for the brokers (default: any free)")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="warren-trace-bench-")
    trace_dir = os.path.join(work, "trace")
    configs = {}
    for mode in ("off", "on"):
        path = os.path.join(work, f"{mode}.conf")
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"trace.enabled = {'true' if mode == 'on' else 'false'}\n")
            f.write(f"trace.dir = {trace_dir}\n")
        configs[mode] = path
    rates: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}  # broker CPU microseconds per message
    writer_cpu: list[float] = []  # the trace writer process's, per message
    for i, (label, flags) in enumerate(SCENARIOS):
        for round_ in range(args.rounds):
            for mode in ("off", "on") if round_ % 2 == 0 else ("on", "off"):
                port = args.port or free_port()
                with warren(port, ["--config", configs[mode]]) as proc:
                    helpers = children(proc.pid)
                    if args.pin:
                        pin(proc.pid, {0})
                        for helper in helpers:
                            pin(helper, {1})
                    before = cpu_seconds(proc.pid)
                    helper_before = sum(cpu_seconds(c) for c in helpers)
                    rate, received = run(
                        port, args.seconds, f"bench-{i}", flags, {1} if args.pin else None
                    )
                    used = cpu_seconds(proc.pid) - before
                    if helpers:
                        writer = sum(cpu_seconds(c) for c in helpers) - helper_before
                        writer_cpu.append(writer / max(received, 1) * 1e6)
                rates.setdefault((label, mode), []).append(rate)
                cpu.setdefault((label, mode), []).append(used / max(received, 1) * 1e6)
                print(
                    f"{label:<40} tracing {mode:<3} {rate:>10,.0f} msg/s "
                    f"{cpu[(label, mode)][-1]:6.2f} us CPU/msg",
                    file=sys.stderr,
                )
    written, dropped = trace_counts(trace_dir)
    print(
        "| scenario | off: msg/s | on: msg/s | on/off | per round: median, worst "
        "| off: broker CPU/msg | on: broker CPU/msg | CPU on/off |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    for label, _ in SCENARIOS:
        off = statistics.median(rates[(label, "off")])
        on = statistics.median(rates[(label, "on")])
        pairs = [b / a for a, b in zip(rates[(label, "off")], rates[(label, "on")], strict=True)]
        c_off = statistics.median(cpu[(label, "off")])
        c_on = statistics.median(cpu[(label, "on")])
        print(
            f"| {label} | {off:,.0f} | {on:,.0f} | {on / off:.0%} | "
            f"{statistics.median(pairs):.0%}, {min(pairs):.0%} | {c_off:.2f} us | "
            f"{c_on:.2f} us | {c_on / c_off:.0%} |"
        )
    if writer_cpu:
        print(f"\ntrace writer process: {statistics.median(writer_cpu):.2f} us CPU per message")
    share = dropped / (written + dropped) if written + dropped else 0.0
    print(f"\ntraced runs wrote {written:,} events; dropped {dropped:,} ({share:.1%}, buffer full)")
    print(f"trace files: {trace_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
