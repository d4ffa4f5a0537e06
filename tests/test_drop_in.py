"""Issue 17, "Drop-in, for real": where a client or an operator saw Warren differ from RabbitMQ.

Listeners on IPv6 and IPv4, a publisher that writes until its socket buffer is full
(amqplib), the socket after connection.close-ok, a deleted default vhost, product.name.
"""

from __future__ import annotations

import errno
import socket
import ssl
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from amqp_raw import RawClient, build
from http_api import HttpApi
from node_amqplib import run_script
from pamqp import commands
from tls_certs import make_pki

from warren.broker.server.main import parse_args, settings_from_args
from warren.broker.testkit import RunningBroker, run_broker
from warren.config import Settings, parse_config
from warren.config.parser import ConfigError
from warren.protocol.constants import PROTOCOL_HEADER

NODE_TIMEOUT = 120.0  # seconds for one amqplib script; reaching it is the failure


@pytest.fixture(scope="module")
def running() -> Iterator[RunningBroker]:
    with run_broker() as b:
        yield b


def addr(b: RunningBroker) -> tuple[str, int]:
    return (b.host, b.port)


# ---- listeners on IPv6 and IPv4 ------------------------------------------------------------
# rabbit_networking (4.3): a port-only listener is tcp_listener_addresses_auto ->
# port_to_listeners: "::" (Linux: takes IPv4 too), "::" and "0.0.0.0" where the two are kept
# apart, "0.0.0.0" where gen_tcp:listen(inet6) fails with eafnosupport. An explicit address
# goes to gen_tcp as it is, which leaves IPV6_V6ONLY at the system's default (off).
# (This machine has ::1 on loopback; the no-IPv6 fallback is tested by refusing AF_INET6.)


def _listening(settings: Settings, **changes: Any) -> Any:
    return run_broker(settings, listeners=settings.listeners, **changes)


def _amqp_start(host: str, port: int) -> bool:
    """A connection.start comes back from ``host``:``port``."""
    with RawClient((host, port)) as c:
        return isinstance(c.begin(), commands.Connection.Start)


def _refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_port_only_listener_takes_ipv6_and_ipv4() -> None:
    with _listening(parse_config("listeners.tcp.default = 0"), management_port=0) as b:
        port = b.port
        assert _amqp_start("::1", port) and _amqp_start("127.0.0.1", port)
        with RawClient.connect(("127.0.0.1", port)), RawClient.connect(("::1", port)):
            api = HttpApi(b.server.management_port or 0)
            peers = {c["peer_host"] for c in api.ok("GET", "/api/connections")}
        assert peers == {"127.0.0.1", "::1"}  # as RabbitMQ shows them (rabbit_misc:ntoa)


def test_amqplib_connects_where_localhost_resolves_to_ipv6_first() -> None:
    with _listening(parse_config("listeners.tcp.default = 0")) as b:
        result = run_script("localhost_ipv6_first.js", str(b.port), timeout=NODE_TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["connected to ::1", "got over IPv6"]


# RabbitMQ 4.1+ refuses a tune-ok below ?FRAME_MIN_SIZE = 8192
# (rabbit_reader:validate_negotiated_integer_value/3); 3.10 here accepts 4096, which older
# amqplib releases asked for by default. warren.frame_min_size = 4096 gives 3.x's minimum.
@pytest.mark.parametrize(
    ("config", "frame_max", "seen"),
    [
        ("", "4096", "refused: Socket closed abruptly during opening handshake"),
        ("", "8192", "open 8192 20000"),
        ("warren.frame_min_size = 4096", "4096", "open 4096 20000"),
    ],
)
def test_amqplib_frame_max_below_8192_is_refused_as_on_4_1(
    config: str, frame_max: str, seen: str
) -> None:
    with run_broker(parse_config(config)) as b:
        result = run_script("frame_max.js", str(b.port), frame_max, timeout=NODE_TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [seen]


def test_port_from_the_command_line_takes_ipv6_and_ipv4() -> None:
    with _listening(settings_from_args(parse_args(["--port", "0"]))) as b:
        assert _amqp_start("::1", b.port) and _amqp_start("127.0.0.1", b.port)


def test_bracketed_ipv6_listeners() -> None:
    conf = "listeners.tcp.any = [::]:0\nlisteners.tcp.v6 = [::1]:0\nlisteners.tcp.v4 = 127.0.0.1:0"
    with _listening(parse_config(conf)) as b:
        (_, any_port), (_, v6_port), (_, v4_port) = b.server.addresses
        assert _amqp_start("::1", any_port) and _amqp_start("127.0.0.1", any_port)
        assert _amqp_start("::1", v6_port) and _refused("127.0.0.1", v6_port)
        assert _amqp_start("127.0.0.1", v4_port) and _refused("::1", v4_port)


def test_port_only_tls_listener_takes_ipv6_and_ipv4(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    settings = parse_config(
        "listeners.ssl.default = 0\n"
        f"ssl_options.certfile = {pki.server_cert}\nssl_options.keyfile = {pki.server_key}\n"
    )
    context = ssl.create_default_context(cafile=str(pki.ca))
    with run_broker(settings, ssl_listeners=settings.ssl_listeners) as b:
        assert b.tls_port is not None
        for host in ("::1", "127.0.0.1"):
            raw = socket.create_connection((host, b.tls_port), timeout=10)
            with context.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(PROTOCOL_HEADER)
                assert tls.recv(7)[:3] == b"\x01\x00\x00", host  # connection.start


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return bool(reply.status == 200)


def test_http_listeners_read_their_own_ip_keys() -> None:
    # rabbitmq_management.schema: management.tcp.ip; rabbitmq_prometheus.schema:
    # prometheus.tcp.ip, each its own listener. "::" takes IPv4 too, as with gen_tcp.
    settings = parse_config("management.tcp.ip = ::\nprometheus.tcp.ip = ::1\n")
    ips = {"management_ip": settings.management_ip, "prometheus_ip": settings.prometheus_ip}
    with run_broker(settings, management_port=0, prometheus_port=0, **ips) as b:
        mgmt, metrics = b.server.management_port, b.server.prometheus_port
        assert _http_ok(f"http://[::1]:{mgmt}/") and _http_ok(f"http://127.0.0.1:{mgmt}/")
        assert _http_ok(f"http://[::1]:{metrics}/metrics")
        assert metrics is not None and _refused("127.0.0.1", metrics)


class _NoIPv6Socket(socket.socket):
    """A kernel booted with ipv6.disable=1: AF_INET6 sockets fail with EAFNOSUPPORT."""

    def __init__(self, family: int = -1, *args: Any, **kwargs: Any) -> None:
        if family == socket.AF_INET6:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        super().__init__(family, *args, **kwargs)


def test_port_only_listener_falls_back_to_ipv4_without_ipv6(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = parse_config("listeners.tcp.default = 0")
    with monkeypatch.context() as patch:
        patch.setattr(socket, "socket", _NoIPv6Socket)
        runner = _listening(settings)
        b = runner.__enter__()
    try:
        assert [host for host, _ in b.server.addresses] == ["0.0.0.0"]
        assert _amqp_start("127.0.0.1", b.port)
    finally:
        runner.__exit__(None, None, None)


# ---- a publisher that writes until its socket buffer is full ------------------------------
# amqplib's callback-API tests ("find high watermark", "set high watermark") publish until
# sendToQueue returns false and close. amqplib's frame mux writes connection.close (channel 0)
# before the publishes still queued for channel 1; Warren used to close the socket right
# after close-ok, so those writes hit a closed socket (EPIPE/ECONNRESET) and the test stalled.


def test_amqplib_publisher_that_fills_its_buffer_then_closes(running: RunningBroker) -> None:
    result = run_script("publish_until_full.js", running.url, "3", timeout=NODE_TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "done"


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


def test_lingering_connection_does_not_count_against_max_connections() -> None:
    with run_broker() as b:
        vhost = b.server.broker.vhosts["/"]
        b.call(lambda: vhost.limits.update({"max-connections": 1}))
        with RawClient.connect(addr(b), channel=None) as first:
            _close(first)
            first.opened = False
            with RawClient.connect(addr(b)) as second:  # while first's socket is still open
                assert second.opened
            assert not first.eof


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
