"""The management HTTP API over real sockets: paths, methods, status codes and JSON fields
as RabbitMQ 3.10's management plugin answers them (checked against a live RabbitMQ)."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pika
import pytest
from aiohttp import web
from pamqp import commands

from tests.amqp_raw import RawClient, build, frame_bytes, header_payload, method_payload
from tests.http_api import HttpApi, q
from warren.broker.ops.management import auth
from warren.broker.ops.management.app import Ctx, HttpSite, ManagementApp, Resource, Router
from warren.broker.testkit import RunningBroker, run_broker

GUEST_HASH_FROM_RABBITMQ = "bLDJCFT+RRW/IWLG0pNfWcaTbisQwjt5u24TLKjMA6r/NM6/"  # "guest"


@pytest.fixture(scope="module")
def warren() -> Iterator[RunningBroker]:
    with run_broker(management_port=0, prometheus_port=0) as running:
        yield running


@pytest.fixture(scope="module")
def api(warren: RunningBroker) -> HttpApi:
    port = warren.server.management_port
    assert port
    return HttpApi(port)


def sample(warren: RunningBroker) -> None:
    warren.call(warren.server.management.rates.sample)


# ---- protocol-level behaviour: auth, errors ----


def test_overview_and_whoami(api: HttpApi, warren: RunningBroker) -> None:
    overview = api.ok("GET", "/api/overview")
    assert overview["product_name"] == "Warren"
    assert overview["management_version"] == overview["rabbitmq_version"] == "3.10.8"
    assert {t["name"] for t in overview["exchange_types"]} == {
        "direct",
        "fanout",
        "topic",
        "headers",
        # built in: RabbitMQ lists them once their plugins are enabled (4.x: core)
        "x-consistent-hash",
        "x-delayed-message",
        "x-local-random",
        "x-modulus-hash",
    }
    assert set(overview["object_totals"]) == {
        "connections",
        "channels",
        "consumers",
        "exchanges",
        "queues",
    }
    assert {"messages", "messages_ready", "messages_unacknowledged"} <= set(
        overview["queue_totals"]
    )
    assert "publish_details" in overview["message_stats"]
    amqp = [x for x in overview["listeners"] if x["protocol"] == "amqp"]
    assert amqp[0]["port"] == warren.port
    assert api.ok("GET", "/api/whoami") == {"name": "guest", "tags": ["administrator"]}


def test_no_credentials_is_401_with_basic_realm(api: HttpApi) -> None:
    reply = api.request("GET", "/api/overview", auth=False)
    assert reply.status == 401
    assert reply.headers["WWW-Authenticate"] == 'Basic realm="RabbitMQ Management"'


def test_wrong_password_is_401_login_failed(api: HttpApi) -> None:
    reply = api.as_user("guest", "wrong").get("/api/overview")
    assert (reply.status, reply.body) == (
        401,
        {"error": "not_authorized", "reason": "Login failed"},
    )


def test_unknown_path_is_404_json(api: HttpApi) -> None:
    reply = api.get("/api/nothing-here")
    assert (reply.status, reply.body) == (404, {"error": "Object Not Found", "reason": "Not Found"})
    assert api.get("/elsewhere").status == 404


def test_wrong_method_is_405_with_allow(api: HttpApi) -> None:
    reply = api.post("/api/overview")
    assert reply.status == 405
    assert reply.headers["Allow"] == "GET"
    assert reply.body["error"] == "method_not_allowed"
    assert api.request("PUT", "/api/queues/%2F").status == 405


def test_bad_json_is_400_not_json(api: HttpApi) -> None:
    reply = api.request("PUT", "/api/queues/%2F/badjson", raw=b"{bad")
    assert (reply.status, reply.body) == (400, {"error": "bad_request", "reason": "not_json"})
    reply = api.request("PUT", "/api/queues/%2F/badjson", raw=b'"{}"')
    assert reply.status == 400
    assert "doubly-JSON-encoded" in reply.body["reason"]


def test_bad_value_is_400(api: HttpApi) -> None:
    reply = api.put("/api/queues/%2F/badvalue", {"durable": "yes"})
    assert (reply.status, reply.body["reason"]) == (400, ["not_boolean", "yes"])
    reply = api.put("/api/queues/%2F/badvalue", {"arguments": {"x-message-ttl": "x"}})
    assert reply.status == 400
    assert "x-message-ttl" in reply.body["reason"]


async def test_a_bug_answers_500_json_not_a_trace() -> None:
    def broken(ctx: Ctx) -> web.StreamResponse:
        raise RuntimeError("boom")

    async with run_broker() as running:
        router = Router()
        router.add("GET", "broken", broken, auth.any_user)
        site = HttpSite(ManagementApp(running.server.management, router).app)
        port = await site.start("127.0.0.1", 0)
        try:
            token = base64.b64encode(b"guest:guest").decode()
            session = aiohttp.ClientSession(headers={"Authorization": "Basic " + token})
            async with session, session.get(f"http://127.0.0.1:{port}/api/broken") as resp:
                assert resp.status == 500
                body = await resp.json()
        finally:
            await site.stop()
    assert body == {"error": "internal_server_error", "reason": "internal error"}  # no detail


def test_a_method_declared_twice_for_a_path_is_refused_when_the_routes_are_built() -> None:
    # two resource modules' tables naming the same path and method: no silent winner
    def handler(ctx: Ctx) -> web.StreamResponse:
        return web.Response()

    first = (Resource("queues/{vhost}", check=auth.vhost, GET=handler),)
    second = (Resource("queues", "queues/{vhost}", check=auth.admin, GET=handler),)
    with pytest.raises(ValueError, match=r"GET /queues/\{vhost\} is declared twice"):
        Router(first, second)
    Router(first, (Resource("queues/{vhost}", check=auth.admin, PUT=handler),))  # another method


def test_options_answers_allow_without_auth(api: HttpApi) -> None:
    reply = api.request("OPTIONS", "/api/queues/%2F/x", auth=False)
    assert reply.status == 200
    assert set(reply.headers["Allow"].split(", ")) == {"DELETE", "GET", "PUT", "OPTIONS"}


# ---- queues ----


def test_queue_lifecycle(api: HttpApi, name: str) -> None:
    path = f"/api/queues/%2F/{q(name)}"
    assert api.put(path, {"durable": True, "arguments": {"x-message-ttl": 60000}}).status == 201
    assert api.put(path, {"durable": True, "arguments": {"x-message-ttl": 60000}}).status == 204
    reply = api.put(path, {"durable": False})
    assert reply.status == 400
    assert reply.body["reason"] == (
        f"inequivalent arg 'durable' for queue '{name}' in vhost '/': "
        "received 'false' but current is 'true'"
    )
    queue = api.ok("GET", path)
    for key, value in {
        "name": name,
        "vhost": "/",
        "durable": True,
        "auto_delete": False,
        "exclusive": False,
        # rabbit_amqqueue:augment_declare_args/5 (4.3): the type is written, classic too
        "arguments": {"x-message-ttl": 60000, "x-queue-type": "classic"},
        "type": "classic",
        "state": "running",
        "messages": 0,
        "messages_ready": 0,
        "messages_unacknowledged": 0,
        "consumers": 0,
        "policy": None,
        "effective_policy_definition": {},
        "consumer_details": [],
        "messages_delayed": 0,
        "messages_expired": 0,
        "messages_dead_lettered": {},
        "consumer_timeouts": 0,
    }.items():
        assert queue[key] == value, key
    assert queue["messages_details"] == {"rate": 0.0}
    assert name in [x["name"] for x in api.ok("GET", "/api/queues/%2F")]
    assert name in [x["name"] for x in api.ok("GET", "/api/queues")]
    assert api.delete(path).status == 204
    assert api.get(path).status == 404
    assert api.delete(path).status == 404


def test_queue_in_missing_vhost_is_404(api: HttpApi) -> None:
    assert api.get("/api/queues/no-such-vhost").status == 404
    assert api.get("/api/queues/no-such-vhost/q").status == 404
    assert api.put("/api/queues/no-such-vhost/q", {"durable": True}).status == 404


def test_reserved_queue_name_is_access_refused(api: HttpApi) -> None:
    reply = api.put("/api/queues/%2F/amq.mine", {"durable": True})
    assert (reply.status, reply.body) == (
        401,
        {"error": "not_authorised", "reason": "Access refused."},
    )


def test_delete_queue_if_empty_and_if_unused(api: HttpApi, name: str) -> None:
    api.ok("PUT", f"/api/queues/%2F/{q(name)}", {"durable": True})
    api.ok(
        "POST",
        "/api/exchanges/%2F/amq.default/publish",
        {"routing_key": name, "properties": {}, "payload": "x", "payload_encoding": "string"},
    )
    reply = api.delete(f"/api/queues/%2F/{q(name)}?if-empty=true")
    assert (reply.status, reply.body["reason"]) == (400, f"queue '{name}' in vhost '/' not empty")
    assert api.delete(f"/api/queues/%2F/{q(name)}?if-unused=true").status == 204


def test_purge_removes_ready_messages(api: HttpApi, name: str) -> None:
    api.ok("PUT", f"/api/queues/%2F/{q(name)}", {"durable": True})
    for i in range(3):
        api.ok(
            "POST",
            "/api/exchanges/%2F/amq.default/publish",
            {
                "routing_key": name,
                "properties": {},
                "payload": str(i),
                "payload_encoding": "string",
            },
        )
    assert api.ok("GET", f"/api/queues/%2F/{q(name)}")["messages_ready"] == 3
    assert api.delete(f"/api/queues/%2F/{q(name)}/contents").status == 204
    assert api.ok("GET", f"/api/queues/%2F/{q(name)}")["messages_ready"] == 0
    assert api.delete("/api/queues/%2F/no-such-queue/contents").status == 404


def test_exclusive_queue_is_locked_to_the_api(
    api: HttpApi, warren: RunningBroker, name: str
) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(warren.url))
    try:
        conn.channel().queue_declare(name, exclusive=True)
        reply = api.delete(f"/api/queues/%2F/{q(name)}/contents")
        assert reply.status == 400
        assert reply.body["reason"].startswith(
            f"cannot obtain exclusive access to locked queue '{name}' in vhost '/'"
        )
        queue = api.ok("GET", f"/api/queues/%2F/{q(name)}")
        assert queue["exclusive"] is True
        assert queue["owner_pid_details"]["name"].startswith("127.0.0.1:")
        get = api.post(
            f"/api/queues/%2F/{q(name)}/get",
            {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"},
        )
        assert get.status == 400
        assert get.body["reason"].startswith("405 RESOURCE_LOCKED - cannot obtain exclusive")
    finally:
        conn.close()


# ---- exchanges and publishing ----


def test_exchange_lifecycle(api: HttpApi, name: str) -> None:
    path = f"/api/exchanges/%2F/{q(name)}"
    assert api.put(path, {"type": "topic", "durable": True}).status == 201
    assert api.put(path, {"type": "topic", "durable": True}).status == 204
    exchange = api.ok("GET", path)
    assert {
        k: exchange[k] for k in ("name", "vhost", "type", "durable", "auto_delete", "internal")
    } == {
        "name": name,
        "vhost": "/",
        "type": "topic",
        "durable": True,
        "auto_delete": False,
        "internal": False,
    }
    reply = api.put(path, {"type": "fanout", "durable": True})
    assert reply.body["reason"] == (
        f"inequivalent arg 'type' for exchange '{name}' in vhost '/': "
        "received 'fanout' but current is 'topic'"
    )
    assert api.delete(path).status == 204
    assert api.get(path).status == 404


def test_exchange_defaults_and_errors(api: HttpApi, name: str) -> None:
    assert api.put(f"/api/exchanges/%2F/{q(name)}").status == 201
    assert api.ok("GET", f"/api/exchanges/%2F/{q(name)}")["type"] == "direct"
    reply = api.put(f"/api/exchanges/%2F/{q(name)}-2", {"type": "nope"})
    assert (reply.status, reply.body["reason"]) == (400, "unknown exchange type 'nope'")
    for path in ("/api/exchanges/%2F/amq.foo",):
        assert api.put(path, {"type": "fanout"}).body["reason"] == "Access refused."
    assert api.delete("/api/exchanges/%2F/amq.direct").status == 401
    assert api.delete("/api/exchanges/%2F/amq.default").status == 401
    default = api.ok("GET", "/api/exchanges/%2F/amq.default")
    assert (default["name"], default["type"]) == ("", "direct")
    names = [x["name"] for x in api.ok("GET", "/api/exchanges/%2F")]
    assert {"", "amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"} <= set(names)


def publish(
    api: HttpApi, routing_key: str, payload: str, exchange: str = "amq.default", **props: Any
) -> Any:
    return api.post(
        f"/api/exchanges/%2F/{q(exchange)}/publish",
        {
            "routing_key": routing_key,
            "properties": props,
            "payload": payload,
            "payload_encoding": "string",
        },
    )


def test_publish_and_get_with_properties(api: HttpApi, name: str) -> None:
    api.ok("PUT", f"/api/queues/%2F/{q(name)}", {"durable": True})
    reply = publish(
        api, name, "hello", delivery_mode=2, headers={"h": 1}, content_type="text/plain"
    )
    assert (reply.status, reply.body) == (200, {"routed": True})
    got = api.ok(
        "POST",
        f"/api/queues/%2F/{q(name)}/get",
        {"count": 5, "ackmode": "ack_requeue_true", "encoding": "auto", "truncate": 50000},
    )
    assert got == [
        {
            "payload_bytes": 5,
            "redelivered": False,
            "exchange": "",
            "routing_key": name,
            "message_count": 0,
            "properties": {"content_type": "text/plain", "headers": {"h": 1}, "delivery_mode": 2},
            "payload": "hello",
            "payload_encoding": "string",
        }
    ]
    # ack_requeue_true puts it back, redelivered
    again = api.ok(
        "POST",
        f"/api/queues/%2F/{q(name)}/get",
        {"count": 1, "ackmode": "ack_requeue_false", "encoding": "base64"},
    )
    assert again[0]["redelivered"] is True
    assert base64.b64decode(again[0]["payload"]) == b"hello"
    assert again[0]["payload_encoding"] == "base64"
    assert api.ok("GET", f"/api/queues/%2F/{q(name)}")["messages"] == 0


def test_get_fetches_distinct_messages_and_truncates(api: HttpApi, name: str) -> None:
    api.ok("PUT", f"/api/queues/%2F/{q(name)}", {"durable": True})
    for body in ("first message", "second"):
        publish(api, name, body)
    got = api.ok(
        "POST",
        f"/api/queues/%2F/{q(name)}/get",
        {"count": 5, "ackmode": "reject_requeue_true", "encoding": "auto", "truncate": 5},
    )
    assert [(m["payload"], m["payload_bytes"], m["message_count"]) for m in got] == [
        ("first", 13, 1),
        ("secon", 6, 0),
    ]
    assert api.ok("GET", f"/api/queues/%2F/{q(name)}")["messages_ready"] == 2


def test_get_reject_requeue_false_dead_letters(api: HttpApi, name: str) -> None:
    api.ok("PUT", f"/api/queues/%2F/{q(name)}.dlq", {"durable": True})
    api.ok(
        "PUT",
        f"/api/queues/%2F/{q(name)}",
        {
            "durable": True,
            "arguments": {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": f"{name}.dlq"},
        },
    )
    publish(api, name, "bad")
    api.ok(
        "POST",
        f"/api/queues/%2F/{q(name)}/get",
        {"count": 1, "ackmode": "reject_requeue_false", "encoding": "auto"},
    )
    assert api.ok("GET", f"/api/queues/%2F/{q(name)}.dlq")["messages_ready"] == 1
    assert api.ok("GET", f"/api/queues/%2F/{q(name)}")["messages_dead_lettered"] == {"rejected": 1}


def test_get_and_publish_bad_bodies(api: HttpApi, name: str) -> None:
    api.ok("PUT", f"/api/queues/%2F/{q(name)}", {"durable": True})
    reply = api.post(f"/api/queues/%2F/{q(name)}/get", {"count": 1, "ackmode": "ack_requeue_true"})
    assert (reply.status, reply.body["reason"]) == (400, "[{key_missing,encoding}]")
    reply = api.post(
        "/api/exchanges/%2F/amq.default/publish",
        {"routing_key": name, "properties": {}, "payload": "x"},
    )
    assert reply.body["reason"] == "[{key_missing,payload_encoding}]"
    reply = api.post(
        "/api/exchanges/%2F/amq.default/publish",
        {"routing_key": name, "properties": {}, "payload": "x", "payload_encoding": "zz"},
    )
    assert reply.body["reason"] == ["unsupported_encoding", "zz"]
    reply = publish(api, name, "x", delivery_mode="x")
    assert reply.body["reason"] == ["not_int", "delivery_mode"]
    reply = publish(api, name, "x", exchange="no-such-exchange")
    assert (reply.status, reply.body["reason"]) == (
        400,
        "404 NOT_FOUND - no exchange 'no-such-exchange' in vhost '/'",
    )
    reply = publish(api, name, "x", user_id="mallory")
    assert reply.body["reason"] == (
        "406 PRECONDITION_FAILED - user_id property set to 'mallory' but authenticated user "
        "was 'guest'"
    )


def test_publish_unroutable_and_expiration(api: HttpApi, name: str) -> None:
    assert publish(api, f"{name}-nobody", "x").body == {"routed": False}
    api.ok("PUT", f"/api/queues/%2F/{q(name)}", {"durable": True})
    publish(api, name, "short-lived", expiration="0")
    assert api.ok("GET", f"/api/queues/%2F/{q(name)}")["messages"] == 0
    assert api.ok("GET", f"/api/queues/%2F/{q(name)}")["messages_expired"] == 1


def test_publish_rejected_by_full_queue(api: HttpApi, name: str) -> None:
    api.ok(
        "PUT",
        f"/api/queues/%2F/{q(name)}",
        {"durable": True, "arguments": {"x-max-length": 1, "x-overflow": "reject-publish"}},
    )
    assert publish(api, name, "1").status == 200
    reply = publish(api, name, "2")
    assert (reply.status, reply.body["reason"]) == (
        400,
        "rejected Unable to publish message. Check queue limits.",
    )


# ---- bindings ----


def test_binding_lifecycle(api: HttpApi, name: str) -> None:
    api.ok("PUT", f"/api/queues/%2F/{q(name)}", {"durable": True})
    api.ok("PUT", f"/api/exchanges/%2F/{q(name)}.x", {"type": "topic"})
    between = f"/api/bindings/%2F/e/{q(name)}.x/q/{q(name)}"
    reply = api.post(between, {"routing_key": "a.b", "arguments": {}})
    assert reply.status == 201
    assert reply.headers["Location"] == f"{name}/a.b"
    listed = api.ok("GET", between)
    assert listed == [
        {
            "source": f"{name}.x",
            "vhost": "/",
            "destination": name,
            "destination_type": "queue",
            "routing_key": "a.b",
            "arguments": {},
            "properties_key": "a.b",
        }
    ]
    default = [b for b in api.ok("GET", "/api/bindings/%2F") if b["destination"] == name]
    assert [(b["source"], b["routing_key"]) for b in default] == [("", name), (f"{name}.x", "a.b")]
    assert publish(api, "a.b", "routed", exchange=f"{name}.x").body == {"routed": True}
    assert api.ok("GET", between + "/a.b")["routing_key"] == "a.b"
    assert len(api.ok("GET", f"/api/queues/%2F/{q(name)}/bindings")) == 2
    assert len(api.ok("GET", f"/api/exchanges/%2F/{q(name)}.x/bindings/source")) == 1
    assert api.delete(between + "/a.b").status == 204
    assert api.ok("GET", between) == []
    assert api.delete(between + "/a.b").status == 404


def test_binding_with_arguments_and_exchange_destination(api: HttpApi, name: str) -> None:
    api.ok("PUT", f"/api/exchanges/%2F/{q(name)}.src", {"type": "headers"})
    api.ok("PUT", f"/api/exchanges/%2F/{q(name)}.dst", {"type": "fanout"})
    between = f"/api/bindings/%2F/e/{q(name)}.src/e/{q(name)}.dst"
    location = api.post(between, {"routing_key": "", "arguments": {"x-match": "any", "k": "v"}})
    assert location.status == 201
    (binding,) = api.ok("GET", between)
    assert binding["destination_type"] == "exchange"
    assert binding["arguments"] == {"x-match": "any", "k": "v"}
    assert binding["properties_key"].startswith("~")
    assert location.headers["Location"].endswith(binding["properties_key"])
    assert len(api.ok("GET", f"/api/exchanges/%2F/{q(name)}.dst/bindings/destination")) == 1
    assert api.delete(between + "/" + q(binding["properties_key"])).status == 204
    assert api.ok("GET", between) == []


def test_binding_key_in_urls_as_rabbitmqadmin_sends_it(api: HttpApi, name: str) -> None:
    api.ok("PUT", f"/api/queues/%2F/{q(name)}", {"durable": True})
    between = f"/api/bindings/%2F/e/amq.topic/q/{q(name)}"
    api.ok("POST", between, {"routing_key": "order.#"})
    (binding,) = api.ok("GET", between)
    assert binding["properties_key"] == "order.%23"
    # the listed key quoted once more (rabbitmqadmin), or sent as listed: both name it
    assert api.get(f"{between}/{q(binding['properties_key'])}").status == 200
    assert api.delete(f"{between}/{binding['properties_key']}").status == 204
    assert api.ok("GET", between) == []


def test_binding_to_missing_objects(api: HttpApi, name: str) -> None:
    api.ok("PUT", f"/api/queues/%2F/{q(name)}", {"durable": True})
    reply = api.post(f"/api/bindings/%2F/e/{q(name)}-nope/q/{q(name)}", {"routing_key": "k"})
    assert (reply.status, reply.body["reason"]) == (404, f"no exchange '{name}-nope' in vhost '/'")
    reply = api.post(f"/api/bindings/%2F/e/amq.direct/q/{q(name)}-nope", {"routing_key": "k"})
    assert (reply.status, reply.body["reason"]) == (404, f"no queue '{name}-nope' in vhost '/'")
    reply = api.post(f"/api/bindings/%2F/e/amq.default/q/{q(name)}", {"routing_key": "k"})
    assert reply.status == 401
    assert api.get(f"/api/bindings/%2F/e/amq.direct/q/{q(name)}-nope").status == 404


# ---- connections, channels, consumers ----


def test_connections_channels_consumers(api: HttpApi, warren: RunningBroker, name: str) -> None:
    params = pika.URLParameters(warren.url)
    params.client_properties = {"connection_name": name}
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=7)
        ch.queue_declare(name, durable=True)
        ch.basic_publish("", name, b"x")
        ch.basic_consume(
            name, lambda *a: None, consumer_tag=f"{name}-tag", arguments={"x-priority": 3}
        )
        conn.channel().confirm_delivery()
        conn.process_data_events(0.1)
        (mine,) = [
            c for c in api.ok("GET", "/api/connections") if c.get("user_provided_name") == name
        ]
        assert mine["name"] == f"127.0.0.1:{mine['peer_port']} -> 127.0.0.1:{warren.port}"
        for key, value in {
            "vhost": "/",
            "user": "guest",
            "state": "running",
            "protocol": "AMQP 0-9-1",
            "channels": 2,
            "peer_host": "127.0.0.1",
            "port": warren.port,
            "ssl": False,
        }.items():
            assert mine[key] == value, key
        assert mine["client_properties"]["product"] == "Pika Python Client Library"
        assert abs(mine["connected_at"] / 1000 - time.time()) < 60
        assert api.ok("GET", f"/api/connections/{q(mine['name'])}")["name"] == mine["name"]
        channels = api.ok("GET", f"/api/connections/{q(mine['name'])}/channels")
        assert [(c["number"], c["confirm"]) for c in channels] == [(1, False), (2, True)]
        channel = api.ok("GET", f"/api/channels/{q(mine['name'] + ' (1)')}")
        for key, value in {
            "prefetch_count": 7,
            "consumer_count": 1,
            "messages_unacknowledged": 1,
            "transactional": False,
            "connection_details": {
                "name": mine["name"],
                "peer_host": "127.0.0.1",
                "peer_port": mine["peer_port"],
            },
        }.items():
            assert channel[key] == value, key
        assert channel["consumer_details"][0]["consumer_tag"] == f"{name}-tag"
        (consumer,) = [
            c for c in api.ok("GET", "/api/consumers/%2F") if c["consumer_tag"] == f"{name}-tag"
        ]
        for key, value in {
            "queue": {"name": name, "vhost": "/"},
            "ack_required": True,
            "exclusive": False,
            "prefetch_count": 7,
            "active": True,
            "activity_status": "up",
            "arguments": {"x-priority": 3},
            "messages_unacknowledged": 1,
            "timed_out": False,
        }.items():
            assert consumer[key] == value, key
        # no consumer timeout, no key: rabbitmqadmin 3.10's ``list consumers`` takes len() of
        # every value and crashed on ``"consumer_timeout": null``; no value may be null
        assert "consumer_timeout" not in consumer
        assert [k for k, v in consumer.items() if v is None] == []
        assert [k for k, v in consumer["channel_details"].items() if v is None] == []
        assert consumer["channel_details"]["name"] == mine["name"] + " (1)"
        assert api.ok("GET", f"/api/queues/%2F/{q(name)}")["consumer_details"][0][
            "consumer_tag"
        ] == (f"{name}-tag")
        # closing it from the API: 320 with the X-Reason header as text
        reply = api.delete(f"/api/connections/{q(mine['name'])}", headers={"X-Reason": "bye now"})
        assert reply.status == 204
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            conn.process_data_events(2)
        assert (closed.value.reply_code, closed.value.reply_text) == (
            320,
            "CONNECTION_FORCED - bye now",
        )
    finally:
        if conn.is_open:
            conn.close()
    assert api.get(f"/api/connections/{q(mine['name'])}").status == 404


def test_consumer_timeout_state_is_shown(api: HttpApi, warren: RunningBroker, name: str) -> None:
    with RawClient.connect((warren.host, warren.port)) as client:
        client.declare_queue(1, name, durable=True, arguments={"x-queue-type": "quorum"})
        client.publish(1, b"slow", routing_key=name)
        tag = client.consume(1, name, f"{name}-slow", arguments={"x-consumer-timeout": 100})
        client.read_delivery(1)
        client.expect_method(commands.Basic.Cancel, 1, 5)
        (consumer,) = [c for c in api.ok("GET", "/api/consumers") if c["consumer_tag"] == tag]
        assert (
            consumer["consumer_timeout"],
            consumer["timed_out"],
            consumer["timed_out_deliveries"],
        ) == (
            100,
            True,
            1,
        )
        queue = api.ok("GET", f"/api/queues/%2F/{q(name)}")
        assert (queue["type"], queue["consumer_timeouts"], queue["messages_ready"]) == (
            "quorum",
            1,
            1,
        )


def test_delayed_retry_and_expiry_counters(api: HttpApi, warren: RunningBroker, name: str) -> None:
    api.ok(
        "PUT",
        f"/api/queues/%2F/{q(name)}",
        {
            "durable": True,
            "arguments": {"x-delayed-retry-type": "all", "x-delayed-retry-min": 60000},
        },
    )
    publish(api, name, "retry me")
    api.ok(
        "POST",
        f"/api/queues/%2F/{q(name)}/get",
        {"count": 1, "ackmode": "reject_requeue_true", "encoding": "auto"},
    )
    queue = api.ok("GET", f"/api/queues/%2F/{q(name)}")
    assert (queue["messages_delayed"], queue["messages_retried"], queue["messages_ready"]) == (
        1,
        1,
        0,
    )


# ---- policies ----


def test_policy_lifecycle_and_effect(api: HttpApi, name: str) -> None:
    api.ok("PUT", f"/api/queues/%2F/{q(name)}", {"durable": True})
    path = f"/api/policies/%2F/{q(name)}-p"
    body = {
        "pattern": f"^{name}$",
        "definition": {"message-ttl": 1000},
        "priority": 1,
        "apply-to": "queues",
    }
    assert api.put(path, body).status == 201
    assert api.put(path, body).status == 204
    expected = {
        "vhost": "/",
        "name": f"{name}-p",
        "pattern": f"^{name}$",
        "apply-to": "queues",
        "definition": {"message-ttl": 1000},
        "priority": 1,
    }
    assert api.ok("GET", path) == expected
    assert expected in api.ok("GET", "/api/policies/%2F")
    assert expected in api.ok("GET", "/api/policies")
    queue = api.ok("GET", f"/api/queues/%2F/{q(name)}")
    assert (queue["policy"], queue["effective_policy_definition"]) == (
        f"{name}-p",
        {"message-ttl": 1000},
    )
    assert api.delete(path).status == 204
    assert api.get(path).status == 404
    assert api.delete(path).status == 404
    assert api.ok("GET", f"/api/queues/%2F/{q(name)}")["policy"] is None


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"pattern": "^q"}, "[{key_missing,definition}]"),
        ({"definition": {"message-ttl": 1}}, "[{key_missing,pattern}]"),
        ({"pattern": "x", "definition": {}}, "Validation failed\n\nno policy provided\n"),
        (
            {"pattern": "x", "definition": {"nope": 1}},
            "Validation failed\n\nunknown policy key 'nope'\n",
        ),
        ({"pattern": "x", "definition": {"message-ttl": 1}, "priority": "a"}, None),
        ({"pattern": "x", "definition": {"message-ttl": 1}, "apply-to": "foo"}, None),
        ({"pattern": "(", "definition": {"message-ttl": 1}}, None),
    ],
)
def test_policy_validation_is_400(api: HttpApi, body: dict[str, Any], reason: str | None) -> None:
    reply = api.put("/api/policies/%2F/invalid", body)
    assert reply.status == 400
    assert reply.body["error"] == "bad_request"
    if reason is not None:
        assert reply.body["reason"] == reason
    else:
        assert reply.body["reason"].startswith("Validation failed\n\n")


def test_policy_in_missing_vhost(api: HttpApi) -> None:
    reply = api.put(
        "/api/policies/no-such-vhost/p", {"pattern": "x", "definition": {"message-ttl": 1}}
    )
    assert reply.status == 404


# ---- users, vhosts, permissions ----


def test_user_lifecycle(api: HttpApi, name: str) -> None:
    path = f"/api/users/{q(name)}"
    assert api.put(path, {"password": "pw", "tags": ["management", "foo"]}).status == 201
    user = api.ok("GET", path)
    assert user["tags"] == ["management", "foo"]
    assert user["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    assert len(base64.b64decode(user["password_hash"])) == 36
    assert user["limits"] == {}
    assert api.as_user(name, "pw").ok("GET", "/api/whoami") == {
        "name": name,
        "tags": ["management", "foo"],
    }
    assert api.put(path, {"password": "pw2", "tags": "management, policymaker"}).status == 204
    assert api.ok("GET", path)["tags"] == ["management", "policymaker"]
    assert api.as_user(name, "pw").get("/api/whoami").status == 401
    assert api.as_user(name, "pw2").get("/api/whoami").status == 200
    assert name in [u["name"] for u in api.ok("GET", "/api/users")]
    assert api.delete(path).status == 204
    assert api.get(path).status == 404
    assert api.delete(path).status == 404


def test_user_from_a_rabbitmq_password_hash(api: HttpApi, name: str) -> None:
    path = f"/api/users/{q(name)}"
    body = {
        "password_hash": GUEST_HASH_FROM_RABBITMQ,
        "hashing_algorithm": "rabbit_password_hashing_sha256",
        "tags": "monitoring",
    }
    assert api.put(path, body).status == 201
    assert api.as_user(name, "guest").ok("GET", "/api/whoami")["tags"] == ["monitoring"]
    assert api.ok("GET", path)["password_hash"] == GUEST_HASH_FROM_RABBITMQ


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"password": "x"}, "tags_not_present"),
        (
            {"password": "x", "password_hash": "abc", "tags": ""},
            "both_password_and_password_hash_are_provided",
        ),
        ({"password_hash": "!!!", "tags": ""}, ["not_base64", "!!!"]),
        (
            {
                "password_hash": GUEST_HASH_FROM_RABBITMQ,
                "hashing_algorithm": "rabbit_password_hashing_md5",
                "tags": "",
            },
            ["unsupported_hashing_algorithm", "rabbit_password_hashing_md5"],
        ),
    ],
)
def test_user_validation_is_400(api: HttpApi, body: dict[str, Any], reason: Any) -> None:
    reply = api.put("/api/users/invalid-user", body)
    assert (reply.status, reply.body["reason"]) == (400, reason)


def test_vhost_lifecycle(api: HttpApi, warren: RunningBroker, name: str) -> None:
    path = f"/api/vhosts/{q(name)}"
    assert api.put(path, {"description": "d", "tags": "a,b"}).status == 201
    assert api.put(path).status == 204
    vhost = api.ok("GET", path)
    assert {k: vhost[k] for k in ("name", "description", "tags", "tracing", "messages")} == {
        "name": name,
        "description": "",  # a PUT replaces the metadata, as RabbitMQ's does
        "tags": [],
        "tracing": False,
        "messages": 0,
    }
    assert name in [v["name"] for v in api.ok("GET", "/api/vhosts")]
    # the vhost is usable over AMQP at once: its creator has full permissions in it
    assert api.ok("GET", f"/api/permissions/{q(name)}/guest")["configure"] == ".*"
    assert api.put(f"/api/queues/{q(name)}/inside", {"durable": True}).status == 201
    conn = pika.BlockingConnection(pika.URLParameters(warren.url.rsplit("/", 1)[0] + "/" + q(name)))
    assert conn.channel().queue_declare("inside", passive=True).method.message_count == 0
    assert api.delete(path).status == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        conn.process_data_events(2)
    assert closed.value.reply_code == 320
    assert api.get(path).status == 404
    assert api.delete(path).status == 404
    assert [p for p in api.ok("GET", "/api/permissions") if p["vhost"] == name] == []


def test_permissions_lifecycle(api: HttpApi, name: str) -> None:
    api.ok("PUT", f"/api/users/{q(name)}", {"password": "pw", "tags": ""})
    path = f"/api/permissions/%2F/{q(name)}"
    assert api.put(path, {"configure": "^c", "write": "^w", "read": "^r"}).status == 201
    assert api.put(path, {"configure": "^c", "write": "^w", "read": "^r"}).status == 204
    expected = {"user": name, "vhost": "/", "configure": "^c", "write": "^w", "read": "^r"}
    assert api.ok("GET", path) == expected
    assert expected in api.ok("GET", "/api/permissions")
    assert api.ok("GET", f"/api/users/{q(name)}/permissions") == [expected]
    assert expected in api.ok("GET", "/api/vhosts/%2F/permissions")
    reply = api.put(path, {"configure": ".*", "write": ".*"})
    assert (reply.status, reply.body["reason"]) == (400, "[{key_missing,read}]")
    reply = api.put(path, {"configure": "(", "write": ".*", "read": ".*"})
    assert (reply.status, reply.body["reason"][0]) == (400, "invalid_regexp")
    reply = api.put(
        f"/api/permissions/no-such-vhost/{q(name)}",
        {"configure": ".*", "write": ".*", "read": ".*"},
    )
    assert (reply.status, reply.body["reason"]) == (400, "vhost_or_user_not_found")
    assert api.delete(path).status == 204
    assert api.get(path).status == 404
    assert api.delete(path).status == 404


# ---- list options, health, rates ----


def test_columns_sort_and_pagination(api: HttpApi, name: str) -> None:
    for suffix in ("b", "a", "c"):
        api.ok("PUT", f"/api/queues/%2F/{q(name)}.{suffix}", {"durable": True})
    rows = api.ok(
        "GET", "/api/queues/%2F?columns=name,message_stats.publish&sort=name&sort_reverse=true"
    )
    mine = [r for r in rows if r["name"].startswith(name)]
    assert [r["name"] for r in mine] == [f"{name}.c", f"{name}.b", f"{name}.a"]
    assert mine[0] == {"name": f"{name}.c", "message_stats": {"publish": 0}}
    page = api.ok("GET", f"/api/queues/%2F?page=1&page_size=2&name={q(name)}")
    assert (page["filtered_count"], page["item_count"], page["page_count"]) == (3, 2, 2)
    assert [r["name"] for r in page["items"]] == [f"{name}.a", f"{name}.b"]
    assert api.get("/api/queues/%2F?page=0").status == 400


def test_pagination_envelope_filter_and_errors_as_rabbitmq(api: HttpApi, name: str) -> None:
    # shapes and reasons checked against RabbitMQ 3.10's management plugin
    for suffix in ("Alpha", "beta", "gamma"):
        api.ok("PUT", f"/api/queues/%2F/{q(name)}.{suffix}", {"durable": True})
    page = api.ok("GET", f"/api/queues/%2F?page=1&name={q(name)}.A&columns=name")
    assert page == {
        "filtered_count": 1,  # the name filter ignores case
        "item_count": 1,
        "items": [{"name": f"{name}.Alpha"}],
        "page": 1,
        "page_count": 1,
        "page_size": 100,
        "total_count": page["total_count"],
    }
    assert page["total_count"] >= 3
    regex = api.ok("GET", f"/api/queues?page=1&use_regex=true&name={q(name)}\\.(B|G)")
    assert [r["name"] for r in regex["items"]] == [f"{name}.beta", f"{name}.gamma"]
    empty = api.ok("GET", "/api/queues?page=1&name=no-such-queue-anywhere")
    assert (empty["filtered_count"], empty["page_count"], empty["items"]) == (0, 0, [])
    past = api.ok("GET", f"/api/queues?page=2&page_size=3&name={q(name)}")  # just past the end
    assert (past["item_count"], past["page_count"]) == (0, 1)
    errors = {
        "page=0": ("invalid_pagination_parameters", "page number 0, page size undefined"),
        "page=1&page_size=501": ("invalid_pagination_parameters", "page number 1, page size 501"),
        "page=1&page_size=0": ("invalid_pagination_parameters", "page number 1, page size 0"),
        "page=x": ("bad_request", "Pagination parameters are invalid"),
        "page=1&page_size=x": ("bad_request", "Pagination parameters are invalid"),
        "page=1&use_regex=true&name=(": ("bad_request", "Pagination parameters are invalid"),
        f"page=3&page_size=1&name={q(name)}.beta": (
            "page_out_of_range",
            "Page out of range, page: 3 page size: 1, len: 1",
        ),
    }
    for query, (error, reason) in errors.items():
        reply = api.get(f"/api/queues?{query}")
        assert reply.status == 400, query
        assert reply.body["error"] == error
        if error == "invalid_pagination_parameters":
            assert reply.body["reason"] == f"Invalid pagination parameters: {reason}"
        else:
            assert reply.body["reason"] == reason
    assert isinstance(api.ok("GET", "/api/queues?page_size=1"), list)  # no page: the plain list


def test_pagination_on_exchanges_connections_and_channels(
    api: HttpApi, warren: RunningBroker, name: str
) -> None:
    for suffix in ("x1", "x2", "x3"):
        api.ok("PUT", f"/api/exchanges/%2F/{q(name)}.{suffix}", {"type": "fanout"})
    page = api.ok(
        "GET", f"/api/exchanges/%2F?page=2&page_size=2&name={q(name)}&sort=name&sort_reverse=true"
    )
    assert [x["name"] for x in page["items"]] == [f"{name}.x1"]
    assert (page["filtered_count"], page["page"], page["page_count"]) == (3, 2, 2)
    params = pika.URLParameters(warren.url)
    params.client_properties = {"connection_name": name}
    conn = pika.BlockingConnection(params)
    conn.channel()
    conn.channel()
    try:
        conns = api.ok(
            "GET", "/api/connections?page=1&page_size=500&columns=name,user_provided_name"
        )
        mine = [c for c in conns["items"] if c.get("user_provided_name") == name]
        assert len(mine) == 1
        chans = api.ok(
            "GET",
            f"/api/channels?page=1&page_size=1&sort=number&sort_reverse=true&name={q(mine[0]['name'])}",
        )
        assert (chans["filtered_count"], chans["page_count"]) == (2, 2)
        assert chans["items"][0]["number"] == 2
    finally:
        conn.close()


def test_ten_thousand_queues_are_paged_sorted_and_filtered_on_the_server() -> None:
    with (
        run_broker(management_port=0) as broker,
        RawClient.connect(("127.0.0.1", broker.port)) as c,
    ):
        # declared by a real client, pipelined (nowait), then one synchronous declare
        burst = b"".join(
            frame_bytes(
                1,
                1,
                method_payload(
                    build(commands.Queue.Declare, queue=f"load.{n:05d}", nowait=True, durable=True)
                ),
            )
            for n in range(10_000)
        )
        c.timeout = 60.0  # a hang guard: 10,000 durable declares take seconds on a loaded machine
        c.send(burst)
        c.send_method(1, build(commands.Queue.Declare, queue="load.deep", durable=True))
        c.expect_method(commands.Queue.DeclareOk, 1)
        for _ in range(3):
            c.send_method(1, build(commands.Basic.Publish, routing_key="load.deep"))
            c.send_frame(2, 1, header_payload(1))
            c.send_frame(3, 1, b"x")
        c.send_method(1, build(commands.Queue.Declare, queue="load.deep", passive=True))
        ok = c.expect_method(commands.Queue.DeclareOk, 1)  # the publishes are in
        assert ok.message_count == 3
        api = HttpApi(broker.server.management_port or 0)
        deepest = api.ok(
            "GET", "/api/queues/%2F?page=1&page_size=5&sort=messages&sort_reverse=true"
        )
        assert deepest["total_count"] == deepest["filtered_count"] == 10_001
        assert deepest["page_count"] == 2001
        assert deepest["items"][0]["name"] == "load.deep"
        assert deepest["items"][0]["messages"] == 3
        assert [r["name"] for r in deepest["items"][1:]] == [
            "load.09999",
            "load.09998",
            "load.09997",
            "load.09996",
        ]
        last = api.ok("GET", "/api/queues?page=21&page_size=500&columns=name")
        assert (last["page_count"], last["item_count"]) == (21, 1)
        assert last["items"] == [{"name": "load.deep"}]
        found = api.ok("GET", "/api/queues?page=1&page_size=500&name=load.0999&columns=name")
        assert [r["name"] for r in found["items"]] == [f"load.0999{n}" for n in range(10)]
        regex = api.ok(
            "GET", "/api/queues?page=1&use_regex=true&name=^load\\.0000[0-4]$&columns=name"
        )
        assert regex["filtered_count"] == 5
        # a sort key without a shortcut builds every row, and still pages the same way
        by_rate = api.ok(
            "GET",
            "/api/queues?page=1&page_size=2&sort=message_stats.publish_details.rate&columns=name",
        )
        assert by_rate["filtered_count"] == 10_001
        assert len(by_rate["items"]) == 2


def test_peek_with_requeue_keeps_the_order(api: HttpApi, name: str) -> None:
    path = f"/api/queues/%2F/{q(name)}"
    api.ok("PUT", path, {"durable": True})
    for n in range(4):
        api.ok(
            "POST",
            "/api/exchanges/%2F/amq.default/publish",
            {
                "routing_key": name,
                "properties": {},
                "payload": f"m{n}",
                "payload_encoding": "string",
            },
        )
    body = {"count": 2, "ackmode": "ack_requeue_true", "encoding": "auto"}
    first = api.ok("POST", f"{path}/get", body)
    assert [m["payload"] for m in first] == ["m0", "m1"]
    assert [m["redelivered"] for m in first] == [False, False]
    again = api.ok("POST", f"{path}/get", {**body, "count": 10})
    assert [m["payload"] for m in again] == ["m0", "m1", "m2", "m3"]
    assert [m["redelivered"] for m in again] == [True, True, False, False]
    assert api.ok("GET", path)["messages_ready"] == 4


def test_overview_rate_samples_newest_first(api: HttpApi, warren: RunningBroker, name: str) -> None:
    api.ok("PUT", f"/api/queues/%2F/{q(name)}", {"durable": True})
    sample(warren)
    publish = {"routing_key": name, "properties": {}, "payload": "x", "payload_encoding": "string"}
    for _ in range(3):
        api.ok("POST", "/api/exchanges/%2F/amq.default/publish", publish)
    sample(warren)
    stats = api.ok("GET", "/api/overview?msg_rates_age=600&msg_rates_incr=5")["message_stats"]
    samples = stats["publish_details"]["samples"]
    assert samples[0]["sample"] == stats["publish"]
    assert samples[0]["sample"] - samples[1]["sample"] == 3
    assert samples[0]["timestamp"] >= samples[1]["timestamp"]
    assert "samples" not in api.ok("GET", "/api/overview")["message_stats"]["publish_details"]
    assert api.get("/api/overview?msg_rates_age=soon").status == 400


def test_health_checks_and_aliveness(api: HttpApi) -> None:
    assert api.ok("GET", "/api/health/checks/alarms") == {"status": "ok"}
    assert api.ok("GET", "/api/aliveness-test/%2F") == {"status": "ok"}
    # RabbitMQ 4.3 (rabbit_mgmt_wm_aliveness_test:to_json/2): a no-op, no queue is declared
    # (3.10 declared a transient one, which 4.3's defaults refuse)
    assert api.get("/api/queues/%2F/aliveness-test").status == 404
    assert api.get("/api/aliveness-test/no-such-vhost").status == 404


def test_nodes(api: HttpApi) -> None:
    (node,) = api.ok("GET", "/api/nodes")
    assert node["name"].startswith("warren@")
    assert (node["running"], node["mem_alarm"], node["disk_free_alarm"]) == (True, False, False)
    assert node["mem_used"] > 0
    assert api.ok("GET", f"/api/nodes/{q(node['name'])}")["name"] == node["name"]
    assert api.get("/api/nodes/rabbit@elsewhere").status == 404


def test_memory_alarm_fails_the_health_check() -> None:
    with run_broker(management_port=0, vm_memory_high_watermark_absolute=1) as running:
        port = running.server.management_port
        assert port
        reply = HttpApi(port).get("/api/health/checks/alarms")
        assert reply.status == 503
        assert reply.body["status"] == "failed"
        assert reply.body["reason"] == "There are alarms in effect in the cluster"
        assert [a["resource"] for a in reply.body["alarms"]] == ["memory"]


def test_message_rates_from_the_sampler(api: HttpApi, warren: RunningBroker, name: str) -> None:
    api.ok("PUT", f"/api/queues/%2F/{q(name)}", {"durable": True})
    sample(warren)
    for i in range(5):
        publish(api, name, str(i))
    time.sleep(0.05)
    sample(warren)
    queue = api.ok("GET", f"/api/queues/%2F/{q(name)}")
    assert queue["message_stats"]["publish"] == 5
    assert queue["message_stats"]["publish_details"]["rate"] > 0
    assert queue["messages_ready_details"]["rate"] > 0
    overview = api.ok("GET", "/api/overview")
    assert overview["message_stats"]["publish_details"]["rate"] > 0
    sample(warren)
    queue = api.ok("GET", f"/api/queues/%2F/{q(name)}")
    assert queue["message_stats"]["publish_details"]["rate"] == 0.0


# ---- browse: GET /api/queues/{vhost}/{queue}/messages (issue 40) ----


def test_browse_five_of_ten_changes_nothing(api: HttpApi, warren: RunningBroker, name: str) -> None:
    # RabbitMQ 4.3's open-source management has no browse: rabbit_mgmt_wm_queue_get
    # (deps/rabbitmq_management/src/rabbit_mgmt_wm_queue_get.erl, basic_gets/6) takes the
    # messages and requeues them redelivered; this route must not touch them at all.
    api.ok("PUT", f"/api/queues/%2F/{q(name)}", {"durable": True})
    for i in range(10):
        publish(api, name, f"m{i}", message_id=f"id{i}", headers={"n": i})
    before = api.ok("GET", f"/api/queues/%2F/{q(name)}")
    rows = api.ok("GET", f"/api/queues/%2F/{q(name)}/messages?offset=3&count=5")
    assert [r["position"] for r in rows] == [3, 4, 5, 6, 7]
    assert [r["payload"] for r in rows] == ["m3", "m4", "m5", "m6", "m7"]
    assert rows[0]["properties"] == {"message_id": "id3", "headers": {"n": 3}}
    assert {(r["redelivered"], r["delivery_count"], r["paged_out"]) for r in rows} == {
        (False, 0, False)
    }
    assert rows[0]["payload_encoding"] == "string" and rows[0]["x_death"] is None
    after = api.ok("GET", f"/api/queues/%2F/{q(name)}")
    for key in ("messages", "messages_ready", "messages_unacknowledged"):
        assert before[key] == after[key] == (10 if key != "messages_unacknowledged" else 0)
    # a later delivery sees all ten, in order, none redelivered
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", warren.port))
    try:
        channel = conn.channel()
        got = []
        for _ in range(10):
            method, _, body = channel.basic_get(name, auto_ack=True)
            assert method is not None
            got.append((body, method.redelivered))
        assert got == [(f"m{i}".encode(), False) for i in range(10)]
    finally:
        conn.close()


def test_browse_bad_input(api: HttpApi, name: str) -> None:
    api.ok("PUT", f"/api/queues/%2F/{q(name)}", {"durable": True})
    bad = api.request("GET", f"/api/queues/%2F/{q(name)}/messages?count=-1")
    assert bad.status == 400 and "count" in str(bad.body)
    bad = api.request("GET", f"/api/queues/%2F/{q(name)}/messages?offset=x")
    assert bad.status == 400 and "offset" in str(bad.body)
    missing = api.request("GET", f"/api/queues/%2F/{q(name)}-missing/messages")
    assert missing.status == 404


def test_browse_quorum_queue_in_priority_order(
    api: HttpApi, warren: RunningBroker, name: str
) -> None:
    # RabbitMQ 4.3 rabbit_fifo_pq: a quorum queue delivers higher priorities first, and no
    # priority property counts as 4 (rabbit_fifo:msg_priority/1); browse lists that order
    api.ok(
        "PUT",
        f"/api/queues/%2F/{q(name)}",
        {"durable": True, "arguments": {"x-queue-type": "quorum"}},
    )
    publish(api, name, "low", priority=1)
    publish(api, name, "none")
    publish(api, name, "high", priority=9)
    rows = api.ok("GET", f"/api/queues/%2F/{q(name)}/messages?offset=0&count=10")
    assert [(r["position"], r["payload"]) for r in rows] == [(0, "high"), (1, "none"), (2, "low")]
    assert api.ok("GET", f"/api/queues/%2F/{q(name)}")["messages_ready"] == 3
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", warren.port))
    try:
        channel = conn.channel()
        got = []
        for _ in range(3):
            method, _, body = channel.basic_get(name, auto_ack=True)
            assert method is not None
            got.append((body, method.redelivered))
        assert got == [(b"high", False), (b"none", False), (b"low", False)]
    finally:
        conn.close()


def test_rejected_message_replays_to_its_queue(
    api: HttpApi, warren: RunningBroker, name: str
) -> None:
    # the first x-death entry holds the exchange and routing keys the message had before it
    # died (RabbitMQ 4.3 deps/rabbit/src/mc.erl, record_death puts the newest first)
    dlq = f"{name}.dlq"
    api.ok("PUT", f"/api/queues/%2F/{q(dlq)}", {"durable": True})
    api.ok(
        "PUT",
        f"/api/queues/%2F/{q(name)}",
        {
            "durable": True,
            "arguments": {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq},
        },
    )
    publish(api, name, "poison")
    publish(api, dlq, "never died")
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", warren.port))
    try:
        channel = conn.channel()
        method, _, _ = channel.basic_get(name)
        assert method is not None
        channel.basic_reject(method.delivery_tag, requeue=False)
        channel.queue_declare(dlq, passive=True)  # a round trip: the reject is done
        bad = api.request("POST", f"/api/queues/%2F/{q(dlq)}/replay", {"count": -1})
        assert bad.status == 400 and "count" in str(bad.body)
        assert api.ok("GET", f"/api/queues/%2F/{q(dlq)}")["messages"] == 2
        result = api.ok("POST", f"/api/queues/%2F/{q(dlq)}/replay", {})
        assert result == {
            "replayed": 1,
            "unroutable": 0,
            "without_x_death": 1,
            "to": [{"exchange": "", "routing_keys": [name], "messages": 1}],
        }
        method, props, body = channel.basic_get(name, auto_ack=True)
        assert method is not None and body == b"poison" and not method.redelivered
        assert "x-death" not in (props.headers or {})
        # the one without x-death stayed, not marked redelivered
        method, _, body = channel.basic_get(dlq, auto_ack=True)
        assert method is not None and body == b"never died" and not method.redelivered
    finally:
        conn.close()
