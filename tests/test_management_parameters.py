"""Runtime parameters over HTTP: /api/parameters[/{component}[/{vhost}[/{name}]]].

RabbitMQ 4.3: deps/rabbitmq_management/src/rabbit_mgmt_wm_parameters.erl (lists,
is_authorized_policies, filter_vhost), rabbit_mgmt_wm_parameter.erl (accept_content:
``value`` required, an ``{error_string, _}`` from rabbit_runtime_parameters:set is a 400),
deps/rabbit/src/rabbit_runtime_parameters.erl (format_error: "Validation failed\\n\\n...\\n")
and rabbit_definitions.erl (runtime_parameter_definition/1, add_parameter/2).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.http_api import HttpApi, http
from warren.broker.engine.parameters import ParameterError
from warren.broker.testkit import RunningBroker, run_broker

UPSTREAM = {"uri": "amqp://remote", "expires": 3600000}


@pytest.fixture
def warren() -> Iterator[RunningBroker]:
    with run_broker(management_port=0) as running:
        yield running


@pytest.fixture
def api(warren: RunningBroker) -> HttpApi:
    return http(warren)


@dataclass
class Recorder:
    """A component as a plugin registers one: refuses values without ``ok``, records the rest."""

    name: str = "test-component"
    events: list[tuple[Any, ...]] = field(default_factory=list)

    def validate(self, vhost: str, name: str, value: Any) -> None:
        if not isinstance(value, dict) or value.get("ok") is not True:
            raise ParameterError(f"{name}: ok must be true")

    def on_set(self, vhost: str, name: str, value: Any) -> None:
        self.events.append(("set", vhost, name, value))

    def on_clear(self, vhost: str, name: str) -> None:
        self.events.append(("clear", vhost, name))


def register(warren: RunningBroker, component: Recorder) -> None:
    warren.call(warren.server.broker.parameters.register, component)


def test_unknown_component_is_stored_listed_and_deleted(api: HttpApi) -> None:
    path = "/api/parameters/federation-upstream/%2F/up1"
    assert api.put(path, {"value": UPSTREAM}).status == 201
    assert api.put(path, {"value": {**UPSTREAM, "expires": 1}}).status == 204  # replaced
    api.ok("PUT", "/api/vhosts/other")
    assert api.put("/api/parameters/federation-upstream/other/up2", {"value": UPSTREAM}).status
    expected = {
        "value": {**UPSTREAM, "expires": 1},
        "vhost": "/",
        "component": "federation-upstream",
        "name": "up1",
    }
    assert api.ok("GET", path) == expected
    assert api.ok("GET", "/api/parameters/federation-upstream/%2F") == [expected]
    listed = api.ok("GET", "/api/parameters/federation-upstream")
    assert [(p["vhost"], p["name"]) for p in listed] == [("/", "up1"), ("other", "up2")]
    assert len(api.ok("GET", "/api/parameters")) == 2
    assert api.ok("GET", "/api/parameters/shovel") == []
    assert api.delete(path).status == 204
    assert api.get(path).status == 404
    assert api.delete(path).status == 404
    # deleting a vhost deletes its parameters
    api.ok("DELETE", "/api/vhosts/other")
    assert api.ok("GET", "/api/parameters") == []


def test_bad_requests_change_nothing(api: HttpApi) -> None:
    path = "/api/parameters/federation-upstream/%2F/up1"
    missing = api.put(path, {"values": UPSTREAM})
    assert (missing.status, missing.body["reason"]) == (400, "[{key_missing,value}]")
    assert api.put(path, {"value": None}).status == 400
    assert api.request("PUT", path, raw=b"{").status == 400
    nowhere = api.put("/api/parameters/federation-upstream/nowhere/up1", {"value": UPSTREAM})
    assert nowhere.status == 404
    assert api.get("/api/parameters/federation-upstream/nowhere").status == 404
    # a component no plugin registers: RabbitMQ 3.10.8 (side by side) and 4.3 answer this,
    # rabbit_runtime_parameters:lookup_component/1
    unknown = api.put("/api/parameters/nosuch/%2F/x", {"value": {"a": 1}})
    assert (unknown.status, unknown.body) == (
        400,
        {"error": "bad_request", "reason": "Validation failed\n\ncomponent nosuch not found\n"},
    )
    assert api.ok("GET", "/api/parameters") == []


def test_registered_component_validates_and_hears(warren: RunningBroker, api: HttpApi) -> None:
    component = Recorder()
    register(warren, component)
    path = "/api/parameters/test-component/%2F/p1"
    refused = api.put(path, {"value": {"ok": False}})
    assert (refused.status, refused.body) == (
        400,
        {"error": "bad_request", "reason": "Validation failed\n\np1: ok must be true\n"},
    )
    assert api.get(path).status == 404
    assert component.events == []
    assert api.put(path, {"value": {"ok": True}}).status == 201
    assert api.delete(path).status == 204
    assert component.events == [("set", "/", "p1", {"ok": True}), ("clear", "/", "p1")]


def test_permissions_follow_policies(api: HttpApi) -> None:
    # rabbit_mgmt_util:is_authorized_policies: administrators, or policymakers in their vhosts
    for user, tags in (("pm", "policymaker"), ("mgmt", "management"), ("stranger", "policymaker")):
        api.ok("PUT", f"/api/users/{user}", {"password": "pw", "tags": tags})
    for user in ("pm", "mgmt"):
        everything = {"configure": ".*", "write": ".*", "read": ".*"}
        api.ok("PUT", f"/api/permissions/%2F/{user}", everything)
    path = "/api/parameters/federation-upstream/%2F/up1"
    assert api.as_user("pm", "pw").put(path, {"value": UPSTREAM}).status == 201
    assert len(api.as_user("pm", "pw").get("/api/parameters").body) == 1
    for user in ("mgmt", "stranger"):
        client = api.as_user(user, "pw")
        assert client.put(path, {"value": UPSTREAM}).status == 401
        assert client.delete(path).status == 401
    assert api.as_user("mgmt", "pw").get("/api/parameters").status == 401
    assert api.as_user("stranger", "pw").get("/api/parameters").body == []  # no vhost of its own
    assert len(api.ok("GET", "/api/parameters")) == 1


def test_durable_and_in_definitions(tmp_path: Path) -> None:
    value = {"uri": ["amqp://a", "amqp://b"], "prefetch-count": 10, "ack-mode": "on-confirm"}
    with run_broker(management_port=0, data_dir=str(tmp_path / "a")) as warren:
        api = http(warren)
        api.ok("PUT", "/api/vhosts/v1")
        api.ok("PUT", "/api/parameters/federation-upstream/v1/up", {"value": value})
        register(warren, Recorder())  # a component nobody registered is refused
        api.ok("PUT", "/api/parameters/test-component/%2F/p", {"value": {"ok": True}})
        warren.restart()
        api = http(warren)
        assert api.ok("GET", "/api/parameters/federation-upstream/v1/up")["value"] == value
        # a component registered after start hears the stored values
        component = Recorder()
        register(warren, component)
        assert component.events == [("set", "/", "p", {"ok": True})]
        exported = api.ok("GET", "/api/definitions")
        scoped = api.ok("GET", "/api/definitions/v1")
    assert sorted(exported["parameters"], key=lambda p: p["name"]) == [
        {"value": {"ok": True}, "vhost": "/", "component": "test-component", "name": "p"},
        {"value": value, "vhost": "v1", "component": "federation-upstream", "name": "up"},
    ]
    # a vhost's own export keeps the vhost in parameters (RabbitMQ 3.10.8, side by side);
    # an import into another vhost puts them there
    assert scoped["parameters"] == [
        {"value": value, "vhost": "v1", "component": "federation-upstream", "name": "up"}
    ]
    with run_broker(management_port=0) as fresh:
        api = http(fresh)
        component = Recorder()
        register(fresh, component)
        assert api.request("POST", "/api/definitions", exported).status == 204
        assert api.ok("GET", "/api/parameters/federation-upstream/v1/up")["value"] == value
        assert component.events == [("set", "/", "p", {"ok": True})]
        api.ok("PUT", "/api/vhosts/v2")
        assert api.request("POST", "/api/definitions/v2", scoped).status == 204
        assert api.ok("GET", "/api/parameters/federation-upstream/v2/up")["value"] == value
        # a value the component refuses stops the import with its message
        bad = {"parameters": [{"vhost": "/", "component": "test-component", "name": "q",
                               "value": {"ok": 1}}]}  # fmt: skip
        refused = api.request("POST", "/api/definitions", bad)
        assert (refused.status, refused.body["reason"]) == (
            400,
            "Validation failed\n\nq: ok must be true\n",
        )
        assert api.get("/api/parameters/test-component/%2F/q").status == 404
