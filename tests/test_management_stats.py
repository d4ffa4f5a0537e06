"""The statistics fields of /api/queues, /api/connections, /api/channels and /api/overview
that RabbitMQ's tools read, computed from what real clients did.

Field names and meanings: RabbitMQ 4.3, deps/rabbit/src/rabbit_amqqueue_process.erl (i/2:
consumer_capacity, memory; handle_pre_hibernate/1: idle_since), rabbit_variable_queue.erl
(info/2: message_bytes*, messages_persistent, *_ram; head_message_timestamp/2),
rabbit_channel.erl (handle_pre_hibernate/1), and
deps/rabbitmq_management_agent/src/rabbit_mgmt_format.erl (now_to_str/1,
format_queue_basic_stats/1); shapes checked against the RabbitMQ 3.10.8 on this machine.
"""

from __future__ import annotations

import datetime
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.http_api import HttpApi, q
from warren.broker.testkit import RunningBroker, run_broker

PERSISTENT = pika.BasicProperties(delivery_mode=2)


@pytest.fixture(scope="module")
def warren(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    data_dir: Path = tmp_path_factory.mktemp("management-stats")
    with run_broker(
        management_port=0,
        prometheus_port=0,
        data_dir=str(data_dir),
        # the tests take the statistics samples themselves (sample()): none in between
        collect_statistics_interval=3_600_000,
    ) as running:
        yield running


@pytest.fixture(scope="module")
def api(warren: RunningBroker) -> HttpApi:
    port = warren.server.management_port
    assert port
    return HttpApi(port)


@pytest.fixture
def conn(warren: RunningBroker, name: str) -> Iterator[pika.BlockingConnection]:
    params = pika.URLParameters(warren.url)
    params.client_properties = {"connection_name": name}  # found by it (conn_name)
    connection = pika.BlockingConnection(params)
    try:
        yield connection
    finally:
        if connection.is_open:
            connection.close()


def sample(warren: RunningBroker) -> None:
    warren.call(warren.server.management.rates.sample)


def queue(api: HttpApi, name: str) -> dict[str, Any]:
    body: dict[str, Any] = api.ok("GET", f"/api/queues/%2F/{q(name)}")
    return body


def listed(api: HttpApi, name: str) -> dict[str, Any]:
    rows: list[dict[str, Any]] = api.ok("GET", "/api/queues/%2F")
    return next(row for row in rows if row["name"] == name)


def ms_of(text: str) -> int:
    """RabbitMQ's now_to_str/1: RFC 3339 with milliseconds and the local offset."""
    assert text[10] == "T" and text[19] == "." and text[23] in "+-Z", text
    return int(datetime.datetime.fromisoformat(text).timestamp() * 1000)


def test_byte_counts_follow_ready_unacked_and_settled_messages(
    api: HttpApi, conn: pika.BlockingConnection, name: str
) -> None:
    ch = conn.channel()
    ch.queue_declare(name, durable=True)
    ch.basic_publish("", name, b"a" * 10, PERSISTENT)
    ch.basic_publish("", name, b"b" * 20)  # transient in a durable queue: not persistent
    ch.basic_publish("", name, b"c" * 40, PERSISTENT)
    conn.process_data_events(0)
    got = queue(api, name)
    assert got["message_bytes"] == got["message_bytes_ready"] == 70
    assert got["message_bytes_unacknowledged"] == 0
    assert got["messages_persistent"] == 2
    assert got["message_bytes_persistent"] == 50
    assert got["messages_ram"] == got["messages_ready_ram"] == 3
    assert got["message_bytes_ram"] == 70
    # two taken, unacked: the bytes move, the total stays
    first, _, _ = ch.basic_get(name)
    second, _, _ = ch.basic_get(name)
    assert first is not None and second is not None
    got = queue(api, name)
    assert got["message_bytes_ready"] == 40
    assert got["message_bytes_unacknowledged"] == 30
    assert got["message_bytes"] == 70
    assert got["messages_unacknowledged_ram"] == 2
    # one acked, one rejected without requeue: both gone
    ch.basic_ack(first.delivery_tag)
    ch.basic_reject(second.delivery_tag, requeue=False)
    conn.process_data_events(0)
    got = queue(api, name)
    assert got["message_bytes_unacknowledged"] == 0
    assert got["message_bytes"] == 40
    assert got["messages_persistent"] == 1 and got["message_bytes_persistent"] == 40
    # taken and the channel closed: back to ready
    third, _, _ = ch.basic_get(name)
    assert third is not None
    assert queue(api, name)["message_bytes_unacknowledged"] == 40
    ch.close()
    got = queue(api, name)
    assert got["message_bytes_unacknowledged"] == 0
    assert got["message_bytes_ready"] == got["message_bytes"] == 40
    # the same numbers in the listing
    row = listed(api, name)
    assert (row["message_bytes"], row["message_bytes_persistent"]) == (40, 40)


def test_quorum_queue_messages_are_all_persistent(
    api: HttpApi, conn: pika.BlockingConnection, name: str
) -> None:
    """rabbit_quorum_queue's handle_tick: messages_persistent is every message, and a quorum
    queue has no head_message_timestamp or *_ready_ram keys."""
    ch = conn.channel()
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    ch.basic_publish("", name, b"x" * 7)
    ch.basic_publish("", name, b"y" * 5, PERSISTENT)
    conn.process_data_events(0)
    got = queue(api, name)
    assert got["messages_persistent"] == 2 and got["message_bytes_persistent"] == 12
    assert "head_message_timestamp" not in got and "messages_ready_ram" not in got


def test_queue_message_stats_by_delivery_kind(
    api: HttpApi, conn: pika.BlockingConnection, name: str
) -> None:
    ch = conn.channel()
    ch.queue_declare(name, durable=True)
    for body in (b"1", b"2", b"3", b"4"):
        ch.basic_publish("", name, body)
    manual, _, _ = ch.basic_get(name)
    assert manual is not None
    ch.basic_ack(manual.delivery_tag)
    assert ch.basic_get(name, auto_ack=True)[0] is not None
    got: list[bytes] = []
    ch.basic_consume(name, lambda c, m, p, b: got.append(b), auto_ack=True)
    while len(got) < 2:
        conn.process_data_events(1)
    ch.cancel()
    assert ch.basic_get(name)[0] is None
    assert ch.basic_get(name)[0] is None
    stats = queue(api, name)["message_stats"]
    picked = {k: stats[k] for k in ("publish", "deliver_get", "deliver", "deliver_no_ack")}
    assert picked == {"publish": 4, "deliver_get": 4, "deliver": 0, "deliver_no_ack": 2}
    assert (stats["get"], stats["get_no_ack"], stats["get_empty"], stats["ack"]) == (1, 1, 2, 1)
    assert stats["get_empty_details"] == {"rate": 0.0}


def test_head_message_timestamp(api: HttpApi, conn: pika.BlockingConnection, name: str) -> None:
    """The older timestamp property of the ready head and the oldest unacked message; null
    in the queue's own JSON and absent from a listing when neither has one."""
    ch = conn.channel()
    ch.queue_declare(name, durable=True)
    assert queue(api, name)["head_message_timestamp"] is None
    assert "head_message_timestamp" not in listed(api, name)
    ch.basic_publish("", name, b"1", pika.BasicProperties(timestamp=1_700_000_000))
    ch.basic_publish("", name, b"2", pika.BasicProperties(timestamp=1_600_000_000))
    conn.process_data_events(0)
    assert queue(api, name)["head_message_timestamp"] == 1_700_000_000
    method, _, _ = ch.basic_get(name)  # unacked now: still the oldest
    assert method is not None
    assert queue(api, name)["head_message_timestamp"] == 1_600_000_000
    assert listed(api, name)["head_message_timestamp"] == 1_600_000_000
    ch.basic_ack(method.delivery_tag)
    ch.basic_get(name, auto_ack=True)
    assert queue(api, name)["head_message_timestamp"] is None


def test_idle_since_of_queues_and_channels(
    warren: RunningBroker, api: HttpApi, conn: pika.BlockingConnection, name: str
) -> None:
    """Present once a statistics sample found the queue (channel) as it is now, with that
    sample's time; gone as soon as it does something, until the next sample."""
    ch = conn.channel()
    ch.queue_declare(name, durable=True)
    ch.basic_publish("", name, b"x")
    conn.process_data_events(0)
    before = int(time.time() * 1000)
    sample(warren)
    after = int(time.time() * 1000)
    got = queue(api, name)
    assert before <= ms_of(got["idle_since"]) <= after
    assert "idle_since" not in listed(api, name)  # the basic form leaves it out (4.3)
    channels = api.ok("GET", f"/api/connections/{q(conn_name(api, name))}/channels")
    [mine] = [c for c in channels if c["number"] == ch.channel_number]
    assert before <= ms_of(mine["idle_since"]) <= after
    # activity: no longer idle, for the queue and for the channel
    ch.basic_publish("", name, b"y")
    conn.process_data_events(0)
    assert "idle_since" not in queue(api, name)
    channel = api.ok("GET", f"/api/channels/{q(mine['name'])}")
    assert "idle_since" not in channel
    later = int(time.time() * 1000)
    sample(warren)
    assert ms_of(queue(api, name)["idle_since"]) >= later
    # unchanged at the next sample: the time stays that of the first quiet one
    idle = queue(api, name)["idle_since"]
    sample(warren)
    assert queue(api, name)["idle_since"] == idle


def conn_name(api: HttpApi, name: str) -> str:
    """The broker's name of the test's connection (``conn``), by the name it gave itself."""
    rows = api.ok("GET", "/api/connections")
    [found] = [row["name"] for row in rows if row.get("user_provided_name") == name]
    assert isinstance(found, str)
    return found


def test_consumer_capacity(api: HttpApi, conn: pika.BlockingConnection, name: str) -> None:
    """0 without consumers (rabbit_amqqueue_process:i/2); 1.0 while a consumer can take
    what the queue has; consumer_utilisation is the same value."""
    ch = conn.channel()
    ch.queue_declare(name, durable=True)
    got = queue(api, name)
    assert got["consumer_capacity"] == got["consumer_utilisation"] == 0
    ch.basic_consume(name, lambda *a: None, auto_ack=True)
    conn.process_data_events(0)
    got = queue(api, name)
    assert got["consumer_capacity"] == got["consumer_utilisation"] == 1.0


def test_memory_counts_the_messages_held(
    api: HttpApi, conn: pika.BlockingConnection, name: str
) -> None:
    ch = conn.channel()
    ch.queue_declare(name, durable=True)
    empty = queue(api, name)["memory"]
    assert empty > 0
    for _ in range(10):
        ch.basic_publish("", name, b"z" * 1000)
    conn.process_data_events(0)
    full = queue(api, name)["memory"]
    assert full >= empty + 10_000
    ch.queue_purge(name)
    assert queue(api, name)["memory"] == empty


def test_connection_socket_counters(
    warren: RunningBroker, api: HttpApi, conn: pika.BlockingConnection, name: str
) -> None:
    """recv_oct/send_oct count bytes, recv_cnt/send_cnt socket reads and writes; send_pend
    what the socket has not taken yet (nothing, for a client that reads)."""
    got = api.ok("GET", f"/api/connections/{q(conn_name(api, name))}")
    assert got["recv_oct"] > 0 and got["send_oct"] > 0
    assert got["recv_cnt"] > 0 and got["send_cnt"] > 0
    assert got["send_pend"] == 0
    assert got["recv_oct_details"] == {"rate": 0.0}
    sample(warren)
    ch = conn.channel()
    ch.queue_declare(name, durable=True)
    ch.basic_publish("", name, b"p" * 5000)
    conn.process_data_events(0)
    sample(warren)
    after = api.ok("GET", f"/api/connections/{q(conn_name(api, name))}")
    assert after["recv_oct"] >= got["recv_oct"] + 5000
    assert after["recv_cnt"] > got["recv_cnt"] and after["send_cnt"] > got["send_cnt"]
    assert after["recv_oct_details"]["rate"] > 0


def test_channel_message_stats(api: HttpApi, conn: pika.BlockingConnection, name: str) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(name, durable=True)
    ch.basic_publish("", name, b"1")
    ch.basic_publish("", name, b"2")
    ch.basic_get(name, auto_ack=True)
    channels = api.ok("GET", f"/api/connections/{q(conn_name(api, name))}/channels")
    [mine] = [c for c in channels if c["number"] == ch.channel_number]
    stats = mine["message_stats"]
    assert (stats["publish"], stats["confirm"], stats["get_no_ack"]) == (2, 2, 1)
    assert stats["deliver_get"] == 1 and stats["get"] == 0


def test_overview_churn_rates_and_delivery_kinds(
    api: HttpApi, warren: RunningBroker, name: str
) -> None:
    before = api.ok("GET", "/api/overview")
    connection = pika.BlockingConnection(pika.URLParameters(warren.url))
    ch = connection.channel()
    ch.queue_declare(name, durable=True)
    ch.queue_declare(name, durable=True)
    ch.basic_publish("", name, b"1")
    ch.basic_get(name, auto_ack=True)
    ch.basic_get(name)
    ch.queue_delete(name)
    connection.close()
    after = api.ok("GET", "/api/overview")
    churn = {
        k: after["churn_rates"][k] - before["churn_rates"][k]
        for k in before["churn_rates"]
        if not k.endswith("_details")
    }
    assert churn == {
        "channel_created": 1,
        "channel_closed": 1,
        "connection_created": 1,
        "connection_closed": 1,
        "queue_declared": 2,
        "queue_created": 1,
        "queue_deleted": 1,
    }
    assert isinstance(after["churn_rates"]["queue_created_details"]["rate"], float)
    stats_before, stats_after = before["message_stats"], after["message_stats"]
    for key, delta in (("get_no_ack", 1), ("get_empty", 1), ("get", 0), ("deliver", 0)):
        assert stats_after[key] - stats_before.get(key, 0) == delta, key


def test_overview_disk_writes_outlive_their_queue(
    api: HttpApi, warren: RunningBroker, conn: pika.BlockingConnection, name: str
) -> None:
    """disk_writes: publish records written, summed over queues, deleted ones included."""
    before = api.ok("GET", "/api/overview")["message_stats"]["disk_writes"]
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(name, durable=True)
    ch.basic_publish("", name, b"w", PERSISTENT)
    ch.basic_publish("", name, b"t")  # transient: no record
    assert api.ok("GET", "/api/overview")["message_stats"]["disk_writes"] == before + 1
    ch.queue_delete(name)
    assert api.ok("GET", "/api/overview")["message_stats"]["disk_writes"] == before + 1
    sample(warren)
    stats = api.ok("GET", "/api/overview")["message_stats"]
    assert stats["disk_writes"] == before + 1
    assert isinstance(stats["disk_writes_details"]["rate"], float)
    assert stats["disk_reads"] >= 0


# the keys rabbitmqadmin v2 (RabbitMQ's current CLI) will not parse a node without, as
# issue 38 found them
ADMIN_V2_NODE_KEYS = {
    "uptime": int,
    "run_queue": int,
    "processors": int,
    "os_pid": str,
    "fd_total": int,
    "proc_total": int,
    "mem_limit": int,
    "mem_alarm": bool,
    "disk_free_limit": int,
    "disk_free_alarm": bool,
    "rates_mode": str,
    "enabled_plugins": list,
    "being_drained": bool,
}


def test_node_keys_are_measured(api: HttpApi, warren: RunningBroker, name: str) -> None:
    (node,) = api.ok("GET", "/api/nodes")
    for key, kind in ADMIN_V2_NODE_KEYS.items():
        assert isinstance(node[key], kind), key
    assert node["os_pid"] == str(os.getpid())  # the broker runs in this process
    assert node["processors"] == len(os.sched_getaffinity(0))
    assert node["fd_total"] == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert 0 < node["fd_used"] < node["fd_total"]
    assert node["sockets_total"] == int((node["fd_total"] - 103) * 0.9 - 2)
    assert node["proc_used"] > 0 and node["proc_total"] > node["proc_used"]
    assert node["disk_free"] > 0 and node["mem_used"] > 0
    assert "rabbitmq_management" in node["enabled_plugins"]
    assert "rabbitmq_prometheus" in node["enabled_plugins"]  # this broker has the port
    assert node["rates_mode"] == "basic" and node["being_drained"] is False
    assert {m["name"] for m in node["auth_mechanisms"]} == {"PLAIN", "AMQPLAIN"}
    assert node["db_dir"] == warren.server.broker.settings.data_dir
    # counters that move with what clients do
    sockets = node["sockets_used"]
    connection = pika.BlockingConnection(pika.URLParameters(warren.url))
    try:
        ch = connection.channel()
        ch.queue_declare(name, durable=True)
        ch.confirm_delivery()
        ch.basic_publish("", name, b"d" * 100, PERSISTENT)
        after = api.ok("GET", f"/api/nodes/{q(node['name'])}")
        assert after["sockets_used"] == sockets + 1
        assert after["connection_created"] == node["connection_created"] + 1
        assert after["queue_created"] == node["queue_created"] + 1
        assert isinstance(after["channel_created_details"]["rate"], float)
        assert after["msg_store_write_count"] == node["msg_store_write_count"] + 1
        assert after["io_write_bytes"] > node["io_write_bytes"]
        assert after["io_sync_count"] > node["io_sync_count"]
        assert after["uptime"] >= node["uptime"]
        # rates of change between two samples (RabbitMQ's *_details of node measures)
        sample(warren)
        ch.basic_publish("", name, b"d" * 100, PERSISTENT)
        sample(warren)
        rated = api.ok("GET", f"/api/nodes/{q(node['name'])}")
        assert rated["msg_store_write_count_details"]["rate"] > 0
        assert rated["io_write_bytes_details"]["rate"] > 0
        for key in ("mem_used", "fd_used", "sockets_used", "proc_used", "disk_free", "gc_num"):
            assert isinstance(rated[key + "_details"]["rate"], float), key
    finally:
        connection.close()
