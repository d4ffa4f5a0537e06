"""RabbitMQ 3.10's own rabbitmqadmin (v1, build/rabbitmqadmin as the image ships it), run as
a subprocess against Warren: every subcommand of its ``help subcommands``, each listing in
the output formats operators script against.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.test_docker_tools import RABBITMQADMIN
from warren.broker.testkit import RunningBroker, run_broker


@pytest.fixture(scope="module")
def warren(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    data_dir = tmp_path_factory.mktemp("rabbitmqadmin")
    with run_broker(management_port=0, prometheus_port=0, data_dir=str(data_dir)) as running:
        yield running


def admin(warren: RunningBroker, *args: str, stdin: str | None = None) -> str:
    """rabbitmqadmin's output of a command that must succeed (exit 0)."""
    assert RABBITMQADMIN.is_file(), "make build/rabbitmqadmin (docker/fetch-rabbitmqadmin)"
    port = str(warren.server.management_port)
    command = [sys.executable, str(RABBITMQADMIN), "-H", "127.0.0.1", "-P", port, *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, input=stdin)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout


def rows(warren: RunningBroker, *args: str) -> Any:
    return json.loads(admin(warren, "-f", "raw_json", *args))


@pytest.fixture(scope="module")
def client(warren: RunningBroker) -> Iterator[pika.BlockingConnection]:
    """A connection with a consumer, so that every listing has a row to print."""
    params = pika.URLParameters(warren.url)
    params.client_properties = {"connection_name": "admin-client"}
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.queue_declare("admin.consumed", durable=True)
    ch.basic_consume("admin.consumed", lambda *a: None)
    conn.process_data_events(0)
    try:
        yield conn
    finally:
        if conn.is_open:
            conn.close()


LISTINGS = (
    "connections",
    "channels",
    "consumers",
    "exchanges",
    "queues",
    "bindings",
    "users",
    "vhosts",
    "permissions",
    "nodes",
    "parameters",
    "policies",
    "operator_policies",
    "vhost_limits",
)


@pytest.mark.parametrize("what", LISTINGS)
def test_list_in_every_format(
    warren: RunningBroker, client: pika.BlockingConnection, what: str
) -> None:
    """Each listing prints in each of rabbitmqadmin's formats without a crash (3.10's
    ``list consumers`` measured every value with len(): a null crashed it)."""
    for fmt in ("table", "long", "kvp", "tsv", "bash"):
        admin(warren, "-f", fmt, "list", what)
    assert isinstance(rows(warren, "list", what), list)


def test_lists_show_the_objects_and_stats_columns(
    warren: RunningBroker, client: pika.BlockingConnection
) -> None:
    [conn] = [c for c in rows(warren, "list", "connections") if c.get("user_provided_name")]
    assert conn["recv_oct"] > 0 and conn["send_oct"] > 0
    [consumer] = rows(warren, "list", "consumers")
    assert consumer["queue"]["name"] == "admin.consumed"
    table = admin(warren, "list", "queues", "name", "messages", "consumer_capacity", "memory")
    assert "admin.consumed" in table and "consumer_capacity" in table
    [node] = rows(warren, "list", "nodes")
    assert node["running"] is True
    overview = json.loads(admin(warren, "-f", "raw_json", "show", "overview"))
    assert overview[0]["object_totals"]["consumers"] >= 1
    assert "churn_rates" in overview[0]
    admin(warren, "show", "overview")


def test_declare_use_and_delete_every_object(
    warren: RunningBroker, client: pika.BlockingConnection, tmp_path: Path
) -> None:
    steps = [
        ("declare", "vhost", "name=adm.v", "tracing=false"),
        ("declare", "exchange", "name=adm.x", "type=topic", "durable=true"),
        ("declare", "queue", "name=adm.q", "durable=true", 'arguments={"x-max-length": 100}'),
        ("declare", "queue", "name=adm.qq", "queue_type=quorum", "durable=true"),
        ("declare", "binding", "source=adm.x", "destination=adm.q", "routing_key=a.*"),
        ("declare", "user", "name=adm.u", "password=adm.p", "tags=monitoring"),
        ("declare", "permission", "vhost=adm.v", "user=adm.u", "configure=.*", "write=.*",
         "read=.*"),
        ("declare", "parameter", "component=federation-upstream", "name=adm.up",
         'value={"uri": "amqp://localhost"}'),
        ("declare", "policy", "name=adm.pol", "pattern=^adm\\.", 'definition={"max-length": 50}',
         "priority=1", "apply-to=queues"),
        ("declare", "operator_policy", "name=adm.op", "pattern=^adm\\.",
         'definition={"max-length": 20}', "apply-to=queues"),
        ("declare", "vhost_limit", "vhost=adm.v", "name=max-queues", "value=10"),
    ]
    for step in steps:
        assert "declared" in admin(warren, *step), step
    assert [p["name"] for p in rows(warren, "list", "policies")] == ["adm.pol"]
    assert [p["name"] for p in rows(warren, "list", "operator_policies")] == ["adm.op"]
    parameters = {(p["component"], p["name"]) for p in rows(warren, "list", "parameters")}
    # vhost limits and operator policies are parameters too; only policies are left out
    # (RabbitMQ 4.3, rabbit_runtime_parameters:list/0)
    assert parameters == {
        ("federation-upstream", "adm.up"),
        ("vhost-limits", "limits"),
        ("operator_policy", "adm.op"),
    }
    [limit] = [v for v in rows(warren, "list", "vhost_limits") if v["vhost"] == "adm.v"]
    assert limit["value"] == {"max-queues": 10}
    # publish (an argument, then stdin), get, purge
    assert "published" in admin(warren, "publish", "exchange=adm.x", "routing_key=a.b",
                                "payload=one", 'properties={"timestamp": 1700000000}')
    assert "published" in admin(warren, "publish", "exchange=adm.x", "routing_key=a.c",
                                stdin="two")
    [got] = rows(warren, "get", "queue=adm.q", "ackmode=ack_requeue_true")
    assert got["payload"] == "one" and got["message_count"] == 1
    payload_file = tmp_path / "payload"
    admin(warren, "get", "queue=adm.q", "ackmode=ack_requeue_true", f"payload_file={payload_file}")
    assert payload_file.read_text() == "one"
    [queue] = [q for q in rows(warren, "list", "queues") if q["name"] == "adm.q"]
    assert queue["messages"] == 2 and queue["message_bytes"] == 6
    assert queue["head_message_timestamp"] == 1700000000
    assert "purged" in admin(warren, "purge", "queue", "name=adm.q")
    # export, then import what was exported
    defs = tmp_path / "defs.json"
    assert "Exported" in admin(warren, "export", str(defs))
    exported = json.loads(defs.read_text())
    assert "adm.q" in {q["name"] for q in exported["queues"]}
    assert "Uploaded" in admin(warren, "import", str(defs))
    deletions = [
        ("delete", "binding", "source=adm.x", "destination_type=queue", "destination=adm.q",
         "properties_key=a.*"),
        ("delete", "exchange", "name=adm.x"),
        ("delete", "queue", "name=adm.q"),
        ("delete", "queue", "name=adm.qq"),
        ("delete", "permission", "vhost=adm.v", "user=adm.u"),
        ("delete", "parameter", "component=federation-upstream", "name=adm.up"),
        ("delete", "policy", "name=adm.pol"),
        ("delete", "operator_policy", "name=adm.op"),
        ("delete", "vhost_limit", "vhost=adm.v", "name=max-queues"),
        ("delete", "user", "name=adm.u"),
        ("delete", "vhost", "name=adm.v"),
    ]
    for step in deletions:
        assert "deleted" in admin(warren, *step), step
    assert "adm.q" not in {q["name"] for q in rows(warren, "list", "queues")}
    assert rows(warren, "list", "policies") == []
    assert rows(warren, "list", "operator_policies") == []


def test_close_connection(warren: RunningBroker) -> None:
    params = pika.URLParameters(warren.url)
    params.client_properties = {"connection_name": "admin-closed"}
    conn = pika.BlockingConnection(params)
    try:
        [name] = [
            c["name"]
            for c in rows(warren, "list", "connections")
            if c.get("user_provided_name") == "admin-closed"
        ]
        assert "closed" in admin(warren, "close", "connection", f"name={name}")
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            conn.process_data_events(2)
        assert closed.value.reply_code == 320
    finally:
        if conn.is_open:
            conn.close()
