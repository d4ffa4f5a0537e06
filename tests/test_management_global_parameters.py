"""Global parameters and the cluster name over HTTP, durable and in definitions.

RabbitMQ 4.3: deps/rabbitmq_management/src/rabbit_mgmt_wm_global_parameter.erl,
rabbit_mgmt_wm_cluster_name.erl (``name`` required, stored as the global parameter
``cluster_name``), deps/rabbit/src/rabbit_definitions.erl (add_global_parameter/2); the codes
below were also read from RabbitMQ 3.10.8 side by side.
"""

from __future__ import annotations

from pathlib import Path

from tests.http_api import http
from warren.broker.testkit import run_broker


def test_global_parameters_and_cluster_name(tmp_path: Path) -> None:
    with run_broker(management_port=0, data_dir=str(tmp_path)) as warren:
        api = http(warren)
        node = api.ok("GET", "/api/cluster-name")["name"]
        assert api.put("/api/global-parameters/g1", {"value": {"a": 1}}).status == 201
        assert api.put("/api/global-parameters/g1", {"value": 2}).status == 204
        missing = api.put("/api/global-parameters/g1", {})
        assert (missing.status, missing.body["reason"]) == (400, "[{key_missing,value}]")
        assert api.ok("GET", "/api/global-parameters/g1") == {"value": 2, "name": "g1"}
        no_name = api.put("/api/cluster-name", {})
        assert (no_name.status, no_name.body["reason"]) == (400, "[{key_missing,name}]")
        assert api.put("/api/cluster-name", {"name": "prod-eu"}).status == 204
        assert api.ok("GET", "/api/cluster-name") == {"name": "prod-eu"}
        assert api.ok("GET", "/api/overview")["cluster_name"] == "prod-eu"
        api.ok("PUT", "/api/users/mgmt", {"password": "pw", "tags": "management"})
        mgmt = api.as_user("mgmt", "pw")
        assert mgmt.put("/api/cluster-name", {"name": "x"}).status == 401
        assert mgmt.get("/api/global-parameters").status == 401
        assert mgmt.ok("GET", "/api/cluster-name") == {"name": "prod-eu"}
        warren.restart()
        api = http(warren)
        expected = [{"name": "cluster_name", "value": "prod-eu"}, {"name": "g1", "value": 2}]
        assert api.ok("GET", "/api/global-parameters") == expected
        exported = api.ok("GET", "/api/definitions")
        assert exported["global_parameters"] == expected
        assert api.delete("/api/global-parameters/g1").status == 204
        assert api.delete("/api/global-parameters/g1").status == 404
        assert api.ok("DELETE", "/api/global-parameters/cluster_name") is None
        assert api.ok("GET", "/api/cluster-name") == {"name": node}
    with run_broker(management_port=0) as fresh:
        api = http(fresh)
        assert api.request("POST", "/api/definitions", exported).status == 204
        assert api.ok("GET", "/api/global-parameters") == expected
        assert api.ok("GET", "/api/cluster-name") == {"name": "prod-eu"}
