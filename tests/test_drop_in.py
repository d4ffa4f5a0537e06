"""Issue 17, "Drop-in, for real": where a client or an operator saw Warren differ from RabbitMQ.

Listeners on IPv6 and IPv4, a publisher that writes until its socket buffer is full
(amqplib), the socket after connection.close-ok, a deleted default vhost, product.name.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from amqp_raw import RawClient, build
from http_api import HttpApi
from pamqp import commands

from warren.broker.testkit import RunningBroker, run_broker
from warren.config import parse_config
from warren.config.parser import ConfigError


@pytest.fixture(scope="module")
def running() -> Iterator[RunningBroker]:
    with run_broker() as b:
        yield b


def addr(b: RunningBroker) -> tuple[str, int]:
    return (b.host, b.port)


# ---- after connection.close-ok ----------------------------------------------------------
# rabbit_reader (4.3): handle_method0(connection.close) -> maybe_close -> close_connection
# sends close-ok and waits for the client to close the socket, arming terminate_connection
# after min(heartbeat, ?CLOSING_TIMEOUT = 30) s; in the closed state only channel-0 methods
# are read: close is answered with close-ok again, close-ok ends the connection.


def _close(c: RawClient) -> None:
    c.send_method(0, commands.Connection.Close(reply_code=200, reply_text="bye"))
    c.expect_method(commands.Connection.CloseOk, 0)


def test_socket_stays_open_after_close_ok_until_the_client_closes(running: RunningBroker) -> None:
    with RawClient.connect(addr(running), channel=1) as c:
        _close(c)
        c.opened = False
        c.assert_silent(0.5)
        assert not c.eof, "the broker closed the socket after close-ok"
        # a second close (two threads closing one connection) is answered, not reset
        _close(c)
        assert not c.eof


def test_nothing_is_processed_after_close_ok(running: RunningBroker, name: str) -> None:
    with RawClient.connect(addr(running), channel=1) as c:
        _close(c)
        c.opened = False
        c.send_method(2, commands.Channel.Open())
        c.send_method(1, build(commands.Queue.Declare, queue=name))
        c.assert_silent(0.3)
        assert not c.eof
    with RawClient.connect(addr(running), channel=1) as other:
        other.send_method(1, build(commands.Queue.Declare, queue=name, passive=True))
        assert other.expect_channel_close(1)[0] == 404


def test_lingering_socket_is_closed_after_the_heartbeat_bound(running: RunningBroker) -> None:
    with RawClient.connect(addr(running), channel=1, heartbeat=1) as c:
        _close(c)
        c.opened = False
        # the bound is the 1 s heartbeat here (30 s without heartbeats); 10 s is the failure
        c.expect_eof(timeout=10)


# ---- a deleted default vhost stays deleted ------------------------------------------------


def _vhost_names(api: HttpApi) -> set[str]:
    return {v["name"] for v in api.ok("GET", "/api/vhosts")}


def test_deleted_default_vhost_is_not_brought_back_by_connections(tmp_path: Path) -> None:
    with run_broker(management_port=0, data_dir=str(tmp_path)) as b:
        api = HttpApi(b.server.management_port or 0)
        api.ok("PUT", "/api/vhosts/other", {})
        assert api.request("DELETE", "/api/vhosts/%2F").status == 204
        with socket.create_connection(addr(b)):  # a bare TCP connection
            pass
        with RawClient(addr(b)) as c:  # a refused login
            c.begin()
            c.send_start_ok(password="wrong")
            c.read_until_eof(timeout=10)
        with RawClient(addr(b)) as c:  # a connection that asks for the deleted vhost
            c.handshake(open_vhost=False)
            c.send_method(0, build(commands.Connection.Open, virtual_host="/"))
            assert c.expect_close()[0] == 530
        assert _vhost_names(api) == {"other"}
        b.restart()
        assert _vhost_names(HttpApi(b.server.management_port or 0)) == {"other"}


def test_store_with_every_vhost_deleted_stays_without_one(tmp_path: Path) -> None:
    with run_broker(management_port=0, data_dir=str(tmp_path)) as b:
        api = HttpApi(b.server.management_port or 0)
        assert api.request("DELETE", "/api/vhosts/%2F").status == 204
        b.restart()
        api = HttpApi(b.server.management_port or 0)
        assert _vhost_names(api) == set()
        assert api.ok("GET", "/api/whoami")["name"] == "guest"  # the users stay


# ---- product.name and product.version ------------------------------------------------------


def test_product_defaults_to_warren(running: RunningBroker) -> None:
    with RawClient(addr(running)) as c:
        props = c.begin().server_properties
    assert props["product"] == "Warren"


def test_product_name_and_version_reach_clients_and_the_api() -> None:
    # RabbitMQ 4.3: rabbit_mgmt_wm_overview reports rabbit:product_name()/product_version(),
    # which product.name/product.version set (rabbit.schema); rabbitmq_version stays the base
    settings = parse_config("product.name = RabbitMQ\nproduct.version = 4.3.0\n")
    with run_broker(settings, management_port=0) as b:
        with RawClient(addr(b)) as c:
            props = c.begin().server_properties
        assert (props["product"], props["version"]) == ("RabbitMQ", "4.3.0")
        api = HttpApi(b.server.management_port or 0)
        overview = api.ok("GET", "/api/overview")
        assert (overview["product_name"], overview["product_version"]) == ("RabbitMQ", "4.3.0")
        exported = api.ok("GET", "/api/definitions")
        assert (exported["product_name"], exported["product_version"]) == ("RabbitMQ", "4.3.0")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("product.name = ''", "product.name =: expected a non-empty string"),
        ("product.nmae = RabbitMQ", "did you mean 'product.name'?"),
    ],
)
def test_product_keys_are_validated(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert message in str(info.value)
