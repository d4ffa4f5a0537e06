"""The test kit (docs/test-kit.md): a manual clock, what happened as data, reset, wait_for.

Every test drives the broker through a real client (pika in a thread, aio-pika on the
broker's own loop) and reads the record the broker keeps; hours of broker time pass in
milliseconds of real time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import pika
import pika.exceptions
import pytest

from tests.http_api import HttpApi, q
from warren.broker.testkit import RunningBroker, run_broker

QUORUM = {"x-queue-type": "quorum"}
REAL_TIME_BOUND = 2.0  # seconds; generous: the point is hours of broker time, not speed


@pytest.fixture
def manual() -> Iterator[RunningBroker]:
    with run_broker(clock="manual") as broker:
        yield broker


def connect(broker: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(broker.url))


def pump(conn: pika.BlockingConnection, until: Any, timeout: float = 5.0) -> None:
    """Let pika read frames until ``until()`` holds (its callbacks run meanwhile)."""
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "pika did not see it in time"
        conn.process_data_events(time_limit=0.02)


# --------------------------------------------------------------------------
# the manual clock, with pika


def test_half_hour_consumer_timeout_in_milliseconds_pika(manual: RunningBroker) -> None:
    """RabbitMQ 4.3's default consumer timeout (30 min) on a quorum queue, without waiting."""
    conn = connect(manual)
    try:
        ch = conn.channel()
        ch.queue_declare("slow", durable=True, arguments=QUORUM)
        ch.basic_publish("", "slow", b"job")
        cancelled: list[Any] = []
        got: list[bytes] = []
        ch.add_on_cancel_callback(cancelled.append)
        tag = ch.basic_consume("slow", lambda c, m, p, body: got.append(body))
        pump(conn, lambda: got == [b"job"])
        started = time.monotonic()
        assert manual.clock.advance(1799.9) == 0  # not yet
        assert manual.outcome_names("slow") == ["unacked"]
        assert manual.clock.advance(0.1) == 1
        pump(conn, lambda: bool(cancelled))
        assert time.monotonic() - started < REAL_TIME_BOUND
        (outcome,) = manual.outcomes("slow")
        assert outcome.outcome == "timed-out"
        assert (outcome.consumer_tag, outcome.timeout_ms, outcome.count) == (tag, 1800000, 1)
        assert outcome.reason == "consumer_timeout"
        assert ch.is_open  # pika announces consumer_cancel_notify: basic.cancel, no close
        assert manual.queue_counts("slow").ready == 1
    finally:
        conn.close()


def test_one_hour_ttl_per_queue_and_per_message_pika(manual: RunningBroker) -> None:
    conn = connect(manual)
    try:
        ch = conn.channel()
        ch.queue_declare("hourly", durable=True, arguments={"x-message-ttl": 3_600_000})
        ch.queue_declare("plain", durable=True)
        ch.confirm_delivery()
        ch.basic_publish("", "hourly", b"a")
        ch.basic_publish("", "plain", b"b", pika.BasicProperties(expiration="3600000"))
        started = time.monotonic()
        manual.clock.advance(3599.999)
        assert manual.queues()["hourly"].ready == 1 and manual.queues()["plain"].ready == 1
        manual.clock.advance(0.001)
        assert time.monotonic() - started < REAL_TIME_BOUND
        assert manual.outcome_names("hourly") == ["expired"]
        assert manual.outcome_names("plain") == ["expired"]
        assert ch.basic_get("hourly") == (None, None, None)
        assert ch.basic_get("plain") == (None, None, None)
    finally:
        conn.close()


def test_x_expires_and_delayed_retry_follow_the_clock_pika(manual: RunningBroker) -> None:
    conn = connect(manual)
    try:
        ch = conn.channel()
        ch.queue_declare("unused", durable=True, arguments={"x-expires": 24 * 3_600_000})  # a day
        ch.queue_declare(
            "retrying",
            durable=True,
            arguments={"x-delayed-retry-type": "all", "x-delayed-retry-min": 600_000},
        )
        ch.basic_publish("", "retrying", b"r")
        method, _, _ = ch.basic_get("retrying")
        assert method is not None
        ch.basic_nack(method.delivery_tag, requeue=True)  # waits 10 minutes, invisible
        manual.wait_for(lambda: manual.outcome_names("retrying") == ["requeued"])
        (outcome,) = manual.outcomes("retrying")
        assert (outcome.reason, outcome.retry_delay_ms) == ("nack", 600_000)
        assert ch.basic_get("retrying") == (None, None, None)
        manual.clock.advance(600)
        method, _, body = ch.basic_get("retrying", auto_ack=True)
        assert body == b"r" and method.redelivered
        assert manual.outcome_names("retrying") == ["acked"]  # basic.get with no-ack
        assert "unused" in manual.queues()
        manual.clock.advance(24 * 3600)
        assert "unused" not in manual.queues()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            ch.queue_declare("unused", passive=True)
        assert closed.value.reply_code == 404
    finally:
        conn.close()


def test_advancing_hours_keeps_the_connection_heartbeats_are_real_time(
    manual: RunningBroker,
) -> None:
    """Heartbeats and the handshake timeout stay on real time: a test cannot lose its
    connection by advancing the broker clock."""
    params = pika.URLParameters(manual.url + "?heartbeat=1")
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        before = manual.clock.now()
        manual.clock.advance(3 * 3600)
        assert manual.clock.now() - before == pytest.approx(3 * 3600)
        conn.process_data_events(time_limit=0.05)
        ch.queue_declare("still-here", durable=True)
        assert conn.is_open and ch.is_open
    finally:
        conn.close()


def test_x_death_time_is_broker_time(manual: RunningBroker) -> None:
    conn = connect(manual)
    try:
        ch = conn.channel()
        ch.queue_declare("dlq", durable=True)
        ch.queue_declare(
            "src",
            durable=True,
            arguments={
                "x-message-ttl": 7_200_000,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": "dlq",
            },
        )
        ch.confirm_delivery()
        ch.basic_publish("", "src", b"late")
        manual.clock.advance(7200)
        _, props, _ = ch.basic_get("dlq", auto_ack=True)
        death_time = props.headers["x-death"][0]["time"]
        assert abs(death_time.timestamp() - manual.clock.wall()) < 1.5
        assert death_time.timestamp() > time.time() + 7000  # two hours ahead of the wall
    finally:
        conn.close()


def test_real_clock_cannot_be_advanced() -> None:
    with run_broker() as broker:
        assert not broker.clock.manual
        with pytest.raises(RuntimeError, match="clock='manual'"):
            broker.clock.advance(1)
        first = broker.clock.now()
        assert broker.clock.now() >= first


# --------------------------------------------------------------------------
# published / outcomes: a scripted scenario, exact


def test_published_and_outcomes_exact_for_a_scripted_scenario_pika(
    manual: RunningBroker,
) -> None:
    conn = connect(manual)
    try:
        ch = conn.channel()
        ch.exchange_declare("shop", "topic")
        ch.exchange_declare("dlx", "fanout")
        ch.queue_declare("dead", durable=True)
        ch.queue_bind("dead", "dlx")
        ch.queue_declare(
            "work",
            durable=True,
            arguments={"x-dead-letter-exchange": "dlx", "x-message-ttl": 600_000},
        )
        ch.queue_bind("work", "shop", "order.created")
        ch.queue_declare("plain", durable=True)
        ch.queue_bind("plain", "shop", "order.paid")
        ch.queue_declare("slow", durable=True, arguments=QUORUM)
        ch.queue_bind("slow", "shop", "order.shipped")
        ch.confirm_delivery()
        for body in (b"w1", b"w2", b"w3"):
            ch.basic_publish("shop", "order.created", body)
        ch.basic_publish("shop", "order.paid", b"p1", pika.BasicProperties(headers={"n": 1}))
        ch.basic_publish("shop", "order.paid", b"p2")
        ch.basic_publish("shop", "order.paid", b"p3", pika.BasicProperties(expiration="1000"))
        ch.basic_publish("shop", "order.paid", b"p4")
        ch.basic_publish("shop", "order.shipped", b"s1")
        ch.basic_publish("shop", "order.lost", b"x")  # unroutable

        m, _, _ = ch.basic_get("work")
        ch.basic_ack(m.delivery_tag)  # w1
        m, _, _ = ch.basic_get("work")
        ch.basic_reject(m.delivery_tag, requeue=False)  # w2: to the DLX
        m, _, _ = ch.basic_get("plain")
        ch.basic_nack(m.delivery_tag, requeue=True)  # p1 back
        m, _, body = ch.basic_get("plain")
        assert body == b"p1" and m.redelivered
        ch.basic_ack(m.delivery_tag)
        m, _, _ = ch.basic_get("plain")
        ch.basic_nack(m.delivery_tag, requeue=False)  # p2: no DLX
        tag = ch.basic_consume("slow", lambda *a: None)
        manual.clock.advance(600)  # w3 and p3 expire
        m, _, body = ch.basic_get("plain")
        assert body == b"p4"
        ch.basic_reject(m.delivery_tag, requeue=False)
        manual.clock.advance(1200)  # 30 minutes since s1 was delivered
        manual.wait_for(lambda: manual.outcome_names("plain")[-1] == "rejected")

        sent = [(p.exchange, p.routing_key, p.body, p.routed_to) for p in manual.published()]
        assert sent == [
            ("shop", "order.created", b"w1", ["work"]),
            ("shop", "order.created", b"w2", ["work"]),
            ("shop", "order.created", b"w3", ["work"]),
            ("shop", "order.paid", b"p1", ["plain"]),
            ("shop", "order.paid", b"p2", ["plain"]),
            ("shop", "order.paid", b"p3", ["plain"]),
            ("shop", "order.paid", b"p4", ["plain"]),
            ("shop", "order.shipped", b"s1", ["slow"]),
            ("shop", "order.lost", b"x", []),
        ]
        paid = manual.published(exchange="shop", routing_key="order.paid")
        assert [p.body for p in paid] == [b"p1", b"p2", b"p3", b"p4"]
        assert paid[0].properties["headers"] == {"n": 1} and paid[0].vhost == "/"
        assert paid[2].properties["expiration"] == "1000"

        work = [(o.body, o.outcome, o.reason) for o in manual.outcomes("work")]
        assert work == [
            (b"w1", "acked", None),
            (b"w2", "dead-lettered", "rejected"),
            (b"w3", "dead-lettered", "expired"),
        ]
        dead = manual.outcomes("dead")
        assert [(o.body, o.outcome, o.exchange) for o in dead] == [
            (b"w2", "ready", "dlx"),
            (b"w3", "ready", "dlx"),
        ]
        assert dead[0].headers["x-death"][0]["reason"] == "rejected"
        plain = [(o.body, o.outcome, o.count) for o in manual.outcomes("plain")]
        assert plain == [
            (b"p1", "acked", 2),
            (b"p2", "nacked", 1),
            (b"p3", "expired", 0),
            (b"p4", "rejected", 1),
        ]
        assert manual.outcomes("plain")[0].history == [
            "published", "got", "nacked", "requeued", "got", "acked",
        ]  # fmt: skip
        (slow,) = manual.outcomes("slow")
        assert (slow.body, slow.outcome, slow.consumer_tag) == (b"s1", "timed-out", tag)
        assert manual.outcomes("nowhere") == []
    finally:
        conn.close()


def test_outcomes_of_consumers_auto_ack_maxlen_and_ready(manual: RunningBroker) -> None:
    conn = connect(manual)
    try:
        ch = conn.channel()
        ch.queue_declare("short", durable=True, arguments={"x-max-length": 1})
        ch.queue_declare("auto", durable=True)
        ch.queue_declare("held", durable=True)
        ch.confirm_delivery()
        ch.basic_publish("", "short", b"old")
        ch.basic_publish("", "short", b"new")  # drop-head: "old" is dropped
        ch.basic_publish("", "auto", b"a")
        ch.basic_publish("", "held", b"h1")
        ch.basic_publish("", "held", b"h2")
        got: list[bytes] = []
        ch.basic_consume("auto", lambda c, m, p, body: got.append(body), auto_ack=True)
        ch.basic_qos(prefetch_count=1)
        ch.basic_consume("held", lambda c, m, p, body: got.append(body), consumer_tag="holder")
        pump(conn, lambda: len(got) == 2)
        manual.wait_for(lambda: manual.outcome_names("held") == ["unacked", "ready"])
        assert [(o.outcome, o.reason) for o in manual.outcomes("short")] == [
            ("dropped", "maxlen"),
            ("ready", None),
        ]
        assert manual.outcome_names("auto") == ["acked"]
        assert manual.outcomes("held")[0].consumer_tag == "holder"
    finally:
        conn.close()
    # the channel closed with h1 unacked: it is back, and says why
    manual.wait_for(lambda: manual.outcome_names("held") == ["requeued", "ready"])
    assert manual.outcomes("held")[0].reason in ("connection_closed", "channel_closed")


# --------------------------------------------------------------------------
# aio-pika, on the broker's own loop


async def test_clock_and_outcomes_with_aio_pika() -> None:
    async with run_broker(clock="manual") as broker:
        connection = await aio_pika.connect(broker.url)
        async with connection:
            channel = await connection.channel()
            await channel.declare_queue("slow", durable=True, arguments=QUORUM)
            await channel.declare_queue(
                "hourly", durable=True, arguments={"x-message-ttl": 3_600_000}
            )
            await channel.default_exchange.publish(aio_pika.Message(b"job"), routing_key="slow")
            await channel.default_exchange.publish(aio_pika.Message(b"tick"), "hourly")
            queue = await channel.get_queue("slow")
            message = await queue.get(no_ack=False)
            assert message.body == b"job"
            started = time.monotonic()
            broker.clock.advance(3600)  # the TTL and the 30-minute timeout, at once
            assert time.monotonic() - started < REAL_TIME_BOUND
            assert broker.outcome_names("hourly") == ["expired"]
            # a basic.get that times out closes the channel (no consumer to cancel)
            assert broker.outcome_names("slow") == ["timed-out"]
            await broker.wait_for_async(lambda: channel.is_closed)
            published = broker.published()
            assert [(p.routing_key, p.body) for p in published] == [
                ("slow", b"job"),
                ("hourly", b"tick"),
            ]


async def test_wait_for_async_and_reset_with_aio_pika() -> None:
    async with run_broker() as broker:
        connection = await aio_pika.connect(broker.url)
        channel = await connection.channel()
        queue = await channel.declare_queue("q", durable=True)
        await channel.default_exchange.publish(aio_pika.Message(b"m"), routing_key="q")
        message = await queue.get(no_ack=False)
        await message.ack()
        await broker.wait_for_async(lambda: broker.outcome_names("q") == ["acked"])
        with pytest.raises(TimeoutError):
            await broker.wait_for_async(lambda: broker.outcome_names("q") == [], timeout=0.05)
        port = broker.port
        result = broker.reset()
        assert result["queues"] == 1 and result["connections"] == 1
        assert broker.queues() == {} and broker.published() == [] and broker.port == port
        with pytest.raises(aio_pika.exceptions.ConnectionClosed) as closed:
            await channel.declare_queue("q", passive=True)
        assert closed.value.args[0] == 320
        async with await aio_pika.connect(broker.url) as again:  # same URL, fresh broker
            ch = await again.channel()
            with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
                await ch.declare_queue("q", passive=True)


# --------------------------------------------------------------------------
# reset


def test_reset_with_100_queues(manual: RunningBroker) -> None:
    conn = connect(manual)
    ch = conn.channel()
    ch.exchange_declare("ex", "direct")
    ch.exchange_declare("ex2", "fanout")
    ch.exchange_bind("ex2", "amq.direct", "k")
    for i in range(100):
        ch.queue_declare(f"q{i}", durable=True, arguments={"x-message-ttl": 60_000})
        ch.queue_bind(f"q{i}", "ex", f"k{i}")
        ch.basic_publish("ex", f"k{i}", b"m")
    ch.queue_bind("q0", "amq.topic", "#")
    manual.call(_set_policy, manual)
    port = manual.port
    manual.wait_for(lambda: len(manual.published()) == 100)

    started = time.perf_counter()
    result = manual.reset()
    elapsed = time.perf_counter() - started

    assert elapsed < 1.0  # a bound that cannot flake; the figure is in docs/test-kit.md
    assert result == {"queues": 100, "exchanges": 2, "policies": 1, "connections": 1}
    assert manual.queues() == {} and manual.published() == [] and manual.port == port
    assert manual.outcomes("q0") == []
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        ch.queue_declare("q0", passive=True)
    assert closed.value.reply_code == 320
    assert "reset" in closed.value.reply_text

    def leftovers() -> dict[str, Any]:
        vhost = manual.server.broker.vhosts["/"]
        return {
            "exchanges": sorted(vhost.exchanges),
            "bindings": sum(len(e.bindings) for e in vhost.exchanges.values()),
            "policies": list(vhost.policies),
        }

    assert manual.call(leftovers) == {
        "exchanges": [
            "",
            "amq.direct",
            "amq.fanout",
            "amq.headers",
            "amq.match",
            "amq.rabbitmq.trace",
            "amq.topic",
        ],
        "bindings": 0,
        "policies": [],
    }
    conn = connect(manual)  # the same URL works at once
    ch = conn.channel()
    ch.queue_declare("q0", durable=True)
    ch.basic_publish("", "q0", b"fresh")
    manual.wait_for(lambda: manual.outcome_names("q0") == ["ready"])
    # timers of the deleted queues went with them: advancing fires none of them
    assert manual.clock.advance(120) == 0
    conn.close()


def _set_policy(broker: RunningBroker) -> None:
    from warren.broker.engine.policy import Policy

    broker.server.broker.vhosts["/"].set_policy(Policy("/", "p", ".*", {"max-length": 10}))


def test_reset_keeping_connections_cancels_their_consumers(manual: RunningBroker) -> None:
    conn = connect(manual)
    try:
        ch = conn.channel()
        ch.queue_declare("q", durable=True)
        cancelled: list[Any] = []
        ch.add_on_cancel_callback(cancelled.append)
        ch.basic_consume("q", lambda *a: None)
        result = manual.reset(close_connections=False)
        assert result["connections"] == 0
        pump(conn, lambda: bool(cancelled))
        assert conn.is_open and ch.is_open
        ch.queue_declare("q2", durable=True)  # the channel goes on in the fresh vhost
        assert list(manual.queues()) == ["q2"]
    finally:
        conn.close()


def test_session_view_reset_touches_only_its_vhost() -> None:
    with run_broker() as broker:
        other = broker.add_vhost("other")
        for view in (broker, other):
            conn = connect(view)
            conn.channel().queue_declare("q", durable=True)
            conn.close()
        other.reset()
        assert other.queues() == {} and list(broker.queues()) == ["q"]


# --------------------------------------------------------------------------
# the HTTP test API (other languages, docker-compose)


@pytest.fixture
def http_broker() -> Iterator[RunningBroker]:
    with run_broker(management_port=0, test_api=True, clock="manual") as broker:
        yield broker


def api(broker: RunningBroker) -> HttpApi:
    return HttpApi(broker.server.management_port)  # type: ignore[attr-defined]


def test_http_test_api_with_the_key(http_broker: RunningBroker) -> None:
    http = api(http_broker)
    conn = connect(http_broker)
    ch = conn.channel()
    ch.queue_declare("q", durable=True, arguments={"x-message-ttl": 60_000})
    ch.confirm_delivery()
    ch.basic_publish("", "q", b"hello", pika.BasicProperties(headers={"k": "v"}))
    ch.basic_publish("amq.direct", "nowhere", b"\xff\x00")

    assert http.get("/api/warren/clock").body["clock"] == "manual"
    advanced = http.ok("POST", "/api/warren/clock/advance", {"seconds": 60})
    assert advanced["fired"] == 1
    published = http.ok("GET", "/api/warren/published")
    assert [
        (p["exchange"], p["routing_key"], p["payload"], p["payload_encoding"], p["routed_to"])
        for p in published
    ] == [
        ("", "q", "hello", "string", ["q"]),
        ("amq.direct", "nowhere", "/wA=", "base64", []),
    ]
    assert published[0]["properties"]["headers"] == {"k": "v"}
    filtered = http.ok("GET", "/api/warren/published?exchange=amq.direct")
    assert [p["routing_key"] for p in filtered] == ["nowhere"]
    (outcome,) = http.ok("GET", f"/api/warren/outcomes/{q('/')}/q")
    assert (outcome["payload"], outcome["outcome"], outcome["reason"]) == (
        "hello",
        "expired",
        "expired",
    )
    assert http.get(f"/api/warren/outcomes/{q('nope')}/q").status == 404

    bad = http.post("/api/warren/clock/advance", {"seconds": -1})
    assert bad.status == 400
    assert http.post("/api/warren/clock/advance", {"seconds": "soon"}).status == 400

    reset = http.ok("POST", "/api/warren/reset", {})
    assert reset["reset"]["/"]["queues"] == 1
    assert http.ok("GET", "/api/warren/published") == []
    assert http_broker.queues() == {}
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker):
        ch.queue_declare("q", passive=True)


def test_http_test_api_needs_an_administrator(http_broker: RunningBroker) -> None:
    http_broker.call(
        lambda: http_broker.server.broker.access.add_user("mon", "pw", tags=("monitoring",))
    )
    http = api(http_broker).as_user("mon", "pw")
    for method, path in (
        ("POST", "/api/warren/reset"),
        ("POST", "/api/warren/clock/advance"),
        ("GET", "/api/warren/published"),
        ("GET", f"/api/warren/outcomes/{q('/')}/q"),
    ):
        assert http.request(method, path, {}).status == 401, path


def test_http_clock_advance_refused_with_the_real_clock() -> None:
    with run_broker(management_port=0, test_api=True) as broker:
        reply = api(broker).post("/api/warren/clock/advance", {"seconds": 1})
        assert reply.status == 400
        assert "warren.clock = manual" in reply.body["reason"]


def test_http_test_api_paths_are_404_without_the_key() -> None:
    with run_broker(management_port=0, clock="manual") as broker:
        http = api(broker)
        for method, path in (
            ("POST", "/api/warren/reset"),
            ("POST", "/api/warren/clock/advance"),
            ("GET", "/api/warren/clock"),
            ("GET", "/api/warren/published"),
            ("GET", f"/api/warren/outcomes/{q('/')}/q"),
        ):
            assert http.request(method, path, {}).status == 404, path
            assert http.request(method, path, {}, auth=False).status == 404, path


def test_test_api_key_from_rabbitmq_conf() -> None:
    from warren.config import parse_config

    settings = parse_config("warren.test_api = true\nwarren.clock = manual\n")
    assert (settings.test_api, settings.clock) == (True, "manual")
    from warren.config import ConfigError

    with pytest.raises(ConfigError, match="real, manual"):
        parse_config("warren.clock = fast\n")


def test_warren_server_does_not_record() -> None:
    """Off unless warren.test_api: the engine's tracer hook stays None, so the message
    path pays nothing; the test kit switches it on."""
    from warren.broker.engine.broker import Broker
    from warren.broker.ops.management.core import Management
    from warren.broker.testkit.recorder import recording_of
    from warren.config import Settings

    plain = Broker(Settings(data_dir=None))
    Management(plain)
    assert recording_of(plain) is None and plain.vhosts["/"].tracer is None
    assert plain.read_coalescing > 0
    with_api = Broker(Settings(data_dir=None, test_api=True))
    Management(with_api)
    assert recording_of(with_api) is not None and with_api.vhosts["/"].tracer is not None
    with run_broker(record=False) as broker:
        assert broker.call(lambda: recording_of(broker.server.broker)) is None


# --------------------------------------------------------------------------
# recording and the lifecycle trace share the engine's hook


def test_recording_and_tracing_together(tmp_path: Path) -> None:
    from tests.test_tracing import of, read_trace

    trace_dir = tmp_path / "trace"
    with run_broker(trace_enabled=True, trace_dir=str(trace_dir)) as broker:
        conn = connect(broker)
        try:
            ch = conn.channel()
            ch.queue_declare("q", durable=True)
            ch.confirm_delivery()
            ch.basic_publish("", "q", b"both")
            _, _, body = ch.basic_get("q", auto_ack=True)
            assert body == b"both"
        finally:
            conn.close()
        assert [p.body for p in broker.published()] == [b"both"]
        events = read_trace(broker, trace_dir)
        (published,) = of(events, "published", rk="q")
        assert published["msg"] == broker.published()[0].id  # one id for both records
        tracing = broker.server.broker.tracing
        vhost = broker.call(lambda: broker.server.broker.vhosts["/"])
        assert broker.call(tracing.disable, vhost) is True
        assert broker.call(tracing.disable, vhost) is False
        assert broker.call(tracing.enable, vhost) is True  # behind the recorder again
        assert broker.call(tracing.enable, vhost) is False
        assert broker.published()[0].body == b"both"  # the record survived both


def test_firehose_stays_off_while_only_recording(manual: RunningBroker) -> None:
    conn = connect(manual)
    try:
        ch = conn.channel()
        ch.queue_declare("fire", durable=True)
        ch.queue_bind("fire", "amq.rabbitmq.trace", "#")
        ch.queue_declare("q", durable=True)
        ch.confirm_delivery()
        ch.basic_publish("", "q", b"x")
        assert ch.basic_get("q", auto_ack=True)[2] == b"x"
        assert manual.queue_depth("fire") == 0  # RabbitMQ: the firehose is on with trace_on
    finally:
        conn.close()


def test_recording_with_a_data_dir_and_over_a_restart(tmp_path: Path) -> None:
    """Recovery makes the vhosts anew: they are recorded too; a restart starts a new record
    and keeps broker time where it was."""
    with run_broker(data_dir=str(tmp_path), clock="manual") as broker:
        conn = connect(broker)
        ch = conn.channel()
        ch.queue_declare("jobs", durable=True, arguments={"x-message-ttl": 3_600_000})
        ch.confirm_delivery()
        ch.basic_publish("", "jobs", b"j", pika.BasicProperties(delivery_mode=2))
        assert [p.body for p in broker.published()] == [b"j"]
        broker.clock.advance(1800)
        broker.restart()
        assert broker.clock.advanced == 1800
        assert broker.published() == [] and broker.queue_depth("jobs") == 1
        broker.clock.advance(1800)  # the TTL counts on from before the restart
        assert broker.queue_depth("jobs") == 0
        assert broker.outcome_names("jobs") == ["expired"]


async def test_acks_rejects_and_timeouts_recorded_with_aio_pika_on_another_loop(
    manual: RunningBroker,
) -> None:
    """The threaded broker (as the fixtures run it) and aio-pika on the test's own loop:
    wait_for_async wakes across threads."""
    connection = await aio_pika.connect(manual.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.set_qos(prefetch_count=10)
        queue = await channel.declare_queue(
            "tasks",
            durable=True,
            arguments={**QUORUM, "x-consumer-timeout": 60_000},
        )
        for body in (b"ok", b"bad", b"slow"):
            await channel.default_exchange.publish(aio_pika.Message(body), routing_key="tasks")
        received: list[aio_pika.abc.AbstractIncomingMessage] = []

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            received.append(message)
            if message.body == b"ok":
                await message.ack()
            elif message.body == b"bad":
                await message.reject(requeue=False)

        tag = await queue.consume(on_message)
        await manual.wait_for_async(
            lambda: manual.outcome_names("tasks") == ["acked", "rejected", "unacked"]
        )
        manual.clock.advance(60)  # the one-minute consumer timeout of "slow"
        outcomes = manual.outcomes("tasks")
        assert [(o.body, o.outcome, o.consumer_tag) for o in outcomes] == [
            (b"ok", "acked", tag),
            (b"bad", "rejected", tag),
            (b"slow", "timed-out", tag),
        ]
        assert outcomes[2].timeout_ms == 60_000
        assert [p.body for p in manual.published(routing_key="tasks")] == [
            b"ok",
            b"bad",
            b"slow",
        ]
        assert channel.is_closed is False


def test_delivery_limit_after_delayed_retries_pika(manual: RunningBroker) -> None:
    conn = connect(manual)
    try:
        ch = conn.channel()
        ch.queue_declare("dead", durable=True)
        ch.queue_declare(
            "limited",
            durable=True,
            arguments={
                **QUORUM,
                "x-delivery-limit": 1,
                "x-delayed-retry-type": "all",
                "x-delayed-retry-min": 60_000,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": "dead",
            },
        )
        ch.confirm_delivery()
        ch.basic_publish("", "limited", b"flaky")
        method, _, _ = ch.basic_get("limited")
        # a reject is a failed delivery; a nack with requeue would not count (RabbitMQ 4.3,
        # rabbit_channel.erl: basic.reject settles as failed, basic.nack as a plain return)
        ch.basic_reject(method.delivery_tag, requeue=True)  # 1st failure: retried in a minute
        assert ch.basic_get("limited") == (None, None, None)
        manual.clock.advance(60)
        method, props, _ = ch.basic_get("limited")
        assert props.headers["x-delivery-count"] == 1
        ch.basic_reject(method.delivery_tag, requeue=True)  # 2nd: past the limit
        manual.wait_for(lambda: manual.outcome_names("dead") == ["ready"])
        (outcome,) = manual.outcomes("limited")
        assert (outcome.outcome, outcome.reason, outcome.count) == (
            "dead-lettered",
            "delivery_limit",
            2,
        )
        assert outcome.history == [
            "published", "got", "rejected", "retry-scheduled", "got", "rejected", "dead-lettered",
        ]  # fmt: skip
    finally:
        conn.close()


def test_recorder_answers_every_event_the_tracer_has() -> None:
    """The recorder stands where the tracer stands: an event it lacks is an internal error."""
    from warren.broker.testkit.recorder import Recorder
    from warren.broker.tracing.tracer import Tracer

    events = [n for n, v in vars(Tracer).items() if callable(v) and not n.startswith("_")]
    assert "delayed" in events
    assert [n for n in events if n not in vars(Recorder)] == []


def test_a_delayed_message_is_recorded_where_it_is_released(manual: RunningBroker) -> None:
    conn = connect(manual)
    ch = conn.channel()
    ch.exchange_declare("later", "x-delayed-message", arguments={"x-delayed-type": "direct"})
    ch.queue_declare("jobs", durable=True)
    ch.queue_bind("jobs", "later", "k")
    ch.basic_publish(
        "later", "k", b"in a minute", pika.BasicProperties(headers={"x-delay": 60_000})
    )
    ch.queue_declare("jobs", passive=True)  # the publish was handled
    assert [p.routed_to for p in manual.published()] == [[]]
    assert manual.outcome_names("jobs") == []
    manual.clock.advance(60)
    assert [p.routed_to for p in manual.published()] == [["jobs"]]
    assert manual.outcome_names("jobs") == ["ready"]
    assert ch.queue_declare("jobs", passive=True).method.message_count == 1
    conn.close()
