"""AMQPS: listeners.ssl.* and ssl_options.*, with pika and aio-pika over TLS.

Certificates are made for the test run (``tls_certs``): a CA, a server
certificate for localhost/127.0.0.1, a client certificate, and a client
certificate from a CA the broker does not trust.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pika
import pika.exceptions
import pytest
from tls_certs import Pki, make_pki

from warren.broker.testkit import RunningBroker, run_broker
from warren.config import ConfigError, Listener, Settings, load_settings, parse_config

TLS_LISTENER = (Listener("tls", "127.0.0.1", 0),)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def tls_settings(pki: Pki, verify: str = "verify_none", fail: bool = False) -> dict[str, object]:
    return {
        "ssl_listeners": TLS_LISTENER,
        "ssl_cacertfile": str(pki.ca),
        "ssl_certfile": str(pki.server_cert),
        "ssl_keyfile": str(pki.server_key),
        "ssl_verify": verify,
        "ssl_fail_if_no_peer_cert": fail,
    }


def client_context(pki: Pki, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    return context


def pika_params(broker: RunningBroker, context: ssl.SSLContext) -> pika.ConnectionParameters:
    assert broker.tls_port is not None
    return pika.ConnectionParameters(
        host="localhost",
        port=broker.tls_port,
        credentials=pika.PlainCredentials(broker.user, broker.password),
        ssl_options=pika.SSLOptions(context, "localhost"),
        connection_attempts=1,
        socket_timeout=5,
    )


def pika_round_trip(broker: RunningBroker, context: ssl.SSLContext, body: bytes) -> bytes:
    conn = pika.BlockingConnection(pika_params(broker, context))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        queue = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", queue, body)
        _method, _props, got = ch.basic_get(queue, auto_ack=True)
        assert isinstance(got, bytes)
        return got
    finally:
        if conn.is_open:
            conn.close()


# ---- configuration ---------------------------------------------------------------------


def test_tls_keys_are_read(tmp_path: Path) -> None:
    settings = parse_config(
        "listeners.ssl.default = 5671\n"
        "listeners.ssl.local = 127.0.0.1:5681\n"
        "ssl_options.cacertfile = /etc/warren/ca.pem\n"
        "ssl_options.certfile = /etc/warren/server.pem\n"
        "ssl_options.keyfile = /etc/warren/server.key\n"
        "ssl_options.verify = verify_peer\n"
        "ssl_options.fail_if_no_peer_cert = true\n"
        "ssl_options.versions.1 = tlsv1.3\n"  # a RabbitMQ key Warren still ignores
    )
    assert settings.ssl_listeners == (
        Listener("default", "", 5671),
        Listener("local", "127.0.0.1", 5681),
    )
    assert settings.listeners == Settings().listeners  # the TCP listener stays
    assert (settings.ssl_cacertfile, settings.ssl_certfile, settings.ssl_keyfile) == (
        "/etc/warren/ca.pem",
        "/etc/warren/server.pem",
        "/etc/warren/server.key",
    )
    assert settings.ssl_verify == "verify_peer" and settings.ssl_fail_if_no_peer_cert
    assert settings.ignored_keys == ("ssl_options.versions.1",)
    assert parse_config("listeners.ssl = none").ssl_listeners == ()
    assert Settings().ssl_listeners == ()  # no TLS unless asked for


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("listeners.ssl.default = 5671\n", "a TLS listener needs ssl_options.certfile"),
        (
            "listeners.ssl.default = 5671\nssl_options.certfile = c.pem\n",
            "a TLS listener needs ssl_options.keyfile",
        ),
        ("ssl_options.verify = verify_peer\n", "verify_peer needs ssl_options.cacertfile"),
        ("ssl_options.verify = verify_all\n", "expected one of: verify_none, verify_peer"),
        ("ssl_options.fail_if_no_peer_cert = true\n", "needs ssl_options.verify = verify_peer"),
        ("ssl_options.fail_if_no_peer_crt = true\n", "unknown key"),
        ("listeners.ssl.default = 5672\n", "a TLS listener needs"),
        (
            "listeners.tcp.default = 5672\nlisteners.ssl.default = 5672\n"
            "ssl_options.certfile = c\nssl_options.keyfile = k\n",
            "already listens on it",
        ),
    ],
)
def test_bad_tls_configuration_stops_the_broker(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(text, "rabbitmq.conf")


# ---- the listener ------------------------------------------------------------------------


def test_pika_and_aio_pika_over_tls_next_to_plain_tcp(pki: Pki) -> None:
    with run_broker(**tls_settings(pki)) as broker:
        assert broker.tls_port and broker.tls_port != broker.port
        assert pika_round_trip(broker, client_context(pki), b"over tls") == b"over tls"

        async def aio() -> bytes:
            assert broker.amqps_url is not None
            conn = await aio_pika.connect(broker.amqps_url, ssl_context=client_context(pki))
            async with conn:
                ch = await conn.channel(publisher_confirms=True)
                queue = await ch.declare_queue(exclusive=True)
                await ch.default_exchange.publish(aio_pika.Message(b"aio over tls"), queue.name)
                message = await queue.get(timeout=5)
                await message.ack()
                return message.body

        assert asyncio.run(aio()) == b"aio over tls"
        # the plain listener works as before, on its own port
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        assert conn.is_open
        conn.close()


def test_a_rabbitmq_conf_with_tls_starts_a_tls_listener(pki: Pki, tmp_path: Path) -> None:
    conf = tmp_path / "rabbitmq.conf"
    conf.write_text(
        "listeners.tcp.default = 127.0.0.1:0\n"
        "listeners.ssl.default = 127.0.0.1:0\n"
        f"ssl_options.cacertfile = {pki.ca}\n"
        f"ssl_options.certfile = {pki.server_cert}\n"
        f"ssl_options.keyfile = {pki.server_key}\n"
        "ssl_options.verify = verify_peer\n"
        "ssl_options.fail_if_no_peer_cert = true\n"
    )
    settings = load_settings(conf, environ={})
    with run_broker(settings, listeners=settings.listeners) as broker:
        cert = (pki.client_cert, pki.client_key)
        assert pika_round_trip(broker, client_context(pki, cert), b"conf") == b"conf"


@pytest.fixture(scope="module")
def mutual_tls(pki: Pki) -> Iterator[RunningBroker]:
    with run_broker(**tls_settings(pki, "verify_peer", fail=True)) as broker:
        yield broker


def test_client_certificate_accepted(pki: Pki, mutual_tls: RunningBroker) -> None:
    context = client_context(pki, (pki.client_cert, pki.client_key))
    assert pika_round_trip(mutual_tls, context, b"mutual") == b"mutual"

    async def aio() -> None:
        assert mutual_tls.amqps_url is not None
        conn = await aio_pika.connect(mutual_tls.amqps_url, ssl_context=context)
        async with conn:
            ch = await conn.channel()
            await ch.declare_queue(exclusive=True)

    asyncio.run(aio())


@pytest.mark.parametrize("which", ["none", "rogue"])
def test_client_without_a_trusted_certificate_is_refused(
    pki: Pki, mutual_tls: RunningBroker, which: str
) -> None:
    cert = None if which == "none" else (pki.rogue_cert, pki.rogue_key)
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika_params(mutual_tls, client_context(pki, cert)))

    async def aio() -> None:
        assert mutual_tls.amqps_url is not None
        await aio_pika.connect(mutual_tls.amqps_url, ssl_context=client_context(pki, cert))

    with pytest.raises((ConnectionError, ssl.SSLError, OSError)):
        asyncio.run(aio())
    assert_no_connections(mutual_tls)


def test_verify_peer_without_fail_if_no_peer_cert(pki: Pki) -> None:
    """A certificate is asked for and checked if sent, but a client may come without one."""
    with run_broker(**tls_settings(pki, "verify_peer", fail=False)) as broker:
        assert pika_round_trip(broker, client_context(pki), b"anonymous") == b"anonymous"
        rogue = client_context(pki, (pki.rogue_cert, pki.rogue_key))
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(pika_params(broker, rogue))


def test_plain_amqp_and_silence_on_the_tls_port(pki: Pki) -> None:
    """Neither a client speaking plain AMQP to the TLS port nor one that says nothing stays."""
    with run_broker(handshake_timeout=500, **tls_settings(pki)) as broker:
        assert broker.tls_port is not None
        with socket.create_connection(("127.0.0.1", broker.tls_port), timeout=5) as plain:
            plain.sendall(b"AMQP\x00\x00\x09\x01")
            assert read_until_closed(plain) == b""  # no AMQP answer, just a closed socket
        with socket.create_connection(("127.0.0.1", broker.tls_port), timeout=5) as silent:
            started = time.monotonic()
            read_until_closed(silent)
            assert time.monotonic() - started < 3  # the TLS handshake timeout, not never
        assert_no_connections(broker)
        assert pika_round_trip(broker, client_context(pki), b"still fine") == b"still fine"


def read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def assert_no_connections(broker: RunningBroker) -> None:
    deadline = time.monotonic() + 5
    while broker.call(lambda: len(broker.server.broker.connections)):
        assert time.monotonic() < deadline, "a refused TLS client left a connection behind"
        time.sleep(0.05)
