"""Topic permissions over HTTP, enforced over AMQP, kept across a restart and in definitions.

RabbitMQ 4.3 (v4.3.5): deps/rabbitmq_management/src/rabbit_mgmt_wm_topic_permission[s].erl,
rabbit_mgmt_wm_topic_permissions_user.erl, rabbit_mgmt_wm_topic_permissions_vhost.erl (routes,
shapes, codes); deps/rabbit/src/rabbit_auth_backend_internal.erl set_topic_permissions/6
(refusals, in its order) and check_topic_access/4 (no permission: allowed; "" is ^$;
expand_topic_permission/2 for {username} and {vhost}); deps/rabbit/src/rabbit_channel.erl
check_write_permitted_on_topics/4 (publish: routing key, CC, BCC), binding_action_with_checks/10
(read on bind and unbind) and check_topic_authorisation/5 (topic exchanges only);
deps/rabbit/src/rabbit_access_control.erl check_topic_access/4 (the refusal text). Shapes were
also compared with RabbitMQ 3.10.8 side by side.
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
    api.ok("PUT", "/api/users/tp", {"password": "pw", "tags": ""})
    api.ok("PUT", "/api/permissions/%2F/tp", {"configure": ".*", "write": ".*", "read": ".*"})
    return api


def connect(warren: RunningBroker, user: str = "tp") -> pika.BlockingConnection:
    credentials = pika.PlainCredentials(user, "pw" if user != "guest" else "guest")
    return pika.BlockingConnection(
        pika.ConnectionParameters(warren.host, warren.port, "/", credentials)
    )


def test_topic_permission_routes_and_refusals(api: HttpApi) -> None:
    body = {"exchange": "amq.topic", "write": "^a", "read": ""}
    assert api.put("/api/topic-permissions/%2F/tp", body).status == 201
    body["write"] = "^b"
    assert api.put("/api/topic-permissions/%2F/tp", body).status == 204  # replaced
    row = {"user": "tp", "vhost": "/", "exchange": "amq.topic", "write": "^b", "read": ""}
    assert api.ok("GET", "/api/topic-permissions/%2F/tp") == [row]
    assert api.ok("GET", "/api/users/tp/topic-permissions") == [row]
    assert api.ok("GET", "/api/topic-permissions") == [row]
    by_vhost = api.ok("GET", "/api/vhosts/%2F/topic-permissions")
    assert by_vhost == [row] and list(by_vhost[0])[:2] == ["vhost", "user"]
    # refusals, each changing nothing
    refusals = [
        ("/api/topic-permissions/%2F/tp", {"write": "a", "read": ""}, "[{key_missing,exchange}]"),
        ("/api/topic-permissions/%2F/nobody", body, "vhost_or_user_not_found"),
        ("/api/topic-permissions/nowhere/tp", body, "vhost_or_user_not_found"),
        (
            "/api/topic-permissions/%2F/tp",
            {"exchange": "nonex", "write": "a", "read": ""},
            ["no_such_exchange", "nonex"],
        ),
    ]
    for path, refused_body, reason in refusals:
        refused = api.put(path, refused_body)
        assert (refused.status, refused.body["reason"]) == (400, reason), path
    bad_regex = api.put("/api/topic-permissions/%2F/tp", {**body, "write": "("})
    assert bad_regex.status == 400 and bad_regex.body["reason"][:2] == ["invalid_regexp", "("]
    assert api.ok("GET", "/api/topic-permissions") == [row]
    for path in (
        "/api/topic-permissions/%2F/guest",  # a pair without any: 404
        "/api/users/nobody/topic-permissions",
        "/api/vhosts/nowhere/topic-permissions",
    ):
        assert api.get(path).status == 404, path
    # administrators only (rabbit_mgmt_util:is_authorized_admin/2)
    api.ok("PUT", "/api/users/mon", {"password": "pw", "tags": "monitoring"})
    monitor = api.as_user("mon", "pw")
    assert monitor.get("/api/topic-permissions").status == 401
    assert monitor.put("/api/topic-permissions/%2F/tp", body).status == 401
    assert api.delete("/api/topic-permissions/%2F/tp").status == 204
    assert api.delete("/api/topic-permissions/%2F/tp").status == 404
    assert api.ok("GET", "/api/topic-permissions") == []


def test_publish_and_bind_checked_on_topic_exchanges(warren: RunningBroker, api: HttpApi) -> None:
    conn = connect(warren)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("amq.topic", "x.a", b"before any topic permission")
        ch.exchange_declare("dx", "direct")
        perm = {"exchange": "amq.topic", "write": "^{username}\\.", "read": "^{vhost}r$"}
        api.ok("PUT", "/api/topic-permissions/%2F/tp", perm)
        api.ok(
            "PUT", "/api/topic-permissions/%2F/tp", {"exchange": "dx", "write": "^$", "read": ""}
        )
        # the open channel sees the new permission; {username} expanded
        ch.basic_publish("amq.topic", "tp.a", b"allowed")
        ch.basic_publish("dx", "any", b"not a topic exchange: not checked")
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, "amq.topic", "/r")  # {vhost} expanded
        ch.queue_bind(q, "dx", "anything")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.basic_publish("amq.topic", "x.a", b"refused")
        assert (refused.value.reply_code, refused.value.reply_text) == (
            403,
            "ACCESS_REFUSED - write access to topic 'x.a' in exchange 'amq.topic' in vhost '/' "
            "refused for user 'tp'",
        )
        ch = conn.channel()
        ch.confirm_delivery()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as by_cc:
            cc = pika.BasicProperties(headers={"CC": ["tp.b", "y.b"]})
            ch.basic_publish("amq.topic", "tp.a", b"a CC key refused", cc)
        assert "write access to topic 'y.b'" in by_cc.value.reply_text
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as bind:
            ch.queue_bind(q, "amq.topic", "other")
        assert (bind.value.reply_code, bind.value.reply_text) == (
            403,
            "ACCESS_REFUSED - read access to topic 'other' in exchange 'amq.topic' in vhost '/' "
            "refused for user 'tp'",
        )
        ch = conn.channel()
        ch.exchange_declare("dest", "fanout")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ebind:
            ch.exchange_bind("dest", "amq.topic", "other")
        assert "read access to topic 'other'" in ebind.value.reply_text
        # another user has no topic permission: nothing is checked for it
        guest = connect(warren, "guest")
        try:
            other = guest.channel()
            other.confirm_delivery()
            other.basic_publish("amq.topic", "x.a", b"guest is not restricted")
        finally:
            guest.close()
        assert api.delete("/api/topic-permissions/%2F/tp").status == 204
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("amq.topic", "x.a", b"allowed again")
    finally:
        conn.close()


def test_client_id_is_not_expanded_on_amqp_0_9_1(warren: RunningBroker, api: HttpApi) -> None:
    # rabbit_channel_sup:start_link/1 gives a network channel no variable map: only {username}
    # and {vhost} are replaced, and "{client_id}" is matched as the literal text it is
    perm = {"exchange": "amq.topic", "write": "^{client_id}$", "read": ".*"}
    api.ok("PUT", "/api/topic-permissions/%2F/tp", perm)
    conn = connect(warren)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("amq.topic", "{client_id}", b"the literal key")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker):
            ch.basic_publish("amq.topic", "tp", b"not a client id")
    finally:
        conn.close()


def test_topic_permissions_durable_and_in_definitions(tmp_path: Path) -> None:
    with run_broker(management_port=0, data_dir=str(tmp_path)) as warren:
        api = http(warren)
        api.ok("PUT", "/api/users/tp", {"password": "pw", "tags": ""})
        perm = {"exchange": "amq.topic", "write": "^w", "read": "^r"}
        api.ok("PUT", "/api/topic-permissions/%2F/tp", perm)
        warren.restart()
        api = http(warren)
        row = {"user": "tp", "vhost": "/", "exchange": "amq.topic", "write": "^w", "read": "^r"}
        assert api.ok("GET", "/api/topic-permissions") == [row]
        exported = api.ok("GET", "/api/definitions")
        assert exported["topic_permissions"] == [row]
        # a deleted user's topic permissions go with it, also on disk
        api.ok("DELETE", "/api/users/tp")
        warren.restart()
        assert http(warren).ok("GET", "/api/topic-permissions") == []
    with run_broker(management_port=0) as fresh:
        api = http(fresh)
        assert api.request("POST", "/api/definitions", exported).status == 204
        assert api.ok("GET", "/api/topic-permissions") == [row]
        # an entry naming a missing exchange is refused with RabbitMQ 4.3's reason
        refused = api.request(
            "POST", "/api/definitions", {"topic_permissions": [{**row, "exchange": "nonex"}]}
        )
        assert (refused.status, refused.body["reason"]) == (400, ["no_such_exchange", "nonex"])
