"""Who may do what: AMQP permission refusals per operation, and the API's rules per user tag.

The expected codes and texts are what RabbitMQ 3.10 answers for the same user
(configure ^c, write ^w, read ^r) and the same operations. Users and
permissions are set up through the management API.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.http_api import HttpApi, q
from warren.broker.ops.management import auth
from warren.broker.ops.management.core import Management
from warren.broker.ops.management.errors import ApiError
from warren.broker.testkit import RunningBroker, run_broker

PERMS = {"configure": "^c", "write": "^w", "read": "^r"}
FULL = {"configure": ".*", "write": ".*", "read": ".*"}


@pytest.fixture(scope="module")
def warren() -> Iterator[RunningBroker]:
    with run_broker(management_port=0) as running:
        port = running.server.management_port
        assert port
        api = HttpApi(port)
        users = {
            "bob": ("", PERMS),
            "mgmt": ("management", PERMS),
            "mon": ("monitoring", None),
            "pol": ("policymaker", FULL),
            "notags": ("", FULL),
        }
        for user, (tags, perms) in users.items():
            api.ok("PUT", f"/api/users/{user}", {"password": "pw", "tags": tags})
            if perms is not None:
                api.ok("PUT", f"/api/permissions/%2F/{user}", perms)
        api.ok("PUT", "/api/vhosts/other")
        # its creator gets full permissions there (as in RabbitMQ); these tests want none
        api.ok("DELETE", "/api/permissions/other/guest")
        for queue in ("cq", "wq", "rq", "zq"):  # zq: bob has no permission on it
            api.ok("PUT", f"/api/queues/%2F/{queue}", {"durable": True})
        for exchange in ("cx", "wx", "rx"):
            api.ok("PUT", f"/api/exchanges/%2F/{exchange}", {"type": "direct"})
        api.ok("POST", "/api/bindings/%2F/e/amq.direct/q/cq", {"routing_key": "k"})
        yield running


@pytest.fixture(scope="module")
def api(warren: RunningBroker) -> HttpApi:
    port = warren.server.management_port
    assert port
    return HttpApi(port)


def amqp_url(warren: RunningBroker, user: str, vhost: str = "") -> str:
    return f"amqp://{user}:pw@{warren.host}:{warren.port}/{q(vhost) if vhost else ''}"


def attempt(warren: RunningBroker, fn: Callable[[BlockingChannel], Any]) -> tuple[int, str] | str:
    """Run one operation as bob on a fresh channel: ``"ok"`` or the channel.close it caused."""
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url(warren, "bob")))
    ch = conn.channel()
    try:
        fn(ch)
        ch.basic_qos(prefetch_count=1)  # a round trip: an asynchronous refusal has arrived
        return "ok"
    except pika.exceptions.ChannelClosedByBroker as exc:
        return (exc.reply_code, exc.reply_text)
    except pika.exceptions.ChannelWrongStateError:
        reason: Any = ch._impl._closing_reason  # closed by the broker while we were not waiting
        return (reason.reply_code, reason.reply_text)
    finally:
        if conn.is_open:
            conn.close()


def refused(kind: str, name: str) -> tuple[int, str]:
    return (403, f"ACCESS_REFUSED - access to {kind} '{name}' in vhost '/' refused for user 'bob'")


AMQP_CASES: list[Any] = [
    ("exchange.declare", lambda ch: ch.exchange_declare("x1", "direct"), refused("exchange", "x1")),
    ("exchange.declare allowed", lambda ch: ch.exchange_declare("cx", "direct"), "ok"),
    (
        "exchange.declare passive needs none",
        lambda ch: ch.exchange_declare("rx", "direct", passive=True),
        "ok",
    ),
    ("exchange.delete", lambda ch: ch.exchange_delete("rx"), refused("exchange", "rx")),
    ("queue.declare", lambda ch: ch.queue_declare("q1", durable=True), refused("queue", "q1")),
    ("queue.declare allowed", lambda ch: ch.queue_declare("cq", durable=True), "ok"),
    ("queue.declare passive needs none", lambda ch: ch.queue_declare("rq", passive=True), "ok"),
    # RabbitMQ 4.3, rabbit_channel.erl handle_method queue.declare passive=true:
    # check_any_resource_access_permitted/3 wants read, write or configure (configure last,
    # so that a refusal reads as a declare's)
    pytest.param(
        "queue.declare passive with write only",
        lambda ch: ch.queue_declare("wq", passive=True),
        "ok",
        id="passive-write-only",
    ),
    pytest.param(
        "queue.declare passive without any permission",
        lambda ch: ch.queue_declare("zq", passive=True),
        refused("queue", "zq"),
        id="passive-no-permission",
    ),
    # rabbit_channel.erl handle_method queue.declare: check_name/2 before
    # check_configure_permitted/3, so the reserved prefix is named, not the permission
    pytest.param(
        "queue.declare amq.gen-foo without configure permission",
        lambda ch: ch.queue_declare("amq.gen-foo"),
        (403, "ACCESS_REFUSED - queue name 'amq.gen-foo' contains reserved prefix 'amq.*'"),
        id="reserved-prefix-before-permission",
    ),
    (
        "queue.bind needs write on queue",
        lambda ch: ch.queue_bind("cq", "amq.direct", "k"),
        refused("queue", "cq"),
    ),
    (
        "queue.bind needs read on exchange",
        lambda ch: ch.queue_bind("wq", "amq.direct", "k"),
        refused("exchange", "amq.direct"),
    ),
    ("queue.bind allowed", lambda ch: ch.queue_bind("wq", "rx", "k"), "ok"),
    ("queue.unbind", lambda ch: ch.queue_unbind("cq", "amq.direct", "k"), refused("queue", "cq")),
    (
        "exchange.bind needs write on destination",
        lambda ch: ch.exchange_bind("cx", "amq.direct", "k"),
        refused("exchange", "cx"),
    ),
    (
        "exchange.bind needs read on source",
        lambda ch: ch.exchange_bind("wx", "amq.direct", "k"),
        refused("exchange", "amq.direct"),
    ),
    (
        "basic.publish",
        lambda ch: ch.basic_publish("amq.direct", "k", b"x"),
        refused("exchange", "amq.direct"),
    ),
    (
        "basic.publish default exchange",
        lambda ch: ch.basic_publish("", "k", b"x"),
        refused("exchange", "amq.default"),
    ),
    ("basic.publish allowed", lambda ch: ch.basic_publish("wx", "k", b"x"), "ok"),
    ("basic.get", lambda ch: ch.basic_get("cq"), refused("queue", "cq")),
    ("basic.get allowed", lambda ch: ch.basic_get("rq"), "ok"),
    ("basic.consume", lambda ch: ch.basic_consume("cq", lambda *a: None), refused("queue", "cq")),
    ("queue.purge", lambda ch: ch.queue_purge("cq"), refused("queue", "cq")),
    ("queue.delete", lambda ch: ch.queue_delete("rq"), refused("queue", "rq")),
    pytest.param(
        "exchange.delete of amq.*: system exchange first",
        lambda ch: ch.exchange_delete("amq.direct"),
        (403, "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed"),
        id="system-exchange-first",
    ),
    pytest.param(
        "exchange.declare with alternate-exchange needs read on it",
        lambda ch: ch.exchange_declare("cxae", "direct", arguments={"alternate-exchange": "zz"}),
        refused("exchange", "cxae"),
        id="alternate-exchange-read",
    ),
    pytest.param(
        "queue.declare with dead-letter exchange needs read on it",
        lambda ch: ch.queue_declare(
            "cqdlx", arguments={"x-dead-letter-exchange": "zz"}, durable=True
        ),
        refused("queue", "cqdlx"),
        id="dead-letter-exchange-read",
    ),
    pytest.param(
        "queue.bind to the default exchange: queue write checked first",
        lambda ch: ch.queue_bind("cq", "", "k"),
        refused("queue", "cq"),
        id="bind-write-before-default-check",
    ),
]


@pytest.mark.parametrize(
    ("label", "operation", "expected"),
    [c if hasattr(c, "marks") else pytest.param(*c, id=c[0]) for c in AMQP_CASES],
)
def test_amqp_operation_permissions(
    warren: RunningBroker, label: str, operation: Callable[[BlockingChannel], Any], expected: Any
) -> None:
    assert attempt(warren, operation) == expected


def test_server_named_queue_needs_configure_on_its_name(warren: RunningBroker) -> None:
    result = attempt(warren, lambda ch: ch.queue_declare("", durable=True))
    assert isinstance(result, tuple)
    assert re.fullmatch(
        r"ACCESS_REFUSED - access to queue 'amq\.gen-[\w-]+' in vhost '/' refused for user 'bob'",
        result[1],
    )


def test_vhost_without_permissions_is_not_allowed(warren: RunningBroker) -> None:
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as denied:
        pika.BlockingConnection(pika.URLParameters(amqp_url(warren, "bob", "other")))
    assert "530" in str(denied.value)
    assert "NOT_ALLOWED - access to vhost 'other' refused for user 'bob'" in str(denied.value)


def test_permissions_changed_over_http_apply_to_open_channels(
    warren: RunningBroker, api: HttpApi
) -> None:
    api.ok("PUT", "/api/users/carol", {"password": "pw", "tags": ""})
    api.ok("PUT", "/api/permissions/%2F/carol", FULL)
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url(warren, "carol")))
    try:
        ch = conn.channel()
        ch.queue_declare("carol-q", durable=True)
        api.ok("PUT", "/api/permissions/%2F/carol", {**FULL, "configure": "^$"})
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            ch.queue_declare("carol-q2", durable=True)
        assert closed.value.reply_code == 403
    finally:
        conn.close()


# ---- the HTTP API per tag ----

TAG_CASES: list[tuple[str, str, str, int, str | None]] = [
    # user, method, path, status, reason
    ("notags", "GET", "/api/overview", 401, "Not management user"),
    ("bob", "GET", "/api/whoami", 401, "Not management user"),
    ("mgmt", "GET", "/api/overview", 200, None),
    ("mgmt", "GET", "/api/users", 401, "Not administrator user"),
    ("mgmt", "GET", "/api/permissions", 401, "Not administrator user"),
    ("mgmt", "GET", "/api/definitions", 401, "Not administrator user"),
    ("mgmt", "GET", "/api/vhosts/%2F", 401, "Not administrator user"),
    ("mgmt", "PUT", "/api/vhosts/mgmt-vhost", 401, "Not administrator user"),
    ("mgmt", "GET", "/api/exchanges/%2F", 200, None),
    ("mgmt", "GET", "/api/exchanges/other", 401, "User not authorised to access virtual host"),
    ("mgmt", "GET", "/api/policies/%2F", 200, None),
    ("mgmt", "PUT", "/api/policies/%2F/p", 401, "User not authorised to access object"),
    ("mgmt", "PUT", "/api/queues/%2F/x1", 401, "Access refused."),
    ("mgmt", "DELETE", "/api/queues/%2F/rq", 401, "Access refused."),
    ("mon", "GET", "/api/overview", 200, None),
    ("mon", "GET", "/api/users", 401, "Not administrator user"),
    ("mon", "GET", "/api/exchanges/%2F", 401, "User not authorised to access virtual host"),
    ("mon", "GET", "/api/vhosts/other/connections", 200, None),
    ("pol", "GET", "/api/users", 401, "Not administrator user"),
    ("pol", "PUT", "/api/policies/other/p", 401, "User not authorised to access object"),
    ("guest", "GET", "/api/exchanges/other", 200, None),
]


@pytest.mark.parametrize(("user", "method", "path", "status", "reason"), TAG_CASES)
def test_api_rules_per_tag(
    api: HttpApi, user: str, method: str, path: str, status: int, reason: str | None
) -> None:
    caller = api if user == "guest" else api.as_user(user, "pw")
    body = {"pattern": "x", "definition": {"message-ttl": 1}} if "policies" in path else None
    reply = caller.request(
        method, path, body if body is not None else ({} if method == "PUT" else None)
    )
    assert reply.status == status, reply.body
    if reason is not None:
        assert reply.body == {"error": "not_authorised", "reason": reason}


def test_vhost_lists_follow_visibility(api: HttpApi) -> None:
    assert [v["name"] for v in api.as_user("mgmt", "pw").ok("GET", "/api/vhosts")] == ["/"]
    assert {v["name"] for v in api.as_user("mon", "pw").ok("GET", "/api/vhosts")} >= {"/", "other"}
    # monitoring sees every vhost, but lists objects only where it may log in (RabbitMQ 3.10)
    assert api.as_user("mon", "pw").ok("GET", "/api/queues") == []
    assert {x["name"] for x in api.as_user("mgmt", "pw").ok("GET", "/api/queues")} >= {"cq", "rq"}


def test_policymaker_sets_policies_where_it_may_log_in(api: HttpApi) -> None:
    pol = api.as_user("pol", "pw")
    body = {"pattern": "^pol", "definition": {"max-length": 5}}
    assert pol.put("/api/policies/%2F/pol-p", body).status == 201
    assert pol.ok("GET", "/api/policies/%2F/pol-p")["definition"] == {"max-length": 5}
    assert pol.delete("/api/policies/%2F/pol-p").status == 204


def test_operations_run_with_the_users_permissions(api: HttpApi) -> None:
    mgmt = api.as_user("mgmt", "pw")
    assert mgmt.put("/api/queues/%2F/cq-mine", {"durable": True}).status == 201
    reply = mgmt.post(
        "/api/exchanges/%2F/amq.direct/publish",
        {"routing_key": "k", "properties": {}, "payload": "x", "payload_encoding": "string"},
    )
    assert (reply.status, reply.body["reason"]) == (
        400,
        "403 ACCESS_REFUSED - access to exchange 'amq.direct' in vhost '/' refused for user 'mgmt'",
    )
    get = {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}
    assert mgmt.post("/api/queues/%2F/rq/get", get).status == 200
    reply = mgmt.post("/api/queues/%2F/cq/get", get)
    assert (reply.status, reply.body["reason"]) == (
        401,
        "ACCESS_REFUSED - access to queue 'cq' in vhost '/' refused for user 'mgmt'",
    )
    # RabbitMQ 4.3 (rabbit_mgmt_wm_aliveness_test:to_json/2) only opens a channel on the
    # vhost: a user with access passes, whatever its queue permissions
    assert mgmt.get("/api/aliveness-test/%2F").body == {"status": "ok"}
    # an administrator without permissions in a vhost is refused there too
    assert api.put("/api/queues/other/q", {"durable": True}).body["reason"] == "Access refused."


def test_connections_are_visible_to_their_owner_and_monitors(
    warren: RunningBroker, api: HttpApi
) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(warren.url))
    own = pika.BlockingConnection(pika.URLParameters(amqp_url(warren, "mgmt")))
    conn.channel()
    own.channel()
    try:
        guest_names = [c["name"] for c in api.ok("GET", "/api/connections") if c["user"] == "guest"]
        (name,) = guest_names
        mgmt, mon = api.as_user("mgmt", "pw"), api.as_user("mon", "pw")
        assert [c["user"] for c in mgmt.ok("GET", "/api/connections")] == ["mgmt"]
        assert {c["user"] for c in mon.ok("GET", "/api/connections")} == {"guest", "mgmt"}
        assert mgmt.get(f"/api/connections/{q(name)}").body == {
            "error": "not_authorised",
            "reason": "User not authorised to access object",
        }
        assert mon.get(f"/api/connections/{q(name)}").status == 200
        assert mon.delete(f"/api/connections/{q(name)}").status == 401
        assert {c["user"] for c in mon.ok("GET", "/api/channels")} == {"guest", "mgmt"}
        (mine,) = mgmt.ok("GET", "/api/connections")
        assert mgmt.delete(f"/api/connections/{q(mine['name'])}").status == 204
        assert api.delete(f"/api/connections/{q(name)}").status == 204
    finally:
        for c in (conn, own):
            with contextlib.suppress(pika.exceptions.AMQPError):
                c.close()


def test_loopback_users_only_from_loopback(warren: RunningBroker) -> None:
    """guest over HTTP from elsewhere than loopback, checked without leaving the machine."""
    mgmt: Management = warren.server.management
    header = "Basic Z3Vlc3Q6Z3Vlc3Q="  # guest:guest
    assert warren.call(auth.authenticate, mgmt, header, "127.0.0.1").name == "guest"
    with pytest.raises(ApiError) as refused_here:
        warren.call(auth.authenticate, mgmt, header, "192.0.2.10")
    assert (refused_here.value.status, refused_here.value.reason) == (
        401,
        "User can only log in via localhost",
    )
    assert auth.is_loopback("::1") and auth.is_loopback("::ffff:127.0.0.1")
