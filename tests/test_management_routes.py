"""Every GET route of RabbitMQ 3.10.8's management API answers on Warren, and the rest of
what was missing answers as RabbitMQ 4.3 does.

The route table: RabbitMQ 3.10.8's dispatcher (deps/rabbitmq_management/src/
rabbit_mgmt_dispatcher.erl) with the shovel and federation management plugins
(rabbit_shovel_mgmt:dispatcher/0, rabbit_federation_mgmt:dispatcher/0): 106 API routes. Asked
with GET, side by side with the objects each names in place, RabbitMQ 3.10.8 answers 89 of them
(GET_ROUTES); 13 allow other methods only and answer 405: NOT_GET_ROUTES, and ``/login`` (the
OAuth login form's POST, which Warren does not have: a 404); 3 name a running
shovel or federation link, which Warren does not run (a 404 there is the answer for a link or
shovel that does not exist), and ``/api`` itself is a 404 on both.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pika
import pytest
from tls_certs import make_pki

from tests.http_api import http
from warren.broker.testkit import RunningBroker, run_broker
from warren.config import Listener

GET_ROUTES = (
    "/aliveness-test/:vhost",
    "/all-configuration",
    "/auth",
    "/auth/attempts/:node",
    "/auth/attempts/:node/source",
    "/bindings",
    "/bindings/:vhost",
    "/bindings/:vhost/e/:source/:dtype/:destination",
    "/bindings/:vhost/e/:source/:dtype/:destination/:props",
    "/channels",
    "/channels/:channel",
    "/cluster-name",
    "/connections",
    "/connections/:connection",
    "/connections/:connection/channels",
    "/connections/username/:username",
    "/consumers",
    "/consumers/:vhost",
    "/definitions",
    "/definitions/:vhost",
    "/exchanges",
    "/exchanges/:vhost",
    "/exchanges/:vhost/:exchange",
    "/exchanges/:vhost/:exchange/bindings/destination",
    "/exchanges/:vhost/:exchange/bindings/source",
    "/extensions",
    "/feature-flags",
    "/federation-links",
    "/federation-links/:vhost",
    "/federation-links/:vhost/state/down",
    "/federation-links/state/down/",
    "/global-parameters",
    "/global-parameters/:name",
    "/health/checks/alarms",
    "/health/checks/certificate-expiration/:within/:unit",
    "/health/checks/local-alarms",
    "/health/checks/node-is-mirror-sync-critical",
    "/health/checks/node-is-quorum-critical",
    "/health/checks/port-listener/:port",
    "/health/checks/protocol-listener/:protocol",
    "/health/checks/virtual-hosts",
    "/healthchecks/node",
    "/healthchecks/node/:node",
    "/nodes",
    "/nodes/:node",
    "/nodes/:node/memory",
    "/nodes/:node/memory/ets",
    "/nodes/:node/memory/ets/:filter",
    "/nodes/:node/memory/ets/:filter/relative",
    "/nodes/:node/memory/ets/relative",
    "/nodes/:node/memory/relative",
    "/operator-policies",
    "/operator-policies/:vhost",
    "/operator-policies/:vhost/:name",
    "/overview",
    "/parameters",
    "/parameters/:component",
    "/parameters/:component/:vhost",
    "/parameters/:component/:vhost/:name",
    "/permissions",
    "/permissions/:vhost/:user",
    "/policies",
    "/policies/:vhost",
    "/policies/:vhost/:name",
    "/queues",
    "/queues/:vhost",
    "/queues/:vhost/:destination/bindings",
    "/queues/:vhost/:queue",
    "/shovels",
    "/shovels/:vhost",
    "/topic-permissions",
    "/topic-permissions/:vhost/:user",
    "/topic-permissions/:vhost/:user/:exchange",
    "/user-limits",
    "/user-limits/:user",
    "/users",
    "/users/:user",
    "/users/:user/permissions",
    "/users/:user/topic-permissions",
    "/users/without-permissions",
    "/vhost-limits",
    "/vhost-limits/:vhost",
    "/vhosts",
    "/vhosts/:vhost",
    "/vhosts/:vhost/channels",
    "/vhosts/:vhost/connections",
    "/vhosts/:vhost/permissions",
    "/vhosts/:vhost/topic-permissions",
    "/whoami",
)

NOT_GET_ROUTES = (
    "/exchanges/:vhost/:exchange/publish",
    "/feature-flags/:name/enable",
    "/queues/:vhost/:queue/actions",
    "/queues/:vhost/:queue/contents",
    "/queues/:vhost/:queue/get",
    "/rebalance/queues",
    "/reset",
    "/reset/:node",
    "/user-limits/:user/:name",
    "/users/bulk-delete",
    "/vhost-limits/:vhost/:name",
    "/vhosts/:vhost/start/:node",
)  # and /login, the OAuth login form's POST, which Warren does not have (docs/operating.md)


@pytest.fixture
def warren() -> Iterator[RunningBroker]:
    with run_broker(management_port=0) as running:
        yield running


def path_of(route: str, values: dict[str, str]) -> str:
    parts = [quote(values[p[1:]], safe="") if p.startswith(":") else p for p in route.split("/")]
    return "/api" + "/".join(parts)


def test_every_rabbitmq_get_route_answers(warren: RunningBroker) -> None:
    assert len(GET_ROUTES) == 89 and len(set(GET_ROUTES)) == 89
    api = http(warren)
    # the objects the routes name
    api.ok("PUT", "/api/users/rt", {"password": "pw", "tags": ""})
    api.ok("PUT", "/api/permissions/%2F/rt", {"configure": ".*", "write": ".*", "read": ".*"})
    api.ok("PUT", "/api/queues/%2F/rt-q", {"durable": True})
    api.ok("PUT", "/api/exchanges/%2F/rt-x", {"type": "topic"})
    api.ok("POST", "/api/bindings/%2F/e/rt-x/q/rt-q", {"routing_key": "k"})
    topic = {"exchange": "amq.topic", "write": ".*", "read": ".*"}
    api.ok("PUT", "/api/topic-permissions/%2F/rt", topic)
    policy = {"pattern": "^zz", "definition": {"max-length": 1}}
    api.ok("PUT", "/api/policies/%2F/rt-p", policy)
    api.ok("PUT", "/api/operator-policies/%2F/rt-p", policy)
    api.ok("PUT", "/api/global-parameters/rt-p", {"value": 1})
    api.ok("PUT", "/api/user-limits/rt/max-channels", {"value": 10})
    conn = pika.BlockingConnection(pika.ConnectionParameters(warren.host, warren.port))
    try:
        conn.channel()
        (connection,) = api.ok("GET", "/api/connections")
        node = api.ok("GET", "/api/nodes")[0]["name"]
        values = {
            "node": node, "vhost": "/", "connection": connection["name"],
            "channel": connection["name"] + " (1)", "username": "guest", "exchange": "amq.topic",
            "queue": "rt-q", "destination": "rt-q", "source": "rt-x", "dtype": "q", "props": "k",
            "user": "rt", "name": "rt-p", "component": "operator_policy", "filter": "rabbit_queue",
            "within": "1", "unit": "days", "port": str(warren.port), "protocol": "amqp",
        }  # fmt: skip
        answers = {route: api.get(path_of(route, values)).status for route in GET_ROUTES}
        assert {r: s for r, s in answers.items() if s != 200} == {}
        refused = {r: api.get(path_of(r, values)).status for r in NOT_GET_ROUTES}
        assert set(refused.values()) == {405}, refused
    finally:
        conn.close()


def test_node_diagnostics(warren: RunningBroker) -> None:
    api = http(warren)
    node = api.ok("GET", "/api/nodes")[0]["name"]
    flags = api.ok("GET", "/api/feature-flags")
    assert {"quorum_queue", "stream_queue", "user_limits"} <= {f["name"] for f in flags}
    assert {(f["state"], f["stability"]) for f in flags} == {("enabled", "required")}
    assert api.put("/api/feature-flags/quorum_queue/enable").status == 204
    assert api.put("/api/feature-flags/no_such_flag/enable").status == 400
    memory = api.ok("GET", f"/api/nodes/{node}/memory")["memory"]
    assert memory["strategy"] == "rss" and memory["total"]["rss"] > 0
    relative = api.ok("GET", f"/api/nodes/{node}/memory/relative")["memory"]
    assert relative["total"] == 100 and relative["other_proc"] >= 1
    assert api.ok("GET", f"/api/nodes/{node}/memory/ets") == {"ets_tables_memory": "no_tables"}
    assert api.get("/api/nodes/other@elsewhere/memory").status == 404
    assert api.ok("GET", f"/api/healthchecks/node/{node}") == {"status": "ok"}
    assert api.get("/api/healthchecks/node/other@elsewhere").status == 404
    # rabbit_core_metrics:format_auth_attempt/1 rows, AMQP 0-9-1 logins only
    assert api.ok("GET", f"/api/auth/attempts/{node}") == []
    pika.BlockingConnection(pika.ConnectionParameters(warren.host, warren.port)).close()
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        bad = pika.PlainCredentials("guest", "wrong")
        pika.BlockingConnection(pika.ConnectionParameters(warren.host, warren.port, "/", bad))
    assert api.ok("GET", f"/api/auth/attempts/{node}") == [
        {
            "protocol": "amqp091",
            "auth_attempts": 2,
            "auth_attempts_failed": 1,
            "auth_attempts_succeeded": 1,
        }
    ]
    assert api.delete(f"/api/auth/attempts/{node}").status == 204
    assert api.ok("GET", f"/api/auth/attempts/{node}") == []
    # monitors read, administrators reset
    api.ok("PUT", "/api/users/mgmt", {"password": "pw", "tags": "management"})
    assert api.as_user("mgmt", "pw").get(f"/api/nodes/{node}/memory").status == 401
    assert api.as_user("mgmt", "pw").get(f"/api/auth/attempts/{node}").status == 401
    # /api/auth answers before a login, as 3.x's rabbit_mgmt_wm_auth:is_authorized/2 does
    settings = api.request("GET", "/api/auth", auth=False)
    assert (settings.status, settings.body["enable_uaa"]) == (200, False)
    assert api.delete("/api/reset").status == 204
    assert api.post("/api/rebalance/queues").status == 204
    assert api.post(f"/api/vhosts/%2F/start/{node}").status == 204
    unknown = api.post("/api/vhosts/%2F/start/other@elsewhere")
    assert (unknown.status, unknown.body["reason"]) == (400, "Unknown node: other@elsewhere")


def test_queue_actions_as_rabbitmq_4(warren: RunningBroker) -> None:
    # rabbit_mgmt_wm_queue_actions (4.3): mirroring is gone, every action is unknown
    api = http(warren)
    api.ok("PUT", "/api/queues/%2F/qa", {"durable": True})
    for action in ("sync", "cancel_sync", "foo"):
        refused = api.post("/api/queues/%2F/qa/actions", {"action": action})
        assert (refused.status, refused.body["reason"]) == (400, ["unknown", action])
    missing = api.post("/api/queues/%2F/qa/actions", {})
    assert (missing.status, missing.body["reason"]) == (400, "[{key_missing,action}]")
    gone = api.post("/api/queues/%2F/nothere/actions", {"action": "sync"})
    assert (gone.status, gone.body["reason"]) == (404, "queue_not_found")
    assert api.get("/api/queues/%2F/qa/actions").status == 405


def test_protocol_listener_and_certificate_expiration(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)  # certificates valid for one day
    tls = {
        "ssl_listeners": (Listener("tls", "127.0.0.1", 0),),
        "ssl_cacertfile": str(pki.ca),
        "ssl_certfile": str(pki.server_cert),
        "ssl_keyfile": str(pki.server_key),
    }
    with run_broker(management_port=0, **tls) as warren:
        api = http(warren)
        # rabbit_mgmt_wm_health_check_protocol_listener (4.3): a list, aliases normalised
        ok = api.ok("GET", "/api/health/checks/protocol-listener/amqp091,amqps,http")
        assert ok["status"] == "ok" and {"amqp", "amqp/ssl", "http"} <= set(ok["protocols"])
        failed = api.get("/api/health/checks/protocol-listener/amqp,mqtt")
        assert failed.status == 503
        assert (failed.body["reason"], failed.body["missing"]) == ("No active listener", ["mqtt"])
        base = "/api/health/checks/certificate-expiration"
        assert api.ok("GET", f"{base}/0/days") == {"status": "ok"}
        expiring = api.get(f"{base}/2/days")
        assert (expiring.status, expiring.body["reason"]) == (503, "Certificates expiring")
        (listener,) = expiring.body["expired"]
        assert listener["certfile"] == str(pki.server_cert)
        assert len(listener["certfile_expires_on"]) == 1
        assert listener["certfile_expires_on"][0] > time.strftime(
            "%Y-%m-%dT%H:%M:%SZ", time.gmtime()
        )
        for path, reason in (
            (f"{base}/x/days", "Invalid expiration value."),
            (
                f"{base}/1/fortnights",
                "Time unit not recognised. Supported units: days, weeks, months, years.",
            ),
        ):
            refused = api.get(path)
            assert (refused.status, refused.body["reason"]) == (400, reason)
