"""Plugin routes Warren answers and closing a user's connections.

RabbitMQ 4.3: deps/rabbitmq_management/src/rabbit_mgmt_wm_extensions.erl,
rabbit_mgmt_wm_connection_user_name.erl (DELETE closes every connection of the user),
deps/rabbitmq_federation_management/src/rabbit_federation_mgmt.erl (federation-links),
deps/rabbitmq_shovel_management/src/rabbit_shovel_mgmt_shovels.erl (shovels); shapes also read
from RabbitMQ 3.10.8 side by side (an empty list where nothing runs).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pika
import pytest

from tests.http_api import HttpApi
from warren.broker.testkit import RunningBroker, run_broker


@pytest.fixture
def warren() -> Iterator[RunningBroker]:
    with run_broker(management_port=0) as running:
        yield running


@pytest.fixture
def api(warren: RunningBroker) -> HttpApi:
    port = warren.server.management_port
    assert port
    return HttpApi(port)


class Shovels:
    """A shovel component as the shovel plugin registers one, reporting its shovels."""

    name = "shovel"

    def validate(self, vhost: str, name: str, value: Any) -> None:
        pass

    def on_set(self, vhost: str, name: str, value: Any) -> None:
        pass

    def on_clear(self, vhost: str, name: str) -> None:
        pass

    def statuses(self) -> list[dict[str, Any]]:
        return [
            {"name": "s1", "vhost": "/", "type": "dynamic", "state": "running"},
            {"name": "s2", "vhost": "other", "type": "dynamic", "state": "starting"},
        ]


def test_plugin_lists(warren: RunningBroker, api: HttpApi) -> None:
    assert api.ok("GET", "/api/extensions") == []
    assert api.ok("GET", "/api/federation-links") == []
    assert api.ok("GET", "/api/federation-links/%2F") == []
    assert api.get("/api/federation-links/nowhere").status == 404
    assert api.ok("GET", "/api/shovels") == []
    warren.call(warren.server.broker.parameters.register, Shovels())
    api.ok("PUT", "/api/vhosts/other")
    assert [s["name"] for s in api.ok("GET", "/api/shovels")] == ["s1", "s2"]
    assert [s["name"] for s in api.ok("GET", "/api/shovels/%2F")] == ["s1"]
    # a management user sees the shovels of its own vhosts only
    api.ok("PUT", "/api/users/m", {"password": "pw", "tags": "management"})
    api.ok("PUT", "/api/permissions/%2F/m", {"configure": ".*", "write": ".*", "read": ".*"})
    assert [s["name"] for s in api.as_user("m", "pw").ok("GET", "/api/shovels")] == ["s1"]


def test_delete_connections_of_a_user(warren: RunningBroker, api: HttpApi) -> None:
    api.ok("PUT", "/api/users/m", {"password": "pw", "tags": "management"})
    api.ok("PUT", "/api/permissions/%2F/m", {"configure": ".*", "write": ".*", "read": ".*"})
    url = warren.url.replace("guest:guest", "m:pw")
    first, second = (pika.BlockingConnection(pika.URLParameters(url)) for _ in range(2))
    mine = pika.BlockingConnection(pika.URLParameters(warren.url))
    try:
        assert api.as_user("m", "pw").delete("/api/connections/username/guest").status == 401
        reply = api.request(
            "DELETE", "/api/connections/username/m", headers={"X-Reason": "maintenance"}
        )
        assert reply.status == 204
        for conn in (first, second):
            with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
                conn.process_data_events(2)
            assert (closed.value.reply_code, closed.value.reply_text) == (
                320,
                "CONNECTION_FORCED - maintenance",
            )
        mine.process_data_events(0)
        assert mine.is_open
        assert api.delete("/api/connections/username/nobody").status == 204
    finally:
        for conn in (first, second, mine):
            if conn.is_open:
                conn.close()


def test_more_health_checks(warren: RunningBroker, api: HttpApi) -> None:
    # rabbit_mgmt_wm_health_check_virtual_hosts, _node_is_quorum_critical, _port_listener
    assert api.ok("GET", "/api/health/checks/virtual-hosts") == {"status": "ok"}
    single = {"status": "ok", "reason": "single node cluster"}
    assert api.ok("GET", "/api/health/checks/node-is-quorum-critical") == single
    assert api.ok("GET", "/api/health/checks/node-is-mirror-sync-critical") == single
    port = warren.port
    assert api.ok("GET", f"/api/health/checks/port-listener/{port}") == {
        "status": "ok",
        "port": port,
    }
    failed = api.get("/api/health/checks/port-listener/1")
    assert failed.status == 503
    assert (failed.body["status"], failed.body["reason"], failed.body["missing"]) == (
        "failed",
        "No active listener",
        1,
    )
    assert port in failed.body["ports"]
