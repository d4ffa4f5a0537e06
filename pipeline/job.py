"""The analysis: trace events in, the report's tables out, all as Spark DataFrames.

One message may sit in several queues (fan-out, dead-lettering); each (vhost, msg,
queue) is a *copy*, and most of the work is one window over each copy's events in time
order. From it come the copy's state before and after each event (ready, unacked,
delayed, gone), which summed per minute give the depths; the delivery each ack settles
(so processing time and the consumer that took it); and the copy's outcome.

Timestamps are microseconds; latencies in the tables are milliseconds.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Collection, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark import SparkConf, StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BooleanType, DataType, IntegerType, LongType, StringType

from warren.broker.tracing import format as trace_format
from warren.pipeline import jvm
from warren.pipeline.schema import DEAD_LETTER_REASONS, READ_SCHEMA

if TYPE_CHECKING:
    import pyarrow as pa

# events that happen to one copy in one queue (routed is exploded into one arrival per queue)
COPY_EVENTS = (
    "delivered",
    "acked",
    "nacked",
    "requeued",
    "retry_scheduled",
    "expired",
    "dead_lettered",
    "dropped",
    "adopted",
)
PERCENTILE_ACCURACY = 10_000  # percentile_approx: relative error 1/10000 of the range's rank
GET = "basic.get"  # the consumer name of basic.get deliveries


@dataclass
class Tables:
    """What the job writes, one Parquet table each (see README "Tracing")."""

    queue_minute: DataFrame  # per queue and time bucket: counts and depths
    queue_latency: DataFrame  # per queue and metric: count, mean, p50, p95, p99, max (ms)
    consumer_latency: DataFrame  # the same per queue, consumer and metric
    consumers: DataFrame  # per queue and consumer: deliveries, ack rate, timeouts, ...
    queue_consumers: DataFrame  # per queue: consumers seen, consumers live at the end
    messages: DataFrame  # per message: publish details, path, outcome
    problems: DataFrame  # messages with something wrong, and what
    problem_groups: DataFrame  # problems by queue, kind and reason: counts, times, examples
    summary: DataFrame  # one row of totals

    def items(self) -> Iterable[tuple[str, DataFrame]]:
        return (
            ("queue_minute", self.queue_minute),
            ("queue_latency", self.queue_latency),
            ("consumer_latency", self.consumer_latency),
            ("consumers", self.consumers),
            ("queue_consumers", self.queue_consumers),
            ("messages", self.messages),
            ("problems", self.problems),
            ("problem_groups", self.problem_groups),
            ("summary", self.summary),
        )


# A short run: the JVM's optimising compiler and adaptive re-planning cost more than they
# save on up to a million events
SHORT_RUN = {
    "spark.sql.adaptive.enabled": "false",
    # one compiler thread and one GC thread: on a busy 2-core machine the JVM's helper
    # threads only compete with its own work
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:CICompilerCount=1 "
    "-XX:+UseSerialGC",
}
# and, with a driver of 2 GB or more, a young generation of 512 MB and an old one of 512 MB
# from the start: the default heap (a 64th of the machine's memory, grown as it fills) took
# 53 collections on 104,789 events, two of them full ones to grow the heap and one for
# class metadata; 9 s of pauses on a busy machine, against 2 s in 16 collections
SHORT_HEAP = "-Xms1g -Xmn512m -XX:MetaspaceSize=256m"
# below this much trace, expressions are interpreted, not compiled by Janino (whole-stage
# or one by one): each compiled class costs more CPU than evaluating it on a few thousand
# rows, while on 100,000 events the compiled plan takes a third less CPU
# (docs/tracing.md); these settings may change in a running session
CODEGEN_BYTES = 4 << 20  # about 25,000 events
INTERPRETED = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}
COMPILED = {"spark.sql.codegen.wholeStage": "true", "spark.sql.codegen.factoryMode": "FALLBACK"}


def codegen_settings(size: int | None) -> dict[str, str]:
    """How expressions are evaluated for ``size`` bytes of trace (None: not known here)."""
    return INTERPRETED if size is not None and size < CODEGEN_BYTES else COMPILED


SHORT_RUN_BYTES = 64 << 20  # of trace files: up to about a million events


def spark_session(
    master: str | None = None,
    driver_memory: str = "4g",
    partitions: int = 8,
    conf: dict[str, str] | None = None,
    short: bool = False,
    trace_size: int | None = None,
) -> SparkSession:
    """A session for the job: ``local[*]`` unless ``master`` or spark-submit says otherwise.

    ``short``: an embedded run on a small trace, tuned for start-up (SHORT_RUN), and for
    ``trace_size`` bytes of trace (codegen_settings)."""
    from pyspark import SparkContext

    builder = SparkSession.builder.appName("warren-report")
    # no Hive: the job reads files and writes Parquet, it needs no metastore
    builder = builder.config("spark.sql.catalogImplementation", "in-memory")
    # PySpark's call-site capture for error messages costs six JVM calls around each
    # function that builds a column: more than half of the job's planning calls
    builder = builder.config("spark.python.sql.dataFrameDebugging.enabled", "false")
    settings = dict(conf or {})
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started this driver
    if master is not None:
        builder = builder.master(master)
    elif not submitted:
        builder = builder.master("local[*]")
    if not submitted:
        # a session of our own on any master: Spark's 200 shuffle partitions are 200 tasks
        # a stage, seconds each on a busy worker, for a trace that fills two
        builder = builder.config("spark.sql.shuffle.partitions", str(partitions))
        builder = builder.config("spark.ui.showConsoleProgress", "false")
    if not submitted and (master is None or master.startswith("local")):
        # an embedded run: the JVM starts here, so its memory can still be chosen
        builder = builder.config("spark.driver.memory", driver_memory)
        builder = builder.config("spark.ui.enabled", "false")
        builder = builder.config("spark.default.parallelism", str(partitions))
        if short:
            settings.update(SHORT_RUN)
            settings.update(codegen_settings(trace_size))
            if _megabytes(driver_memory) >= 2048:
                options = settings["spark.driver.extraJavaOptions"]
                settings["spark.driver.extraJavaOptions"] = f"{options} {SHORT_HEAP}"
        # the Python workers decode the trace files: they need warren, as this one has it
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    for key, value in settings.items():
        builder = builder.config(key, value)
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    if not submitted and SparkContext._gateway is None:
        # the driver's JVM started from its kept command line (start_gateway), with the
        # configuration getOrCreate passes to spark-submit
        launch = SparkConf()
        for key, value in builder._options.items():
            launch.set(key, value)
        # the class cache on a short run only: on a long one its start-up saving is lost in
        # the run, and Java 25's AOT cache made by a short run cost 10 to 60% more CPU
        # (docs/tracing.md "Scale")
        gateway = jvm.start_gateway(launch, jvm.java_runtime(), classes=short)
        SparkContext._ensure_initialized(gateway=gateway)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if not (spark.sparkContext.master or "").startswith("local"):
        # the executors decode the trace with Warren's code: they get it from the job, so a
        # worker needs only PySpark (docs/tracing.md "On a cluster")
        spark.sparkContext.addPyFile(package_zip())
    return spark


def _megabytes(size: str) -> int:
    """A JVM memory size as Spark takes it ("4g", "512m"; a plain number is MB), in MB."""
    units = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1 << 20}
    size = size.strip().lower().removesuffix("b")
    if size[-1:] in units:
        return int(float(size[:-1]) * units[size[-1]])
    return int(float(size))


_zip_dir: list[str] = []  # package_zip()'s directory, removed at exit


def package_zip() -> str:
    """Warren's Python sources (no C extensions: a worker's CPU and Python may differ)
    as a zip an executor puts on its sys.path; made once per process."""
    import zipfile

    import warren

    if _zip_dir:
        return os.path.join(_zip_dir[0], "warren.zip")
    _zip_dir.append(tempfile.mkdtemp(prefix="warren-pyfiles-"))
    atexit.register(shutil.rmtree, _zip_dir[0], True)
    root = os.path.dirname(warren.__file__)
    path = os.path.join(_zip_dir[0], "warren.zip")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        # the subpackages are links to the repository's folders in a source tree
        for folder, dirs, files in os.walk(root, followlinks=True):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    full = os.path.join(folder, name)
                    z.write(full, os.path.join("warren", os.path.relpath(full, root)))
    return path


def missing_on_executor(error: BaseException) -> str | None:
    """The module a failed job's executor could not import, from the error's text."""
    import re

    found = re.search(r"No module named '?([A-Za-z_][\w.]*)'?", str(error))
    return found.group(1) if found else None


def _decode(item: tuple[str, bytes]) -> Iterator[str]:
    """A file's lines, each with its place in its session's stream ("n"): the broker dates
    the events of one event-loop iteration alike (trace_events.TraceClock), and events
    that share a time are ordered by the stream, as the broker wrote them."""
    data = item[1]
    first = trace_format.file_number(data) << 32
    for n, line in enumerate(trace_format.file_lines(data), first):
        yield f'{{"n":{n},{line[1:]}'


# of trace files: below this the driver writes the tables itself (write(here=True)), and
# a trace pyarrow cannot parse is decoded to JSON lines for Spark's reader
LOCAL_DECODE_BYTES = 64 << 20
_scratch: list[str] = []  # directories of decoded traces, removed by cleanup()
_spans: dict[str, tuple[int, int]] = {}  # trace -> first and last ts, seen while decoding
_decoded: set[str] = set()  # traces decoded here below LOCAL_DECODE_BYTES


_early: dict[str, Future[tuple[str, str] | None]] = {}  # trace -> decode_early's decode


def decode_early(trace: str, parallelism: int) -> None:
    """Start decoding a local trace for a local-mode session that is yet to start, in a
    thread: the decode (pyarrow, without Python's lock) runs while the JVM starts, and
    :func:`load_events` takes its result. ``parallelism``: the session's default one."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="warren-decode")
    _early[trace] = pool.submit(_decode_local, trace, parallelism)
    pool.shutdown(wait=False)


def _decode_here(spark: SparkSession, trace: str) -> tuple[str, str] | None:
    """A local trace in local mode, decoded here into a scratch directory; or None.
    The JVM then reads plain files: no Python worker decodes and pickles the events for
    Spark's JSON reader to parse again. Returns the directory and the format of its files:
    Parquet from ARROW_BYTES of trace (JSON lines below LOCAL_DECODE_BYTES if pyarrow
    cannot parse them; None, so Spark's reader decides, above), else JSON lines."""
    early = _early.pop(trace, None)
    if not (spark.sparkContext.master or "").startswith("local"):
        if early is not None:
            early.result()  # its scratch directory goes with cleanup()
        return None
    if early is not None:
        return early.result()
    return _decode_local(trace, spark.sparkContext.defaultParallelism)


def _decode_local(trace: str, parallelism: int) -> tuple[str, str] | None:
    """_decode_here's decode, for a session of default ``parallelism``."""
    if os.path.isdir(trace):
        names = sorted(n for n in os.listdir(trace) if n.startswith("warren-trace-"))
        files = [os.path.join(trace, n) for n in names]
    elif os.path.isfile(trace):
        files = [trace]
    else:
        return None  # hdfs://, s3a://: Spark reads it
    size = sum(os.path.getsize(f) for f in files)
    if not files:
        return None
    scratch = tempfile.mkdtemp(prefix="warren-report-")
    _scratch.append(scratch)
    _spans.pop(trace, None)
    small = size < LOCAL_DECODE_BYTES
    if size >= ARROW_BYTES and _parquet_here(files, scratch, trace, parallelism, small):
        if small:
            _decoded.add(trace)
        return scratch, "parquet"
    if not small:
        return None
    first, last = None, None
    for i, name in enumerate(files):
        with open(name, "rb") as f:
            data = f.read()
        with open(os.path.join(scratch, f"{i}.json"), "w", encoding="utf-8") as out:
            for line in _decode((name, data)):
                out.write(line if line.endswith("\n") else line + "\n")
                ts = _line_ts(line)
                if ts is not None:
                    first = ts if first is None or ts < first else first
                    last = ts if last is None or ts > last else last
    if first is not None and last is not None:
        _spans[trace] = (first, last)
    _decoded.add(trace)
    return scratch, "json"


# of trace files: from this size (about 25,000 events) the driver parses the decoded
# lines with pyarrow and writes them as Parquet: Spark's JSON reader took 5 s of CPU for
# 104,789 events, pyarrow takes 0.6 s and Spark's columnar Parquet reader little more
ARROW_BYTES = 4 << 20
# rows of a Parquet row group in a big trace's scratch files: Spark splits a file between
# tasks at row groups only (about 40 MB each, uncompressed)
ROW_GROUP = 1 << 18


def _arrow_type(kind: DataType) -> pa.DataType:
    import pyarrow as pa

    if isinstance(kind, ArrayType):
        return pa.list_(_arrow_type(kind.elementType))
    if isinstance(kind, LongType):
        return pa.int64()
    if isinstance(kind, IntegerType):
        return pa.int32()
    if isinstance(kind, StringType):
        return pa.string()
    if isinstance(kind, BooleanType):
        return pa.bool_()
    raise TypeError(f"no Arrow type for {kind}")


def _arrow_file(name: str) -> pa.Table | None:
    """One trace file's events as Arrow, with the schema Spark reads them with and each
    line's place ("n", as _decode gives it); None if pyarrow cannot parse them all."""
    import pyarrow as pa
    import pyarrow.json as pj

    schema = pa.schema([pa.field(f.name, _arrow_type(f.dataType)) for f in READ_SCHEMA.fields])
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    with open(name, "rb") as f:
        data = f.read()
    parsed = None
    if trace_format.file_number(data) == 0 and data[:1] == b"{" and data.endswith(b"}\n"):
        # a file of JSON lines as the generator or a decode writes it: parsed as it is, the
        # line's number its "n" if every line is one row (no blank line, none cut short)
        try:
            parsed = pj.read_json(pa.py_buffer(data), parse_options=options)
        except (pa.ArrowException, ValueError):
            parsed = None
        if parsed is not None and parsed.num_rows == data.count(b"\n"):
            parsed = parsed.set_column(
                schema.get_field_index("n"), "n", pa.array(range(parsed.num_rows), pa.int64())
            )
        else:
            parsed = None
    if parsed is None:
        text = []
        for line in _decode((name, data)):
            # a line cut short by a live broker: Spark's JSON reader makes it a row of
            # nulls, which load_events drops
            if line.rstrip().endswith("}"):
                text.append(line if line.endswith("\n") else line + "\n")
        del data
        try:
            parsed = pj.read_json(pa.py_buffer("".join(text).encode()), parse_options=options)
        except (pa.ArrowException, ValueError):
            return None  # not as the broker writes it: Spark's reader decides
    rows = parsed.num_rows
    return pa.table(
        [
            parsed[f.name] if f.name in parsed.column_names else pa.nulls(rows, f.type)
            for f in schema
        ],
        schema=schema,
    )


def _parquet_here(
    files: list[str], scratch: str, trace: str, parallelism: int, small: bool = True
) -> bool:
    """The events of ``files`` as Parquet files in ``scratch``, parsed by pyarrow with the
    schema Spark reads them with: a small trace as one file per core, a big one file by
    file (two at a time, in bounded memory) with a row group per ROW_GROUP events. False
    (and no file) if pyarrow cannot parse them all, so Spark's JSON reader and its rules
    apply."""
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
    except ImportError:
        return False
    spans: list[tuple[int, int]] = []

    def span(table: pa.Table) -> None:
        kept = table.filter(pc.and_(pc.is_valid(table["ev"]), pc.is_valid(table["ts"])))
        if kept.num_rows:
            low_high = pc.min_max(kept["ts"])
            spans.append((low_high["min"].as_py(), low_high["max"].as_py()))

    if small:
        tables = [_arrow_file(name) for name in files]
        if any(t is None for t in tables):
            return False
        table = pa.concat_tables([t for t in tables if t is not None])
        span(table)
        rows = table.num_rows
        # one file per core: Spark reads a file's row group in one task
        parts = max(1, parallelism)
        step = -(-rows // parts) or 1
        for i in range(0, max(rows, 1), step):
            path = os.path.join(scratch, f"{i // step}.parquet")
            pq.write_table(table.slice(i, step), path, compression="none")
    else:

        def convert(i: int) -> bool:
            table = _arrow_file(files[i])
            if table is None:
                return False
            span(table)
            path = os.path.join(scratch, f"{i}.parquet")
            pq.write_table(table, path, compression="none", row_group_size=ROW_GROUP)
            return True

        # pyarrow parses and writes without the GIL: two files at a time keep two cores
        # busy where one file's parse does not
        with ThreadPoolExecutor(2, thread_name_prefix="warren-parse") as pool:
            done = list(pool.map(convert, range(len(files))))
        if not all(done):
            for name in os.listdir(scratch):
                os.unlink(os.path.join(scratch, name))
            return False
    if spans:
        _spans[trace] = (min(s[0] for s in spans), max(s[1] for s in spans))
    return True


def _line_ts(line: str) -> int | None:
    """The ts of a decoded line (``{"n":..,"ts":..,``), without parsing the JSON; None
    for a line cut short (Spark drops it)."""
    start = line.find(',"ts":')
    if start < 0 or not line.rstrip().endswith("}"):
        return None
    start += 6
    end = start
    while end < len(line) and line[end].isdigit():
        end += 1
    return int(line[start:end]) if end > start else None


def small(trace: str, out: str) -> bool:
    """A trace :func:`load_events` decoded here, and a local ``out``: this process writes
    the tables (:func:`write`)."""
    return trace in _decoded and "://" not in out


def known_bucket(trace: str) -> float | None:
    """The automatic bucket of a trace :func:`load_events` decoded here, or None: the
    driver saw every time stamp, so no Spark job needs to find the span."""
    span = _spans.get(trace)
    return None if span is None else bucket_for((span[1] - span[0]) / 1e6)


def cleanup() -> None:
    """Remove the scratch directories of decoded traces (after the tables are written)."""
    while _scratch:
        shutil.rmtree(_scratch.pop(), ignore_errors=True)
    _spans.clear()
    _decoded.clear()


atexit.register(cleanup)


def load_events(spark: SparkSession, trace: str) -> DataFrame:
    """Every event of the trace files in ``trace`` (a directory or one file).

    Each file is decoded on its own, in parallel (broker/tracing/format.py). An ack whose
    delivery lies in an earlier file comes out of its file with the delivery's channel
    and tag only, and gets the rest here from that delivery.
    """
    path = os.path.join(trace, "warren-trace-*") if os.path.isdir(trace) else trace
    reader = spark.read.schema(READ_SCHEMA)
    decoded = _decode_here(spark, trace)
    if decoded is not None:
        scratch, form = decoded
        source = reader.parquet(scratch) if form == "parquet" else reader.json(scratch)
    else:
        source = reader.json(spark.sparkContext.binaryFiles(path).flatMap(_decode))
    # a JSON file's line cut short by a live broker parses as nulls: dropped here
    events = source.filter(F.col("ev").isNotNull() & F.col("ts").isNotNull())
    if decoded is None or decoded[1] != "parquet":
        # decoded once, read twice below; Parquet files are read again for less CPU than
        # a cache of them costs (3.1 s for 104,789 events)
        events = events.persist(StorageLevel.DISK_ONLY)
    ev = F.col("ev")
    loose = (ev == "acked") & F.col("msg").isNull()
    deliveries = events.filter((ev == "delivered") & F.col("chan").isNotNull()).select(
        "chan", "tag", "vhost", "msg", "queue", "consumer"
    )
    # a tag is delivered once per channel: at most one delivery per loose ack (none if
    # it was delivered before tracing began)
    settled = deliveries.join(
        F.broadcast(events.filter(loose).select("ts", "n", "chan", "tag")), ["chan", "tag"]
    ).select("ts", "n", F.lit("acked").alias("ev"), "vhost", "msg", "queue", "consumer", "tag")
    return events.filter(~loose).unionByName(settled, allowMissingColumns=True).drop("chan")


def _count(condition: Column) -> Column:
    return F.sum(F.when(condition, 1).otherwise(0))


def _ms(column: Column) -> Column:
    return column / F.lit(1000.0)


def _percentiles(value: Column) -> list[Column]:
    pct = F.percentile_approx(value, [0.5, 0.95, 0.99], PERCENTILE_ACCURACY)
    return [
        F.count(value).alias("count"),
        F.round(_ms(F.avg(value)), 3).alias("mean_ms"),
        F.round(_ms(pct[0]), 3).alias("p50_ms"),
        F.round(_ms(pct[1]), 3).alias("p95_ms"),
        F.round(_ms(pct[2]), 3).alias("p99_ms"),
        F.round(_ms(F.max(value)), 3).alias("max_ms"),
    ]


def copy_events(events: DataFrame, partitions: int | None = None) -> DataFrame:
    """Every event of every message, with the window's view of its copy's history.

    Rows of one message share a partition: the window over each copy, the per-copy and the
    per-message aggregations all run there, after this one shuffle. Message-level rows
    (published, and ``unrouted`` for a publish that reached no queue) have no queue.
    """
    ev = F.col("ev")
    columns = ["vhost", "msg", "ts", "n", "ev", "consumer", "conn", "redelivered", "requeue", "why"]
    columns += ["reason", "exchange", "rk", "size", "mid", "cid", "mandatory"]
    routed = ev == "routed"
    arrival = routed & F.coalesce(F.size("queues") > 0, F.lit(False))
    # a publish that reached no queue; a dead-lettered copy that reached none is dropped
    unrouted = routed & F.coalesce((F.size("queues") == 0) & ~F.col("dead_letter"), F.lit(False))
    # one pass over the events (a union of three filters read the trace three times)
    every = events.filter(ev.isin("published", *COPY_EVENTS) | arrival | unrouted).select(
        *[
            F.when(unrouted, F.lit("unrouted")).otherwise(ev).alias(c) if c == "ev" else c
            for c in columns
        ],
        F.explode(F.when(arrival, F.col("queues")).otherwise(F.array("queue"))).alias("queue"),
    )
    by_message = (
        every.repartition(partitions, "vhost", "msg")
        if partitions
        else every.repartition("vhost", "msg")
    )
    state = (
        F.when(ev.isin("routed", "requeued"), "ready")
        .when(ev == "delivered", "unacked")
        .when((ev == "nacked") & F.col("requeue"), "unacked")
        .when(ev == "retry_scheduled", "delayed")
        .when(ev.isin("adopted", "published", "unrouted"), "none")  # adopted: unknown before
        .otherwise("gone")
    )
    copy = Window.partitionBy("vhost", "msg", "queue").orderBy("ts", "n")
    upto = copy.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    delivered = ev == "delivered"
    # one select, so one Window operator computes them all in one pass over the sorted
    # rows (a projection between windows would keep them apart: five passes)
    rows = by_message.select(
        "*",
        state.alias("state"),
        F.coalesce(F.lag(state).over(copy), F.lit("none")).alias("prev"),
        F.last(F.when(ev == "routed", F.col("ts")), True).over(upto).alias("arrived_ts"),
        F.last(F.when(delivered, F.col("ts")), True).over(upto).alias("deliver_ts"),
        # the consumer of the copy's latest delivery
        F.last(F.when(delivered, F.coalesce("consumer", F.lit(GET))), True).over(upto).alias("by"),
        F.last(F.when(delivered, F.col("conn")), True).over(upto).alias("by_conn"),
    )
    return rows


# bucket lengths the automatic choice picks from, seconds
BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 300, 900, 3600)
MAX_BUCKETS = 120  # points per chart series


def auto_bucket(events: DataFrame) -> float:
    """The shortest bucket that gives a series at most MAX_BUCKETS points over the trace:
    a trace seconds long gets sub-second buckets, not one point."""
    span = events.agg((F.max("ts") - F.min("ts")).alias("span")).first()
    return bucket_for((span["span"] or 0) / 1e6 if span is not None else 0)


def bucket_for(seconds: float) -> float:
    return next((b for b in BUCKETS if seconds / b <= MAX_BUCKETS), BUCKETS[-1])


def queue_minute(rows: DataFrame, bucket_seconds: float) -> DataFrame:
    ev = F.col("ev")
    bucket_us = max(1, round(bucket_seconds * 1_000_000))
    timed_out = ev.isin("requeued", "retry_scheduled") & (F.col("why") == "consumer_timeout")

    def delta(state: str) -> Column:
        return F.sum(
            F.when(F.col("state") == state, 1).otherwise(0)
            - F.when(F.col("prev") == state, 1).otherwise(0)
        )

    counts = (
        rows.filter(F.col("queue").isNotNull())
        .withColumn("bucket", (F.col("ts") / bucket_us).cast("long") * bucket_us)
        .groupBy("vhost", "queue", "bucket")
        .agg(
            _count(ev == "routed").alias("published"),
            _count(ev == "delivered").alias("delivered"),
            _count((ev == "delivered") & F.col("redelivered")).alias("redelivered"),
            _count(ev == "acked").alias("acked"),
            _count(ev == "nacked").alias("nacked"),
            _count(ev == "requeued").alias("requeued"),
            _count(ev == "retry_scheduled").alias("retried"),
            _count(timed_out).alias("timed_out"),
            _count(ev == "expired").alias("expired"),
            _count(ev == "dead_lettered").alias("dead_lettered"),
            *[
                _count((ev == "dead_lettered") & (F.col("reason") == r)).alias(f"dead_lettered_{r}")
                for r in DEAD_LETTER_REASONS
            ],
            _count(ev == "dropped").alias("dropped"),
            delta("ready").alias("d_ready"),
            delta("unacked").alias("d_unacked"),
            delta("delayed").alias("d_delayed"),
        )
    )
    running = (
        Window.partitionBy("vhost", "queue")
        .orderBy("bucket")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    return (
        counts.withColumn("ready", F.sum("d_ready").over(running))
        .withColumn("unacked", F.sum("d_unacked").over(running))
        .withColumn("delayed", F.sum("d_delayed").over(running))
        .withColumn("minute", F.timestamp_micros("bucket"))
        .drop("d_ready", "d_unacked", "d_delayed", "bucket")
        .orderBy("vhost", "queue", "minute")
    )


def latency_samples(rows: DataFrame) -> DataFrame:
    """(vhost, queue, consumer, metric, us): one sample per first delivery or ack."""
    ev = F.col("ev")
    keys = ["vhost", "queue"]
    first = rows.filter(
        (ev == "delivered") & ~F.col("redelivered") & F.col("arrived_ts").isNotNull()
    ).select(
        *keys,
        F.coalesce("consumer", F.lit(GET)).alias("consumer"),
        F.lit("publish_to_first_delivery").alias("metric"),
        (F.col("ts") - F.col("arrived_ts")).alias("us"),
    )
    acks = rows.filter(ev == "acked")
    to_ack = acks.filter(F.col("arrived_ts").isNotNull()).select(
        *keys,
        F.col("by").alias("consumer"),
        F.lit("publish_to_ack").alias("metric"),
        (F.col("ts") - F.col("arrived_ts")).alias("us"),
    )
    processing = acks.filter(F.col("deliver_ts").isNotNull()).select(
        *keys,
        F.col("by").alias("consumer"),
        F.lit("deliver_to_ack").alias("metric"),
        (F.col("ts") - F.col("deliver_ts")).alias("us"),
    )
    return first.unionByName(to_ack).unionByName(processing)


def consumers(rows: DataFrame, samples: DataFrame) -> DataFrame:
    ev = F.col("ev")
    who = F.when(ev == "delivered", F.coalesce("consumer", F.lit(GET))).otherwise(F.col("by"))
    timed_out = ev.isin("requeued", "retry_scheduled") & (F.col("why") == "consumer_timeout")
    counts = (
        rows.filter(ev.isin("delivered", "acked", "nacked", "requeued", "retry_scheduled"))
        .withColumn("consumer", who)
        .filter(F.col("consumer").isNotNull())
        .groupBy("vhost", "queue", "consumer")
        .agg(
            # the least of its connections: collect_set makes this a hash aggregation
            # (a first() of a string one that sorts the rows)
            F.array_min(F.collect_set("by_conn")).alias("conn"),
            _count(ev == "delivered").alias("deliveries"),
            _count((ev == "delivered") & F.col("redelivered")).alias("redeliveries"),
            _count(ev == "acked").alias("acks"),
            _count(ev == "nacked").alias("nacks"),
            _count(timed_out).alias("timeouts"),
        )
    )
    pct = F.percentile_approx("us", [0.99], PERCENTILE_ACCURACY)
    processing = (
        samples.filter(F.col("metric") == "deliver_to_ack")
        .groupBy("vhost", "queue", "consumer")
        .agg(
            F.round(_ms(F.avg("us")), 3).alias("processing_mean_ms"),
            F.round(_ms(pct[0]), 3).alias("processing_p99_ms"),
        )
    )
    queue = Window.partitionBy("vhost", "queue")
    return (
        counts.join(processing, ["vhost", "queue", "consumer"], "left")
        .withColumn("ack_rate", F.round(F.col("acks") / F.col("deliveries"), 4))
        .withColumn("share", F.round(F.col("deliveries") / F.sum("deliveries").over(queue), 4))
        .orderBy("vhost", "queue", F.desc("deliveries"))
    )


def queue_consumers(events: DataFrame) -> DataFrame:
    """Per queue: consumer tags seen, and those whose last word was not a cancellation
    (one that delivered but was added before the trace began counts as live)."""
    ev = F.col("ev")
    seen = events.filter(
        ev.isin("consumer_added", "consumer_cancelled")
        | ((ev == "delivered") & F.col("consumer").isNotNull())
    )
    last = seen.groupBy("vhost", "queue", "consumer").agg(
        F.max_by("ev", F.struct("ts", "n")).alias("last")
    )
    return (
        last.groupBy("vhost", "queue")
        .agg(
            F.count("*").alias("consumers_seen"),
            _count(F.col("last") != "consumer_cancelled").alias("live_consumers"),
        )
        .orderBy("vhost", "queue")  # the same table from any number of partitions
    )


def copies(rows: DataFrame) -> DataFrame:
    """One row per copy: its counts and how it ended; and one per message (queue null) with
    what the publish said. ``rows`` is partitioned by message: no shuffle here."""
    ev = F.col("ev")
    last = F.max_by(F.struct("ev", "reason"), F.struct("ts", "n"))
    outcome = (
        F.when(F.col("last.ev") == "acked", "acked")
        .when(
            F.col("last.ev").isin("dead_lettered", "dropped"),
            F.concat_ws(":", "last.ev", "last.reason"),
        )
        .when(F.col("last.ev") == "expired", "expired")
        .when(F.col("last.ev").isin("delivered", "nacked"), "unacked")
        .when(F.col("last.ev") == "retry_scheduled", "delayed")
        .otherwise("ready")
    )
    origin = ev.isin("published", "adopted")

    def publish(column: str) -> Column:
        return F.first(F.when(origin, F.col(column)), True)

    return (
        rows.groupBy("vhost", "msg", "queue")
        .agg(
            F.min(F.when(ev == "routed", F.col("ts"))).alias("arrived_ts"),
            _count(ev == "delivered").alias("deliveries"),
            _count(ev == "nacked").alias("nacks"),
            _count(ev == "retry_scheduled").alias("retries"),
            _count(
                ev.isin("requeued", "retry_scheduled") & (F.col("why") == "consumer_timeout")
            ).alias("timeouts"),
            _count(ev == "expired").alias("expirations"),
            F.min(
                F.when(
                    ev.isin("requeued", "retry_scheduled") & (F.col("why") == "consumer_timeout"),
                    F.col("ts"),
                )
            ).alias("timed_out_ts"),
            F.max("ts").alias("last_ts"),
            last.alias("last"),
            F.min(F.when(origin, F.col("ts"))).alias("published_ts"),
            publish("exchange").alias("exchange"),
            publish("rk").alias("routing_key"),
            publish("size").alias("size"),
            publish("mid").alias("message_id"),
            publish("cid").alias("correlation_id"),
            F.first(F.when(ev == "published", F.col("conn")), True).alias("publisher"),
            F.max(ev == "adopted").alias("adopted"),
            F.max(
                F.when(
                    ev == "unrouted", F.when(F.col("mandatory"), "returned").otherwise("unroutable")
                )
            ).alias("unrouted"),
        )
        .withColumn("outcome", outcome)
        .drop("last")
    )


def messages(per_copy: DataFrame) -> DataFrame:
    """One row per message: what was published, the path through the queues, the outcome."""
    queued = F.col("queue").isNotNull()
    label = F.concat(
        F.col("queue"),
        F.lit(" ("),
        F.col("outcome"),
        F.when(
            F.col("deliveries") > 0,
            F.concat(F.lit(", delivered "), F.col("deliveries").cast("string"), F.lit("x")),
        ).otherwise(F.lit("")),
        F.when(
            F.col("retries") > 0,
            F.concat(F.lit(", retried "), F.col("retries").cast("string"), F.lit("x")),
        ).otherwise(F.lit("")),
        F.when(
            F.col("timeouts") > 0,
            F.concat(F.lit(", timed out "), F.col("timeouts").cast("string"), F.lit("x")),
        ).otherwise(F.lit("")),
        F.lit(")"),
    )
    final = F.array_join(
        F.array_sort(
            F.array_distinct(
                F.collect_list(
                    F.when(queued & ~F.col("outcome").startswith("dead_lettered"), F.col("outcome"))
                )
            )
        ),
        ",",
    )
    hop_order = F.when(queued, F.coalesce("arrived_ts", F.lit(0))).otherwise(F.lit(-1))
    return (
        per_copy.withColumn("label", label)
        .groupBy("vhost", "msg")
        .agg(
            F.min("published_ts").alias("published_ts"),
            F.first("exchange", True).alias("exchange"),
            F.first("routing_key", True).alias("routing_key"),
            F.first("size", True).alias("size"),
            F.first("message_id", True).alias("message_id"),
            F.first("correlation_id", True).alias("correlation_id"),
            F.first("publisher", True).alias("publisher"),
            F.max("adopted").alias("adopted"),
            F.max("unrouted").alias("unrouted"),
            F.transform(
                F.array_sort(F.collect_list(F.when(queued, F.struct(hop_order, "label")))),
                lambda s: s["label"],
            ).alias("hops"),
            F.collect_list("queue").alias("queues"),
            F.sum("deliveries").alias("deliveries"),
            F.max("deliveries").alias("max_deliveries"),
            F.sum("retries").alias("retries"),
            F.sum("timeouts").alias("timeouts"),
            final.alias("final"),
            F.max_by(F.when(queued, F.col("outcome")), hop_order).alias("last_outcome"),
            F.max(queued & F.col("outcome").startswith("dead_lettered")).alias("dead_lettered"),
            F.max(F.col("expirations") > 0).alias("expired"),
            F.max(queued & F.col("outcome").isin("unacked", "ready", "delayed")).alias(
                "never_acked"
            ),
        )
        .withColumn(
            "path",
            F.coalesce(F.when(F.size("hops") > 0, F.array_join("hops", " -> ")), F.col("unrouted")),
        )
        .withColumn(
            "outcome",
            F.coalesce(
                F.col("unrouted"),
                F.when(F.col("final") != "", F.col("final")),
                F.col("last_outcome"),
            ),
        )
        .withColumn("published", F.timestamp_micros("published_ts"))
        .drop("hops", "final", "last_outcome", "unrouted", "published_ts")
    )


def problems(msgs: DataFrame, max_deliveries: int) -> DataFrame:
    why = F.array_compact(
        F.array(
            F.when(
                F.col("max_deliveries") > max_deliveries,
                F.concat(F.lit("delivered "), F.col("max_deliveries").cast("string"), F.lit("x")),
            ),
            F.when(F.col("dead_lettered"), F.lit("dead_lettered")),
            F.when(F.col("expired"), F.lit("expired")),
            F.when(F.col("never_acked"), F.lit("never_acked")),
            F.when(F.col("outcome").startswith("dropped"), F.col("outcome")),
            F.when(F.col("outcome").isin("unroutable", "returned"), F.col("outcome")),
        )
    )
    return (
        msgs.withColumn("problems", why)
        .filter(F.size("problems") > 0)
        .select(
            "vhost",
            "msg",
            "message_id",
            "correlation_id",
            "published",
            "problems",
            "outcome",
            "deliveries",
            "path",
        )
        .orderBy("published", "msg")
    )


EXAMPLES = 3  # message ids per problem group


def problem_groups(per_copy: DataFrame) -> DataFrame:
    """Problems counted by (vhost, queue, problem, reason): dead_lettered (reason: rejected,
    expired, maxlen, delivery_limit), dropped (the same reasons, no dead-letter exchange),
    expired (a TTL with nowhere to go), timed_out (consumer_timeout), never_acked (reason:
    the copy's state at the end: ready, unacked or delayed) and unroutable (no queue;
    reason: unroutable or returned). Each with its first and last time and the broker's ids
    of its first EXAMPLES messages. A copy counts once per problem it has."""
    queued = F.col("queue").isNotNull()
    outcome = F.col("outcome")

    def problem(condition: Column, name: str, reason: Column, ts: str) -> Column:
        found = F.struct(
            F.lit(name).alias("problem"), reason.alias("reason"), F.col(ts).alias("ts")
        )
        return F.when(condition, found)

    after_colon = F.substring_index(outcome, ":", -1)
    found = F.array_compact(
        F.array(
            problem(
                queued & outcome.startswith("dead_lettered:"),
                "dead_lettered",
                after_colon,
                "last_ts",
            ),
            problem(queued & outcome.startswith("dropped:"), "dropped", after_colon, "last_ts"),
            problem(queued & (outcome == "expired"), "expired", F.lit("ttl"), "last_ts"),
            problem(
                queued & (F.col("timeouts") > 0),
                "timed_out",
                F.lit("consumer_timeout"),
                "timed_out_ts",
            ),
            problem(
                queued & outcome.isin("ready", "unacked", "delayed"),
                "never_acked",
                outcome,
                "last_ts",
            ),
            problem(
                ~queued & F.col("unrouted").isNotNull(),
                "unroutable",
                F.col("unrouted"),
                "published_ts",
            ),
        )
    )
    first = F.array_sort(F.collect_list(F.struct("p.ts", "msg")))
    return (
        per_copy.select("vhost", "queue", "msg", F.explode(found).alias("p"))
        .groupBy(
            "vhost", "queue", F.col("p.problem").alias("problem"), F.col("p.reason").alias("reason")
        )
        .agg(
            F.count("*").alias("messages"),
            F.timestamp_micros(F.min("p.ts")).alias("first"),
            F.timestamp_micros(F.max("p.ts")).alias("last"),
            F.transform(F.slice(first, 1, EXAMPLES), lambda s: s["msg"]).alias("examples"),
        )
        .orderBy(F.desc("messages"), "vhost", "queue", "problem", "reason")
    )


def summary(events: DataFrame, msgs: DataFrame, bucket_seconds: float) -> DataFrame:
    ev = F.col("ev")
    totals = events.agg(
        F.count("*").alias("events"),
        F.timestamp_micros(F.min("ts")).alias("first_event"),
        F.timestamp_micros(F.max("ts")).alias("last_event"),
        F.coalesce(F.max("dropped"), F.lit(0)).alias("trace_events_dropped"),
        _count(ev == "published").alias("published"),
        F.coalesce(
            F.sum(F.when((ev == "confirmed") & F.col("ack"), F.col("seq") - F.col("first") + 1)),
            F.lit(0),
        ).alias("confirmed"),
        _count(ev == "delivered").alias("deliveries"),
        _count(ev == "acked").alias("acks"),
        _count(ev == "consumer_timed_out").alias("consumer_timeouts"),
    )
    outcomes = msgs.agg(
        F.count("*").alias("messages"),
        _count(F.col("outcome") == "acked").alias("messages_acked"),
        _count(F.col("dead_lettered")).alias("messages_dead_lettered"),
        _count(F.col("expired")).alias("messages_expired"),
        _count(F.col("never_acked")).alias("messages_never_acked"),
        _count(F.col("outcome").isin("unroutable", "returned")).alias("messages_unroutable"),
    )
    # the bucket queue_minute used: the report fills the buckets nothing happened in
    return totals.crossJoin(outcomes).withColumn("bucket_seconds", F.lit(float(bucket_seconds)))


# the cached tables in plain columns: compressing them (choosing an encoding per column
# and batch, then encoding and decoding) took a fifth of the executors' CPU
JOB_SETTINGS = {"spark.sql.inMemoryColumnarStorage.compressed": "false"}


def analyse(
    events: DataFrame,
    bucket_seconds: float | None = None,
    max_deliveries: int = 3,
    partitions: int | None = None,
) -> Tables:
    """All tables; ``events`` is what :func:`load_events` returns."""
    # no adaptive re-planning: a cached table planned adaptively does not tell its
    # partitioning, so each table made from ``rows`` (partitioned by message) would shuffle
    # it again, twice, and sort it (a runtime setting; small traces' sessions have it off)
    events.sparkSession.conf.set("spark.sql.adaptive.enabled", "false")
    for key, value in JOB_SETTINGS.items():
        events.sparkSession.conf.set(key, value)
    # the parsed trace is read by three tables: load_events keeps JSON lines parsed on
    # local disk; Parquet is read again, only the columns each read needs, for less CPU
    # than a cache of every column costs (54 s of 579 for 10,483,565 events)
    rows = copy_events(events, partitions).persist(StorageLevel.MEMORY_AND_DISK)
    # not cached: three reads of a few of the rows' columns cost less than a cache of
    # millions of samples
    samples = latency_samples(rows)
    per_copy = copies(rows).persist(StorageLevel.MEMORY_AND_DISK)
    msgs = messages(per_copy).persist(StorageLevel.MEMORY_AND_DISK)
    if bucket_seconds is None:
        bucket_seconds = auto_bucket(events)
    return Tables(
        queue_minute=queue_minute(rows, bucket_seconds),
        queue_latency=samples.groupBy("vhost", "queue", "metric")
        .agg(*_percentiles(F.col("us")))
        .orderBy("vhost", "queue", "metric"),
        consumer_latency=samples.groupBy("vhost", "queue", "consumer", "metric")
        .agg(*_percentiles(F.col("us")))
        .orderBy("vhost", "queue", "consumer", "metric"),
        consumers=consumers(rows, samples),
        queue_consumers=queue_consumers(events),
        messages=msgs,
        problems=problems(msgs, max_deliveries),
        problem_groups=problem_groups(per_copy),
        summary=summary(events, msgs, bucket_seconds),
    )


def write(
    tables: Tables,
    out: str,
    here: bool = False,
    early: tuple[Collection[str], Callable[[], object]] | None = None,
) -> dict[str, str]:
    """Each table as Parquet under ``out``; small ones as a single file.

    ``here``: a small trace's tables, collected as Arrow and written by this process (a
    local ``out``): a Spark write job costs a second of commit protocol on the driver,
    for a table of a few kilobytes. ``early``: (names, then): ``then`` runs once those
    tables are written, while the others are (with ``here``; else after all of them)."""
    names, then = early or ((), lambda: None)
    order = sorted(tables.items(), key=lambda item: item[0] not in names)
    paths = {name: os.path.join(out, name) for name, _ in order}
    if here and hasattr(tables.summary, "toArrow"):  # PySpark 4
        # one thread collects the tables while this one runs ``then``; three threads
        # collecting concurrently (one table's planning during another's job) measured
        # no faster on 2 cores, and no cheaper (docs/tracing.md)
        with ThreadPoolExecutor(1, thread_name_prefix="warren-table") as pool:
            done = {name: pool.submit(_write_here, frame, paths[name]) for name, frame in order}
            for name in names:
                done[name].result()
            then()
            for future in done.values():
                future.result()
        return paths
    for name, frame in order:
        if name != "messages":
            frame = frame.coalesce(1)
        frame.write.mode("overwrite").parquet(paths[name])
    then()
    return paths


def _write_here(frame: DataFrame, path: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = frame.toArrow()
    for i, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type):
            # as Spark writes a timestamp (INT96, read back as naive nanoseconds in UTC):
            # the same tables whichever wrote them
            ns = pa.timestamp("ns")
            table = table.set_column(i, field.with_type(ns), table.column(i).cast(ns))
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    pq.write_table(
        table, os.path.join(path, "part-00000.parquet"), use_deprecated_int96_timestamps=True
    )


def message_events(events: DataFrame, key: str) -> DataFrame:
    """Every event of the message(s) whose broker id, message-id or correlation-id is ``key``."""
    match = (F.col("mid") == key) | (F.col("cid") == key)
    if key.isdigit():
        match = match | (F.col("msg") == int(key))
    ids = events.filter(match).select("vhost", "msg").distinct()
    timed_out = events.filter(F.col("ev") == "consumer_timed_out").select(
        "*", F.explode("msgs").alias("timed_out_msg")
    )
    direct = events.join(ids, ["vhost", "msg"])
    via_timeout = (
        timed_out.join(ids.withColumnRenamed("msg", "timed_out_msg"), ["vhost", "timed_out_msg"])
        .withColumn("msg", F.col("timed_out_msg"))
        .drop("timed_out_msg")
    )
    return direct.unionByName(via_timeout).orderBy("msg", "ts", "n")
