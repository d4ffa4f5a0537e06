"""What message-lifecycle tracing costs at full load: bench.py against Warren, tracing off and on.

    python tests/benchmarks/trace_overhead.py [--seconds 3] [--rounds 10] [--port N] [--same]
        [--only TEXT]

For each scenario, starts two brokers side by side (``trace.enabled = false`` / ``true``
in a config file), and runs bench.py ``--rounds`` times against each, alternating
(off-on, on-off, ...) and waiting before each run until both broker and trace writer are
idle. Prints the median rates, their ratio, the quartiles of the per-round ratios (each
round's two runs are back to back, so they share the machine's mood), the broker's CPU per
message, and how many events the traced runs wrote and dropped (the buffer is never
allowed to slow the broker: when the writer falls behind, events are dropped and counted).
On a shared machine single runs swing by a third: trust many short rounds, not a few
long ones. ``--same`` traces on neither broker (an A/A run): the spread of the per-round
ratio when nothing differs, to read the traced runs' spread against.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from run_bench import free_port  # noqa: E402
from with_broker import warren  # noqa: E402

SCENARIOS = [
    ("1p/1c 16 B prefetch 100", ["--prefetch", "100"]),
    ("1p/1c 16 B prefetch 100, one ack each", ["--prefetch", "100", "--multi-ack", "1"]),
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
    """(events written, events dropped) in a trace directory (its files decoded)."""
    from warren.broker.tracing import format as trace_format

    written = 0
    dropped: dict[str, int] = {}  # per broker process: its writer counts from 0
    for path in trace_format.trace_files(directory):
        pid = os.path.basename(path).split("-")[3]  # warren-trace-<time>-<pid>-<n>.wtrace
        for line in trace_format.lines([path]):
            written += 1
            if '"ev":"trace_dropped"' in line:
                dropped[pid] = max(dropped.get(pid, 0), json.loads(line)["dropped"])
    return written, sum(dropped.values())


def quiet(pids: list[int], timeout: float = 30.0) -> None:
    """Wait until these processes stop using CPU: a trace writer still formatting the last
    run's events would take CPU from the next run."""
    deadline = time.monotonic() + timeout
    last = sum(cpu_seconds(p) for p in pids)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = sum(cpu_seconds(p) for p in pids)
        if now - last < 0.01:
            return
        last = now


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return q1, q2, q3


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one run")
    parser.add_argument("--rounds", type=int, default=10, help="runs per mode and scenario")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="broker on CPU 0; load generator and trace writer on CPU 1 (a dedicated core)",
    )
    parser.add_argument("--port", type=int, help="first of two AMQP ports (default: any free)")
    parser.add_argument(
        "--only", metavar="TEXT", help="the scenarios whose name contains TEXT (say: confirms)"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the trace files (gigabytes) for a look"
    )
    parser.add_argument(
        "--same",
        action="store_true",
        help="trace on neither broker: the spread of the ratio when nothing differs",
    )
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="warren-trace-bench-")
    trace_dir = os.path.join(work, "trace")
    configs = {}
    for mode in ("off", "on"):
        path = os.path.join(work, f"{mode}.conf")
        with open(path, "w", encoding="utf-8") as f:
            traced = mode == "on" and not args.same
            f.write(f"trace.enabled = {'true' if traced else 'false'}\n")
            f.write(f"trace.dir = {trace_dir}\n")
        configs[mode] = path
    ports = {"off": args.port or free_port(), "on": args.port + 1 if args.port else free_port()}
    rates: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}  # broker CPU microseconds per message
    writer_cpu: list[float] = []  # the trace writer process's, per message
    scenarios = [s for s in SCENARIOS if args.only is None or args.only in s[0]]
    for i, (label, flags) in enumerate(scenarios):
        # both brokers stay up through the scenario's rounds, which alternate between them
        # (off-on, on-off, ...): a slow spell of the machine lands on both modes alike
        with (
            warren(ports["off"], ["--config", configs["off"]]) as off_proc,
            warren(ports["on"], ["--config", configs["on"]]) as on_proc,
        ):
            procs = {"off": off_proc, "on": on_proc}
            helpers = {mode: children(proc.pid) for mode, proc in procs.items()}
            if args.pin:
                for mode, proc in procs.items():
                    pin(proc.pid, {0})
                    for helper in helpers[mode]:
                        pin(helper, {1})
            for mode in ("off", "on"):  # warm-up: queue declared, code paths hot
                run(ports[mode], 1.0, f"bench-{i}", flags, {1} if args.pin else None)
            for round_ in range(args.rounds):
                for mode in ("off", "on") if round_ % 2 == 0 else ("on", "off"):
                    pid = procs[mode].pid
                    quiet([pid, *helpers[mode]])
                    before = cpu_seconds(pid)
                    helper_before = sum(cpu_seconds(c) for c in helpers[mode])
                    rate, received = run(
                        ports[mode], args.seconds, f"bench-{i}", flags, {1} if args.pin else None
                    )
                    used = cpu_seconds(pid) - before
                    if helpers[mode]:
                        quiet([pid, *helpers[mode]])  # the writer's share of this run, all of it
                        writer = sum(cpu_seconds(c) for c in helpers[mode]) - helper_before
                        writer_cpu.append(writer / max(received, 1) * 1e6)
                    rates.setdefault((label, mode), []).append(rate)
                    cpu.setdefault((label, mode), []).append(used / max(received, 1) * 1e6)
                    print(
                        f"{label:<40} tracing {mode:<3} {rate:>10,.0f} msg/s "
                        f"{cpu[(label, mode)][-1]:6.2f} us CPU/msg",
                        file=sys.stderr,
                    )
    written, dropped = trace_counts(trace_dir) if os.path.isdir(trace_dir) else (0, 0)
    print(
        f"{args.rounds} rounds of {args.seconds:g} s per mode and scenario"
        f"{' (--same: the on broker does not trace either)' if args.same else ''}\n\n"
        "| scenario | off: msg/s | on: msg/s | on/off | per round: quartiles "
        "| off: broker CPU/msg | on: broker CPU/msg | CPU on/off |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    for label, _ in scenarios:
        off = statistics.median(rates[(label, "off")])
        on = statistics.median(rates[(label, "on")])
        # a round where either broker moved nothing (a starved machine) has no ratio
        pairs = [
            b / a
            for a, b in zip(rates[(label, "off")], rates[(label, "on")], strict=True)
            if a and b
        ]
        q1, q2, q3 = quartiles(pairs)
        c_off = statistics.median(cpu[(label, "off")])
        c_on = statistics.median(cpu[(label, "on")])
        print(
            f"| {label} | {off:,.0f} | {on:,.0f} | {on / off:.0%} | "
            f"{q1:.0%}, {q2:.0%}, {q3:.0%} | {c_off:.2f} us | {c_on:.2f} us | {c_on / c_off:.0%} |"
        )
    if writer_cpu:
        print(f"\ntrace writer process: {statistics.median(writer_cpu):.2f} us CPU per message")
    share = dropped / (written + dropped) if written + dropped else 0.0
    print(f"\ntraced runs wrote {written:,} events; dropped {dropped:,} ({share:.1%}, buffer full)")
    if args.keep:
        print(f"trace files: {trace_dir}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
