"""Dynamic shovels: ``PUT /api/parameters/shovel/{vhost}/{name}`` moves messages, observed with
real clients (pika) on Warren and on the RabbitMQ on this machine.

RabbitMQ 4.3, deps/rabbitmq_shovel/src: rabbit_shovel_parameters.erl (validate/5,
shovel_validation/0), rabbit_amqp091_shovel.erl (validate_src/1, validate_dest/1,
validate_src_funs/2, validate_dest_funs/2; parse_source/1 and parse_dest/4 for defaults;
publish/4 and confirm_to_inbound/4: with on-confirm a message is acked to the source only
once the destination confirmed it), rabbit_shovel_util.erl (validate_uri/3,
validate_delete_after/2, update_headers/5), rabbit_shovel_worker.erl (report_running/1: the
status row's fields; terminate/2 with autodelete clears the parameter);
deps/rabbit/src/rabbit_parameter_validation.erl (proplist/3: "Unrecognised terms", 'Key
"..." not found'); deps/amqp_client/src/amqp_uri.erl (the URI errors);
deps/rabbitmq_shovel_management/src/rabbit_shovel_mgmt_shovel.erl (the per-shovel routes) and
rabbit_shovel_mgmt_util.erl (format/2: the status rows).

The RabbitMQ tests use the broker at ``WARREN_RABBITMQ_URL`` (default: guest on
127.0.0.1:5672), with a few connections each and queues of their own, deleted at the end.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.http_api import HttpApi
from warren.broker.testkit import RunningBroker, run_broker

RABBITMQ = os.environ.get("WARREN_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
WAIT = 60.0  # seconds a test waits for messages to arrive before it fails


@pytest.fixture
def warren() -> Iterator[RunningBroker]:
    with run_broker(management_port=0) as running:
        yield running


@pytest.fixture
def api(warren: RunningBroker) -> HttpApi:
    assert warren.server.management_port
    return HttpApi(warren.server.management_port)


def publish(url: str, queue: str, ids: range, declare: bool = True) -> None:
    """Persistent messages into a durable queue, each body its id, in transactions of 500:
    tx.commit-ok says they are on disk (one confirm at a time would wait for each fsync)."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        if declare:
            ch.queue_declare(queue, durable=True)
        ch.tx_select()
        props = pika.BasicProperties(delivery_mode=2)
        for i in ids:
            ch.basic_publish("", queue, str(i).encode(), props)
            if i % 500 == 499:
                ch.tx_commit()
        ch.tx_commit()
    finally:
        conn.close()


def receive(url: str, queue: str, expected: set[int], wait: float = WAIT) -> list[int]:
    """Consume (and ack) from ``queue`` until every id in ``expected`` came, or ``wait`` ends;
    every id received, duplicates included, in order."""
    got: list[int] = []
    deadline = time.monotonic() + wait
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        for method, _, body in ch.consume(queue, inactivity_timeout=0.2):
            if method is not None:
                got.append(int(body))
                ch.basic_ack(method.delivery_tag)
            if expected <= set(got) or time.monotonic() > deadline:
                break
        ch.cancel()
    finally:
        conn.close()
    return got


def depth(url: str, queue: str) -> int:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return int(conn.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        conn.close()


def delete_queue(url: str, queue: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        conn.channel().queue_delete(queue)
    finally:
        conn.close()


def wait_for(predicate: Any, what: str, wait: float = WAIT) -> Any:
    """Poll a broker's state (an API read) until ``predicate`` holds; fails after ``wait``."""
    deadline = time.monotonic() + wait
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def shovel_state(api: HttpApi, name: str) -> dict[str, Any] | None:
    rows = api.ok("GET", "/api/shovels")
    return next((r for r in rows if r["name"] == name), None)


def running(api: HttpApi, name: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        row = shovel_state(api, name)
        return row if row is not None and row["state"] == "running" else None

    result: dict[str, Any] = wait_for(check, f"shovel {name} running")
    return result


# -- within Warren --------------------------------------------------------------------------


def test_a_shovel_moves_100_messages_within_warren(warren: RunningBroker, api: HttpApi) -> None:
    publish(warren.url, "from", range(100))
    definition = {
        "src-uri": "amqp://",
        "src-queue": "from",
        "dest-uri": "amqp://",
        "dest-queue": "to",
        "dest-add-forward-headers": True,
        "dest-add-timestamp-header": True,
    }
    reply = api.request("PUT", "/api/parameters/shovel/%2F/mover", {"value": definition})
    assert reply.status == 201
    got = receive(warren.url, "to", set(range(100)))
    assert got == list(range(100))  # one consumer, one publisher: the order is kept
    assert depth(warren.url, "from") == 0
    row = running(api, "mover")
    assert row["forwarded"] == 100
    assert {k: row[k] for k in ("vhost", "type", "src_uri", "dest_uri", "src_queue")} == {
        "vhost": "/",
        "type": "dynamic",
        "src_uri": "amqp://",
        "dest_uri": "amqp://",
        "src_queue": "from",
    }
    assert row["dest_queue"] == "to"
    assert row["src_protocol"] == row["dest_protocol"] == "amqp091"
    # rabbit_shovel_behaviour:metrics/1; without src-delete-after both are unlimited
    assert (row["remaining"], row["remaining_unacked"], row["pending"]) == (
        "unlimited",
        "unlimited",
        0,
    )
    # the forward headers name the shovel (rabbit_shovel_util:update_headers/5)
    publish(warren.url, "from", range(100, 101), declare=False)
    conn = pika.BlockingConnection(pika.URLParameters(warren.url))
    ch = conn.channel()
    wait_for(lambda: depth(warren.url, "to") == 1, "the forwarded message")
    _, props, body = ch.basic_get("to", auto_ack=True)
    conn.close()
    assert body == b"100"
    (entry,) = props.headers["x-shovelled"]
    assert entry == {
        "shovelled-by": api.ok("GET", "/api/overview")["cluster_name"],
        "shovel-type": "dynamic",
        "shovel-name": "mover",
        "shovel-vhost": "/",
        "src-uri": "amqp://",
        "dest-uri": "amqp://",
        "src-queue": "from",
        "dest-queue": "to",
    }
    assert abs(props.headers["x-shovelled-timestamp"] - time.time()) < 60
    # the shovel's connections are direct ones, named after it
    names = {
        c["client_properties"].get("connection_name") for c in api.ok("GET", "/api/connections")
    }
    assert "Shovel mover" in names


def test_large_and_empty_bodies_and_properties_cross_intact(
    warren: RunningBroker, api: HttpApi
) -> None:
    """A body over frame_max arrives in several body frames, an empty one in none; the
    properties arrive as the publisher sent them."""
    big = bytes(range(256)) * 1200  # 307,200 bytes: three body frames at frame_max 131072
    props = pika.BasicProperties(
        content_type="application/octet-stream",
        message_id="m-1",
        priority=3,
        headers={"x-n": 1, "nested": {"a": [1, "b"]}},
        delivery_mode=2,
    )
    conn = pika.BlockingConnection(pika.URLParameters(warren.url))
    ch = conn.channel()
    ch.queue_declare("bodies", durable=True)
    ch.basic_publish("", "bodies", big, props)
    ch.basic_publish("", "bodies", b"", props)
    definition = {
        "src-uri": "amqp://",
        "src-queue": "bodies",
        "dest-uri": "amqp://",
        "dest-queue": "copies",
    }
    api.ok("PUT", "/api/parameters/shovel/%2F/bodies", {"value": definition})
    running(api, "bodies")  # the destination queue is declared
    wait_for(lambda: depth(warren.url, "copies") == 2, "both messages")
    got = [ch.basic_get("copies", auto_ack=True) for _ in range(2)]
    conn.close()
    assert [body for _, _, body in got] == [big, b""]
    for _, received, _ in got:
        assert (received.content_type, received.message_id, received.priority) == (
            "application/octet-stream",
            "m-1",
            3,
        )
        assert received.headers == {"x-n": 1, "nested": {"a": [1, "b"]}}
        assert received.delivery_mode == 2


def test_a_blocked_destination_shows_as_blocked_and_resumes(
    warren: RunningBroker, api: HttpApi
) -> None:
    """connection.blocked from the destination (a memory alarm here): the state is blocked
    (rabbit_amqp091_shovel:status/1), and the shovel carries on once unblocked."""
    definition = {
        "src-uri": "amqp://",
        "src-queue": "pressure",
        "dest-uri": "amqp://",
        "dest-queue": "relief",
    }
    publish(warren.url, "pressure", range(5))
    api.ok("PUT", "/api/parameters/shovel/%2F/pressed", {"value": definition})
    assert receive(warren.url, "relief", set(range(5))) == list(range(5))
    monitor = warren.server.broker.monitor

    def memory_limit(limit: int) -> None:
        monitor.memory_limit = limit
        monitor.check()

    warren.call(memory_limit, 1)
    state = lambda: (shovel_state(api, "pressed") or {}).get("state")  # noqa: E731
    wait_for(lambda: state() == "blocked", "blocked")
    warren.call(memory_limit, 1 << 50)
    wait_for(lambda: state() == "running", "running again")
    publish(warren.url, "pressure", range(5, 10), declare=False)
    assert receive(warren.url, "relief", set(range(5, 10))) == list(range(5, 10))


def test_exchange_to_exchange_keeps_or_replaces_the_routing_key(
    warren: RunningBroker, api: HttpApi
) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(warren.url))
    ch = conn.channel()
    ch.exchange_declare("in", "topic")
    ch.exchange_declare("out", "direct")
    ch.queue_declare("kept", durable=True)
    ch.queue_bind("kept", "out", "a.b")
    definition = {
        "src-uri": "amqp://",
        "src-exchange": "in",
        "src-exchange-key": "a.#",
        "dest-uri": ["amqp://"],
        "dest-exchange": "out",
        "ack-mode": "on-publish",
    }
    api.ok("PUT", "/api/parameters/shovel/%2F/x2x", {"value": definition})
    row = running(api, "x2x")
    assert (row["src_exchange"], row["src_exchange_key"], row["dest_exchange"]) == (
        "in",
        "a.#",
        "out",
    )
    ch.basic_publish("in", "a.b", b"1")
    ch.basic_publish("in", "x.y", b"2")  # not bound at the source
    conn.close()
    assert receive(warren.url, "kept", {1}) == [1]
    assert depth(warren.url, "kept") == 0


def test_move_messages_deletes_the_shovel_when_the_queue_is_moved(
    warren: RunningBroker, api: HttpApi
) -> None:
    """The console's "Move messages": src-delete-after queue-length; once that many moved,
    the shovel deletes its own parameter (rabbit_shovel_worker:terminate/2, autodelete)."""
    publish(warren.url, "full", range(25))
    definition = {
        "src-uri": "amqp://",
        "src-queue": "full",
        "dest-uri": "amqp://",
        "dest-queue": "empty",
        "src-delete-after": "queue-length",
    }
    api.ok("PUT", "/api/parameters/shovel/%2F/move", {"value": definition})
    wait_for(lambda: api.get("/api/parameters/shovel/%2F/move").status == 404, "autodelete")
    assert api.ok("GET", "/api/shovels") == []
    assert depth(warren.url, "full") == 0
    assert receive(warren.url, "empty", set(range(25))) == list(range(25))
    # a count: exactly that many, the rest stays
    publish(warren.url, "full", range(10), declare=False)
    definition["src-delete-after"] = 4
    api.ok("PUT", "/api/parameters/shovel/%2F/four", {"value": definition})
    wait_for(lambda: api.get("/api/parameters/shovel/%2F/four").status == 404, "autodelete")
    assert depth(warren.url, "full") == 6
    assert receive(warren.url, "empty", {0, 1, 2, 3}) == [0, 1, 2, 3]


def test_delete_after_duration_ends_the_shovel(warren: RunningBroker, api: HttpApi) -> None:
    """src-delete-after-duration: seconds after it started consuming, the shovel deletes
    itself whatever it moved (rabbit_shovel_util:sched_expire_after_duration/2)."""
    definition = {
        "src-uri": "amqp://",
        "src-queue": "idle",
        "dest-uri": "amqp://",
        "src-delete-after-duration": 1,
    }
    api.ok("PUT", "/api/parameters/shovel/%2F/brief", {"value": definition})
    running(api, "brief")
    wait_for(lambda: api.get("/api/parameters/shovel/%2F/brief").status == 404, "autodelete")
    assert api.ok("GET", "/api/shovels") == []


BASE = {"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://"}


@pytest.mark.parametrize(
    ("value", "errors"),
    [
        ({**BASE, "bogus": 1}, ['Unrecognised terms [{<<"bogus">>,1}] in bad']),
        (
            {**BASE, "src-uri": "http://x"},
            ['"http://x" not a valid URI: {{unexpected_uri_scheme,"http"},"http://x"}'],
        ),
        (
            {**BASE, "dest-uri": "amqp://h:99999"},
            ['"amqp://h:99999" not a valid URI: {{port_out_of_range,99999},"amqp://h:99999"}'],
        ),
        ({"src-uri": "amqp://", "src-queue": "q"}, ['Key "dest-uri" not found in bad']),
        ({**BASE, "src-exchange": "x"}, ["Cannot specify 'src-exchange' and 'src-queue'"]),
        (
            {"src-uri": "amqp://", "dest-uri": "amqp://"},
            ["Must specify 'src-exchange' or 'src-queue'"],
        ),
        (
            {**BASE, "dest-queue": "a", "dest-exchange": "b"},
            ["Cannot specify 'dest-exchange' and 'dest-queue'"],
        ),
        (
            {**BASE, "src-delete-after": 5, "ack-mode": "no-ack"},
            ["Cannot specify 'no-ack' and numerical 'delete-after'"],
        ),
        (
            {**BASE, "src-delete-after": -1},
            [
                'src-delete-after should be a number greater than or equal to 0, "never" or '
                '"queue-length", actually was -1'
            ],
        ),
        (
            {**BASE, "ack-mode": "sometimes"},
            [
                'ack-mode should be one of [<<"no-ack">>,<<"on-publish">>,<<"on-confirm">>], '
                'actually was <<"sometimes">>'
            ],
        ),
        (
            {**BASE, "src-prefetch-count": "10", "dest-add-forward-headers": 1},
            [
                "dest-add-forward-headers should be boolean, actually was 1",
                'src-prefetch-count should be a number, actually was <<"10">>',
            ],
        ),
        (
            {**BASE, "src-uri": "amqp:///nowhere"},
            ['user "none" may not connect to vhost "nowhere"'],
        ),
    ],
)
def test_bad_definitions_are_refused_and_change_nothing(
    api: HttpApi, value: dict[str, Any], errors: list[str]
) -> None:
    reply = api.request("PUT", "/api/parameters/shovel/%2F/bad", {"value": value})
    assert reply.status == 400
    assert reply.body == {
        "error": "bad_request",
        "reason": "Validation failed\n\n" + "".join(e + "\n" for e in errors),
    }
    assert api.get("/api/parameters/shovel/%2F/bad").status == 404
    assert api.ok("GET", "/api/shovels") == []


def test_restart_delete_and_the_definition_without_credentials(
    warren: RunningBroker, api: HttpApi
) -> None:
    api.ok("PUT", "/api/users/mover", {"password": "secret", "tags": ""})
    api.ok("PUT", "/api/permissions/%2F/mover", {"configure": ".*", "write": ".*", "read": ".*"})
    host, port = warren.server.addresses[0]
    uri = f"amqp://mover:secret@{host}:{port}/%2F?heartbeat=10"
    definition = {"src-uri": uri, "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b"}
    api.ok("PUT", "/api/parameters/shovel/%2F/s", {"value": definition})
    row = running(api, "s")
    assert row["src_uri"] == f"amqp://{host}:{port}/%2F"  # no credentials, no query
    shown = api.ok("GET", "/api/shovels/vhost/%2F/s")
    assert shown["value"]["src-uri"] == f"amqp://{host}:{port}/%2F"
    assert (shown["vhost"], shown["component"], shown["name"]) == ("/", "shovel", "s")
    # the stored parameter keeps them: the shovel needs them
    assert api.ok("GET", "/api/parameters/shovel/%2F/s")["value"]["src-uri"] == uri
    assert api.request("DELETE", "/api/shovels/vhost/%2F/s/restart").status == 204
    running(api, "s")
    publish(warren.url, "a", range(3), declare=False)
    assert receive(warren.url, "b", {0, 1, 2}) == [0, 1, 2]
    assert api.request("DELETE", "/api/shovels/vhost/%2F/nope/restart").status == 404
    assert api.get("/api/shovels/vhost/%2F/nope").status == 404
    assert api.request("DELETE", "/api/shovels/vhost/%2F/s").status == 204
    assert api.get("/api/parameters/shovel/%2F/s").status == 404
    assert api.ok("GET", "/api/shovels") == []
    publish(warren.url, "a", range(3, 4), declare=False)
    assert depth(warren.url, "a") == 1  # stopped: nothing consumes any more


def test_a_shovel_that_cannot_connect_reports_terminated_and_retries(
    warren: RunningBroker, api: HttpApi
) -> None:
    with socket.socket() as sock:  # a port with nobody behind it
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    definition = {
        "src-uri": f"amqp://127.0.0.1:{port}",
        "src-queue": "q",
        "dest-uri": "amqp://",
        "reconnect-delay": 0.2,
    }
    api.ok("PUT", "/api/parameters/shovel/%2F/lost", {"value": definition})

    def terminated() -> dict[str, Any] | None:
        row = shovel_state(api, "lost")
        return row if row is not None and row["state"] == "terminated" else None

    row = wait_for(terminated, "terminated")
    assert row["reason"] == '"failed to connect to source"'


def test_shovels_survive_a_restart_and_travel_in_definitions(tmp_path: Path) -> None:
    definition = {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b"}
    with run_broker(management_port=0, data_dir=str(tmp_path / "one")) as one:
        api = HttpApi(one.server.management_port or 0)
        api.ok("PUT", "/api/parameters/shovel/%2F/kept", {"value": definition})
        running(api, "kept")
        one.restart()
        running(api, "kept")
        publish(one.url, "a", range(5), declare=False)
        assert receive(one.url, "b", set(range(5))) == list(range(5))
        exported = api.ok("GET", "/api/definitions")
    assert [p for p in exported["parameters"] if p["component"] == "shovel"] == [
        {"value": definition, "vhost": "/", "component": "shovel", "name": "kept"}
    ]
    with run_broker(management_port=0) as two:
        api = HttpApi(two.server.management_port or 0)
        api.ok("POST", "/api/definitions", exported)
        running(api, "kept")
        publish(two.url, "a", range(3), declare=False)
        assert receive(two.url, "b", {0, 1, 2}) == [0, 1, 2]


# -- with the RabbitMQ on this machine -----------------------------------------------------


def unique(prefix: str) -> str:
    return f"warren-shovel-{prefix}-{uuid.uuid4().hex[:8]}"


def test_a_shovel_moves_100_messages_into_rabbitmq(warren: RunningBroker, api: HttpApi) -> None:
    target = unique("in")
    try:
        publish(warren.url, "out", range(100))
        definition = {
            "src-uri": "amqp://",
            "src-queue": "out",
            "dest-uri": RABBITMQ,
            "dest-queue": target,
        }
        api.ok("PUT", "/api/parameters/shovel/%2F/to-rabbit", {"value": definition})
        assert receive(RABBITMQ, target, set(range(100))) == list(range(100))
        assert depth(warren.url, "out") == 0
    finally:
        api.request("DELETE", "/api/shovels/vhost/%2F/to-rabbit")
        delete_queue(RABBITMQ, target)


def test_a_shovel_moves_100_messages_out_of_rabbitmq(warren: RunningBroker, api: HttpApi) -> None:
    source = unique("out")
    try:
        publish(RABBITMQ, source, range(100))
        definition = {
            "src-uri": RABBITMQ,
            "src-queue": source,
            "dest-uri": "amqp://",
            "dest-queue": "in",
            "src-delete-after": "queue-length",
        }
        api.ok("PUT", "/api/parameters/shovel/%2F/from-rabbit", {"value": definition})
        assert receive(warren.url, "in", set(range(100))) == list(range(100))
        gone = lambda: api.get("/api/parameters/shovel/%2F/from-rabbit").status == 404  # noqa: E731
        wait_for(gone, "autodelete")
        assert depth(RABBITMQ, source) == 0
    finally:
        delete_queue(RABBITMQ, source)


# -- kill -9 --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Warren:
    """A Warren in its own process, so that it can be killed with SIGKILL and started again
    on the same ports and data directory."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.port = free_port()
        self.http_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"
        self.api = HttpApi(self.http_port)

    def start(self) -> None:
        log = open(self.data.parent / f"{self.data.name}.log", "ab")  # noqa: SIM115
        command = [sys.executable, "-m", "warren", "--bind", "127.0.0.1"]
        command += ["--port", str(self.port), "--management-port", str(self.http_port)]
        command += ["--prometheus-port", "none", "--data-dir", str(self.data)]
        self.proc = subprocess.Popen(command, stdout=log, stderr=log)
        log.close()
        wait_for(self._ready, "warren to start")

    def _ready(self) -> bool:
        assert self.proc is not None
        assert self.proc.poll() is None, "warren exited"
        try:
            return self.api.get("/api/overview").status == 200
        except OSError:
            return False

    def kill_9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture
def process(tmp_path: Path) -> Iterator[Warren]:
    broker = Warren(tmp_path / "warren")
    broker.start()
    yield broker
    broker.stop()


N = 5000


def moved_some(url: str, queue: str, at_least: int) -> bool:
    try:
        return depth(url, queue) >= at_least
    except pika.exceptions.AMQPError:
        return False


def test_on_confirm_loses_nothing_when_warren_is_killed_as_the_destination(
    process: Warren,
) -> None:
    """RabbitMQ -> Warren, the shovel in Warren: kill -9 Warren mid-way, start it again; the
    shovel comes back with its parameter and every message arrives (some maybe twice: what
    RabbitMQ acked was confirmed by Warren, the rest RabbitMQ redelivers)."""
    source = unique("kill-src")
    try:
        publish(RABBITMQ, source, range(N))
        definition = {
            "src-uri": RABBITMQ,
            "src-queue": source,
            "dest-uri": "amqp://",
            "dest-queue": "landed",
            "ack-mode": "on-confirm",
            "src-prefetch-count": 200,
            "reconnect-delay": 1,
        }
        process.api.ok("PUT", "/api/parameters/shovel/%2F/in", {"value": definition})
        wait_for(lambda: moved_some(process.url, "landed", N // 50), "some messages moved")
        process.kill_9()
        assert depth(RABBITMQ, source) > 0, "the kill came after every message moved"
        process.start()
        got = receive(process.url, "landed", set(range(N)))
        assert set(got) == set(range(N))
        wait_for(lambda: depth(RABBITMQ, source) == 0, "the source drained")
    finally:
        process.api.request("DELETE", "/api/shovels/vhost/%2F/in")
        delete_queue(RABBITMQ, source)


def test_on_confirm_loses_nothing_when_warren_is_killed_as_the_source(process: Warren) -> None:
    """Warren -> RabbitMQ, the shovel in Warren: kill -9 Warren mid-way; what Warren had not
    seen acked is still in its queue after the restart, and the shovel moves it."""
    target = unique("kill-dest")
    try:
        publish(process.url, "leaving", range(N))
        definition = {
            "src-uri": "amqp://",
            "src-queue": "leaving",
            "dest-uri": RABBITMQ,
            "dest-queue": target,
            "src-prefetch-count": 200,
            "reconnect-delay": 1,
        }
        process.api.ok("PUT", "/api/parameters/shovel/%2F/out", {"value": definition})
        wait_for(lambda: moved_some(RABBITMQ, target, N // 50), "some messages moved")
        process.kill_9()
        assert depth(RABBITMQ, target) < N, "the kill came after every message moved"
        process.start()
        got = receive(RABBITMQ, target, set(range(N)))
        assert set(got) == set(range(N))
        wait_for(lambda: depth(process.url, "leaving") == 0, "the source drained")
    finally:
        process.api.request("DELETE", "/api/shovels/vhost/%2F/out")
        delete_queue(RABBITMQ, target)


def test_a_shovel_reconnects_when_the_other_broker_is_killed_and_comes_back(
    warren: RunningBroker, api: HttpApi, tmp_path: Path
) -> None:
    """Warren -> another Warren, which is killed with SIGKILL and started again: the shovel
    reports terminated, reconnects after reconnect-delay, and with on-confirm every message
    arrives."""
    other = Warren(tmp_path / "other")
    other.start()
    try:
        publish(warren.url, "far", range(N))
        definition = {
            "src-uri": "amqp://",
            "src-queue": "far",
            "dest-uri": other.url,
            "dest-queue": "away",
            "src-prefetch-count": 100,
            "reconnect-delay": 0.5,
        }
        api.ok("PUT", "/api/parameters/shovel/%2F/far", {"value": definition})
        wait_for(lambda: moved_some(other.url, "away", N // 50), "some messages moved")
        other.kill_9()
        assert depth(warren.url, "far") > 0, "the kill came after every message moved"

        def terminated() -> bool:
            row = shovel_state(api, "far")
            return row is not None and row["state"] == "terminated"

        wait_for(terminated, "the shovel to see the destination gone")
        other.start()
        got = receive(other.url, "away", set(range(N)))
        assert set(got) == set(range(N))
        assert running(api, "far")["dest_uri"] == f"amqp://127.0.0.1:{other.port}/%2F"
    finally:
        other.stop()


def test_status_rows_are_json_objects_rabbitmqadmin_reads(api: HttpApi) -> None:
    """rabbitmqadmin 3.10's list shovels shows name, vhost, type, state; every value is a JSON
    scalar (a null or nested object would break its table)."""
    definition = {"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://"}
    api.ok("PUT", "/api/parameters/shovel/%2F/plain", {"value": definition})
    row = running(api, "plain")
    assert all(isinstance(v, str | int) for v in row.values()), json.dumps(row)


# -- the console's "Move messages" ----------------------------------------------------------


def test_the_console_moves_messages_with_a_shovel_that_deletes_itself(
    warren: RunningBroker, api: HttpApi, tmp_path: Path
) -> None:
    """The queue page's "Move messages" form, as rabbitmq_shovel_management's shovel.js sends
    it: a shovel named "Move from {queue}" with src-delete-after queue-length."""
    from playwright.sync_api import expect, sync_playwright

    from tests.test_console import CHROMIUM, CHROMIUM_ARGS, POLL_MS, SHOT_LIMIT

    publish(warren.url, "console.stuck", range(40))
    errors: list[str] = []
    shots = Path(os.environ.get("WARREN_CONSOLE_SHOTS") or tmp_path)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{api.base}/?refresh={POLL_MS}")
        page.fill("input[name=username]", "guest")
        page.fill("input[name=password]", "guest")
        page.click("form#login button[type=submit]")
        expect(page.locator("#who")).to_contain_text("guest")
        page.goto(f"{api.base}/?refresh={POLL_MS}#/queue/%2F/console.stuck")
        expect(page.locator("[data-stat=ready] b")).to_have_text("40")
        form = page.locator("form[data-role=move-messages]")
        form.locator("input[name=destination]").fill("console.fixed")
        form.scroll_into_view_if_needed()
        form.locator("button[type=submit]").click()
        expect(form.locator(".msg.ok")).to_contain_text("Moving the messages to console.fixed")
        expect(page.locator("[data-stat=ready] b")).to_have_text("0")
        page.screenshot(path=str(shots / "console-move.png"), full_page=False)
        browser.close()
    assert 0 < (shots / "console-move.png").stat().st_size < SHOT_LIMIT
    assert errors == []
    gone = "/api/parameters/shovel/%2F/Move%20from%20console.stuck"
    wait_for(lambda: api.get(gone).status == 404, "the shovel to delete itself")
    assert receive(warren.url, "console.fixed", set(range(40))) == list(range(40))


# -- warrenctl -------------------------------------------------------------------------------


def test_warrenctl_shovel_status_restart_and_delete(warren: RunningBroker, api: HttpApi) -> None:
    """rabbitmqctl's shovel_status, restart_shovel and delete_shovel (rabbitmq_shovel's
    Elixir.RabbitMQ.CLI.Ctl.Commands.*ShovelCommand.erl: banners, the not-found texts)."""
    from tests.test_warrenctl import ctl

    definition = {"src-uri": "amqp://", "src-queue": "c1", "dest-uri": "amqp://"}
    api.ok("PUT", "/api/parameters/shovel/%2F/ctl", {"value": definition})
    running(api, "ctl")
    node = api.ok("GET", "/api/overview")["node"]
    status = ctl(warren, "shovel_status")
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0] == f"Shovel status on node {node}"
    assert lines[1].split("\t") == [
        "name", "vhost", "type", "state", "source", "destination", "last_changed"
    ]  # fmt: skip
    assert lines[2].split("\t")[:6] == ["ctl", "/", "dynamic", "running", "amqp://", "amqp://"]
    restarted = ctl(warren, "restart_shovel", "ctl")
    assert restarted.returncode == 0, restarted.stderr
    assert restarted.stdout.startswith(
        f"Restarting dynamic Shovel ctl in virtual host / on node {node}"
    )
    missing = ctl(warren, "restart_shovel", "nope")
    assert missing.returncode == 70
    assert (
        f"Shovel with the given name was not found on the target node '{node}' and / or "
        "virtual host '/'"
    ) in missing.stderr
    deleted = ctl(warren, "delete_shovel", "ctl")
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.startswith("Deleting shovel ctl in vhost /")
    assert api.get("/api/parameters/shovel/%2F/ctl").status == 404
    assert ctl(warren, "delete_shovel", "ctl").returncode == 70
