"""Vhost limits over HTTP, enforced over AMQP, and the vhost creator's permissions.

RabbitMQ 4.3: deps/rabbit/src/rabbit_vhost_limit.erl (the ``vhost-limits`` runtime parameter,
validate/5), deps/rabbitmq_management/src/rabbit_mgmt_wm_limits.erl and rabbit_mgmt_wm_limit.erl;
the texts and codes below were also read from RabbitMQ 3.10.8 side by side.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.http_api import HttpApi, http, q
from warren.broker.testkit import RunningBroker, run_broker


@pytest.fixture
def warren() -> Iterator[RunningBroker]:
    with run_broker(management_port=0) as running:
        yield running


@pytest.fixture
def api(warren: RunningBroker) -> HttpApi:
    return http(warren)


def amqp(warren: RunningBroker, vhost: str, user: str = "guest") -> pika.BlockingConnection:
    url = f"amqp://{user}:{'pw' if user != 'guest' else 'guest'}@{warren.host}:{warren.port}/"
    return pika.BlockingConnection(pika.URLParameters(url + q(vhost)))


def test_limits_set_listed_and_enforced(warren: RunningBroker, api: HttpApi) -> None:
    assert api.put("/api/vhosts/lim").status == 201
    assert api.put("/api/vhost-limits/lim/max-queues", {"value": 1}).status == 204
    assert api.put("/api/vhost-limits/lim/max-connections", {"value": 1}).status == 204
    limits = {"max-queues": 1, "max-connections": 1}
    assert api.ok("GET", "/api/vhost-limits") == [{"vhost": "lim", "value": limits}]
    assert api.ok("GET", "/api/vhost-limits/lim") == [{"vhost": "lim", "value": limits}]
    assert api.ok("GET", "/api/vhost-limits/%2F") == []
    # stored as RabbitMQ stores them: one runtime parameter
    assert api.ok("GET", "/api/parameters/vhost-limits") == [
        {"value": limits, "vhost": "lim", "component": "vhost-limits", "name": "limits"}
    ]
    conn = amqp(warren, "lim")
    try:
        ch = conn.channel()
        ch.queue_declare("q1", durable=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.queue_declare("q2", durable=True)
        assert (refused.value.reply_code, refused.value.reply_text) == (
            406,
            "PRECONDITION_FAILED - cannot declare queue 'q2': queue limit in vhost 'lim' (1) "
            "is reached",
        )
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as denied:
            amqp(warren, "lim")
        assert (
            "NOT_ALLOWED - access to vhost 'lim' refused for user 'guest': "
            "connection limit (1) is reached"
        ) in str(denied.value)
    finally:
        conn.close()
    assert api.delete("/api/vhost-limits/lim/max-queues").status == 204
    assert api.delete("/api/vhost-limits/lim/max-queues").status == 204  # as RabbitMQ: no 404
    assert api.delete("/api/vhost-limits/lim/max-connections").status == 204
    assert api.ok("GET", "/api/vhost-limits") == []
    conn, other = amqp(warren, "lim"), amqp(warren, "lim")
    try:
        conn.channel().queue_declare("q2", durable=True)
    finally:
        conn.close()
        other.close()


@pytest.mark.parametrize(
    ("name", "value", "reason"),
    [
        ("max-queues", 1.5, "max-queues should be a number, actually was 1.5"),
        ("max-connections", "x", 'max-connections should be a number, actually was <<"x">>'),
        ("max-foo", 1, 'Unrecognised terms [{<<"max-foo">>,1}] in limits'),
    ],
)
def test_bad_limits_are_refused(api: HttpApi, name: str, value: object, reason: str) -> None:
    api.ok("PUT", "/api/vhost-limits/%2F/max-queues", {"value": 5})
    refused = api.put(f"/api/vhost-limits/%2F/{name}", {"value": value})
    assert (refused.status, refused.body["reason"]) == (400, f"Validation failed\n\n{reason}\n")
    assert api.ok("GET", "/api/vhost-limits/%2F") == [{"vhost": "/", "value": {"max-queues": 5}}]
    missing = api.put("/api/vhost-limits/%2F/max-queues", {})
    assert (missing.status, missing.body["reason"]) == (400, "[{key_missing,value}]")
    assert api.put("/api/vhost-limits/nowhere/max-queues", {"value": 1}).status == 404
    assert api.get("/api/vhost-limits/nowhere").status == 404


def test_only_administrators_set_limits(api: HttpApi) -> None:
    api.ok("PUT", "/api/users/mon", {"password": "pw", "tags": "monitoring"})
    mon = api.as_user("mon", "pw")
    assert mon.put("/api/vhost-limits/%2F/max-queues", {"value": 1}).status == 401
    assert mon.get("/api/vhost-limits").body == []


def test_limits_survive_restart_and_round_trip(tmp_path: Path) -> None:
    with run_broker(management_port=0, data_dir=str(tmp_path)) as warren:
        api = http(warren)
        api.ok("PUT", "/api/vhosts/lim")
        api.ok("PUT", "/api/vhost-limits/lim/max-queues", {"value": 0})
        warren.restart()
        api = http(warren)
        assert api.ok("GET", "/api/vhost-limits/lim") == [
            {"vhost": "lim", "value": {"max-queues": 0}}
        ]
        exported = api.ok("GET", "/api/definitions")
        conn = amqp(warren, "lim")
        try:
            with pytest.raises(pika.exceptions.ChannelClosedByBroker):
                conn.channel().queue_declare("q1", durable=True)
        finally:
            conn.close()
    with run_broker(management_port=0) as fresh:
        api = http(fresh)
        assert api.request("POST", "/api/definitions", exported).status == 204
        assert api.ok("GET", "/api/vhost-limits/lim") == [
            {"vhost": "lim", "value": {"max-queues": 0}}
        ]


def test_vhost_creator_gets_full_permissions(warren: RunningBroker, api: HttpApi) -> None:
    api.ok("PUT", "/api/users/adm", {"password": "pw", "tags": "administrator"})
    adm = api.as_user("adm", "pw")
    assert adm.put("/api/vhosts/made").status == 201
    everything = {"configure": ".*", "write": ".*", "read": ".*"}
    assert api.ok("GET", "/api/vhosts/made/permissions") == [
        {"vhost": "made", "user": "adm", **everything}
    ]
    amqp(warren, "made", "adm").close()  # usable at once
    # an update does not grant; an import grants to the importing user
    api.ok("DELETE", "/api/permissions/made/adm")
    assert adm.put("/api/vhosts/made", {"description": "x"}).status == 204
    assert api.ok("GET", "/api/vhosts/made/permissions") == []
    assert adm.request("POST", "/api/definitions", {"vhosts": [{"name": "imp"}]}).status == 204
    assert api.ok("GET", "/api/vhosts/imp/permissions") == [
        {"vhost": "imp", "user": "adm", **everything}
    ]


def test_vhost_limits_in_vhost_entries(api: HttpApi) -> None:
    # rabbit_definitions:vhost_definition/1 (4.3) exports a vhost's limits in its entry
    api.ok("PUT", "/api/vhosts/lim")
    api.ok("PUT", "/api/vhost-limits/lim/max-connections", {"value": 3})
    (entry,) = [v for v in api.ok("GET", "/api/definitions")["vhosts"] if v["name"] == "lim"]
    assert entry["limits"] == {"max-connections": 3}
    imported = {"vhosts": [{"name": "lim2", "limits": {"max-queues": 7}}]}
    assert api.request("POST", "/api/definitions", imported).status == 204
    assert api.ok("GET", "/api/vhost-limits/lim2") == [
        {"vhost": "lim2", "value": {"max-queues": 7}}
    ]
