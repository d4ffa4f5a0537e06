"""``warren-healthcheck`` (``python -m warren.broker.tools.healthcheck``): is AMQP served?

A port probe says only that something listens. This does what a client
does: protocol header, connection.start/start-ok (PLAIN), tune/tune-ok,
connection.open on the vhost, then a clean connection.close. Exit status 0
means healthy, 1 unhealthy (Docker's HEALTHCHECK convention).

By default it reads the settings as ``warren-server`` does, so inside the
image the configured port, ``RABBITMQ_DEFAULT_USER``/``_PASS``/``_VHOST``
and ``RABBITMQ_CONFIG_FILE`` need no repeating. It imports only config/ and
pamqp, not the engine, to stay cheap when run every few seconds.
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import time

from pamqp import commands, frame
from pamqp.base import Frame

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD = 1
FRAME_TYPES = (1, 2, 3, 8)  # method, content header, content body, heartbeat
FRAME_END = b"\xce"
# a bind-all listener is checked on the matching loopback address
LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


class Unhealthy(Exception):
    """What went wrong, in one line for `docker inspect`."""


class _Conn:
    """A blocking socket with one deadline for the whole check."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.deadline = time.monotonic() + timeout
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise Unhealthy(f"cannot connect to {host}:{port}: {exc}") from None
        self.buffer = b""

    def _recv_exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise Unhealthy("timed out waiting for the broker")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                raise Unhealthy("timed out waiting for the broker") from None
            except OSError as exc:
                raise Unhealthy(f"connection failed: {exc}") from None
            if not chunk:
                raise Unhealthy("the broker closed the connection")
            self.buffer += chunk
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def send(self, value: Frame | bytes) -> None:
        data = value if isinstance(value, bytes) else frame.marshal(value, 0)
        try:
            self.sock.sendall(data)
        except OSError as exc:
            raise Unhealthy(f"connection failed: {exc}") from None

    def method(self) -> Frame:
        """The next method frame on channel 0 (heartbeats and others are skipped)."""
        while True:
            head = self._recv_exactly(7)
            if head.startswith(b"AMQP"):  # the broker rejected our protocol version
                raise Unhealthy("the broker refused protocol AMQP 0-9-1")
            kind, _channel, size = struct.unpack(">BHI", head)
            if kind not in FRAME_TYPES:
                raise Unhealthy(f"not an AMQP broker: it sent {head!r}")
            payload = self._recv_exactly(size + 1)
            if payload[-1:] != FRAME_END:
                raise Unhealthy("malformed frame from the broker")
            if kind != FRAME_METHOD:
                continue
            _, _, value = frame.unmarshal(head + payload)
            assert isinstance(value, Frame)
            return value

    def expect(self, wanted: type[Frame]) -> Frame:
        value = self.method()
        if isinstance(value, commands.Connection.Close):
            raise Unhealthy(f"the broker refused: {value.reply_code} {value.reply_text}")
        if not isinstance(value, wanted):
            raise Unhealthy(f"expected {wanted.__name__}, got {type(value).__name__}")
        return value

    def close(self) -> None:
        self.sock.close()


def check(
    host: str,
    port: int,
    user: str = "guest",
    password: str = "guest",
    vhost: str = "/",
    timeout: float = 5.0,
) -> float:
    """Open and close one AMQP connection; return the seconds it took or raise Unhealthy."""
    started = time.monotonic()
    conn = _Conn(host, port, timeout)
    try:
        conn.send(PROTOCOL_HEADER)
        start = conn.expect(commands.Connection.Start)
        assert isinstance(start, commands.Connection.Start)
        if b"PLAIN" not in start.mechanisms.encode().split():
            raise Unhealthy(f"the broker does not offer PLAIN (offers {start.mechanisms})")
        conn.send(
            commands.Connection.StartOk(
                client_properties={
                    "product": "warren-healthcheck",
                    # a refused login then gets a connection.close with the reason
                    "capabilities": {"authentication_failure_close": True},
                },
                mechanism="PLAIN",
                response=f"\0{user}\0{password}",
            )
        )
        tune = conn.expect(commands.Connection.Tune)
        assert isinstance(tune, commands.Connection.Tune)
        conn.send(commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
        conn.send(commands.Connection.Open(virtual_host=vhost))
        conn.expect(commands.Connection.OpenOk)
        conn.send(commands.Connection.Close(200, "health check done", 0, 0))
        conn.expect(commands.Connection.CloseOk)
    finally:
        conn.close()
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="warren-healthcheck",
        description="Exit 0 if the broker completes an AMQP handshake, else 1. Defaults come "
        "from the broker's configuration ($RABBITMQ_CONFIG_FILE, $RABBITMQ_DEFAULT_*).",
    )
    parser.add_argument("--config", metavar="PATH", help="rabbitmq.conf to read defaults from")
    parser.add_argument("--host", help="default: the first listener's address (or loopback)")
    parser.add_argument("--port", type=int, help="default: the first listener's port")
    parser.add_argument("--user", help="default: default_user")
    parser.add_argument("--password", help="default: default_pass")
    parser.add_argument("--vhost", help="default: default_vhost")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing when healthy")
    args = parser.parse_args(argv)

    from warren.config import ConfigError, load_settings

    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"warren-healthcheck: configuration error: {exc}", file=sys.stderr)
        return 1
    listener = settings.listeners[0] if settings.listeners else None
    host = args.host or (LOOPBACK.get(listener.host, listener.host) if listener else "127.0.0.1")
    port = args.port or (listener.port if listener else 5672)
    try:
        took = check(
            host,
            port,
            args.user if args.user is not None else settings.default_user,
            args.password if args.password is not None else settings.default_pass,
            args.vhost if args.vhost is not None else settings.default_vhost,
            args.timeout,
        )
    except Unhealthy as exc:
        print(f"warren-healthcheck: unhealthy: {exc}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"warren-healthcheck: healthy ({host}:{port}, {took * 1000:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
