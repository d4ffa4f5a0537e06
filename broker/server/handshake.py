"""The connection class of AMQP 0-9-1 as the server runs it (rabbit_reader's
handle_method0): connection.start, start-ok (authentication: PLAIN and AMQPLAIN, loopback
users, the delayed refusal), tune, open (the vhost; the node's, the vhost's and the user's
connection limits; access), the handshake timeout, the heartbeats at the interval tune
settled, the user's max-channels limit that each channel.open is checked against, the
client's connection.close and close-ok, and connection.blocked while a resource alarm is on.
``Connection`` (broker/server/amqp_connection.py) calls in here for those methods; the
protocol (protocol/connection.py) has checked their order and applied the tuning.
"""

from __future__ import annotations

import platform
from typing import TYPE_CHECKING, Any, Final

from pamqp import commands

from warren.broker.engine.users import INTERNAL_USER
from warren.broker.server.flow import ALARM
from warren.protocol.connection import CLOSED, OPEN
from warren.protocol.constants import ACCESS_REFUSED, NOT_ALLOWED
from warren.protocol.errors import ConnectionError_
from warren.protocol.frames import HEARTBEAT_FRAME
from warren.protocol.tables import TableError, decode_table

if TYPE_CHECKING:
    from warren.broker.server.amqp_connection import Connection

VERSION: Final = "0.1.0"
LOGIN_REFUSAL_DELAY: Final = 1.0  # seconds before a refused login is answered (RabbitMQ waits too)
# after close-ok the client closes the socket, within the heartbeat interval or this many
# seconds, whichever is shorter (rabbit_reader:close_connection's ?CLOSING_TIMEOUT)
CLOSING_TIMEOUT: Final = 30.0


def server_properties(product: str = "Warren", version: str | None = None) -> dict[str, Any]:
    """``product`` and ``version`` are product.name / product.version (Warren's by default)."""
    return {
        "product": product,
        "version": version or VERSION,
        "platform": f"Python {platform.python_version()}",
        "copyright": "The Warren authors",
        "information": "An AMQP 0-9-1 broker in Python",
        "cluster_name": "warren@" + platform.node(),
        "capabilities": {
            "publisher_confirms": True,
            "exchange_exchange_bindings": True,
            "basic.nack": True,
            "consumer_cancel_notify": True,
            "connection.blocked": True,
            "consumer_priorities": True,
            "authentication_failure_close": True,
            "per_consumer_qos": True,
            "direct_reply_to": True,
        },
    }


def send_start(conn: Connection) -> None:
    conn.send_method(
        0,
        commands.Connection.Start(
            version_major=0,
            version_minor=9,
            server_properties=server_properties(
                conn.broker.settings.product_name, conn.broker.settings.product_version
            ),
            mechanisms="AMQPLAIN PLAIN",
            locales="en_US",
        ),
    )


def start_ok(conn: Connection, method: commands.Connection.StartOk) -> None:
    conn.client_properties = method.client_properties or {}
    caps = conn.client_properties.get("capabilities")
    conn.capabilities = caps if isinstance(caps, dict) else {}
    mechanism = method.mechanism
    response = method.response if isinstance(method.response, bytes) else b""
    if mechanism == "PLAIN":
        parts = response.split(b"\x00")
        user, password = (parts[1], parts[2]) if len(parts) == 3 else (b"", b"")
    elif mechanism == "AMQPLAIN":
        try:
            table, _ = decode_table(len(response).to_bytes(4, "big") + response)
        except TableError:
            table = {}
        user, password = _as_bytes(table.get("LOGIN")), _as_bytes(table.get("PASSWORD"))
    else:
        raise ConnectionError_(
            ACCESS_REFUSED, f"unsupported authentication mechanism '{mechanism}'", 10, 11
        )
    name = user.decode(errors="replace")
    stats = conn.broker.stats
    address = conn.peer[0] if conn.peer else ""
    # rabbit_reader:auth_fail/5 (4.3) tells a client with authentication_failure_close
    # only this text, whatever the reason (a wrong password, or a loopback user from
    # another address, checked after the password: rabbit_reader:auth_phase/2); the
    # reason goes to the log. The same answer both ways lets no remote client learn
    # whether a loopback user's password was right.
    refused = (
        f"Login was refused using authentication mechanism {mechanism}. "
        "For details see the broker logfile."
    )
    if conn.direct:
        # rabbit_direct:connect/2: no password; a user named must exist, and without one
        # it is RabbitMQ's internal "none" user, allowed everything
        if name and name not in conn.broker.access.users:
            _refuse_login(conn, refused, name, "no such user")
            return
        _logged_in(conn, name or INTERNAL_USER)
        return
    if not conn.broker.authenticate(name, password.decode(errors="replace")):
        stats.auth_attempt(False, address, name)
        _refuse_login(conn, refused, name, "invalid credentials")
        return
    if name in conn.broker.settings.loopback_users and not _from_loopback(conn):
        stats.auth_attempt(False, address, name)
        _refuse_login(conn, refused, name, f"user '{name}' can only connect via localhost")
        return
    stats.auth_attempt(True, address, name)
    _logged_in(conn, name)


def _logged_in(conn: Connection, name: str) -> None:
    conn.user = name
    authenticated(conn)
    settings = conn.broker.settings
    conn.send_method(
        0,
        commands.Connection.Tune(
            channel_max=settings.channel_max,
            frame_max=settings.frame_max,
            heartbeat=settings.heartbeat,
        ),
    )


def authenticated(conn: Connection) -> None:
    if conn.handshaking:
        conn.handshaking = False
        conn.broker.handshaking -= 1


def _refuse_login(conn: Connection, detail: str, user: str, reason: str) -> None:
    """Log why, ignore the peer, and answer ``detail`` only after a delay that slows
    guessing down."""
    conn.broker.log.warning(f"login refused for user '{user}'", peer=conn.peer, reason=reason)
    conn.protocol.stop()
    conn.refusal = conn.broker.timers.call_later(LOGIN_REFUSAL_DELAY, lambda: _refuse(conn, detail))


def _refuse(conn: Connection, detail: str) -> None:
    if conn.protocol.state is CLOSED:
        return
    if conn.capabilities.get("authentication_failure_close") is True:
        # the one error RabbitMQ reports before tuning
        conn.connection_error(ConnectionError_(ACCESS_REFUSED, detail), report=True)
        conn.flush()
    conn.close_transport()


def _from_loopback(conn: Connection) -> bool:
    host = conn.peer[0] if conn.peer else ""
    return host.startswith("127.") or host in ("::1", "localhost") or host.startswith("::ffff:127.")


def connection_open(conn: Connection, method: commands.Connection.Open) -> None:
    vhost = conn.broker.vhosts.get(method.virtual_host)
    if vhost is None:
        raise ConnectionError_(NOT_ALLOWED, f"vhost {method.virtual_host} not found", 10, 40)
    node_limit = conn.broker.settings.connection_max
    if node_limit is not None and len(conn.broker.connections) > node_limit:
        # rabbit_reader:is_over_node_connection_limit/1: every connection counts,
        # this one too, and the check comes before the vhost's
        raise ConnectionError_(
            NOT_ALLOWED,
            f"connection refused: node connection limit ({node_limit}) is reached",
            10,
            40,
        )
    limit = vhost.limits.get("max-connections")
    if limit is not None and limit >= 0:
        open_here = sum(
            1 for c in conn.broker.connections if c.protocol.state is OPEN and c.vhost is vhost
        )
        if open_here >= limit:
            raise ConnectionError_(
                NOT_ALLOWED,
                f"access to vhost '{vhost.name}' refused for user '{conn.user}': "
                f"connection limit ({limit}) is reached",
                10,
                40,
            )
    user_limit = conn.broker.access.user_limit(conn.user, "max-connections")
    if user_limit is not None:
        # rabbit_reader:is_over_user_connection_limit/1, after the vhost's limit
        own = sum(
            1 for c in conn.broker.connections if c.protocol.state is OPEN and c.user == conn.user
        )
        if own >= user_limit:
            raise ConnectionError_(
                NOT_ALLOWED,
                f"connection refused for user '{conn.user}': "
                f"user connection limit ({user_limit}) is reached",
                10,
                40,
            )
    if not conn.broker.access.can_access_vhost(conn.user, vhost.name):
        raise ConnectionError_(
            NOT_ALLOWED,
            f"access to vhost '{vhost.name}' refused for user '{conn.user}'",
            10,
            40,
        )
    conn.vhost = vhost
    conn.opened_at = conn.broker.timers.now()
    if conn.handshake_timer is not None:
        conn.handshake_timer.cancel()
        conn.handshake_timer = None
    conn.send_method(0, commands.Connection.OpenOk())
    conn.broker.connection_opened(conn)
    conn.broker.log.info("connection opened", **conn.describe())


def timed_out(conn: Connection) -> None:
    conn.handshake_timer = None
    if conn.opened_at is None and conn.protocol.state is not CLOSED:
        conn.broker.log.info("handshake timeout", peer=conn.peer)
        conn.close_transport()


# ---- after the handshake: the user's channel limit at channel.open ----


def check_user_channels(conn: Connection, limit: int) -> None:
    """rabbit_reader:is_over_limits/1: the user's open channels on every connection; a
    refusal closes the connection (530, no method named)."""
    user = conn.user
    count = sum(
        1
        for c in conn.broker.connections
        if c.user == user
        for ch in c.channels.values()
        if not ch.closed
    )
    if count >= limit:
        raise ConnectionError_(
            NOT_ALLOWED,
            f"number of channels opened for user '{user}' has reached "
            f"the maximum allowed user limit of {limit}",
        )


# ---- heartbeats, at the interval tune settled ----


def schedule_heartbeat(conn: Connection) -> None:
    # tick twice per interval: send when we were quiet, count the client's quiet ticks
    conn.heartbeat_handle = conn.broker.timers.call_later(
        conn.heartbeat / 2, lambda: _heartbeat_tick(conn)
    )


def _heartbeat_tick(conn: Connection) -> None:
    if conn.protocol.state is CLOSED:
        return
    if conn.received or conn.flow.stopped:  # what we do not read, we cannot hear
        conn.silent_ticks = 0
        conn.received = False
    else:
        conn.silent_ticks += 1
        if conn.silent_ticks >= 4:  # two whole intervals without a byte
            conn.close_reason = "missed heartbeats"
            conn.close_transport()
            return
    if not conn.sent:
        conn.transport.write(HEARTBEAT_FRAME)
    conn.sent = False
    schedule_heartbeat(conn)


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value or "").encode()


# ---- the rest of the connection class ----


def connection_method(conn: Connection, method: Any) -> None:
    # the protocol lets each handshake step through once, in order, and refuses the rest
    if isinstance(method, commands.Connection.StartOk):
        start_ok(conn, method)
    elif isinstance(method, commands.Connection.TuneOk):
        if conn.protocol.heartbeat:  # the protocol has checked and applied the tuning
            schedule_heartbeat(conn)
    elif isinstance(method, commands.Connection.Open):
        connection_open(conn, method)
    elif isinstance(method, commands.Connection.Close):
        conn.close_reason = f"client closed: {method.reply_code} {method.reply_text}"
        for channel in conn.channels.values():
            channel.flush_confirms()  # owed confirms go before close-ok
        conn.send_method(0, commands.Connection.CloseOk())
        conn.release_all()
        conn.flush()
        _await_client_close(conn)
    elif isinstance(method, commands.Connection.CloseOk):
        conn.close_transport()
    elif isinstance(method, commands.Connection.UpdateSecret):
        conn.send_method(0, commands.Connection.UpdateSecretOk())


def _await_client_close(conn: Connection) -> None:
    """Leave closing the socket to the client, as RabbitMQ does after close-ok.

    A client that closes one connection from several threads at once then sees no
    reset or EOF error. Only connection.close (answered again) and close-ok are
    read meanwhile; a client that never closes loses the socket after the bound.
    """
    if conn.close_timer is None:
        beat = conn.heartbeat
        bound = beat if 0 < beat < CLOSING_TIMEOUT else CLOSING_TIMEOUT
        conn.close_timer = conn.broker.timers.call_later(bound, conn.close_transport)


def block(conn: Connection) -> None:
    """Stop reading a publishing connection while an alarm is on (RabbitMQ's blocking)."""
    conn.blocked = True
    if conn.capabilities.get("connection.blocked") is True and conn.protocol.state is OPEN:
        reason = "low on memory" if "memory" in conn.broker.alarms else "low on disk"
        conn.send_method(0, commands.Connection.Blocked(reason=reason))
    conn.flow.pause(ALARM)


def unblock(conn: Connection) -> None:
    conn.blocked = False
    if conn.capabilities.get("connection.blocked") is True and conn.protocol.state is OPEN:
        conn.send_method(0, commands.Connection.Unblocked())
    if conn.flow.clear(ALARM):
        conn.resume()  # what was read before the block
