"""Hostile and careless peers: what the fuzzers found, and the security checks of issue 10."""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from amqp_raw import (
    FRAME_METHOD,
    RawClient,
    build,
    frame_bytes,
    header_payload,
    method_payload,
    shortstr,
)
from pamqp import commands

import warren.broker.engine.channel
import warren.broker.engine.users
import warren.broker.ops.management.app
import warren.broker.server.amqp_connection
from warren.broker.testkit import RunningBroker, run_broker

CONFIRMS_FIX = (
    "broker/server/amqp_connection.py: confirms owed when a channel or connection closes are "
    "written after channel.close-ok / connection.close(-ok)"
)


@pytest.fixture(scope="module")
def running() -> Iterator[RunningBroker]:
    with run_broker() as b:
        yield b


def addr(b: RunningBroker) -> tuple[str, int]:
    return (b.host, b.port)


def publish_frames(channel: int, queue: str, n: int) -> bytes:
    out = b""
    for i in range(n):
        out += frame_bytes(FRAME_METHOD, channel, method_payload(
            build(commands.Basic.Publish, exchange="", routing_key=queue)))  # fmt: skip
        out += frame_bytes(2, channel, b"\x00\x3c\x00\x00" + (1).to_bytes(8, "big") + b"\x00\x00")
        out += frame_bytes(3, channel, bytes([48 + i % 10]))
    return out


def frames_until_eof(c: RawClient) -> list[tuple[int, Any]]:
    out = []
    while True:
        try:
            f = c.read_frame(timeout=3)
        except AssertionError:  # EOF
            return out
        if f.type == FRAME_METHOD:
            out.append((f.channel, f.method()))
            if isinstance(out[-1][1], commands.Connection.CloseOk):
                return out  # closing the socket is the client's turn now, as with RabbitMQ


# ---- confirms around a close ----------------------------------------------------------------


def test_confirms_come_before_channel_close_ok(running: RunningBroker) -> None:
    with RawClient.connect(addr(running)) as c:
        queue = c.new_queue(1, exclusive=True)
        c.channel_open(2)
        c.confirm_select(2)
        c.send(publish_frames(2, queue, 3) + frame_bytes(FRAME_METHOD, 2, method_payload(
            commands.Channel.Close(reply_code=200, reply_text="bye"))))  # fmt: skip
        seen = c.frames_within(0.5)
        kinds = [(f.channel, type(f.method()).__name__) for f in seen if f.type == FRAME_METHOD]
        assert kinds[-1] == (2, "CloseOk"), f"frames after channel.close-ok: {kinds}"


def test_confirms_come_before_connection_close_ok(running: RunningBroker) -> None:
    with RawClient.connect(addr(running)) as c:
        queue = c.new_queue(1)
        c.confirm_select(1)
        c.send(publish_frames(1, queue, 3) + frame_bytes(FRAME_METHOD, 0, method_payload(
            commands.Connection.Close(reply_code=200, reply_text="bye"))))  # fmt: skip
        methods = frames_until_eof(c)
        c.opened = False
        assert isinstance(methods[-1][1], commands.Connection.CloseOk), methods[-3:]
        c2 = RawClient.connect(addr(running))
        c2.delete_queue(1, queue)
        c2.close()


def test_nothing_follows_the_brokers_connection_close(running: RunningBroker) -> None:
    with RawClient.connect(addr(running)) as c:
        queue = c.new_queue(1, exclusive=True)
        c.confirm_select(1)
        c.send(publish_frames(1, queue, 3) + b"\x01\x00\x01\x00\x00\x00\x00\x00")  # bad end
        methods = frames_until_eof(c)
        c.opened = False
        closes = [i for i, (_, m) in enumerate(methods) if isinstance(m, commands.Connection.Close)]
        assert closes and closes[0] == len(methods) - 1, methods[-3:]
        assert any(isinstance(m, commands.Basic.Ack) for _, m in methods)  # confirms come, first


# ---- output that nobody reads ---------------------------------------------------------------


def test_a_client_that_never_reads_cannot_fill_the_brokers_memory() -> None:
    """basic.get + basic.reject(requeue) fetches the same 1 MB message again for ~40 octets:
    a client that sends this without reading must meet TCP backpressure, as with RabbitMQ."""
    with run_broker() as b:
        c = RawClient.connect(addr(b))
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
        try:
            c.declare_queue(1, "big", exclusive=True)
            c.publish(1, b"x" * 1_000_000, routing_key="big")
            c.call(1, commands.Basic.Qos(prefetch_count=0), commands.Basic.QosOk)
            pairs = b"".join(
                frame_bytes(FRAME_METHOD, 1, method_payload(build(commands.Basic.Get, queue="big")))
                + frame_bytes(
                    FRAME_METHOD,
                    1,
                    method_payload(commands.Basic.Reject(delivery_tag=tag, requeue=True)),
                )
                for tag in range(1, 121)
            )  # 6 KB that ask for 120 MB
            c.send(pairs)
            time.sleep(1.0)

            def buffered() -> int:
                return max(
                    conn.transport.get_write_buffer_size() for conn in b.server.broker.connections
                )

            # high-water mark (4 MB) plus what one event may write (a message, here 1 MB)
            assert b.call(buffered) <= 8 * 1024 * 1024
        finally:
            c.abort()


# ---- internal errors --------------------------------------------------------------------------


COMPARE_DIGEST = hmac.compare_digest
SECRET = "secret detail at /srv/warren/broker/engine/channel.py:123"


def test_an_internal_error_answers_a_generic_text(
    running: RunningBroker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(channel: Any, method: Any) -> None:
        raise RuntimeError(SECRET)

    monkeypatch.setitem(warren.broker.engine.channel.HANDLERS, commands.Basic.Qos, broken)
    with RawClient.connect(addr(running)) as c, caplog.at_level(logging.ERROR):
        c.send_method(1, commands.Basic.Qos(prefetch_count=1))
        code, text, _, _ = c.expect_close()
    assert code == 541 and text.startswith("INTERNAL_ERROR - ")
    for leak in ("secret", "RuntimeError", "/srv", ".py", "Traceback"):
        assert leak not in text, text
    # the operator gets it, in the log (with the traceback, under the broker's own logging)
    assert any(
        r.levelno == logging.ERROR and "internal error" in r.getMessage() for r in caplog.records
    )
    with RawClient.connect(addr(running)) as other:  # nobody else noticed
        other.declare_queue(1, "", exclusive=True)


def test_a_management_api_bug_answers_a_generic_500(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(self: Any, request: Any) -> Any:
        raise RuntimeError(SECRET)

    monkeypatch.setattr(warren.broker.ops.management.app.ManagementApp, "_handle", broken)
    with run_broker(management_port=0) as b:
        assert b.management_url is not None
        request = urllib.request.Request(b.management_url.replace("guest:guest@", "") + "/api/")
        request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=5)
        assert caught.value.code == 500
        body = caught.value.read().decode()
        json.loads(body)
        for leak in ("secret", "RuntimeError", "/srv", ".py"):
            assert leak not in body, body


# ---- logins --------------------------------------------------------------------------------------


def test_passwords_are_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []

    def compare(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return COMPARE_DIGEST(a, b)

    monkeypatch.setattr(warren.broker.engine.users.hmac, "compare_digest", compare)
    access = warren.broker.engine.users.AccessControl()
    access.add_user("alice", "right")
    assert access.authenticate("alice", "right") is not None
    assert access.authenticate("alice", "wrong") is None
    assert len(calls) == 2  # no early exit on the first differing character


def test_an_unknown_user_costs_what_a_wrong_password_costs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[bytes] = []

    def compare(a: bytes, b: bytes) -> bool:
        calls.append(a)
        return COMPARE_DIGEST(a, b)

    monkeypatch.setattr(warren.broker.engine.users.hmac, "compare_digest", compare)
    access = warren.broker.engine.users.AccessControl()
    access.add_user("alice", "right")
    assert access.authenticate("mallory", "right") is None
    assert len(calls) == 1


REFUSAL_DELAY = 0.5  # the least delay the test accepts (RabbitMQ waits 3 s before it closes)


@pytest.mark.parametrize("capabilities", [None, {}], ids=["failure-close", "no-capability"])
def test_a_failed_login_is_logged_and_slowed_down(
    running: RunningBroker,
    caplog: pytest.LogCaptureFixture,
    capabilities: dict[str, Any] | None,
) -> None:
    with caplog.at_level(logging.INFO), RawClient(addr(running)) as c:
        c.begin()
        started = time.monotonic()
        c.send_start_ok(password="not-the-password", capabilities=capabilities)
        # meanwhile everyone else is served at once: the delay blocks nothing
        with RawClient.connect(addr(running)) as other:
            other.declare_queue(1, "", exclusive=True)
        assert time.monotonic() - started < REFUSAL_DELAY
        if capabilities is None:
            assert c.expect_close(timeout=10)[0] == 403
        c.read_until_eof(timeout=10)
        assert time.monotonic() - started >= REFUSAL_DELAY
    refusals = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("guest" in r.getMessage() and "refused" in r.getMessage() for r in refusals)
    assert not any("not-the-password" in r.getMessage() for r in caplog.records)


# ---- names that are not UTF-8 (found by atheris; fixed in protocol/) --------------------------


def test_a_name_that_is_not_utf8_comes_back_in_a_reply_the_client_can_read(
    running: RunningBroker,
) -> None:
    with RawClient.connect(addr(running)) as c:
        passive = b"\x00\x00" + shortstr(b"q\xbe") + b"\x01" + b"\x00\x00\x00\x00"
        c.send_method_raw(1, 50, 10, passive)  # queue.declare passive: 404 names the queue
        assert c.expect_channel_close(1) == (
            404,
            "NOT_FOUND - no queue 'q\ufffd' in vhost '/'",
            50,
            10,
        )
        c.channel_open(1)  # a channel error, not a connection one (it was 541 before)


def test_dead_lettering_keeps_a_routing_key_that_is_not_utf8(running: RunningBroker) -> None:
    """x-death is written in a queue's expiry timer: an encoding error there lost the message."""
    with RawClient.connect(addr(running)) as c:
        target = c.new_queue(1, exclusive=True)
        source = c.new_queue(
            1,
            exclusive=True,
            arguments={
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": target,
                "x-message-ttl": 20,
            },
        )
        c.declare_exchange(1, "odd-keys", "fanout", auto_delete=True)
        c.bind_queue(1, source, "odd-keys")
        c.send_method_raw(
            1, 60, 40, b"\x00\x00" + shortstr("odd-keys") + shortstr(b"\xfe\xff") + b"\x00"
        )
        c.send_frame(2, 1, header_payload(1))
        c.send_frame(3, 1, b"x")
        deadline = time.monotonic() + 5
        while (d := c.get(1, target, no_ack=True)) is None:
            assert time.monotonic() < deadline, "the dead-lettered message never arrived"
            time.sleep(0.02)
        assert d.body == b"x"
        assert b"\xfe\xff" in d.header_payload  # routing-keys in x-death: the client's octets


# ---- the handshake's order (found by the broker fuzzer) -----------------------------------------

STATE_FIX = (
    "broker/server/amqp_connection.py _connection_method: start-ok, tune-ok and open are "
    "accepted in any state (a second open switches vhost, a second tune-ok starts a second "
    "heartbeat timer)"
)


@pytest.mark.parametrize(
    ("method", "ids"),
    [
        (build(commands.Connection.Open, virtual_host="/"), (10, 40)),
        (commands.Connection.TuneOk(channel_max=10, frame_max=4096, heartbeat=0), (10, 31)),
        (
            build(
                commands.Connection.StartOk,
                client_properties={},
                mechanism="PLAIN",
                response="\x00guest\x00guest",
                locale="en_US",
            ),
            (10, 11),
        ),
    ],
    ids=["open", "tune-ok", "start-ok"],
)
def test_a_handshake_method_on_a_running_connection_is_refused(
    running: RunningBroker, method: Any, ids: tuple[int, int]
) -> None:
    """RabbitMQ: 504 CHANNEL_ERROR - unexpected method in connection state running."""
    with RawClient.connect(addr(running)) as c:
        c.send_method(0, method)
        assert c.expect_close() == (
            504,
            "CHANNEL_ERROR - unexpected method in connection state running",
            *ids,
        )


def test_a_closed_connection_is_not_kept_alive_by_its_timers(running: RunningBroker) -> None:
    import gc

    def alive() -> int:
        gc.collect()
        connection_class = warren.broker.server.amqp_connection.Connection
        return sum(type(o) is connection_class for o in gc.get_objects())

    before = running.call(alive)
    c = RawClient(addr(running))
    c.handshake(open_vhost=False, heartbeat=None)  # the server's 60 s: a tick every 30 s
    c.send_method(0, commands.Connection.TuneOk(channel_max=10, frame_max=4096, heartbeat=600))
    c.abort()
    deadline = time.monotonic() + 3
    while running.call(alive) > before:
        assert time.monotonic() < deadline, "a closed connection is still referenced"
        time.sleep(0.05)


def test_an_unsolicited_close_ok_is_refused_and_nothing_after_it_is_done(
    running: RunningBroker,
) -> None:
    """Found by the broker fuzzer. RabbitMQ: 504 unexpected method in connection state running."""
    with RawClient.connect(addr(running)) as c:
        declare = method_payload(build(commands.Queue.Declare, queue="after-close-ok"))
        c.send(
            frame_bytes(FRAME_METHOD, 0, method_payload(commands.Connection.CloseOk()))
            + frame_bytes(FRAME_METHOD, 1, declare)
        )
        assert c.expect_close() == (
            504,
            "CHANNEL_ERROR - unexpected method in connection state running",
            10,
            51,
        )
    assert "after-close-ok" not in running.queues()


def test_a_publisher_that_never_reads_its_returns_meets_back_pressure() -> None:
    """Mandatory publishes that route nowhere come back whole: a client that sends them
    without reading stops being read once its returns fill the socket (no unbounded output)."""
    with run_broker() as b:
        c = RawClient.connect(addr(b))
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
        try:
            body = b"r" * 1_000_000
            one = (
                frame_bytes(FRAME_METHOD, 1, method_payload(build(
                    commands.Basic.Publish, routing_key="nowhere", mandatory=True)))
                + frame_bytes(2, 1, header_payload(len(body)))
                + b"".join(
                    frame_bytes(3, 1, body[i : i + 131_064])
                    for i in range(0, len(body), 131_064)
                )
            )  # fmt: skip

            def send_all() -> None:
                with contextlib.suppress(OSError):  # the test aborts the socket midway
                    c.send(one * 100)

            sender = threading.Thread(target=send_all, daemon=True)
            sender.start()

            def paused() -> bool:
                return any(not conn.writable for conn in b.server.broker.connections)

            deadline = time.monotonic() + 10
            while not b.call(paused):
                assert time.monotonic() < deadline, "the broker never stopped writing"
                time.sleep(0.01)

            def buffered() -> int:
                return max(
                    conn.transport.get_write_buffer_size() for conn in b.server.broker.connections
                )

            # high-water mark (4 MB) plus what one turn may write (here about 1 MB)
            assert b.call(buffered) <= 8 * 1024 * 1024
            assert sender.is_alive()  # 100 MB cannot all have been taken
            with RawClient.connect(addr(b)) as other:  # the others are still served
                other.declare_queue(1, "", exclusive=True)
        finally:
            c.abort()
        sender.join(5)
