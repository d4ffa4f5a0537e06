"""The PySpark job (pipeline/) on a real broker's trace and on a generated one.

One SparkSession serves the module (local[2], tuned for start-up: small data, short JVM).
The first test drives a scenario with real clients against a tracing broker and checks the
job's numbers against what the scenario did; the second checks the job's aggregates
against a plain-Python computation (tests/trace_reference.py) over a generated trace.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.trace_reference import load, nearest_rank, reference
from warren.broker.testkit import RunningBroker, run_broker
from warren.broker.tracing import format as trace_format
from warren.pipeline import cli, generate, report

# JIT and code generation cost more than they save on a few thousand events
FAST_START = {
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.codegen.wholeStage": "false",
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
}
QUORUM = {"x-queue-type": "quorum"}
TO_DEAD = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"}


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from warren.pipeline.job import spark_session

    session = spark_session("local[2]", "1g", 2, conf=FAST_START)
    yield session
    session.stop()


def totals(tables: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    return {q["queue"]: q for q in report.queue_rows(tables)}


def _props(mid: str) -> pika.BasicProperties:
    return pika.BasicProperties(message_id=mid)


def _wait(condition: Any, conn: pika.BlockingConnection | None = None, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        if conn is not None:
            conn.process_data_events(0.02)
        else:
            time.sleep(0.02)


def scenario(broker: RunningBroker) -> dict[str, Any]:
    """Publishes, acks, nacks, a consumer timeout, TTL expiry, retries, dead-lettering."""
    seen: dict[str, Any] = {"slow_work_ms": []}
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.queue_declare("dead", durable=True)
    ch.queue_declare("orders", durable=True)
    ch.queue_declare("emails", durable=True)
    ch.queue_declare("payments", durable=True, arguments={**QUORUM, "x-consumer-timeout": 150})
    ch.queue_declare("ttl", durable=True, arguments={"x-message-ttl": 50, **TO_DEAD})
    ch.queue_declare(
        "retry",
        durable=True,
        arguments={
            **QUORUM,
            **TO_DEAD,
            "x-delayed-retry-type": "failed",
            "x-delayed-retry-min": 30,
            "x-delivery-limit": 1,
        },
    )
    ch.queue_declare("rejects", arguments=TO_DEAD, durable=True)
    ch.confirm_delivery()
    for i in range(20):
        ch.basic_publish("", "orders", b"order", _props(f"o-{i}"))
    for i in range(10):
        ch.basic_publish("", "emails", b"email", _props(f"e-{i}"))
    ch.basic_publish("", "payments", b"pay", _props("p-0"))
    for i in range(3):
        ch.basic_publish("", "ttl", b"short-lived", _props(f"t-{i}"))
    for i in range(2):
        ch.basic_publish("", "retry", b"flaky", _props(f"r-{i}"))
    ch.basic_publish("", "rejects", b"bad", _props("x-0"))
    plain = conn.channel()
    plain.basic_publish("", "nowhere", b"lost", _props("u-0"), mandatory=True)

    # orders: two consumers, one acks at once, one works 40 ms per message
    work = conn.channel()
    work.basic_qos(prefetch_count=1)
    acked = []

    def fast(c: Any, m: Any, p: Any, b: bytes) -> None:
        c.basic_ack(m.delivery_tag)
        acked.append(p.message_id)

    def slow(c: Any, m: Any, p: Any, b: bytes) -> None:
        started = time.monotonic()
        time.sleep(0.04)
        # measured before the ack is sent: the broker's deliver-to-ack spans at least this,
        # however late this thread runs again after sending it
        seen["slow_work_ms"].append((time.monotonic() - started) * 1000)
        c.basic_ack(m.delivery_tag)
        acked.append(p.message_id)

    work.basic_consume("orders", fast, consumer_tag="fast")
    work.basic_consume("orders", slow, consumer_tag="slow")
    _wait(lambda: len(acked) == 20, conn)

    # emails: the first delivery of every even message is nacked and requeued
    nacked: set[str] = set()

    def flaky(c: Any, m: Any, p: Any, b: bytes) -> None:
        n = int(p.message_id[2:])
        if n % 2 == 0 and p.message_id not in nacked:
            nacked.add(p.message_id)
            c.basic_nack(m.delivery_tag, requeue=True)
        else:
            c.basic_ack(m.delivery_tag)
            acked.append(p.message_id)

    work.basic_consume("emails", flaky, consumer_tag="flaky")
    _wait(lambda: len(acked) == 30, conn)

    # retry: r-0 is rejected until the delivery limit dead-letters it, r-1 once then acked
    failures: dict[str, int] = {}

    def retrying(c: Any, m: Any, p: Any, b: bytes) -> None:
        failures[p.message_id] = failures.get(p.message_id, 0) + 1
        if p.message_id == "r-1" and failures["r-1"] == 2:
            c.basic_ack(m.delivery_tag)
            acked.append(p.message_id)
        else:
            # a reject counts toward a quorum queue's delivery limit, a nack does not
            # (RabbitMQ 4.3, rabbit_channel.erl; tests/test_delivery_limit.py)
            c.basic_reject(m.delivery_tag, requeue=True)

    work.basic_consume("retry", retrying, consumer_tag="retrier")
    _wait(lambda: failures.get("r-0") == 2 and "r-1" in acked, conn)

    # rejects: rejected without requeue
    method, _, _ = ch.basic_get("rejects")
    ch.basic_reject(method.delivery_tag, requeue=False)

    # payments: a consumer that never acks times out; another takes the message after
    sleepy = pika.BlockingConnection(pika.URLParameters(broker.url))
    sleepy.channel().basic_consume("payments", lambda *a: None, consumer_tag="sleepy")
    _wait(lambda: broker.queue_counts("payments").ready == 1, sleepy)
    work.basic_consume("payments", fast, consumer_tag="rescuer")
    _wait(lambda: "p-0" in acked, conn)
    sleepy.close()

    # dead: everything dead-lettered (3 expired, 1 over the delivery limit, 1 rejected)
    _wait(lambda: broker.queue_depth("dead") == 5, conn)
    work.basic_consume("dead", fast, consumer_tag="dlq")
    _wait(lambda: len(acked) == 38 - 3 + 3 - 1, conn)  # 34 acks, t-* and r-0 in dead
    conn.close()
    return seen


def test_the_job_on_a_real_broker(spark: Any, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    # small files: deliveries and their acks fall in different ones, which the job reads
    # apart (pipeline/job.py load_events)
    with run_broker(trace_enabled=True, trace_dir=str(trace), trace_rotate_size=1500) as broker:
        seen = scenario(broker)
    files = list(trace.glob("warren-trace-*.wtrace"))
    alone = [json.loads(line) for f in files for line in trace_format.file_lines(f.read_bytes())]
    assert any(e["ev"] == "acked" and "msg" not in e for e in alone)
    out = tmp_path / "report"
    cli.run(spark, str(trace), str(out), bucket_seconds=60, max_deliveries=1)
    tables = report.read_tables(str(out))
    q = totals(tables)
    fields = (
        "published",
        "delivered",
        "redelivered",
        "acked",
        "nacked",
        "requeued",
        "retried",
        "timed_out",
        "expired",
        "dead_lettered",
        "dropped",
        "ready",
        "unacked",
    )
    expected = {
        "orders": (20, 20, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        "emails": (10, 15, 5, 10, 5, 5, 0, 0, 0, 0, 0, 0, 0),
        "payments": (1, 2, 1, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0),
        "ttl": (3, 0, 0, 0, 0, 0, 0, 0, 3, 3, 0, 0, 0),
        "retry": (2, 4, 2, 1, 3, 0, 2, 0, 0, 1, 0, 0, 0),
        "rejects": (1, 1, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0),
        "dead": (5, 5, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0),
    }
    assert {name: tuple(q[name][f] for f in fields) for name in expected} == expected
    assert q["ttl"]["dead_lettered_expired"] == 3
    assert q["retry"]["dead_lettered_delivery_limit"] == 1
    assert q["rejects"]["dead_lettered_rejected"] == 1

    consumers = {(c["queue"], c["consumer"]): c for c in tables["consumers"]}
    assert consumers[("orders", "fast")]["deliveries"] == 10
    assert consumers[("orders", "slow")]["deliveries"] == 10
    assert consumers[("orders", "slow")]["share"] == 0.5
    assert consumers[("emails", "flaky")]["ack_rate"] == round(10 / 15, 4)
    assert (
        consumers[("payments", "sleepy")]["timeouts"],
        consumers[("payments", "sleepy")]["acks"],
    ) == (1, 0)
    assert consumers[("payments", "rescuer")]["acks"] == 1

    # latencies: the broker's view of the slow consumer's work, against the client's
    latency = {(r["queue"], r["consumer"], r["metric"]): r for r in tables["consumer_latency"]}
    slow = latency[("orders", "slow", "deliver_to_ack")]
    client = sorted(seen["slow_work_ms"])
    assert slow["count"] == 10
    assert client[4] - 1 <= slow["p50_ms"] <= client[4] + 25
    assert client[-1] - 1 <= slow["max_ms"] <= client[-1] + 25
    pay = {r["metric"]: r for r in tables["queue_latency"] if r["queue"] == "payments"}
    assert 150 <= pay["publish_to_ack"]["max_ms"] < 1500  # held through the 150 ms timeout

    summary = tables["summary"][0]
    assert (summary["messages"], summary["published"], summary["confirmed"]) == (38, 38, 37)
    assert summary["messages_unroutable"] == 1 and summary["consumer_timeouts"] == 1
    assert summary["trace_events_dropped"] == 0
    problems = {p["message_id"]: p for p in tables["problems"]}
    assert set(problems) == {
        "e-0",
        "e-2",
        "e-4",
        "e-6",
        "e-8",
        "p-0",
        "r-0",
        "r-1",
        "t-0",
        "t-1",
        "t-2",
        "x-0",
        "u-0",
    }
    assert problems["t-1"]["path"] == "ttl (dead_lettered:expired) -> dead (acked, delivered 1x)"
    assert problems["t-1"]["problems"] == ["dead_lettered", "expired"]
    assert problems["r-0"]["path"] == (
        "retry (dead_lettered:delivery_limit, delivered 2x, retried 1x) -> "
        "dead (acked, delivered 1x)"
    )
    assert problems["p-0"]["path"] == "payments (acked, delivered 2x, timed out 1x)"
    assert problems["u-0"]["outcome"] == "returned"
    # grouped: each kind of problem once per queue and reason, with the first messages
    mid = {p["msg"]: p["message_id"] for p in tables["problems"]}
    groups = {
        (g["queue"], g["problem"], g["reason"]): (
            g["messages"],
            sorted(mid[m] for m in g["examples"]),
        )
        for g in tables["problem_groups"]
    }
    assert groups == {
        ("ttl", "dead_lettered", "expired"): (3, ["t-0", "t-1", "t-2"]),
        ("retry", "dead_lettered", "delivery_limit"): (1, ["r-0"]),
        ("rejects", "dead_lettered", "rejected"): (1, ["x-0"]),
        ("payments", "timed_out", "consumer_timeout"): (1, ["p-0"]),
        (None, "unroutable", "returned"): (1, ["u-0"]),
    }
    for g in tables["problem_groups"]:
        assert summary["first_event"] <= g["first"] <= g["last"] <= summary["last_event"]
    html = (out / "report.html").read_text()
    ttl = next(g for g in tables["problem_groups"] if g["queue"] == "ttl")
    assert f'<a href="#msg-{ttl["examples"][0]}"' in html  # to the message's own row
    assert f'id="msg-{ttl["examples"][0]}"' in html
    assert "data:image/png;base64," in html and "consumer timed out" not in html
    assert "1 delivery timed out" in html  # the payments queue's diagnosis


def test_message_history(spark: Any, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    generate.generate(str(trace), 200, seed=3)
    from warren.pipeline import job

    events = job.load_events(spark, str(trace))
    rows = [r.asDict() for r in job.message_events(events, "m-7").collect()]
    assert rows[0]["ev"] == "published" and rows[0]["mid"] == "m-7"
    assert rows[1]["ev"] == "routed"
    assert [r["ts"] for r in rows] == sorted(r["ts"] for r in rows)
    assert {r["msg"] for r in rows} == {rows[0]["msg"]}
    assert job.message_events(events, str(rows[0]["msg"])).count() == len(rows)


def test_events_that_share_a_time_keep_the_stream_order(spark: Any, tmp_path: Path) -> None:
    """A nack with requeue, and the redelivery it makes room for, happen in one event-loop
    iteration and share one time (broker/tracing/events.py TraceClock): the job orders them
    as the broker wrote them, not by a guess from their names."""
    trace = tmp_path / "trace"
    with run_broker(trace_enabled=True, trace_dir=str(trace)) as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        ch.queue_declare("again", durable=True)
        ch.basic_qos(prefetch_count=1)
        ch.basic_publish("", "again", b"x", _props("m-again"))
        seen: list[bool] = []

        def on_message(chan: Any, method: Any, _: Any, __: bytes) -> None:
            seen.append(method.redelivered)
            if method.redelivered:
                chan.basic_ack(method.delivery_tag)
            else:
                chan.basic_nack(method.delivery_tag, requeue=True)

        ch.basic_consume("again", on_message)
        _wait(lambda: len(seen) == 2, conn)
        ch.queue_declare("again", passive=True)  # the ack is in
        conn.close()
        broker.call(broker.server.broker.tracing.flush)
    from warren.pipeline import job

    events = job.load_events(spark, str(trace))
    rows = [r.asDict() for r in job.message_events(events, "m-again").collect()]
    evs = [r["ev"] for r in rows]
    assert evs == ["published", "routed", "delivered", "nacked", "requeued", "delivered", "acked"]
    assert rows[3]["ts"] == rows[4]["ts"] == rows[5]["ts"]  # one iteration: one time
    copy = job.copy_events(events).filter("queue = 'again'").orderBy("ts", "n").collect()
    assert [(r["ev"], r["prev"], r["state"]) for r in copy] == [
        ("routed", "none", "ready"),
        ("delivered", "ready", "unacked"),
        ("nacked", "unacked", "unacked"),
        ("requeued", "unacked", "ready"),
        ("delivered", "ready", "unacked"),
        ("acked", "unacked", "gone"),
    ]


@pytest.mark.parametrize("parsed_by", ["spark", "pyarrow"])
def test_the_job_against_plain_python(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parsed_by: str
) -> None:
    from warren.pipeline import job

    if parsed_by == "pyarrow":  # as a trace of ARROW_BYTES or more is read
        monkeypatch.setattr(job, "ARROW_BYTES", 0)
    trace = tmp_path / "trace"
    generate.generate(str(trace), 3000, seed=7, per_file=4000)
    assert len(list(trace.glob("warren-trace-*"))) > 2
    out = tmp_path / "report"
    cli.run(spark, str(trace), str(out), bucket_seconds=60, max_deliveries=3)
    tables = report.read_tables(str(out))
    ref = reference(load(trace))
    q = totals(tables)
    assert set(q) == set(ref["queues"])
    for name, counts in ref["queues"].items():
        got = q[name]
        for field, ref_field in (
            ("published", "routed"),
            ("delivered", "delivered"),
            ("redelivered", "redelivered"),
            ("acked", "acked"),
            ("nacked", "nacked"),
            ("requeued", "requeued"),
            ("retried", "retry_scheduled"),
            ("timed_out", "timed_out"),
            ("expired", "expired"),
            ("dead_lettered", "dead_lettered"),
            ("ready", "depth_ready"),
            ("unacked", "depth_unacked"),
        ):
            assert got[field] == counts[ref_field], (name, field)
        for reason in ("expired", "rejected", "delivery_limit"):
            assert got[f"dead_lettered_{reason}"] == counts[f"dead_lettered_{reason}"]
    for c in tables["consumers"]:
        counts = ref["consumers"][(c["queue"], c["consumer"])]
        assert (c["deliveries"], c["acks"], c["timeouts"]) == (
            counts["deliveries"],
            counts["acks"],
            counts["timeouts"],
        )
        samples = ref["processing"][(c["queue"], c["consumer"])]
        assert c["processing_mean_ms"] == pytest.approx(
            sum(samples) / len(samples) / 1000, abs=0.002
        )
        assert c["processing_p99_ms"] == pytest.approx(nearest_rank(samples, 0.99), rel=0.01)
    assert len(tables["consumers"]) == len(ref["consumers"])
    for row in tables["queue_latency"]:
        if row["metric"] == "deliver_to_ack":
            samples = ref["processing_by_queue"][row["queue"]]
            assert row["count"] == len(samples)
            assert row["p50_ms"] == pytest.approx(nearest_rank(samples, 0.5), rel=0.01)
            assert row["p95_ms"] == pytest.approx(nearest_rank(samples, 0.95), rel=0.01)
            assert row["max_ms"] == max(samples) / 1000
    dead = {
        (g["queue"], g["reason"]): g["messages"]
        for g in tables["problem_groups"]
        if g["problem"] == "dead_lettered"
    }
    for name, counts in ref["queues"].items():
        for reason in ("expired", "rejected", "delivery_limit"):
            assert dead.get((name, reason), 0) == counts[f"dead_lettered_{reason}"]
    summary = tables["summary"][0]
    assert summary["messages"] == ref["messages"] == 3000
    assert summary["messages_unroutable"] == ref["unroutable"]


def test_pyarrow_reads_the_events_spark_reads(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From ARROW_BYTES of trace the driver parses the lines with pyarrow into Parquet: the
    same events as Spark's JSON reader, a line cut short by a live broker dropped by both,
    and a line pyarrow cannot take as Spark does leaves the trace to Spark."""
    from warren.pipeline import job

    trace = tmp_path / "trace"
    generate.generate(str(trace), 300, seed=5, per_file=500)
    last = sorted(trace.glob("warren-trace-*"))[-1]
    with last.open("a") as f:
        f.write('{"ts":1767225600000001,"ev":"delivered","vhost":"/","queue":"or')

    def read() -> tuple[set[str], list[tuple[Any, ...]]]:
        events = job.load_events(spark, str(trace))
        rows = sorted(tuple(r) for r in events.collect())
        scratch = job._scratch[-1]
        forms = {name.rsplit(".", 1)[-1] for name in os.listdir(scratch)}
        job.cleanup()
        return forms, rows

    forms, by_spark = read()
    assert forms == {"json"}
    monkeypatch.setattr(job, "ARROW_BYTES", 0)
    forms, by_pyarrow = read()
    assert forms == {"parquet"}
    assert by_pyarrow == by_spark
    assert len(by_spark) == sum(len(f.read_text().splitlines()) for f in trace.iterdir()) - 1
    with last.open("a") as f:  # a number where a string belongs: Spark's reader decides
        f.write('\n{"ts":1767225600000002,"ev":"published","vhost":"/","rk":5}\n')
    forms, mixed = read()
    assert forms == {"json"}
    assert len(mixed) == len(by_spark) + 1


def test_a_big_trace_is_parsed_file_by_file(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From LOCAL_DECODE_BYTES of trace the driver parses each file with pyarrow into a
    Parquet file of its own (the lines' numbers as "n"): the same events as Spark's JSON
    reader on Python workers' decoding, a file with a line cut short parsed line by line;
    the tables are written by Spark, and a line pyarrow cannot take leaves the trace to
    Spark's reader."""
    from warren.pipeline import job

    trace = tmp_path / "trace"
    generate.generate(str(trace), 300, seed=5, per_file=500)
    last = sorted(trace.glob("warren-trace-*"))[-1]
    with last.open("a") as f:
        f.write('{"ts":1767225600000001,"ev":"delivered","vhost":"/","queue":"or')

    def read() -> tuple[list[str], list[tuple[Any, ...]], bool]:
        events = job.load_events(spark, str(trace))
        rows = sorted(tuple(r) for r in events.collect())
        names = sorted(os.listdir(job._scratch[-1]))
        here = job.small(str(trace), str(tmp_path / "out"))
        job.cleanup()
        return names, rows, here

    monkeypatch.setattr(job, "LOCAL_DECODE_BYTES", 0)
    monkeypatch.setattr(job, "ARROW_BYTES", 1 << 40)  # pyarrow never: Spark's reader
    names, by_spark, _ = read()
    assert names == []
    monkeypatch.setattr(job, "ARROW_BYTES", 0)
    names, by_pyarrow, here = read()
    files = len(list(trace.glob("warren-trace-*")))
    assert files > 2 and names == sorted(f"{i}.parquet" for i in range(files))
    assert not here
    assert by_pyarrow == by_spark
    assert len(by_spark) == sum(len(f.read_text().splitlines()) for f in trace.iterdir()) - 1
    with last.open("a") as f:  # a number where a string belongs: Spark's reader decides
        f.write('\n{"ts":1767225600000002,"ev":"published","vhost":"/","rk":5}\n')
    names, mixed, _ = read()
    assert names == []
    assert len(mixed) == len(by_spark) + 1


def test_render_and_queue_diagnosis(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--render redraws the report from the tables alone, without Spark; --queue explains."""
    trace = tmp_path / "trace"
    generate.generate(str(trace), 300, seed=5)
    out = tmp_path / "report"
    cli.run(spark, str(trace), str(out))
    (out / "report.html").unlink()
    args = ["--trace", str(trace), "--out", str(out), "--render", "--queue", "orders"]
    assert cli.main(args) == 0
    printed = capsys.readouterr().out
    assert "consumer c-orders-slow" in printed and "is slow" in printed
    assert (out / "report.html").exists()


def test_short_trace_report(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trace a second long: sub-second buckets on an axis of the trace's own range,
    ids as --message takes them, counted nouns, and a queue nobody consumes named first."""
    trace = tmp_path / "trace"
    with run_broker(trace_enabled=True, trace_dir=str(trace)) as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        for name in ("idle", "work"):
            ch.queue_declare(name, durable=True)
        for i in range(3):
            ch.basic_publish("", "idle", b"x", _props(f"i-{i}"))
        ch.basic_publish("", "work", b"x", _props("w-0"))
        got: list[int] = []
        tag = ch.basic_consume("work", lambda c, m, p, b: got.append(m.delivery_tag))
        _wait(lambda: got, conn)
        ch.basic_ack(got[0])
        ch.basic_cancel(tag)
        # spread the trace over about a second: the test is about a short trace's time axis
        time.sleep(0.6)
        for i in range(2):
            ch.basic_publish("", "work", b"x", _props(f"w-{i + 1}"))
        conn.close()
    out = tmp_path / "report"
    cli.run(spark, str(trace), str(out))
    tables = report.read_tables(str(out))
    summary = tables["summary"][0]
    span = summary["last_event"] - summary["first_event"]
    assert 0.5 < span.total_seconds() < 10
    start, end = report.time_axis(tables)
    assert end == summary["last_event"]
    work = [r for r in tables["queue_minute"] if r["queue"] == "work"]
    assert len(work) >= 2  # more than one point per series
    assert 0 < summary["bucket_seconds"] < 1  # chosen from the trace's length
    step = report.bucket_length(tables)
    assert step is not None and step.total_seconds() == summary["bucket_seconds"]
    assert timedelta(0) <= summary["first_event"] - start < step  # the first bucket's start
    # the job writes only busy buckets; the chart draws the quiet ones between them as zeros
    filled = report._with_empty_buckets(work, step)
    assert len(filled) > len(work)
    assert all(b["minute"] - a["minute"] <= step * 1.5 for a, b in itertools.pairwise(filled))
    assert all(start <= r["minute"] <= end for r in tables["queue_minute"])

    q = totals(tables)
    idle_notes = report.diagnose(q["idle"], [])
    assert idle_notes[0].startswith("3 messages ready and no consumer at the end of the trace:")
    work_notes = report.diagnose(q["work"], [])
    assert work_notes[0].startswith("2 messages ready and no consumer at the end of the trace")
    assert "(every consumer it had was cancelled)" in work_notes[0]

    html = (out / "report.html").read_text()
    ids = [p["msg"] for p in tables["problems"]]
    assert ids and all(id_ > 999 for id_ in ids)
    for id_ in ids:
        assert f">{id_}<" in html and f"{id_:,}" not in html
    print(report.terminal_summary(tables, "work"))
    printed = capsys.readouterr().out
    assert ": 1 delivery (100%)" in printed and "0 timeouts" in printed
    assert "1 deliveries" not in printed


def test_without_the_pipeline_extra_one_line_and_exit_2(tmp_path: Path) -> None:
    import subprocess
    import sys

    # as if pyspark were not installed: an import of it fails, find_spec finds nothing
    code = (
        "import sys; sys.modules['pyspark'] = None\n"
        "from warren.pipeline.cli import main\n"
        f"sys.exit(main(['--trace', {str(tmp_path)!r}, '--out', {str(tmp_path / 'r')!r}]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.splitlines() == [
        "warren-report: needs pyspark; install them with: pip install 'warren[pipeline]' "
        "(and Java 17+ for Spark)"
    ]


def test_serve_answers_two_reports_on_one_session(spark: Any, tmp_path: Path) -> None:
    """warren-report --serve's loop: two traces through one warm session, each report's
    counts exact; a line that is not a report's arguments is answered and skipped."""
    import io

    made = {}
    for name, messages, seed in (("a", 150, 3), ("b", 250, 4)):
        made[name] = generate.generate(str(tmp_path / name), messages, seed=seed)
    lines = [
        f"--trace {tmp_path / 'a'} --out {tmp_path / 'ra'}\n",
        "--no-such-option\n",
        "\n",
        f"--trace {tmp_path / 'b'} --out {tmp_path / 'rb'} --queue orders\n",
        "quit\n",
        f"--trace {tmp_path / 'a'} --out {tmp_path / 'never'}\n",
    ]
    out = io.StringIO()
    assert cli.serve(spark, lines, out) == 1
    answer = out.getvalue().splitlines()
    assert answer[0] == "ready"
    assert [line for line in answer if line == "done" or line.startswith("error:")] == [
        "done",
        "error: not a report's arguments: --no-such-option",
        "done",
    ]
    assert f"report: {tmp_path / 'ra'}/report.html" in answer
    assert f"report: {tmp_path / 'rb'}/report.html" in answer
    assert not (tmp_path / "never").exists()
    for name, messages in (("a", 150), ("b", 250)):
        tables = report.read_tables(str(tmp_path / f"r{name}"))
        summary = tables["summary"][0]
        assert (summary["events"], summary["messages"]) == (made[name], messages)
        ref = reference(load(tmp_path / name))
        q = totals(tables)
        assert {n: q[n]["published"] for n in q} == {
            n: c["routed"] for n, c in ref["queues"].items()
        }
        assert {n: q[n]["acked"] for n in q} == {n: c["acked"] for n, c in ref["queues"].items()}
