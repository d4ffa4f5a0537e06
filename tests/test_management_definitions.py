"""Definitions: RabbitMQ's JSON format exported and imported over HTTP and at boot.

``tests/data/rabbitmq-3.10-definitions.json`` was exported from RabbitMQ
3.10.8 (user ``orders-app`` has password ``s3cret``, ``guest`` has ``guest``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.http_api import HttpApi, q
from warren.broker.ops.management.definitions import DefinitionsError
from warren.broker.testkit import RunningBroker, run_broker

RABBITMQ_FILE = Path(__file__).parent / "data" / "rabbitmq-3.10-definitions.json"


@pytest.fixture
def warren() -> Iterator[RunningBroker]:
    with run_broker(management_port=0) as running:
        yield running


@pytest.fixture
def api(warren: RunningBroker) -> HttpApi:
    port = warren.server.management_port
    assert port
    return HttpApi(port)


def amqp(warren: RunningBroker, user: str, password: str, vhost: str) -> pika.BlockingConnection:
    url = f"amqp://{user}:{password}@{warren.host}:{warren.port}/{q(vhost)}"
    return pika.BlockingConnection(pika.URLParameters(url))


def test_rabbitmq_export_imports_and_works(warren: RunningBroker, api: HttpApi) -> None:
    reply = api.request("POST", "/api/definitions", raw=RABBITMQ_FILE.read_bytes())
    assert reply.status == 204
    user = api.ok("GET", "/api/users/orders-app")
    assert user["tags"] == ["management"]
    assert user["password_hash"] == "EfW3Hr2p4d1WqDH9qJFWVyt/EpRPxDUyDj9+onsPhU3sQRFb"
    created = api.ok("GET", "/api/queues/orders/orders.created")
    assert (created["type"], created["durable"], created["policy"]) == (
        "quorum",
        True,
        "orders-limits",
    )
    assert created["arguments"]["x-delivery-limit"] == 5
    # the imported user logs in with the password it had on RabbitMQ, with its permissions
    conn = amqp(warren, "orders-app", "s3cret", "orders")
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("orders.events", "order.created.eu", b"{}")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            ch.queue_declare("billing", durable=True)
        assert closed.value.reply_text == (
            "ACCESS_REFUSED - access to queue 'billing' in vhost 'orders' refused for user "
            "'orders-app'"
        )
    finally:
        conn.close()
    assert api.ok("GET", "/api/queues/orders/orders.created")["messages"] == 1
    (e2e,) = api.ok("GET", "/api/bindings/orders/e/orders.commands/e/orders.events")
    assert (e2e["routing_key"], e2e["arguments"]) == ("cmd", {"x-tenant": "eu"})
    # importing again changes nothing: what exists is kept
    assert api.request("POST", "/api/definitions", raw=RABBITMQ_FILE.read_bytes()).status == 204
    assert api.ok("GET", "/api/queues/orders/orders.created")["messages"] == 1


def _normalised(defs: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in defs.items():
        if isinstance(value, list):
            out[key] = sorted(value, key=lambda item: json.dumps(item, sort_keys=True))
        else:
            out[key] = value
    return out


def build_topology(api: HttpApi) -> None:
    api.ok("PUT", "/api/vhosts/shop", {"description": "the shop", "tags": "prod,eu"})
    api.ok("PUT", "/api/users/alice", {"password": "pw", "tags": "management,policymaker"})
    api.ok("PUT", "/api/users/svc", {"password": "pw2", "tags": ""})
    for user in ("guest", "alice"):
        api.ok(
            "PUT", f"/api/permissions/shop/{user}", {"configure": ".*", "write": ".*", "read": ".*"}
        )
    api.ok(
        "PUT", "/api/permissions/shop/svc", {"configure": "^svc", "write": "^svc", "read": "^svc"}
    )
    api.ok("PUT", "/api/exchanges/shop/events", {"type": "topic", "durable": True})
    api.ok(
        "PUT",
        "/api/exchanges/shop/commands",
        {"type": "direct", "durable": True, "arguments": {"alternate-exchange": "events"}},
    )
    api.ok(
        "PUT", "/api/exchanges/shop/hx", {"type": "headers", "auto_delete": False, "internal": True}
    )
    api.ok(
        "PUT", "/api/queues/shop/orders", {"durable": True, "arguments": {"x-message-ttl": 5000}}
    )
    api.ok(
        "PUT", "/api/queues/shop/work", {"durable": True, "arguments": {"x-queue-type": "quorum"}}
    )
    api.ok("PUT", "/api/queues/%2F/plain", {"durable": True})
    api.ok("POST", "/api/bindings/shop/e/events/q/orders", {"routing_key": "order.#"})
    api.ok(
        "POST",
        "/api/bindings/shop/e/hx/q/work",
        {"routing_key": "", "arguments": {"x-match": "all", "kind": "job"}},
    )
    api.ok("POST", "/api/bindings/shop/e/commands/e/events", {"routing_key": "c"})
    api.ok(
        "PUT",
        "/api/policies/shop/limits",
        {
            "pattern": "^orders$",
            "definition": {"max-length": 10},
            "priority": 2,
            "apply-to": "queues",
        },
    )


def wipe(api: HttpApi) -> None:
    for user in api.ok("GET", "/api/users"):
        if user["name"] != "guest":
            api.ok("DELETE", f"/api/users/{q(user['name'])}")
    for vhost in api.ok("GET", "/api/vhosts"):
        if vhost["name"] != "/":
            api.ok("DELETE", f"/api/vhosts/{q(vhost['name'])}")
    for queue in api.ok("GET", "/api/queues/%2F"):
        api.ok("DELETE", f"/api/queues/%2F/{q(queue['name'])}")


def test_round_trip_export_wipe_import_compare(api: HttpApi) -> None:
    build_topology(api)
    exported = api.ok("GET", "/api/definitions")
    assert {"users", "vhosts", "permissions", "policies", "queues", "exchanges", "bindings"} <= set(
        exported
    )
    assert exported["rabbit_version"] == exported["rabbitmq_version"]
    wipe(api)
    after_wipe = api.ok("GET", "/api/definitions")
    assert after_wipe["queues"] == [] and after_wipe["exchanges"] == []
    assert [u["name"] for u in after_wipe["users"]] == ["guest"]
    assert api.request("POST", "/api/definitions", raw=json.dumps(exported).encode()).status == 204
    assert _normalised(api.ok("GET", "/api/definitions")) == _normalised(exported)
    # and the imported users can log in with their old passwords
    assert api.as_user("alice", "pw").ok("GET", "/api/whoami")["name"] == "alice"


def test_export_leaves_out_what_cannot_be_restored(warren: RunningBroker, api: HttpApi) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(warren.url))
    try:
        ch = conn.channel()
        ch.queue_declare("mine-only", exclusive=True)
        ch.queue_bind("mine-only", "amq.direct", "k")
        exported = api.ok("GET", "/api/definitions")
    finally:
        conn.close()
    assert "mine-only" not in [x["name"] for x in exported["queues"]]
    assert exported["bindings"] == []  # neither the exclusive queue's nor the default ones
    assert exported["exchanges"] == []  # amq.* and the default exchange are built in


def test_download_header(api: HttpApi) -> None:
    reply = api.get("/api/definitions?download=warren.json")
    assert reply.headers["Content-Disposition"] == "attachment; filename=warren.json"


def test_vhost_scoped_export_and_import(api: HttpApi) -> None:
    build_topology(api)
    exported = api.ok("GET", "/api/definitions/shop")
    assert set(exported) == {
        "rabbit_version",
        "metadata",  # rabbit_mgmt_wm_definitions:small_parts/1 (4.3), {vhost, _}
        "parameters",
        "policies",
        "queues",
        "exchanges",
        "bindings",
    }
    assert all("vhost" not in x for x in exported["queues"] + exported["exchanges"])
    api.ok("PUT", "/api/vhosts/shop-copy")
    api.ok(
        "PUT", "/api/permissions/shop-copy/guest", {"configure": ".*", "write": ".*", "read": ".*"}
    )
    assert (
        api.request("POST", "/api/definitions/shop-copy", raw=json.dumps(exported).encode()).status
        == 204
    )
    assert {x["name"] for x in api.ok("GET", "/api/queues/shop-copy")} == {"orders", "work"}
    assert api.ok("GET", "/api/policies/shop-copy/limits")["vhost"] == "shop-copy"
    assert api.get("/api/definitions/no-such-vhost").status == 400
    assert api.request("POST", "/api/definitions/no-such-vhost", raw=b"{}").status == 404


@pytest.mark.parametrize(
    ("definitions", "reason"),
    [
        ({"users": [{"name": "x", "password": "p"}]}, "tags_not_present"),
        (
            {
                "queues": [
                    {
                        "name": "q",
                        "vhost": "nope",
                        "durable": True,
                        "auto_delete": False,
                        "arguments": {},
                    }
                ]
            },
            ["no_such_vhost", "nope"],
        ),
        (
            {
                "permissions": [
                    {"user": "nobody", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}
                ]
            },
            ["no_such_user", "nobody"],
        ),
        (
            {
                "policies": [
                    {"vhost": "/", "name": "pz", "pattern": ".*", "definition": {"bogus": 1}}
                ]
            },
            "Validation failed\n\nunknown policy key 'bogus'\n (//pz)",
        ),
        (
            {"queues": [{"name": "q", "vhost": "/", "arguments": {"x-queue-type": "nope"}}]},
            None,
        ),
        ({"queues": "not a list"}, "'queues' must be a list of objects"),
    ],
)
def test_import_errors_are_400(api: HttpApi, definitions: dict[str, Any], reason: Any) -> None:
    reply = api.request("POST", "/api/definitions", raw=json.dumps(definitions).encode())
    assert reply.status == 400
    assert reply.body["error"] == "bad_request"
    if reason is not None:
        assert reply.body["reason"] == reason


def test_import_bad_json_and_skipped_entries(api: HttpApi) -> None:
    reply = api.request("POST", "/api/definitions", raw=b"{bad")
    assert (reply.status, reply.body["reason"]) == (400, "failed_to_parse_json")
    skipped = {
        "queues": [{"name": "amq.reserved", "vhost": "/", "durable": True, "arguments": {}}],
        "exchanges": [{"name": "amq.direct", "vhost": "/", "type": "fanout"}],
        "bindings": [
            {
                "source": "missing",
                "vhost": "/",
                "destination": "missing-too",
                "destination_type": "queue",
                "routing_key": "k",
                "arguments": {},
            }
        ],
    }
    assert api.request("POST", "/api/definitions", raw=json.dumps(skipped).encode()).status == 204
    assert api.get("/api/queues/%2F/amq.reserved").status == 404
    assert api.ok("GET", "/api/exchanges/%2F/amq.direct")["type"] == "direct"


def test_load_definitions_at_boot(tmp_path: Path) -> None:
    with run_broker(management_port=0, load_definitions=str(RABBITMQ_FILE)) as running:
        port = running.server.management_port
        assert port
        api = HttpApi(port)
        assert {v["name"] for v in api.ok("GET", "/api/vhosts")} == {"/", "orders"}
        # a 3.10 export has no x-queue-type; the import augments it as 4.3 does
        # (rabbit_definitions:add_queue_int/3 calls rabbit_amqqueue:augment_declare_args/5)
        assert api.ok("GET", "/api/queues/orders/orders.dead")["arguments"] == {
            "x-message-ttl": 86400000,
            "x-queue-type": "classic",
        }
        amqp(running, "orders-app", "s3cret", "orders").close()


def test_load_definitions_from_a_directory(tmp_path: Path) -> None:
    (tmp_path / "1-vhost.json").write_text(json.dumps({"vhosts": [{"name": "v1"}]}))
    (tmp_path / "2-queue.json").write_text(
        json.dumps({"queues": [{"name": "q1", "vhost": "v1", "durable": True, "arguments": {}}]})
    )
    (tmp_path / "ignored.txt").write_text("not json")
    with run_broker(load_definitions=str(tmp_path)) as running:
        assert running.call(lambda: list(running.server.broker.vhosts["v1"].queues)) == ["q1"]


def test_bad_definitions_file_stops_the_broker(tmp_path: Path) -> None:
    bad = tmp_path / "defs.json"
    bad.write_text(json.dumps({"users": [{"name": "x"}]}))
    with pytest.raises(DefinitionsError) as refused, run_broker(load_definitions=str(bad)):
        pass
    assert str(refused.value) == f'load_definitions: {bad}: "tags_not_present"'
    bad.write_text("{not json")
    with (
        pytest.raises(DefinitionsError, match="is not JSON"),
        run_broker(load_definitions=str(bad)),
    ):
        pass
    with (
        pytest.raises(DefinitionsError, match="cannot read"),
        run_broker(load_definitions=os.path.join(str(tmp_path), "missing.json")),
    ):
        pass
