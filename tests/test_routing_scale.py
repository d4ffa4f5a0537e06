"""Routing with many bindings: the topic trie against a reference matcher, exchanges kept
up to date binding by binding, and over a socket (pika, raw frames) the shapes that used
to cost in proportion to the bindings: thousands of ``user.<i>.#`` topic bindings, direct
exchanges with thousands of keys, exchange-to-exchange chains to thousands of queues."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pika.adapters.blocking_connection
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from tests.amqp_raw import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_METHOD,
    RawClient,
    build,
    frame_bytes,
    header_payload,
    method_payload,
)
from warren.broker.engine.exchange import (
    Binding,
    Declared,
    DirectExchange,
    Exchange,
    FanoutExchange,
    TopicExchange,
    TopicTrie,
)
from warren.broker.engine.message import Message
from warren.broker.testkit import RunningBroker, run_broker

CURVE = Path(__file__).resolve().parent / "benchmarks" / "routing_curve.py"

# -- the trie against a regular expression (hypothesis) ------------------------------------


def reference_matches(pattern: str, routing_key: str) -> bool:
    """RabbitMQ's topic rules as a regular expression over '.'-prefixed words: '*' is one
    word (possibly empty), '#' zero or more, and the empty key or pattern has no words."""

    def words(s: str) -> list[str]:
        return s.split(".") if s else []

    parts = {"*": r"\.[^.]*", "#": r"(?:\.[^.]*)*"}
    regex = "".join(parts.get(w, re.escape("." + w)) for w in words(pattern))
    return re.fullmatch(regex, "".join("." + w for w in words(routing_key))) is not None


# small alphabets, so that patterns and keys meet often; keys may hold '*' and '#' literally
PATTERNS = st.lists(st.sampled_from(["a", "b", "", "*", "#"]), max_size=5).map(".".join)
KEYS = st.lists(st.sampled_from(["a", "b", "", "c", "*", "#"]), max_size=6).map(".".join)


class Dest:
    """A destination as an exchange sees one: the exchanges bound to it are kept on it."""

    def __init__(self) -> None:
        self.sources: dict[Exchange, None] = {}


DESTS = [Dest() for _ in range(4)]


def test_reference_matcher_agrees_with_known_cases() -> None:
    cases = [
        ("#", "", True), ("*", "", False), ("", "", True), ("", "a", False),
        ("*", ".", False), ("*.*", ".", True), ("#.#", "a", True), ("a.#.#.b", "a.b", True),
        ("a.#.#.b", "a.x.y.b", True), ("a.*.#", "a", False), ("#.a", "a.a", True),
    ]  # fmt: skip
    for pattern, key, expected in cases:
        assert reference_matches(pattern, key) is expected, (pattern, key)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(PATTERNS, st.sampled_from(DESTS)), max_size=8), st.lists(KEYS))
def test_topic_trie_matches_reference(bound: list[tuple[str, object]], keys: list[str]) -> None:
    trie = TopicTrie()
    for pattern, dest in bound:
        trie.add(pattern, dest)
    for key in keys + [p for p, _ in bound]:
        got = trie.match(key)
        assert len({id(d) for d in got}) == len(got), "a destination twice"
        want = {id(d) for p, d in bound if reference_matches(p, key)}
        assert {id(d) for d in got} == want, key


# one operation on an exchange: bind (pattern, destination, arguments variant), unbind the
# n-th live binding, or drop every binding to a destination (a deleted queue)
OPS = st.one_of(
    st.tuples(st.just("bind"), PATTERNS, st.sampled_from(DESTS), st.sampled_from([0, 1])),
    st.tuples(st.just("unbind"), st.integers(0, 20)),
    st.tuples(st.just("drop"), st.sampled_from(DESTS)),
)
MATCHERS: dict[type[Exchange], Callable[[str, str], bool]] = {
    TopicExchange: reference_matches,
    DirectExchange: lambda pattern, key: pattern == key,
    FanoutExchange: lambda pattern, key: True,
}


@pytest.mark.parametrize("kind", list(MATCHERS), ids=lambda k: k.kind)
@settings(max_examples=150, deadline=None)
@given(ops=st.lists(OPS, max_size=25), keys=st.lists(KEYS, min_size=1, max_size=6))
def test_exchange_index_follows_bindings(
    kind: type[Exchange], ops: list[tuple], keys: list[str]
) -> None:
    """Route after every bind, unbind and destination drop: the index updated binding by
    binding routes as the bindings say, each destination once."""
    exchange = kind(Declared("x"))
    live: list[tuple[str, object, dict[str, int]]] = []
    matches = MATCHERS[kind]
    for op in ops:
        if op[0] == "bind":
            _, pattern, dest, variant = op
            arguments = {"v": variant} if variant else {}
            added = exchange.bind(Binding(dest, pattern, arguments))
            assert added == ((pattern, dest, arguments) not in live)
            if added:
                live.append((pattern, dest, arguments))
        elif op[0] == "unbind" and live:
            pattern, dest, arguments = live.pop(op[1] % len(live))
            assert exchange.unbind(dest, pattern, arguments)
        elif op[0] == "drop":
            exchange.unbind_destination(op[1])
            live = [b for b in live if b[1] is not op[1]]
        for key in keys + [b[0] for b in live]:
            got = exchange.route(key, dict)
            assert len({id(d) for d in got}) == len(got), "a destination twice"
            assert {id(d) for d in got} == {id(d) for p, d, _ in live if matches(p, key)}
        for dest in DESTS:
            bound = any(b[1] is dest for b in live)
            assert exchange.binds_to(dest) == bound
            assert (exchange in dest.sources) == bound
    if isinstance(exchange, TopicExchange) and not live:
        assert exchange._trie.empty(), "nodes left behind"


# -- over a socket: the shapes, routed exactly (pika) -----------------------------------------


@pytest.fixture
def channel(amqp_url: str) -> Iterator[pika.adapters.blocking_connection.BlockingChannel]:
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        yield ch
    finally:
        if conn.is_open:
            conn.close()


@pytest.fixture
def cleanup(amqp_url: str) -> Iterator[tuple[list[str], list[str]]]:
    """(queues, exchanges) to delete after the test, on a fresh connection."""
    queues: list[str] = []
    exchanges: list[str] = []
    yield queues, exchanges
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        ch = conn.channel()
        for q in queues:
            ch.queue_delete(q)
        for x in exchanges:
            ch.exchange_delete(x)
    finally:
        conn.close()


Channel = pika.adapters.blocking_connection.BlockingChannel


def drain(ch: Channel, queue: str) -> list[str]:
    bodies = []
    while True:
        method, _, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return sorted(bodies)
        bodies.append(body.decode())


def routed(ch: Channel, exchange: str, key: str) -> bool:
    """Publish ``key`` as the body, mandatory; False if the broker returned it unroutable."""
    try:
        ch.basic_publish(exchange, key, key.encode(), mandatory=True)
    except pika.exceptions.UnroutableError:
        return False
    return True


def test_topic_thousands_of_user_bindings_route_exactly(
    channel: Channel, cleanup: tuple[list[str], list[str]], name: str
) -> None:
    """2,000 ``user.<i>.#`` bindings over three queues, one ``user.*.alerts`` binding: each
    key reaches its user's queue (and the alerts queue) once; unbinding a user or deleting
    a queue takes exactly those routes away."""
    queues, exchanges = cleanup
    ch, ex = channel, f"{name}.x"
    exchanges.append(ex)
    ch.exchange_declare(ex, "topic")
    qs = [f"{name}.q{i}" for i in range(3)]
    alerts = f"{name}.alerts"
    for q in (*qs, alerts):
        queues.append(q)
        ch.queue_declare(q, durable=True)
    for i in range(2000):
        ch.queue_bind(qs[i % 3], ex, f"user.{i}.#")
    ch.queue_bind(alerts, ex, "user.*.alerts")
    sample = [0, 1, 2, 3, 500, 1001, 1999]
    for i in sample:
        for key in (f"user.{i}", f"user.{i}.x", f"user.{i}.alerts", f"user.{i}.a.b.c"):
            assert routed(ch, ex, key)
    assert not routed(ch, ex, "user.2000.x")
    assert not routed(ch, ex, "user")
    for n, q in enumerate(qs):
        want = [
            k for i in sample if i % 3 == n
            for k in (f"user.{i}", f"user.{i}.x", f"user.{i}.alerts", f"user.{i}.a.b.c")
        ]  # fmt: skip
        assert drain(ch, q) == sorted(want)
    assert drain(ch, alerts) == sorted(f"user.{i}.alerts" for i in sample)

    ch.queue_unbind(qs[1], ex, "user.1.#")
    ch.queue_delete(qs[2])
    assert not routed(ch, ex, "user.1.x")
    assert not routed(ch, ex, "user.2.x")
    assert routed(ch, ex, "user.4.x") and routed(ch, ex, "user.3.x")
    assert routed(ch, ex, "user.2.alerts")
    assert drain(ch, qs[0]) == ["user.3.x"]
    assert drain(ch, qs[1]) == ["user.4.x"]
    assert drain(ch, alerts) == ["user.2.alerts"]


def test_direct_thousands_of_keys_route_exactly(
    channel: Channel, cleanup: tuple[list[str], list[str]], name: str
) -> None:
    queues, exchanges = cleanup
    ch, ex = channel, f"{name}.x"
    exchanges.append(ex)
    ch.exchange_declare(ex, "direct")
    qa, qb = f"{name}.a", f"{name}.b"
    for q in (qa, qb):
        queues.append(q)
        ch.queue_declare(q, durable=True)
    for i in range(2000):
        ch.queue_bind(qa if i % 2 else qb, ex, f"device-{i}")
    ch.queue_bind(qa, ex, "device-10")  # two queues on one key
    ch.queue_bind(qa, ex, "device-11", arguments={"v": 1})  # the same queue twice
    for key in ("device-10", "device-11", "device-12", "device-1999"):
        assert routed(ch, ex, key)
    assert not routed(ch, ex, "device-2000")
    assert drain(ch, qa) == ["device-10", "device-11", "device-1999"]
    assert drain(ch, qb) == ["device-10", "device-12"]
    ch.queue_unbind(qa, ex, "device-11")
    assert routed(ch, ex, "device-11")  # the binding with arguments is still there
    ch.queue_unbind(qa, ex, "device-11", arguments={"v": 1})
    assert not routed(ch, ex, "device-11")
    assert drain(ch, qa) == ["device-11"]


def test_headers_many_bindings_one_copy_per_queue(
    channel: Channel, cleanup: tuple[list[str], list[str]], name: str
) -> None:
    queues, exchanges = cleanup
    ch, ex = channel, f"{name}.x"
    exchanges.append(ex)
    ch.exchange_declare(ex, "headers")
    qa, qb = f"{name}.a", f"{name}.b"
    for q in (qa, qb):
        queues.append(q)
        ch.queue_declare(q, durable=True)
    for i in range(300):
        ch.queue_bind(qa if i % 2 else qb, ex, arguments={"x-match": "any", f"h{i}": i, "all": 1})
    props = pika.BasicProperties(headers={"all": 1})
    ch.basic_publish(ex, "", b"everyone", props, mandatory=True)
    ch.basic_publish(ex, "", b"h7", pika.BasicProperties(headers={"h7": 7}), mandatory=True)
    assert drain(ch, qa) == ["everyone", "h7"]
    assert drain(ch, qb) == ["everyone"]


def test_exchange_chain_to_many_queues_one_copy_each(
    channel: Channel, cleanup: tuple[list[str], list[str]], name: str
) -> None:
    """A fanout bound to a topic and a direct exchange that reach the same 300 queues: one
    copy per queue."""
    queues, exchanges = cleanup
    ch = channel
    src, topic, direct = f"{name}.src", f"{name}.topic", f"{name}.direct"
    exchanges.extend((src, topic, direct))
    ch.exchange_declare(src, "fanout")
    ch.exchange_declare(topic, "topic")
    ch.exchange_declare(direct, "direct")
    ch.exchange_bind(topic, src)
    ch.exchange_bind(direct, src)
    qs = [f"{name}.q{i}" for i in range(300)]
    for i, q in enumerate(qs):
        queues.append(q)
        ch.queue_declare(q, durable=True)
        ch.queue_bind(q, topic, f"user.{i}.#")
        ch.queue_bind(q, topic, "*.7")
        ch.queue_bind(q, direct, "user.7")
    assert routed(ch, src, "user.7")
    assert routed(ch, src, "user.8.x")
    assert all(drain(ch, q) == ["user.7"] for q in qs[:8] + qs[9:])
    assert drain(ch, qs[8]) == ["user.7", "user.8.x"]


# -- over a socket: the rate does not fall with the bindings (raw frames) --------------------


def publishes(exchange: str, keys: list[str]) -> bytes:
    header = frame_bytes(FRAME_HEADER, 1, header_payload(1))
    body = frame_bytes(FRAME_BODY, 1, b"x")
    return b"".join(
        frame_bytes(
            FRAME_METHOD,
            1,
            method_payload(build(commands.Basic.Publish, exchange=exchange, routing_key=k)),
        )
        + header
        + body
        for k in keys
    )


def bind_many(c: RawClient, exchange: str, queues: list[str], keys: list[str]) -> None:
    """queue.bind with no-wait, pipelined, then a round trip to know they were all done."""
    c.send(
        b"".join(
            frame_bytes(
                FRAME_METHOD,
                1,
                method_payload(
                    build(
                        commands.Queue.Bind,
                        queue=queues[i % len(queues)],
                        exchange=exchange,
                        routing_key=k,
                        nowait=True,
                    )
                ),
            )
            for i, k in enumerate(keys)
        )
    )
    c.declare_queue(1, queues[0], passive=True)


SHAPES = {
    # exchange type, binding key of binding i, a routing key for a random binding
    "topic": ("topic", "user.{}.#", "user.{}.x"),
    "direct": ("direct", "device-{}", "device-{}"),
}


def lines_run(fn: Callable[[], object]) -> int:
    """Python lines ``fn`` executes in Warren's engine: the routing work itself, counted
    exactly (the machine's load does not change it, unlike a rate)."""
    count = 0

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line" and "/broker/" in frame.f_code.co_filename:
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count


def routing_lines(running: RunningBroker, exchange: str, keys: list[str]) -> int:
    """Lines the broker runs to route ``keys`` (on its own loop, where its objects live)."""

    def measure() -> int:
        vhost = running.server.broker.vhosts["/"]
        ex = vhost.exchanges[exchange]
        msgs = [Message(exchange, k, b"\x00\x00", b"x") for k in keys]
        return lines_run(lambda: [vhost.route(ex, m) for m in msgs])

    return running.call(measure)


@pytest.fixture(scope="module")
def engine() -> Iterator[RunningBroker]:
    with run_broker() as running:
        yield running


@pytest.mark.parametrize("shape", [*SHAPES, "topic-behind-exchange-binding"])
def test_routing_work_does_not_grow_with_bindings(
    engine: RunningBroker, name: str, shape: str
) -> None:
    """The same number of distinct-key routes with 100 and with 10,000 bindings: the engine
    runs about as many lines for each (a scan of the bindings per key ran 100 times more).
    Rates are routing_curve.py's business (make bench-compare), not a test's."""
    kind, bind_key, route_key = SHAPES[shape.split("-")[0]]
    c = RawClient.connect(("127.0.0.1", engine.port))
    qs = [f"{name}.q{i}" for i in range(2)]
    try:
        for q in qs:
            c.declare_queue(1, q, arguments={"x-max-length": 1})
        work: dict[int, int] = {}
        for n in (100, 10_000):
            ex = target = f"{name}.x{n}"
            c.declare_exchange(1, ex, kind)
            bind_many(c, ex, qs, [bind_key.format(i) for i in range(n)])
            if shape.endswith("exchange-binding"):
                target = f"{ex}.src"
                c.declare_exchange(1, target, "fanout")
                c.call(
                    1, build(commands.Exchange.Bind, destination=ex, source=target),
                    commands.Exchange.BindOk,
                )  # fmt: skip
            keys = [route_key.format((i * 7919) % n) for i in range(200)]
            work[n] = routing_lines(engine, target, keys)
        growth = work[10_000] / work[100]
        assert growth < 1.5, f"10,000 bindings cost {growth:.2f}x the lines of 100"
    finally:
        c.close()


def test_fanout_chain_to_many_queues_costs_in_proportion(engine: RunningBroker, name: str) -> None:
    """A fanout bound to a fanout with 4,000 queues costs about 10 times the lines of one
    with 400 (each queue is one more destination), not 100 times: the queues a message
    reaches are collected without a scan of those already found."""
    c = RawClient.connect(("127.0.0.1", engine.port))
    qs = [f"{name}.q{i}" for i in range(4000)]
    try:
        for q in qs:
            c.send_method(1, build(commands.Queue.Declare, queue=q, nowait=True, durable=True,
                                   arguments={"x-max-length": 1}))  # fmt: skip
        c.declare_queue(1, qs[-1], passive=True)
        work: dict[int, int] = {}
        for n in (400, 4000):
            src, inner = f"{name}.src{n}", f"{name}.inner{n}"
            c.declare_exchange(1, src, "fanout")
            c.declare_exchange(1, inner, "fanout")
            c.call(
                1, build(commands.Exchange.Bind, destination=inner, source=src),
                commands.Exchange.BindOk,
            )  # fmt: skip
            bind_many(c, inner, qs[:n], [""] * n)
            work[n] = routing_lines(engine, src, [""] * 5)
        growth = work[4000] / work[400]
        assert 8 < growth < 12, f"10x the queues cost {growth:.1f}x the lines"
    finally:
        c.close()


# -- the benchmark script itself ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["topic", "direct", "headers"])
def test_routing_curve_script_reports_each_point(amqp_url: str, kind: str, tmp_path: Path) -> None:
    """routing_curve.py (make bench-compare) against the test broker as both brokers: a
    row per point with both rates, and the exchanges and queues it made are gone after."""
    out = tmp_path / "rows.json"
    result = subprocess.run(
        [
            sys.executable, str(CURVE), "--warren-url", amqp_url, "--rabbit-url", amqp_url,
            "--kind", kind, "--bindings", "10,200", "--time", "0.2", "--runs", "1",
            "--warren-pid", str(os.getpid()), "--json", str(out),
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())
    assert [r["bindings"] for r in rows] == [10, 200]
    assert all(r["warren"] > 0 and r["rabbit"] > 0 for r in rows)
    assert "| 200 |" in result.stdout
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        ch = conn.channel()
        for broker in ("warren", "rabbit"):
            with pytest.raises(pika.exceptions.ChannelClosedByBroker):
                ch.exchange_declare(
                    f"routing-curve.{kind}.200.{broker}.{rows[0]['pid']}", passive=True
                )
            ch = conn.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker):
                ch.queue_declare(
                    f"routing-curve.{kind}.200.{broker}.{rows[0]['pid']}.q0", passive=True
                )
            ch = conn.channel()
    finally:
        if conn.is_open:
            conn.close()
