"""Operator policies over HTTP, merged with policies and enforced, durable, in definitions.

RabbitMQ 4.3 (v4.3.5): deps/rabbitmq_management/src/rabbit_mgmt_wm_operator_policies.erl and
rabbit_mgmt_wm_operator_policy.erl (routes, codes, who may do what); deps/rabbit/src/
rabbit_policy.erl set_op/7 (defaults: priority 0, apply-to all; stored as the runtime parameter
``operator_policy``), merge_operator_definitions/2 and operator_policy_validation/0;
deps/rabbit/src/rabbit_policies.erl (the operator keys, their texts, merge_policy_value/3: the
smaller of two limits, the operator's overflow). Shapes also compared with RabbitMQ 3.10.8.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.http_api import HttpApi, http
from warren.broker.testkit import RunningBroker, run_broker


@pytest.fixture
def warren() -> Iterator[RunningBroker]:
    with run_broker(management_port=0) as running:
        yield running


@pytest.fixture
def api(warren: RunningBroker) -> HttpApi:
    return http(warren)


def test_operator_policy_routes_and_refusals(api: HttpApi) -> None:
    body = {"pattern": "^op", "definition": {"max-length": 5}, "apply-to": "queues"}
    assert api.put("/api/operator-policies/%2F/cap", body).status == 201
    assert api.put("/api/operator-policies/%2F/cap", {**body, "priority": 2}).status == 204
    row = {
        "vhost": "/",
        "name": "cap",
        "pattern": "^op",
        "apply-to": "queues",
        "definition": {"max-length": 5},
        "priority": 2,
    }
    assert api.ok("GET", "/api/operator-policies") == [row]
    assert api.ok("GET", "/api/operator-policies/%2F") == [row]
    assert api.ok("GET", "/api/operator-policies/%2F/cap") == row
    # kept as RabbitMQ keeps it: a runtime parameter
    assert api.ok("GET", "/api/parameters/operator_policy") == [
        {
            "value": {k: row[k] for k in ("pattern", "definition", "priority", "apply-to")},
            "vhost": "/",
            "component": "operator_policy",
            "name": "cap",
        }
    ]
    refusals = [
        (
            {"pattern": "^op", "definition": {"dead-letter-exchange": "x"}},
            'Validation failed\n\n[{<<"dead-letter-exchange">>,<<"x">>}] are not recognised '
            "policy settings\n",
        ),
        (
            {"pattern": "^op", "definition": {"max-length": -5}},
            "Validation failed\n\n-5 is not a valid maximum length\n",
        ),
        ({"pattern": "^op", "definition": {}}, "Validation failed\n\nno policy provided\n"),
        ({"definition": {"max-length": 1}}, "[{key_missing,pattern}]"),
    ]
    for refused_body, reason in refusals:
        refused = api.put("/api/operator-policies/%2F/other", refused_body)
        assert (refused.status, refused.body["reason"]) == (400, reason)
    no_vhost = api.put("/api/operator-policies/nowhere/x", body)
    assert (no_vhost.status, no_vhost.body["reason"]) == (404, "vhost_not_found")
    assert api.ok("GET", "/api/operator-policies") == [row]
    assert api.get("/api/operator-policies/%2F/none").status == 404
    assert api.get("/api/operator-policies/nowhere").status == 404
    # listing: anyone with access to the vhost; reading one and changing: administrators
    api.ok("PUT", "/api/users/pm", {"password": "pw", "tags": "policymaker"})
    api.ok("PUT", "/api/permissions/%2F/pm", {"configure": ".*", "write": ".*", "read": ".*"})
    maker = api.as_user("pm", "pw")
    assert maker.ok("GET", "/api/operator-policies") == [row]
    assert maker.get("/api/operator-policies/%2F/cap").status == 401
    assert maker.put("/api/operator-policies/%2F/cap", body).status == 401
    assert maker.delete("/api/operator-policies/%2F/cap").status == 401
    assert api.delete("/api/operator-policies/%2F/cap").status == 204
    assert api.delete("/api/operator-policies/%2F/cap").status == 404


def test_merged_with_policy_and_enforced(warren: RunningBroker, api: HttpApi) -> None:
    policy = {"pattern": "^op", "definition": {"max-length": 10, "message-ttl": 60000}}
    api.ok("PUT", "/api/policies/%2F/user-side", policy)
    conn = pika.BlockingConnection(pika.ConnectionParameters(warren.host, warren.port))
    try:
        ch = conn.channel()
        ch.queue_declare("op-q", durable=True)
        for i in range(8):
            ch.basic_publish("", "op-q", str(i).encode())
        assert ch.queue_declare("op-q", passive=True).method.message_count == 8
        operator = {
            "pattern": "^op",
            "definition": {"max-length": 5, "message-ttl": 120000, "overflow": "reject-publish"},
            "apply-to": "queues",
        }
        api.ok("PUT", "/api/operator-policies/%2F/cap", operator)
        # the lower max-length (5) and the operator's overflow win: with 8 messages in it, the
        # queue refuses more (the policy's 10 alone would take them)
        queue = api.ok("GET", "/api/queues/%2F/op-q")
        assert (queue["policy"], queue["operator_policy"]) == ("user-side", "cap")
        assert queue["effective_policy_definition"] == {
            "max-length": 5,
            "message-ttl": 60000,
            "overflow": "reject-publish",
        }
        ch.confirm_delivery()
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", "op-q", b"over the operator's limit")
        api.ok("DELETE", "/api/operator-policies/%2F/cap")
        queue = api.ok("GET", "/api/queues/%2F/op-q")
        assert queue["operator_policy"] is None
        assert queue["effective_policy_definition"] == policy["definition"]
        ch.basic_publish("", "op-q", b"the policy's limit again")
    finally:
        conn.close()


def test_operator_policies_durable_and_in_definitions(tmp_path: Path) -> None:
    operator = {"pattern": "^op", "definition": {"max-length": 3}, "priority": 1}
    with run_broker(management_port=0, data_dir=str(tmp_path)) as warren:
        api = http(warren)
        api.ok("PUT", "/api/operator-policies/%2F/cap", operator)
        api.ok("PUT", "/api/queues/%2F/op-durable", {"durable": True})
        warren.restart()
        api = http(warren)
        assert api.ok("GET", "/api/queues/%2F/op-durable")["operator_policy"] == "cap"
        exported = api.ok("GET", "/api/definitions")
        # rabbit_definitions: operator policies travel as parameters
        (param,) = [p for p in exported["parameters"] if p["component"] == "operator_policy"]
        assert param["value"] == {**operator, "apply-to": "all"}
    with run_broker(management_port=0) as fresh:
        api = http(fresh)
        assert api.request("POST", "/api/definitions", exported).status == 204
        assert api.ok("GET", "/api/queues/%2F/op-durable")["effective_policy_definition"] == {
            "max-length": 3
        }
        # a policy-shaped ``operator_policies`` section imports too
        section = {"operator_policies": [{"vhost": "/", "name": "two", **operator}]}
        assert api.request("POST", "/api/definitions", section).status == 204
        assert api.ok("GET", "/api/operator-policies/%2F/two")["priority"] == 1
        bad = {
            "operator_policies": [
                {"vhost": "/", "name": "bad", "pattern": "x", "definition": {"x": 1}}
            ]
        }
        refused = api.request("POST", "/api/definitions", bad)
        assert refused.status == 400 and api.get("/api/operator-policies/%2F/bad").status == 404
