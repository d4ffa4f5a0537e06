"""Connection negotiation: protocol header, start/tune/open, auth, limits, close, heartbeats."""

from __future__ import annotations

import time
from typing import Any

import pytest
from amqp_raw import FRAME_HEARTBEAT, PROTOCOL_HEADER, RawClient, Timeout, build
from pamqp import commands

EXPECTED_CAPABILITIES = [
    "publisher_confirms",
    "exchange_exchange_bindings",
    "basic.nack",
    "consumer_cancel_notify",
    "connection.blocked",
    "consumer_priorities",
    "authentication_failure_close",
    "per_consumer_qos",
    "direct_reply_to",
]

LOGIN_REFUSED = (
    "ACCESS_REFUSED - Login was refused using authentication mechanism {}. "
    "For details see the broker logfile."
)


@pytest.mark.parametrize(
    "header",
    [
        b"AMQP\x01\x01\x00\x0a",  # AMQP 0-10
        b"AMQP\x00\x00\x09\x00",  # 0-9 (not 0-9-1)
        b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
    ],
    ids=["amqp-0-10", "amqp-0-9", "http"],
)
def test_wrong_protocol_header_gets_supported_header_then_eof(
    amqp_addr: tuple[str, int], header: bytes
) -> None:
    with RawClient(amqp_addr) as c:
        c.send(header)
        assert c.read_until_eof() == PROTOCOL_HEADER


def test_connection_start_fields(amqp_addr: tuple[str, int]) -> None:
    with RawClient(amqp_addr) as c:
        start = c.begin()
    assert (start.version_major, start.version_minor) == (0, 9)
    mechanisms = start.mechanisms.split()
    assert "PLAIN" in mechanisms
    assert "AMQPLAIN" in mechanisms
    assert "en_US" in start.locales.split()
    props: dict[str, Any] = start.server_properties
    for key in ("product", "version", "platform"):
        assert isinstance(props.get(key), str | bytes), key
        assert props[key], key
    caps = props["capabilities"]
    for cap in EXPECTED_CAPABILITIES:
        assert caps.get(cap) is True, cap


def test_tune_proposal(amqp_addr: tuple[str, int]) -> None:
    with RawClient(amqp_addr) as c:
        c.begin()
        c.send_start_ok()
        tune = c.tune_ok()
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)


@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
def test_login_mechanisms(amqp_addr: tuple[str, int], mechanism: str) -> None:
    with RawClient.connect(amqp_addr, mechanism=mechanism) as c:
        q = c.new_queue(1, exclusive=True)
        assert q.startswith("amq.gen-")


@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
@pytest.mark.parametrize(
    ("user", "password"),
    [("guest", "wrong-password"), ("no-such-user", "guest")],
    ids=["bad-password", "unknown-user"],
)
def test_refused_login_with_authentication_failure_close(
    amqp_addr: tuple[str, int], user: str, password: str, mechanism: str
) -> None:
    with RawClient(amqp_addr) as c:
        c.begin()
        c.send_start_ok(user=user, password=password, mechanism=mechanism)
        assert c.expect_close(wait_eof=True) == (403, LOGIN_REFUSED.format(mechanism), 0, 0)


def test_unknown_vhost(amqp_addr: tuple[str, int], name: str) -> None:
    vhost = f"no-such-vhost-{name}"
    with RawClient(amqp_addr) as c:
        c.handshake(open_vhost=False)
        c.send_method(0, build(commands.Connection.Open, virtual_host=vhost))
        assert c.expect_close(wait_eof=True) == (
            530,
            f"NOT_ALLOWED - vhost {vhost} not found",
            10,
            40,
        )


SILENTLY_REFUSED: dict[str, dict[str, Any]] = {
    # tune-ok values beyond what the server proposed (0 means "no limit")
    "channel_max=0": {"tune": {"channel_max": 0}},
    "channel_max=2048": {"tune": {"channel_max": 2048}},
    "frame_max=0": {"tune": {"frame_max": 0}},
    "frame_max=4095": {"tune": {"frame_max": 4095}},  # below the protocol minimum
    # below 4.1+'s ?FRAME_MIN_SIZE of 8192 (rabbit_reader:validate_negotiated_integer_value/3);
    # RabbitMQ 3.10 accepts it
    "frame_max=8191": {"tune": {"frame_max": 8191}},
    "frame_max=131073": {"tune": {"frame_max": 131073}},
    # a client without authentication_failure_close is not told why
    "bad-password-no-capability": {"start_ok": {"password": "x", "capabilities": {}}},
    "unknown-mechanism": {"start_ok": {"mechanism": "NO-SUCH-MECHANISM"}},
}


def test_handshake_errors_before_open_drop_the_connection_silently(
    amqp_addr: tuple[str, int],
) -> None:
    """No connection.close is sent before connection.open has succeeded (except
    for refused logins when the client asked for authentication_failure_close).
    The cases run side by side because the broker may delay the close."""
    clients: dict[str, RawClient] = {}
    try:
        for case, spec in SILENTLY_REFUSED.items():
            c = clients[case] = RawClient(amqp_addr)
            c.begin()
            c.send_start_ok(**spec.get("start_ok", {}))
            if "tune" in spec:
                c.tune_ok(**spec["tune"])
                c.send_method(0, commands.Connection.Open(virtual_host="/"))
        for case, c in clients.items():
            assert c.read_until_eof() == b"", case
    finally:
        for c in clients.values():
            c.abort()


def test_tune_ok_smaller_values_accepted(amqp_addr: tuple[str, int]) -> None:
    with RawClient.connect(amqp_addr, channel=None, channel_max=10, frame_max=8192) as c:
        c.channel_open(10)
        q = c.new_queue(10, exclusive=True)
        assert q.startswith("amq.gen-")


def test_channel_max_limits_number_of_open_channels(amqp_addr: tuple[str, int]) -> None:
    with RawClient.connect(amqp_addr, channel=None, channel_max=2) as c:
        # The limit counts open channels; the channel number itself is not checked.
        c.channel_open(1)
        c.channel_open(100)
        c.send_method(3, commands.Channel.Open())
        assert c.expect_close() == (
            530,
            "NOT_ALLOWED - number of channels opened (2) has reached the "
            "negotiated channel_max (2)",
            0,
            0,
        )


def test_channel_max_allows_reuse_after_close(amqp_addr: tuple[str, int]) -> None:
    with RawClient.connect(amqp_addr, channel=None, channel_max=1) as c:
        c.channel_open(1)
        c.channel_close(1)
        c.channel_open(2)
        c.channel_close(2)
        c.channel_open(1)
        assert c.new_queue(1, exclusive=True).startswith("amq.gen-")


def test_method_before_connection_open(amqp_addr: tuple[str, int]) -> None:
    with RawClient(amqp_addr) as c:
        c.handshake(open_vhost=False)
        c.send_method_raw(1, 20, 10, b"\x00")  # channel.open, empty out-of-band
        assert c.expect_close() == (
            505,
            "UNEXPECTED_FRAME - type 1, all octets = <<0,20,0,10,0>>",
            0,
            0,
        )


CLOSE = commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)


@pytest.mark.parametrize(
    ("method", "ids"),
    [
        (commands.Connection.TuneOk(channel_max=10, frame_max=4096, heartbeat=0), (10, 31)),
        (
            commands.Connection.StartOk(
                client_properties={}, mechanism="PLAIN", response="\0guest\0guest", locale="en_US"
            ),
            (10, 11),
        ),
        (CLOSE, (10, 50)),  # RabbitMQ accepts connection.close only once the vhost is open
        (commands.Connection.CloseOk(), (10, 51)),
        (commands.Connection.UpdateSecret(new_secret="guest", reason="rotate"), (10, 70)),
        (commands.Queue.Declare(queue=""), (50, 10)),
    ],
    ids=["tune-ok", "start-ok", "close", "close-ok", "update-secret", "queue.declare"],
)
def test_unexpected_method_between_tune_ok_and_open_names_the_opening_state(
    amqp_addr: tuple[str, int], method: Any, ids: tuple[int, int]
) -> None:
    with RawClient(amqp_addr) as c:
        c.handshake(open_vhost=False)
        c.send_method(0, method)
        assert c.expect_close() == (
            504,
            "CHANNEL_ERROR - unexpected method in connection state opening",
            *ids,
        )


def test_update_secret_ok_from_a_client_is_unexpected(amqp_addr: tuple[str, int]) -> None:
    """Only a server answers update-secret: a client's update-secret-ok is refused."""
    with RawClient.connect(amqp_addr) as c:
        c.send_method(0, commands.Connection.UpdateSecretOk())
        assert c.expect_close() == (
            504,
            "CHANNEL_ERROR - unexpected method in connection state running",
            10,
            71,
        )


def test_connection_close_before_tune_ok_drops_the_socket(amqp_addr: tuple[str, int]) -> None:
    """Before the connection is tuned nothing is reported, a close included (RabbitMQ)."""
    with RawClient(amqp_addr) as c:
        c.begin()
        c.send_start_ok()
        c.expect_method(commands.Connection.Tune, 0)
        c.send_method(0, CLOSE)
        assert c.read_until_eof() == b""


def test_connection_close_answered_by_close_ok(amqp_addr: tuple[str, int]) -> None:
    c = RawClient.connect(amqp_addr, channel=1)
    try:
        c.channel_open(2)
        c.send_method(
            0,
            commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0),
        )
        c.expect_method(commands.Connection.CloseOk, channel=0)
        # After close-ok the connection is finished: further methods are ignored.
        c.send_method(3, commands.Channel.Open())
        c.assert_silent(0.3)
    finally:
        c.abort()


def test_server_sends_heartbeats_at_negotiated_interval(amqp_addr: tuple[str, int]) -> None:
    with RawClient.connect(amqp_addr, channel=None, heartbeat=1) as c:
        assert c.tune is not None
        assert c.tune.heartbeat == 60  # the server's proposal; the client chose 1
        began = time.monotonic()
        seen: list[float] = []
        last_sent = began
        while (now := time.monotonic()) < began + 2.6:
            if now - last_sent >= 0.5:
                c.send_heartbeat()
                last_sent = now
            try:
                f = c.read_frame(timeout=min(0.25, began + 2.6 - now))
            except Timeout:
                continue
            assert f.type == FRAME_HEARTBEAT and f.channel == 0, f
            assert f.payload == b""
            seen.append(time.monotonic())
        assert len(seen) >= 2, seen
        gaps = [b - a for a, b in zip([began, *seen], seen, strict=False)]
        assert max(gaps) <= 1.5, gaps
        # the connection is still healthy
        c.channel_open(1)


def test_frame_min_size_4096_lets_a_client_tune_to_4096_as_on_3_x() -> None:
    """warren.frame_min_size = 4096 (tests/rabbitmq-3.x.conf) gives back 3.x's minimum."""
    from warren.broker.testkit import run_broker
    from warren.config import parse_config

    with run_broker(parse_config("warren.frame_min_size = 4096\n")) as running:
        addr = (running.host, running.port)
        with RawClient.connect(addr, channel=None, frame_max=4096) as c:
            c.channel_open(1)
            assert c.new_queue(1, exclusive=True).startswith("amq.gen-")
        with RawClient(addr) as c:
            c.begin()
            c.send_start_ok()
            c.tune_ok(frame_max=4095)
            c.send_method(0, commands.Connection.Open(virtual_host="/"))
            assert c.read_until_eof() == b""
