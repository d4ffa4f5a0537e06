"""Message-lifecycle tracing in the broker: the events a real client's actions produce.

Each test starts a broker with tracing on and its own trace directory, drives it with
pika (or a raw socket where a client must vanish), flushes the writer and reads the
NDJSON lines back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from pamqp import commands

from tests.amqp_raw import (
    FRAME_METHOD,
    RawClient,
    build,
    frame_bytes,
    method_payload,
    publish_frames,
)
from warren.broker.testkit import RunningBroker, run_broker
from warren.broker.tracing import format as trace_format
from warren.broker.tracing import handover as trace_writer
from warren.broker.tracing import schema
from warren.config import ConfigError, parse_config

ROOT = Path(__file__).resolve().parent.parent
QUORUM = {"x-queue-type": "quorum"}


def read_trace(broker: RunningBroker, directory: Path) -> list[dict[str, Any]]:
    broker.call(broker.server.broker.tracing.flush)
    return read_lines(directory)


def read_lines(directory: Path) -> list[dict[str, Any]]:
    events = trace_format.events(str(directory))
    for event in events:
        conforms(event)
    return events


_JSON_TYPES: dict[str, Any] = {
    schema.LONG: int,
    schema.INT: int,
    schema.STRING: str,
    schema.BOOL: bool,
    schema.STRINGS: list,
    schema.LONGS: list,
}
SEEN: set[str] = set()  # the events the tracing tests have decoded (see the last test)


def conforms(event: dict[str, Any]) -> None:
    """A decoded line has exactly its event's declared fields (broker/tracing/schema.py)."""
    declared = schema.BY_NAME[event["ev"]]
    required = {*schema.COMMON, *declared.fields} - set(declared.optional)
    assert required <= event.keys() <= {*schema.COMMON, *declared.fields}, event
    for name, value in event.items():
        kind = schema.FIELDS[name]
        assert value is None or isinstance(value, _JSON_TYPES[kind]), (name, event)
        if kind in (schema.STRINGS, schema.LONGS):
            inner = str if kind == schema.STRINGS else int
            assert all(isinstance(v, inner) for v in value), (name, event)
    SEEN.add(event["ev"])


def test_the_docs_table_is_the_declaration() -> None:
    docs = (Path(__file__).parent.parent / "docs" / "tracing.md").read_text()
    assert schema.markdown_table() in docs


def of(events: list[dict[str, Any]], ev: str, **match: Any) -> list[dict[str, Any]]:
    return [e for e in events if e["ev"] == ev and all(e.get(k) == v for k, v in match.items())]


def history(events: list[dict[str, Any]], msg: int) -> list[str]:
    return [f"{e['ev']}:{e.get('queue') or ''}" for e in events if e.get("msg") == msg]


@pytest.fixture
def trace_dir(tmp_path: Path) -> Path:
    return tmp_path / "trace"


@pytest.fixture
def traced(trace_dir: Path) -> Iterator[RunningBroker]:
    with run_broker(trace_enabled=True, trace_dir=str(trace_dir)) as broker:
        yield broker


def connect(broker: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(broker.url))


def test_off_unless_configured(trace_dir: Path) -> None:
    # record=False: the test kit's recorder would sit on the same hook (broker/testkit/recorder.py)
    with run_broker(trace_dir=str(trace_dir), record=False) as broker:
        conn = connect(broker)
        ch = conn.channel()
        ch.queue_declare("q", durable=True)
        ch.basic_publish("", "q", b"x")
        assert ch.basic_get("q", auto_ack=True)[2] == b"x"
        conn.close()
        assert broker.call(lambda: broker.server.broker.vhosts["/"].tracer) is None
    assert not trace_dir.exists()


def test_one_message_from_publish_to_ack(traced: RunningBroker, trace_dir: Path) -> None:
    conn = connect(traced)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("orders", durable=True)
    before = time.time()
    props = pika.BasicProperties(message_id="order-1", correlation_id="c-9", delivery_mode=2)
    ch.basic_publish("", "orders", b"hello", props)
    got = []
    ch.basic_consume("orders", lambda c, m, p, b: got.append(m.delivery_tag), consumer_tag="ct1")
    while not got:
        conn.process_data_events(0.05)
    ch.basic_ack(got[0])
    conn.close()
    events = read_trace(traced, trace_dir)
    published = of(events, "published")[0]
    msg = published["msg"]
    assert history(events, msg) == ["published:", "routed:", "delivered:orders", "acked:orders"]
    assert {k: published[k] for k in ("exchange", "rk", "size", "mid", "cid", "persistent")} == {
        "exchange": "",
        "rk": "orders",
        "size": 5,
        "mid": "order-1",
        "cid": "c-9",
        "persistent": True,
    }
    assert published["seq"] == 1 and published["ch"] == 1
    assert published["conn"].startswith("127.0.0.1:")
    assert of(events, "routed", msg=msg)[0]["queues"] == ["orders"]
    confirmed = of(events, "confirmed")[0]
    assert (confirmed["first"], confirmed["seq"], confirmed["ack"]) == (1, 1, True)
    delivered = of(events, "delivered", msg=msg)[0]
    assert delivered["consumer"] == "ct1" and delivered["tag"] == 1
    assert delivered["redelivered"] is False and delivered["conn"] == published["conn"]
    assert of(events, "acked", msg=msg)[0]["consumer"] == "ct1"
    assert of(events, "consumer_added", queue="orders")[0]["consumer"] == "ct1"
    assert of(events, "consumer_cancelled", consumer="ct1")[0]["why"] == "client"  # pika cancels
    times = [e["ts"] for e in events]
    assert times == sorted(times)
    assert before - 1 < published["ts"] / 1e6 < time.time() + 1  # wall clock, microseconds


def test_what_one_loop_iteration_handled_shares_one_time(
    traced: RunningBroker, trace_dir: Path
) -> None:
    """The events carry the clock read once per event-loop iteration (TraceClock): three
    publishes read in one segment share their time, one sent after the broker went idle
    has a later time, and no time goes back from one line to the next."""

    def count() -> bytes:  # a passive declare answers after the publishes before it
        method = build(commands.Queue.Declare, queue="q", passive=True)
        return frame_bytes(FRAME_METHOD, 1, method_payload(method))

    raw = RawClient.connect((traced.host, traced.port))
    raw.call(1, build(commands.Queue.Declare, queue="q", durable=True), commands.Queue.DeclareOk)
    raw.send(b"".join([publish_frames("q", b) for b in (b"1", b"2", b"3")]) + count())
    assert raw.expect_method(commands.Queue.DeclareOk).message_count == 3
    time.sleep(0.005)  # time to pass, not to wait for anything
    raw.send(publish_frames("q", b"4") + count())
    assert raw.expect_method(commands.Queue.DeclareOk).message_count == 4
    raw.close()
    events = read_trace(traced, trace_dir)
    times = [e["ts"] for e in of(events, "published")]
    assert times[0] == times[1] == times[2]
    assert times[3] >= times[2] + 5000  # microseconds
    every = [e["ts"] for e in events]
    assert every == sorted(every)


def test_fan_out_and_dead_letter_copies_keep_the_id(traced: RunningBroker, trace_dir: Path) -> None:
    conn = connect(traced)
    ch = conn.channel()
    ch.exchange_declare("fan", "fanout")
    ch.queue_declare("dlq", durable=True)
    ch.queue_declare("a", durable=True)
    ch.queue_declare(
        "b",
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"},
        durable=True,
    )
    ch.queue_bind("a", "fan")
    ch.queue_bind("b", "fan")
    ch.basic_publish("fan", "", b"x")
    method, _, _ = ch.basic_get("b")
    ch.basic_reject(method.delivery_tag, requeue=False)
    conn.close()
    events = read_trace(traced, trace_dir)
    msg = of(events, "published")[0]["msg"]
    assert sorted(of(events, "routed", msg=msg)[0]["queues"]) == ["a", "b"]
    assert of(events, "nacked", msg=msg)[0]["requeue"] is False
    dead = of(events, "dead_lettered", msg=msg)[0]
    assert (dead["queue"], dead["reason"], dead["dlx"], dead["dlrk"]) == (
        "b",
        "rejected",
        "",
        "dlq",
    )
    routed = of(events, "routed", msg=msg, dead_letter=True)[0]
    assert routed["queues"] == ["dlq"] and routed["rk"] == "dlq"


def test_why_messages_come_back(traced: RunningBroker, trace_dir: Path) -> None:
    conn = connect(traced)
    ch = conn.channel()
    ch.queue_declare("w", durable=True)
    for i in range(3):
        ch.basic_publish("", "w", str(i).encode())
    method, _, _ = ch.basic_get("w")
    ch.basic_nack(method.delivery_tag, requeue=True)  # nack
    other = conn.channel()
    other.basic_get("w")
    other.close()  # channel closed with one unacked
    conn.close()
    for polite in (True, False):
        raw = RawClient.connect((traced.host, traced.port))
        raw.send_method(1, build(commands.Basic.Get, queue="w", no_ack=False))
        raw.expect_method(commands.Basic.GetOk)
        if polite:
            raw.close()  # connection.close, with the channel still open
        else:
            raw.abort()  # the socket just goes
    deadline = time.time() + 5
    while time.time() < deadline and traced.queue_counts("w").unacked:
        time.sleep(0.02)
    events = read_trace(traced, trace_dir)
    whys = [e["why"] for e in of(events, "requeued", queue="w")]
    assert whys == ["nack", "channel_closed", "connection_closed", "connection_lost"]
    assert [e["redelivered"] for e in of(events, "delivered", queue="w")] == [
        False,
        True,
        True,
        True,
    ]


def test_every_kind_of_ack_names_exactly_its_deliveries(
    traced: RunningBroker, trace_dir: Path
) -> None:
    """Single, multiple (with and without gaps), tag 0 and acks in a transaction."""
    conn = connect(traced)
    ch = conn.channel()
    ch.queue_declare("acks", durable=True)
    for i in range(12):
        ch.basic_publish("", "acks", str(i).encode())
    tags = [ch.basic_get("acks")[0].delivery_tag for _ in range(12)]
    assert tags == list(range(1, 13))
    ch.basic_ack(2)  # one tag
    ch.basic_nack(4, requeue=False)  # settled otherwise: the next ack has a gap
    ch.basic_ack(5, multiple=True)  # 1, 3, 5
    ch.basic_ack(7, multiple=True)  # 6, 7: no gap
    ch.tx_select()
    ch.basic_ack(9)
    ch.basic_ack(10, multiple=True)  # 8, 10
    ch.tx_commit()
    ch.basic_ack(0, multiple=True)  # everything left: 11, 12
    ch.tx_commit()  # the channel stays transactional
    conn.close()
    events = read_trace(traced, trace_dir)
    acked = [e["tag"] for e in of(events, "acked", queue="acks")]
    assert acked == [2, 1, 3, 5, 6, 7, 9, 8, 10, 11, 12]
    assert [e["tag"] for e in of(events, "nacked", queue="acks")] == [4]
    delivered = {e["tag"]: e["msg"] for e in of(events, "delivered", queue="acks")}
    assert {e["tag"]: e["msg"] for e in of(events, "acked", queue="acks")} == {
        t: m for t, m in delivered.items() if t != 4
    }


def test_missed_heartbeats_are_a_lost_connection(traced: RunningBroker, trace_dir: Path) -> None:
    conn = connect(traced)
    ch = conn.channel()
    ch.queue_declare("hb", durable=True)
    ch.basic_publish("", "hb", b"x")
    raw = RawClient.connect((traced.host, traced.port), heartbeat=1)
    raw.send_method(1, build(commands.Basic.Get, queue="hb", no_ack=False))
    raw.expect_method(commands.Basic.GetOk)
    assert [raw.next_frame().type, raw.next_frame().payload] == [2, b"x"]  # header, body
    # silent for two heartbeat intervals: the broker hangs up (asyncio closes the socket
    # after the broker's connection_lost has returned the message)
    raw.expect_eof(timeout=10)
    conn.close()
    events = read_trace(traced, trace_dir)
    assert [e["why"] for e in of(events, "requeued", queue="hb")] == ["connection_lost"]


def test_consumer_timeout(traced: RunningBroker, trace_dir: Path) -> None:
    conn = connect(traced)
    ch = conn.channel()
    ch.queue_declare("slow", durable=True, arguments={**QUORUM, "x-consumer-timeout": 100})
    ch.basic_publish("", "slow", b"x")
    ch.basic_consume("slow", lambda *a: None, consumer_tag="sleepy")
    deadline = time.time() + 5
    while time.time() < deadline and not of(read_trace(traced, trace_dir), "requeued"):
        conn.process_data_events(0.05)
    conn.close()
    events = read_trace(traced, trace_dir)
    msg = of(events, "published")[0]["msg"]
    timed_out = of(events, "consumer_timed_out")[0]
    assert (timed_out["consumer"], timed_out["tags"], timed_out["msgs"]) == ("sleepy", [1], [msg])
    assert (timed_out["timeout_ms"], timed_out["action"]) == (100, "cancel")
    assert of(events, "requeued", msg=msg)[0]["why"] == "consumer_timeout"


def test_expiry_retry_limits_and_deletion(traced: RunningBroker, trace_dir: Path) -> None:
    conn = connect(traced)
    ch = conn.channel()
    ch.queue_declare("ttl", arguments={"x-message-ttl": 30}, durable=True)
    ch.queue_declare("dead", durable=True)
    ch.queue_declare(
        "ttl-dlx",
        arguments={
            "x-message-ttl": 30,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "dead",
        },
        durable=True,
    )
    retry = {**QUORUM, "x-delayed-retry-type": "failed", "x-delayed-retry-min": 40}
    ch.queue_declare("retry", durable=True, arguments=retry)
    ch.queue_declare("short", arguments={"x-max-length": 1}, durable=True)
    ch.queue_declare("gone", durable=True)
    ch.queue_declare("unused", arguments={"x-expires": 50}, durable=True)
    for queue in ("ttl", "ttl-dlx", "retry", "short", "short", "gone"):
        ch.basic_publish("", queue, b"x")
    ch.basic_publish("", "nowhere", b"x", mandatory=True)
    method, _, _ = ch.basic_get("retry")
    ch.basic_nack(method.delivery_tag, requeue=True)
    time.sleep(0.2)
    ch.queue_delete("gone")
    conn.close()
    events = read_trace(traced, trace_dir)
    assert of(events, "expired", queue="ttl") and not of(events, "dead_lettered", queue="ttl")
    assert of(events, "dead_lettered", queue="ttl-dlx", reason="expired", dlrk="dead")
    assert of(events, "routed", dead_letter=True)[0]["queues"] == ["dead"]
    retried = of(events, "retry_scheduled", queue="retry")[0]
    assert (retried["attempt"], retried["delay_ms"], retried["why"]) == (1, 40, "nack")
    assert of(events, "dropped", queue="short", reason="maxlen")
    assert of(events, "dropped", queue="gone", reason="queue_deleted")
    assert of(events, "queue_deleted", queue="gone")[0]["messages"] == 1
    assert of(events, "queue_expired", queue="unused")
    assert of(events, "routed", rk="nowhere")[0]["queues"] == []
    assert of(events, "routed", rk="nowhere")[0]["mandatory"] is True


def test_a_full_buffer_drops_and_counts(trace_dir: Path) -> None:
    with run_broker(trace_enabled=True, trace_dir=str(trace_dir), trace_buffer=10) as broker:
        conn = connect(broker)
        ch = conn.channel()
        ch.queue_declare("burst", durable=True)
        for _ in range(300):  # one socket read: the writer cannot drain in between
            ch.basic_publish("", "burst", b"x")
        conn.process_data_events(0.3)
        assert broker.queue_depth("burst") == 300
        conn.close()
        events = read_trace(broker, trace_dir)
        status = broker.call(broker.server.broker.tracing.status)
    assert status["events_dropped"] > 0
    assert max(e["dropped"] for e in of(events, "trace_dropped")) == status["events_dropped"]
    published = len(of(events, "published")) + len(of(events, "routed"))
    assert published + status["events_dropped"] >= 600


def test_a_stalled_writer_never_stalls_the_broker(trace_dir: Path) -> None:
    """The writer process stopped: its pipe fills, the buffer fills, events are dropped and
    counted, and the broker goes on; resumed, it writes what it was given."""
    with run_broker(trace_enabled=True, trace_dir=str(trace_dir), trace_buffer=1000) as broker:
        child = broker.call(lambda: broker.server.broker.tracing.writer._child)
        os.kill(child.pid, signal.SIGSTOP)
        try:
            conn = connect(broker)
            ch = conn.channel()
            ch.queue_declare("stalled", durable=True)
            ch.confirm_delivery()
            for _ in range(20_000):  # ~3 MB of events: more than the pipe and the buffer
                ch.basic_publish("", "stalled", b"x")
            assert broker.queue_depth("stalled") == 20_000
            dropped = broker.call(broker.server.broker.tracing.status)["events_dropped"]
            assert dropped > 0
            # a flush (shutdown's too) gives up on a writer that reads nothing: FLUSH_TIMEOUT,
            # within the 10 s broker.call allows
            broker.call(broker.server.broker.tracing.flush)
        finally:
            os.kill(child.pid, signal.SIGCONT)
        conn.close()
        events = read_trace(broker, trace_dir)
        status = broker.call(broker.server.broker.tracing.status)
    assert max(e["dropped"] for e in of(events, "trace_dropped")) == status["events_dropped"]
    published = len(of(events, "published")) + len(of(events, "routed"))
    assert published > 0 and published + status["events_dropped"] >= 40_000


def test_a_dead_writer_costs_the_trace_not_the_broker(trace_dir: Path) -> None:
    with run_broker(trace_enabled=True, trace_dir=str(trace_dir)) as broker:
        conn = connect(broker)
        ch = conn.channel()
        ch.queue_declare("orphan", durable=True)
        ch.basic_publish("", "orphan", b"before")
        read_trace(broker, trace_dir)
        child = broker.call(lambda: broker.server.broker.tracing.writer._child)
        child.kill()
        child.wait()
        ch.confirm_delivery()
        for i in range(2_000):  # the pipe breaks on the next hand-over
            ch.basic_publish("", "orphan", str(i).encode())
        assert broker.call(lambda: broker.server.broker.tracing.writer._child) is None
        broker.call(broker.server.broker.tracing.flush)  # returns at once
        assert ch.basic_get("orphan", auto_ack=True)[2] == b"before"
        assert broker.queue_depth("orphan") == 2_000
        conn.close()
    published = [e for e in read_lines(trace_dir) if e["ev"] == "published"]
    assert published and published[0]["size"] == len(b"before")


def test_files_rotate_by_size_and_each_decodes_alone(trace_dir: Path) -> None:
    with run_broker(trace_enabled=True, trace_dir=str(trace_dir), trace_rotate_size=1500) as broker:
        conn = connect(broker)
        ch = conn.channel()
        ch.queue_declare("r", durable=True)
        ch.basic_qos(prefetch_count=50)
        tags = []
        ch.basic_consume("r", lambda _c, method, _p, _b: tags.append(method.delivery_tag))
        for i in range(40):
            ch.basic_publish("", "r", b"x")
            conn.process_data_events(time_limit=0)
            if i % 5 == 0:
                broker.call(broker.server.broker.tracing.flush)
        while len(tags) < 40:
            conn.process_data_events(time_limit=1)
        for tag in tags:  # the acks land in other files than most of their deliveries
            ch.basic_ack(tag)
            if tag % 5 == 0:
                broker.call(broker.server.broker.tracing.flush)
        conn.close()
    whole = read_lines(trace_dir)
    files = sorted(trace_dir.glob("warren-trace-*.wtrace"))
    assert len(files) > 2
    assert [len(of(whole, ev)) for ev in ("published", "delivered", "acked")] == [40, 40, 40]
    # each file alone, as the report job reads them: its own ids at its start, and an ack
    # of a delivery in an earlier file given as that delivery's channel and tag
    alone = [json.loads(line) for f in files for line in trace_format.file_lines(f.read_bytes())]
    assert any(e["ev"] == "acked" and "msg" not in e for e in alone)
    deliveries = {(e["chan"], e["tag"]): e for e in of(alone, "delivered")}

    def settled(e: dict[str, Any]) -> dict[str, Any]:
        if e["ev"] == "acked" and "msg" not in e:
            d = deliveries[e["chan"], e["tag"]]
            e = {"ts": e["ts"], "ev": "acked"} | {k: d[k] for k in ("vhost", "msg", "queue")}
            e |= {"consumer": d["consumer"], "tag": d["tag"]}
        return {k: v for k, v in e.items() if k != "chan"}

    assert [settled(e) for e in alone] == whole


def test_decode_prints_the_lines_and_a_torn_file_reads_to_its_tear(trace_dir: Path) -> None:
    with run_broker(trace_enabled=True, trace_dir=str(trace_dir)) as broker:
        conn = connect(broker)
        ch = conn.channel()
        ch.queue_declare("d", durable=True)
        for _ in range(5):
            ch.basic_publish("", "d", b"x")
            ch.queue_declare("d", passive=True)  # answered once the publish before it is
            broker.call(broker.server.broker.tracing.flush)  # one batch each
        conn.close()
    whole = read_lines(trace_dir)
    out = subprocess.run(
        [sys.executable, "-m", "warren.broker.tracing.format", "decode", str(trace_dir)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert [json.loads(line) for line in out.splitlines()] == whole
    # a crash leaves the last batch cut short: the file reads up to it
    (path,) = trace_dir.glob("warren-trace-*.wtrace")
    data = path.read_bytes()
    path.write_bytes(data[:-3])
    torn = read_lines(trace_dir)
    assert torn == whole[: len(torn)] and len(torn) < len(whole)
    assert len(of(torn, "published")) == 5
    path.write_bytes(data[:20])  # cut inside the file's header
    assert read_lines(trace_dir) == []
    # a file of another layout is refused by name, not misread
    path.write_bytes(b"WRNTRC02" + data[8:])
    with pytest.raises(ValueError, match="trace file format b'02': this Warren reads b'03'"):
        read_lines(trace_dir)


def test_only_the_configured_vhosts(trace_dir: Path) -> None:
    with run_broker(trace_enabled=True, trace_dir=str(trace_dir), trace_vhosts=("orders",)) as b:
        orders = b.add_vhost("orders")
        b.add_vhost("other")
        for view in (b, orders):
            conn = connect(view)
            ch = conn.channel()
            ch.queue_declare("q", durable=True)
            ch.basic_publish("", "q", b"x")
            conn.close()
        events = read_trace(b, trace_dir)
        assert b.call(lambda: sorted(b.server.broker.tracing.traced)) == ["orders"]
    assert {e["vhost"] for e in of(events, "published")} == {"orders"}


def test_routes_named_right_after_the_writer_forgets_them(
    trace_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past MAX_NAMES routes the writer forgets every route's id; a vhost's tracer that
    kept its last route's id (Tracer.published) must forget it too."""
    monkeypatch.setattr(trace_writer, "MAX_NAMES", 3)
    with run_broker(trace_enabled=True, trace_dir=str(trace_dir)) as b:
        other = b.add_vhost("other")
        conns = {name: connect(view) for name, view in (("/", b), ("other", other))}
        chs = {name: conn.channel() for name, conn in conns.items()}
        for ch in chs.values():
            for name in ("x", "r1", "r2", "r3"):
                ch.queue_declare(name, durable=True)
        # each step's publishes handled before the next's (a passive declare's reply)
        chs["other"].basic_publish("", "x", b"1")  # "other" keeps x's id
        chs["other"].queue_declare("x", passive=True)
        for name in ("r1", "r2", "r3"):  # the third route: the writer forgets them all
            chs["/"].basic_publish("", name, b"2")
        chs["/"].queue_declare("x", passive=True)
        chs["other"].basic_publish("", "x", b"3")
        for conn in conns.values():
            conn.close()
        events = read_trace(b, trace_dir)
    routed = [(e["vhost"], e["rk"], e["queues"]) for e in of(events, "routed")]
    assert routed == [
        ("other", "x", ["x"]),
        ("/", "r1", ["r1"]),
        ("/", "r2", ["r2"]),
        ("/", "r3", ["r3"]),
        ("other", "x", ["x"]),
    ]


def test_on_and_off_at_run_time(trace_dir: Path) -> None:
    with run_broker(trace_dir=str(trace_dir), management_port=0) as broker:
        url = f"http://127.0.0.1:{broker.server.management_port}"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("RABBITMQ_CONFIG_FILE", None)

        def ctl(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "warren.broker.tools.warrenctl", "--url", url, *args],
                capture_output=True,
                text=True,
                env=env,
                timeout=30,
                check=False,
            )

        def publish(body: bytes) -> None:
            conn = connect(broker)
            ch = conn.channel()
            ch.queue_declare("q", durable=True)
            ch.basic_publish("", "q", body)
            conn.close()

        publish(b"before")
        on = ctl("trace_on", "-p", "/")
        assert on.returncode == 0 and 'Starting tracing for vhost "/"' in on.stdout
        publish(b"during")
        request = urllib.request.Request(url + "/api/trace")
        request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
        with urllib.request.urlopen(request) as resp:
            status = json.load(resp)
        assert status["vhosts"] == ["/"] and status["dir"] == str(trace_dir)
        assert ctl("trace_off").returncode == 0
        publish(b"after")
        missing = ctl("trace_on", "-p", "nope")
        assert missing.returncode == 69 and "does not exist" in missing.stderr
        events = read_trace(broker, trace_dir)
    assert [e["ev"] for e in events if e["ev"].startswith("trace_")] == [
        "trace_started",
        "trace_stopped",
    ]
    assert [e["size"] for e in of(events, "published")] == [len(b"during")]


def test_reused_names_and_a_new_writer_keep_events_right(trace_dir: Path) -> None:
    """Channels, consumers and queues are ids in the stream: a closed channel's number
    reused, a queue deleted and declared again, and a writer process started anew (its
    ids mean nothing to the next one) all still give the right names."""
    with run_broker(trace_enabled=True, trace_dir=str(trace_dir)) as broker:
        tracing = broker.server.broker.tracing
        conn = connect(broker)
        first = conn.channel()
        first.queue_declare("a", durable=True)
        first.basic_publish("", "a", b"1")
        first.close()
        second = conn.channel()  # pika reuses the lowest free number
        assert second.channel_number == first.channel_number
        second.queue_delete("a")
        second.queue_declare("a", durable=True)
        second.queue_declare("b", durable=True)
        second.basic_publish("", "b", b"2")
        got: list[int] = []
        second.basic_consume("b", lambda c, m, p, b: got.append(m.delivery_tag), consumer_tag="x")
        while not got:
            conn.process_data_events(0.05)
        second.basic_ack(got[0])
        broker.call(tracing.close)  # the writer process ends; the next one starts afresh
        broker.call(lambda: tracing.enable(broker.server.broker.vhosts["/"]))
        second.basic_publish("", "a", b"3")
        second.basic_publish("", "b", b"4")
        while len(got) < 2:
            conn.process_data_events(0.05)
        second.basic_ack(got[1])
        conn.close()
        events = read_trace(broker, trace_dir)
    routed = [(e["queues"], e["rk"]) for e in of(events, "routed")]
    assert routed == [(["a"], "a"), (["b"], "b"), (["a"], "a"), (["b"], "b")]
    assert {(e["conn"], e["ch"]) for e in of(events, "published")} == {
        (of(events, "published")[0]["conn"], first.channel_number)
    }
    delivered = of(events, "delivered")
    assert [(e["queue"], e["consumer"], e["tag"]) for e in delivered] == [
        ("b", "x", 1),
        ("b", "x", 2),
    ]
    assert [e["msg"] for e in of(events, "acked")] == [e["msg"] for e in delivered]
    assert of(events, "queue_deleted", queue="a")[0]["messages"] == 1


def test_ids_taken_back_when_a_vhost_stops_tracing(trace_dir: Path) -> None:
    """A vhost stops tracing, the writer process ends, tracing starts again with a new one:
    the channel, consumer and queue that lived through it are named right (they gave back
    ids that the new writer process would not know)."""
    with run_broker(trace_enabled=True, trace_dir=str(trace_dir)) as broker:
        tracing = broker.server.broker.tracing
        vhost = broker.server.broker.vhosts["/"]
        conn = connect(broker)
        ch = conn.channel()
        ch.queue_declare("live", durable=True)
        got: list[int] = []
        ch.basic_consume("live", lambda c, m, p, b: got.append(m.delivery_tag), consumer_tag="k")
        for round_ in (1, 2):
            ch.basic_publish("", "live", b"x")
            while len(got) < round_:
                conn.process_data_events(0.05)
            ch.basic_ack(got[-1])
            ch.basic_publish("", "live", b"y")  # delivered, and acked after the restart
            while len(got) < round_ + 1:
                conn.process_data_events(0.05)
            if round_ == 1:
                broker.call(lambda: tracing.disable(vhost))
                broker.call(tracing.close)
                broker.call(lambda: tracing.enable(vhost))
                ch.basic_ack(got[-1])
                got.pop()
        ch.basic_ack(got[-1])
        conn.close()
        events = read_trace(broker, trace_dir)
    assert [e["ev"] for e in events if e["ev"].startswith("trace_")] == [
        "trace_started",
        "trace_stopped",
        "trace_started",
    ]
    after = events[[e["ev"] for e in events].index("trace_started", 1) :]
    routed = of(after, "routed")
    assert [(e["queues"], e["rk"]) for e in routed] == [(["live"], "live")] * 2
    published = of(after, "published")
    first_conn = of(events, "published")[0]["conn"]
    assert {(e["conn"], e["ch"]) for e in published} == {(first_conn, ch.channel_number)}
    delivered = of(after, "delivered")
    assert [(e["queue"], e["consumer"], e["msg"]) for e in delivered] == [
        ("live", "k", e["msg"]) for e in published
    ]
    assert [e["msg"] for e in of(after, "acked")] == [e["msg"] for e in published]


def test_config_keys() -> None:
    settings = parse_config(
        "trace.enabled = true\ntrace.dir = /var/log/warren-trace\ntrace.vhosts = /, orders\n"
        "trace.rotate_size = 1MiB\ntrace.rotate_interval = 600\ntrace.buffer = 1000\n"
    )
    assert settings.trace_enabled is True
    assert settings.trace_dir == "/var/log/warren-trace"
    assert settings.trace_vhosts == ("/", "orders")
    assert (settings.trace_rotate_size, settings.trace_rotate_interval) == (1024 * 1024, 600)
    assert settings.trace_buffer == 1000
    assert parse_config("trace.vhosts = all").trace_vhosts is None
    with pytest.raises(ConfigError, match="comma-separated list of vhost names"):
        parse_config("trace.vhosts = a,,b")
    with pytest.raises(ConfigError, match="expected 'true' or 'false'"):
        parse_config("trace.enabled = yes")


def test_firehose_copies_publishes_and_deliveries_as_rabbitmq_does(traced: RunningBroker) -> None:
    conn = connect(traced)
    ch = conn.channel()
    ch.queue_declare("fh.sink", durable=True)
    ch.queue_bind("fh.sink", "amq.rabbitmq.trace", "#")
    ch.queue_declare("fh.work", durable=True)
    props = pika.BasicProperties(
        content_type="text/plain", delivery_mode=2, priority=3, headers={"a": 1},
        message_id="m1", timestamp=1700000000,
    )  # fmt: skip
    ch.basic_publish("", "fh.work", b"hello", props)
    method, _, body = ch.basic_get("fh.work", auto_ack=True)
    assert body == b"hello"
    copies = []
    for _ in range(100):  # the copies follow, in a later loop turn, the event that made them
        if len(copies) == 2:
            break
        method, got, body = ch.basic_get("fh.sink", auto_ack=True)
        if method is not None:
            copies.append((method.routing_key, method.exchange, body, got.headers))
    assert ch.basic_get("fh.sink")[0] is None  # a trace copy is not traced again
    conn_name = copies[0][3]["connection"]
    assert conn_name.endswith(f"-> 127.0.0.1:{traced.port}")
    common = {
        "exchange_name": "",
        "routing_keys": ["fh.work"],
        "properties": {
            "content_type": "text/plain", "delivery_mode": 2, "priority": 3,
            "headers": {"a": 1}, "message_id": "m1", "timestamp": 1700000000,
        },
        "vhost": "/", "connection": conn_name, "channel": 1, "user": "guest",
    }  # fmt: skip
    publish, deliver = copies
    assert publish[:3] == ("publish.", "amq.rabbitmq.trace", b"hello")
    assert publish[3].pop("node").startswith("warren@")
    assert publish[3] == {**common, "routed_queues": ["fh.work"]}
    assert deliver[:3] == ("deliver.fh.work", "amq.rabbitmq.trace", b"hello")
    deliver[3].pop("node")
    assert deliver[3] == {**common, "redelivered": 0}
    # clients cannot publish to it: it is internal, as in RabbitMQ
    ch.basic_publish("amq.rabbitmq.trace", "x", b"no")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.basic_get("fh.sink")
    assert closed.value.reply_code == 403
    conn.close()


def test_every_line_of_a_lifecycle_is_as_declared(trace_dir: Path) -> None:
    """Publish, confirm, get, nack, reject to a dead-letter queue, consume, ack, cancel,
    expire and delete, then decode: read_lines checks every line against the declaration."""
    with run_broker(trace_enabled=True, trace_dir=str(trace_dir), clock="manual") as broker:
        conn = connect(broker)
        ch = conn.channel()
        ch.queue_declare("decl-dlq", durable=True)
        dead_letter = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "decl-dlq"}
        ch.queue_declare("decl-q", durable=True, arguments=dead_letter)
        ch.queue_declare("decl-ttl", durable=True, arguments={"x-message-ttl": 1000})
        ch.confirm_delivery()
        for body in (b"a", b"b"):
            ch.basic_publish(
                "", "decl-q", body, pika.BasicProperties(message_id="m", delivery_mode=2)
            )
        ch.basic_publish("", "decl-ttl", b"t")
        method, _, _ = ch.basic_get("decl-q")
        ch.basic_nack(method.delivery_tag, requeue=True)
        method, _, _ = ch.basic_get("decl-q")
        ch.basic_reject(method.delivery_tag, requeue=False)
        method, _, body = ch.basic_get("decl-dlq")
        assert body == b"a"
        ch.basic_ack(method.delivery_tag)
        ch.basic_cancel(ch.basic_consume("decl-dlq", lambda *_: None))
        broker.clock.advance(2)
        ch.queue_delete("decl-q")
        conn.close()
        events = read_trace(broker, trace_dir)
    seen = {e["ev"] for e in events}
    assert {
        "trace_started", "published", "routed", "confirmed", "delivered", "nacked", "requeued",
        "dead_lettered", "consumer_added", "acked", "consumer_cancelled", "expired",
        "queue_deleted",
    } <= seen, seen  # fmt: skip
