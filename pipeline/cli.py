"""``warren-report`` (also ``python -m warren.pipeline``): run the job, write tables and report.

    warren-report --trace ./trace --out ./report                 # embedded Spark, local[*]
    warren-report --trace ./trace --out ./report --queue orders  # + why orders is slow
    warren-report --trace ./trace --message order-42             # what happened to it
    warren-report --trace hdfs:///warren/trace --out hdfs:///warren/report \\
        --master spark://head:7077                               # on a cluster
    spark-submit pipeline/cli.py --trace ... --out ...           # or through spark-submit
    warren-report --serve      # one warm session; a report per line of stdin (see serve())
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import sys
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DETAIL_FIELDS = (
    "exchange",
    "rk",
    "queues",
    "size",
    "mid",
    "cid",
    "persistent",
    "conn",
    "ch",
    "seq",
    "consumer",
    "tag",
    "redelivered",
    "count",
    "no_ack",
    "requeue",
    "why",
    "attempt",
    "delay_ms",
    "reason",
    "dlx",
    "dlrk",
    "tags",
    "timeout_ms",
    "action",
    "dead_letter",
)


# what `pip install 'warren[pipeline]'` brings; --render needs no Spark
PIPELINE_MODULES = ("pyspark", "pyarrow", "matplotlib")
RENDER_MODULES = ("pyarrow", "matplotlib")


def missing_modules(names: tuple[str, ...]) -> list[str]:
    import importlib.util

    return [name for name in names if importlib.util.find_spec(name) is None]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="warren-report",
        description="Analyse Warren's message-lifecycle traces with Spark.",
    )
    p.add_argument("--trace", help="trace directory (or one file)")
    p.add_argument("--out", help="where the Parquet tables and report.html go")
    p.add_argument("--master", help="Spark master (default local[*], or spark-submit's)")
    p.add_argument(
        "--message",
        metavar="ID",
        help="print the history of one message: the broker's id, a message-id or a correlation-id",
    )
    p.add_argument("--queue", help="after the report, print why this queue is slow")
    p.add_argument(
        "--bucket-seconds",
        type=float,
        help="rate/depth bucket (default: from the trace's length, at most 120 per series)",
    )
    p.add_argument(
        "--max-deliveries",
        type=int,
        default=3,
        help="a message delivered more often than this is a problem (3)",
    )
    p.add_argument("--driver-memory", default="4g", help="embedded runs only (4g)")
    p.add_argument(
        "--partitions",
        type=int,
        help="shuffle partitions of a session this starts (default: one per 32 MB of trace, "
        "one per core to 64)",
    )
    p.add_argument(
        "--render",
        action="store_true",
        help="only redraw report.html from the tables already in --out",
    )
    p.add_argument(
        "--serve",
        action="store_true",
        help="keep one Spark session and make a report per line of standard input, each "
        "line this command's arguments (--trace DIR --out DIR ...); 'done' or 'error: ...' "
        "ends each answer",
    )
    args = p.parse_args(argv)
    if args.serve:
        return args
    if args.trace is None:
        p.error("give --trace DIR (or --serve)")
    if args.out is None and args.message is None:
        p.error("give --out DIR for the report, or --message ID for one message's history")
    return args


def trace_bytes(trace: str) -> int | None:
    """The size of the trace files; None if ``trace`` is not a local path."""
    size = 0
    if os.path.isdir(trace):
        for name in os.listdir(trace):
            if name.startswith("warren-trace-"):
                size += os.path.getsize(os.path.join(trace, name))
    elif os.path.isfile(trace):
        size = os.path.getsize(trace)
    else:
        return None
    return size


ONE_PARTITION_BYTES = 4 << 20  # of trace files: about 25,000 events


def auto_partitions(trace: str) -> int:
    """One for a small trace (a sorted table's shuffle into more partitions costs a Spark
    job of its own, to sample the range bounds), one per core for a middling one, more
    for a big one."""
    size = trace_bytes(trace)
    if size is None:
        return 32  # not a local path (hdfs://, s3://): the cluster's size is unknown here
    if size < ONE_PARTITION_BYTES:
        return 1
    return max(os.cpu_count() or 2, min(64, size // (32 << 20)))


def _time(ts: int) -> str:
    moment = datetime.datetime.fromtimestamp(ts / 1e6, tz=datetime.UTC)
    return moment.strftime("%H:%M:%S.%f")


def print_history(rows: list[dict[str, Any]]) -> None:
    if not rows:
        print("no such message in the trace")
        return
    current = None
    start = 0
    for row in rows:
        if row["msg"] != current:
            current, start = row["msg"], row["ts"]
            print(f"\nmessage {current} ({row['vhost']})")
        details = []
        for key in DETAIL_FIELDS:
            value = row.get(key)
            if value is not None and value != [] and not (key == "dead_letter" and not value):
                details.append(f"{key}={value}")
        queue = row.get("queue") or ""
        elapsed = (row["ts"] - start) / 1000
        print(
            f"  {_time(row['ts'])} {elapsed:>+11.3f}ms  {row['ev']:<19}{queue:<20}"
            f"{' '.join(details)}"
        )


def run(
    spark: SparkSession,
    trace: str,
    out: str,
    bucket_seconds: float | None = None,
    max_deliveries: int = 3,
    phases: dict[str, float] | None = None,
) -> None:
    """The job on an existing session: Parquet tables and report.html in ``out``.

    ``phases``, if given, gets the seconds spent planning, running the job and writing
    its tables (and drawing the charts, meanwhile), and writing the report."""
    from warren.pipeline import job, report

    started = time.monotonic()
    events = job.load_events(spark, trace)
    if bucket_seconds is None:
        bucket_seconds = job.known_bucket(trace)
    tables = job.analyse(events, bucket_seconds, max_deliveries)
    planned = time.monotonic()
    charts: list[dict[str, str]] = []
    # the charts are drawn while the job writes the tables they do not need
    early = (report.CHART_TABLES, lambda: charts.append(report.chart_images(out)))
    job.write(tables, out, here=job.small(trace, out), early=early)
    spark.catalog.clearCache()
    job.cleanup()
    written = time.monotonic()
    report.write_report(out, trace, charts[0])
    if phases is not None:
        phases["plan and read"] = planned - started
        phases["job"] = written - planned
        phases["report"] = time.monotonic() - written


def report_once(
    spark: SparkSession, args: argparse.Namespace, started: float, phases: dict[str, float]
) -> None:
    """One report (or --message history) on a running session, and its terminal summary."""
    from warren.pipeline import job, report

    if args.message is not None:
        events = job.load_events(spark, args.trace)
        rows = [r.asDict() for r in job.message_events(events, args.message).collect()]
        print_history(rows)
        if args.out is None:
            return
    run(spark, args.trace, args.out, args.bucket_seconds, args.max_deliveries, phases)
    elapsed = time.monotonic() - started
    data = report.read_tables(args.out)
    path = f"{args.out}/report.html"
    events_total = data["summary"][0]["events"]
    print(report.terminal_summary(data, args.queue))
    print(
        f"\n{events_total:,} events in {elapsed:.1f} s ({events_total / elapsed:,.0f} events/s: "
        + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases.items())
        + ")"
        f"\ntables: {args.out}/<table>/ (Parquet)\nreport: {path}"
    )


def _missing_line(error: BaseException) -> str | None:
    from warren.pipeline import job

    module = job.missing_on_executor(error)
    if module is None:
        return None
    return (
        f"warren-report: an executor's Python has no module {module!r}: a worker needs "
        "pyspark and pyarrow installed (the job ships Warren itself)"
    )


def serve(spark: SparkSession, lines: Iterable[str], out: TextIO) -> int:
    """Reports on one warm session: each line of ``lines`` is warren-report's arguments
    (``--trace DIR --out DIR [--queue Q] [--message ID] ...``); the answer is the usual
    output, then a line ``done`` or ``error: <why>``. An empty line is skipped; ``quit``
    or the end of input stops. Returns the number of failed requests."""
    from warren.pipeline import job

    failed = 0
    print("ready", file=out, flush=True)
    for line in lines:
        words = shlex.split(line)
        if not words:
            continue
        if words == ["quit"]:
            break
        try:
            args = parse_args(words)
            if args.serve or args.render or args.trace is None:
                raise SystemExit(2)
        except SystemExit:
            failed += 1
            print(f"error: not a report's arguments: {line.strip()}", file=out, flush=True)
            continue
        started = time.monotonic()
        if (spark.sparkContext.master or "").startswith("local"):
            partitions = args.partitions or auto_partitions(args.trace)
            spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
            for key, value in job.codegen_settings(trace_bytes(args.trace)).items():
                spark.conf.set(key, value)
        stdout, sys.stdout = sys.stdout, out
        try:
            report_once(spark, args, started, {})
        except Exception as exc:  # one bad request must not end the session
            failed += 1
            why = _missing_line(exc) or f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
            print(f"error: {why}", file=out, flush=True)
            continue
        finally:
            sys.stdout = stdout
            job.cleanup()
        print("done", file=out, flush=True)
    return failed


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = missing_modules(RENDER_MODULES if args.render else PIPELINE_MODULES)
    if missing:
        print(
            f"warren-report: needs {', '.join(missing)}; "
            "install them with: pip install 'warren[pipeline]' (and Java 17+ for Spark)",
            file=sys.stderr,
        )
        return 2
    from warren.pipeline import report

    if args.render:
        path, tables = report.write_report(args.out, args.trace)
        print(report.terminal_summary(tables, args.queue))
        print(f"\nreport: {path}")
        return 0
    from warren.pipeline import job

    started = time.monotonic()
    if args.out is not None or args.serve:
        # the charts' imports, while this thread waits for the JVM
        threading.Thread(target=report.preload, daemon=True).start()
    if args.serve:
        # tuned for the small traces a warm session is for (SHORT_RUN)
        spark = job.spark_session(args.master, args.driver_memory, 2, short=True, trace_size=0)
        try:
            serve(spark, sys.stdin, sys.stdout)
        finally:
            spark.stop()
        return 0
    partitions = args.partitions or auto_partitions(args.trace)
    size = trace_bytes(args.trace)
    short = size is not None and size < job.SHORT_RUN_BYTES
    embedded = "PYSPARK_GATEWAY_PORT" not in os.environ  # not started by spark-submit
    if size is not None and embedded and (args.master or "local").startswith("local"):
        # a local session's default parallelism is its shuffle partitions (spark_session)
        job.decode_early(args.trace, partitions)
    spark = job.spark_session(
        args.master, args.driver_memory, partitions, short=short, trace_size=size
    )
    phases = {"session": time.monotonic() - started}
    try:
        report_once(spark, args, started, phases)
    except Exception as exc:
        line = _missing_line(exc)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 2
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
