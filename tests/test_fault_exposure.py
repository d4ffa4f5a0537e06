"""What a remote client or another local user can learn (issue 41, findings 6 and 7)."""

from __future__ import annotations

import socket
import stat
from pathlib import Path

import pika
import pytest
from amqp_raw import RawClient

from warren.broker.testkit import run_broker
from warren.config import Listener

GENERIC = (
    "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
    "For details see the broker logfile."
)


def outward_address() -> str:
    """This machine's address on the interface of its route out (not loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("192.0.2.254", 9))  # no packet is sent: only the route is looked up
        address = str(sock.getsockname()[0])
    assert not address.startswith("127.")
    return address


@pytest.mark.parametrize("password", ["guest", "wrong"], ids=["right", "wrong"])
def test_a_remote_guest_gets_the_generic_refusal_whether_or_not_the_password_is_right(
    password: str,
) -> None:
    # rabbit_reader:auth_phase/2 (4.3) checks the password, then check_user_loopback; both
    # refusals go through auth_fail/5, which sends a client with authentication_failure_close
    # only "Login was refused using authentication mechanism ~ts. For details see the broker
    # logfile." (the reason is logged): the answer does not tell a right password from a
    # wrong one
    host = outward_address()
    with run_broker(listeners=(Listener("all", "0.0.0.0", 0),)) as running:
        port = running.server.addresses[0][1]
        client = RawClient((host, port))
        client.begin()
        client.send_start_ok(user="guest", password=password)
        code, text, _, _ = client.expect_close()
        assert (code, text) == (403, GENERIC)
        client.abort()


def test_the_data_directory_is_the_brokers_users_only(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    (data / "left.over").write_text("x")  # made by someone else, before: made private too
    (data / "left.over").chmod(0o644)
    with run_broker(data_dir=str(data)) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("p.q", durable=True)
        ch.basic_publish("", "p.q", b"m", pika.BasicProperties(delivery_mode=2))
        ch.queue_declare("p.s", durable=True, arguments={"x-queue-type": "stream"})
        ch.basic_publish("", "p.s", b"s")
        conn.close()
        paths = [data, *data.rglob("*")]
        assert any(p.name == "definitions.sqlite3" for p in paths)
        assert any(p.suffix == ".seg" for p in paths)
        for path in paths:
            mode = stat.S_IMODE(path.stat().st_mode)
            assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
