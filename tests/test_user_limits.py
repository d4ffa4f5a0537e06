"""User limits (max-connections, max-channels) over HTTP, enforced over AMQP, durable, in
definitions.

RabbitMQ 4.3 (v4.3.5): deps/rabbitmq_management/src/rabbit_mgmt_wm_user_limits.erl and
rabbit_mgmt_wm_user_limit.erl (routes, shapes, who may read them);
deps/rabbit/src/rabbit_auth_backend_internal.erl validate_user_limits/1, is_over_limit/3 (a
negative limit is none, 0 refuses all) and put_user/3 (a user's ``limits``);
deps/rabbit/src/rabbit_reader.erl is_over_user_connection_limit/1 (connection.open) and
is_over_limits/1 (channel.open: the connection closes, 530). Texts also compared with
RabbitMQ 3.10.8 side by side.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.http_api import HttpApi, http
from warren.broker.testkit import RunningBroker, run_broker


@pytest.fixture
def warren() -> Iterator[RunningBroker]:
    with run_broker(management_port=0) as running:
        yield running


@pytest.fixture
def api(warren: RunningBroker) -> HttpApi:
    api = http(warren)
    api.ok("PUT", "/api/users/ul", {"password": "pw", "tags": "management"})
    api.ok("PUT", "/api/permissions/%2F/ul", {"configure": ".*", "write": ".*", "read": ".*"})
    return api


def connect(warren: RunningBroker, user: str = "ul") -> pika.BlockingConnection:
    credentials = pika.PlainCredentials(user, "pw" if user != "guest" else "guest")
    return pika.BlockingConnection(
        pika.ConnectionParameters(warren.host, warren.port, "/", credentials)
    )


def test_user_limit_routes_and_refusals(api: HttpApi) -> None:
    assert api.put("/api/user-limits/ul/max-connections", {"value": 2}).status == 204
    assert api.put("/api/user-limits/ul/max-channels", {"value": 3}).status == 204
    assert api.put("/api/user-limits/ul/max-channels", {"value": 4}).status == 204
    row = {"user": "ul", "value": {"max-connections": 2, "max-channels": 4}}
    assert api.ok("GET", "/api/user-limits") == [row]
    assert api.ok("GET", "/api/user-limits/ul") == [row]
    assert api.ok("GET", "/api/user-limits/guest") == []
    assert api.get("/api/user-limits/nobody").status == 404
    assert api.ok("GET", "/api/users/ul")["limits"] == row["value"]
    refusals = [
        (
            "/api/user-limits/ul/max-foo",
            {"value": 2},
            'Unrecognised terms [{<<"max-foo">>,2}] in user-limits',
        ),
        (
            "/api/user-limits/ul/max-channels",
            {"value": "x"},
            'max-channels should be a number, actually was <<"x">>',
        ),
        ("/api/user-limits/ul/max-channels", {}, "[{key_missing,value}]"),
        ("/api/user-limits/nobody/max-channels", {"value": 1}, ["no_such_user", "nobody"]),
    ]
    for path, body, reason in refusals:
        refused = api.put(path, body)
        assert (refused.status, refused.body["reason"]) == (400, reason), path
    assert api.ok("GET", "/api/user-limits") == [row]
    # a user reads its own limits; only administrators list or change them
    own = api.as_user("ul", "pw")
    assert own.ok("GET", "/api/user-limits/ul") == [row]
    assert own.get("/api/user-limits/guest").status == 401
    assert own.get("/api/user-limits").status == 401
    assert own.put("/api/user-limits/ul/max-channels", {"value": 9}).status == 401
    assert api.delete("/api/user-limits/ul/max-channels").status == 204
    assert api.delete("/api/user-limits/ul/max-channels").status == 204  # as RabbitMQ: no 404
    assert api.delete("/api/user-limits/nobody/max-channels").status == 404
    assert api.ok("GET", "/api/user-limits/ul") == [{"user": "ul", "value": {"max-connections": 2}}]
    # PUT /api/users/:u with limits sets them (rabbit_auth_backend_internal:put_user/3)
    body = {"password": "pw", "tags": "", "limits": {"max-channels": 1}}
    assert api.put("/api/users/ul", body).status == 204
    assert api.ok("GET", "/api/user-limits/ul")[0]["value"] == {"max-channels": 1}
    refused = api.put("/api/users/ul2", {**body, "limits": {"max-x": 1}})
    assert refused.status == 400 and api.get("/api/users/ul2").status == 404


def test_max_connections_and_max_channels_enforced(warren: RunningBroker, api: HttpApi) -> None:
    api.ok("PUT", "/api/user-limits/ul/max-connections", {"value": 1})
    api.ok("PUT", "/api/user-limits/ul/max-channels", {"value": 2})
    first = connect(warren)
    try:
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as denied:
            connect(warren)
        assert (
            "NOT_ALLOWED - connection refused for user 'ul': user connection limit (1) is reached"
        ) in str(denied.value)
        guest = connect(warren, "guest")  # other users are not counted
        guest.close()
        first.channel()
        first.channel()
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            first.channel()
        assert (closed.value.reply_code, closed.value.reply_text) == (
            530,
            "NOT_ALLOWED - number of channels opened for user 'ul' has reached "
            "the maximum allowed user limit of 2",
        )
    finally:
        if first.is_open:
            first.close()
    # a negative limit is no limit; 0 refuses every connection
    api.ok("PUT", "/api/user-limits/ul/max-connections", {"value": -1})
    a, b = connect(warren), connect(warren)
    a.close()
    b.close()
    api.ok("PUT", "/api/user-limits/ul/max-connections", {"value": 0})
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError):
        connect(warren)


def test_user_limits_durable_and_in_definitions(tmp_path: Path) -> None:
    with run_broker(management_port=0, data_dir=str(tmp_path)) as warren:
        api = http(warren)
        api.ok("PUT", "/api/users/ul", {"password": "pw", "tags": ""})
        api.ok("PUT", "/api/user-limits/ul/max-channels", {"value": 5})
        warren.restart()
        api = http(warren)
        assert api.ok("GET", "/api/user-limits") == [{"user": "ul", "value": {"max-channels": 5}}]
        exported = api.ok("GET", "/api/definitions")
        (user,) = [u for u in exported["users"] if u["name"] == "ul"]
        assert user["limits"] == {"max-channels": 5}
    with run_broker(management_port=0) as fresh:
        api = http(fresh)
        assert api.request("POST", "/api/definitions", exported).status == 204
        assert api.ok("GET", "/api/user-limits") == [{"user": "ul", "value": {"max-channels": 5}}]
        bad = {"users": [{**user, "name": "ul3", "limits": {"max-channels": "many"}}]}
        refused = api.request("POST", "/api/definitions", bad)
        assert refused.status == 400 and api.get("/api/users/ul3").status == 404
