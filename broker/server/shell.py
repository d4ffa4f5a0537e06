"""The asyncio shell: sockets in, bytes to the connection, bytes out.

Nothing here knows AMQP; ``broker.server.amqp_connection.Connection`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from typing import Any

from warren.broker.engine.broker import Broker
from warren.broker.engine.timers import Timers
from warren.broker.ops.management.core import Management
from warren.broker.ops.shovel import Shovels
from warren.broker.server.amqp_connection import Connection
from warren.broker.server.listen import display_host, listen_sockets, naming
from warren.config import Settings


class AMQPServerProtocol(asyncio.Protocol):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.connection: Connection | None = None

    def connection_made(self, transport: Any) -> None:  # uvloop's transports are not subclasses
        if not admit(self.broker):
            transport.abort()  # its descriptor is back at once; no byte was read or written
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # bounded output per connection: past this the consumer's deliveries pause
        transport.set_write_buffer_limits(high=4 * 1024 * 1024, low=1024 * 1024)
        peer = transport.get_extra_info("peername")
        self.connection = Connection(
            self.broker, transport, (display_host(peer[0]), peer[1]) if peer else None
        )
        self.broker.connections.add(self.connection)

    def data_received(self, data: bytes) -> None:
        assert self.connection is not None
        self.connection.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.connection is not None:
            self.connection.connection_lost()

    def pause_writing(self) -> None:
        if self.connection is not None:
            self.connection.pause_writing()

    def resume_writing(self) -> None:
        if self.connection is not None:
            self.connection.resume_writing()


def admit(broker: Broker, handshake: bool = True) -> bool:
    """Whether a connection just accepted may stay: not while ``warren.handshake_max``
    connections are still in their handshake (not authenticated yet), nor while fewer
    than ``warren.descriptor_reserve`` descriptors are free (the message store, the
    definitions database and the resource monitor need them). A refused one is closed
    at once, before anything is read: a flood of idle sockets cannot take the last
    descriptors, nor keep the ones it has past handshake_timeout. The HTTP listeners
    (management, Prometheus) ask with ``handshake=False``: the reserve holds for them
    too, their connections have no AMQP handshake to count."""
    settings = broker.settings
    monitor = broker.monitor
    reason = ""
    if handshake and broker.handshaking >= settings.handshake_max:
        reason = f"{broker.handshaking} connections are in their handshake (handshake_max)"
    elif monitor.descriptors_used + settings.descriptor_reserve >= monitor.descriptor_limit:
        reason = (
            f"fewer than {settings.descriptor_reserve} descriptors free "
            f"(descriptor_reserve; {monitor.descriptors_used} of {monitor.descriptor_limit} open)"
        )
    else:
        monitor.descriptors_used += 1  # counted again at the next check
        if broker.refusing:
            broker.log.warning("accepting connections again")
            broker.refusing = ""
        return True
    if reason != broker.refusing:  # once a spell, not once a connection
        broker.log.warning("refusing new connections", reason=reason)
        broker.refusing = reason
    broker.refused_connections += 1
    return False


def tls_context(settings: Settings) -> ssl.SSLContext:
    """The server side of ``ssl_options.*``, as RabbitMQ reads them.

    verify_none asks for no client certificate; verify_peer asks for one and
    checks it against cacertfile, and fail_if_no_peer_cert refuses a client
    that has none. Protocol versions and ciphers are Python's defaults (TLS 1.2+).
    """
    if not settings.ssl_certfile or not settings.ssl_keyfile:
        raise ValueError("a TLS listener needs ssl_options.certfile and ssl_options.keyfile")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(settings.ssl_certfile, settings.ssl_keyfile)
    if settings.ssl_cacertfile:
        context.load_verify_locations(settings.ssl_cacertfile)
    if settings.ssl_verify == "verify_peer":
        required = settings.ssl_fail_if_no_peer_cert
        context.verify_mode = ssl.CERT_REQUIRED if required else ssl.CERT_OPTIONAL
    else:
        context.verify_mode = ssl.CERT_NONE
    return context


class Server:
    """A broker with its TCP and TLS listeners on the running loop."""

    def __init__(self, settings: Settings, clock: Timers | None = None) -> None:
        self.settings = settings
        # ``clock``: broker time that outlives this server (the test kit's restart)
        self.broker = Broker(settings, Timers(asyncio.get_running_loop()), clock)
        self.servers: list[asyncio.AbstractServer] = []
        self.tls_servers: list[asyncio.AbstractServer] = []  # kept apart: .addresses is AMQP
        self.management = Management(self.broker)
        self.http_sites: list[Any] = []  # broker.ops.management.app.HttpSite
        # dynamic shovels: validated from the start (recovery, definitions), run once listening
        self.shovels = Shovels(self.management, self.open_direct)
        self.broker.parameters.register(self.shovels)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.broker.open_store()  # recover before the first client can see anything
        self.broker.monitor.start()
        if self.settings.load_definitions:
            from warren.broker.ops.management.definitions import load_definitions

            load_definitions(self.management, self.settings.load_definitions)
        for listener in self.settings.listeners:
            where = (listener.host, listener.port, f"listeners.tcp.{listener.name}", "--port")
            with naming(*where):
                socks = listen_sockets(listener.host, listener.port)
            for sock in socks:
                server = await loop.create_server(
                    lambda: AMQPServerProtocol(self.broker), sock=sock, backlog=1024
                )
                self.servers.append(server)
        if self.settings.ssl_listeners:
            context = tls_context(self.settings)
            for listener in self.settings.ssl_listeners:
                setting = f"listeners.ssl.{listener.name}"
                with naming(listener.host, listener.port, setting, ""):
                    socks = listen_sockets(listener.host, listener.port)
                for sock in socks:
                    server = await loop.create_server(
                        lambda: AMQPServerProtocol(self.broker),
                        sock=sock,
                        backlog=1024,
                        ssl=context,
                        # a peer that stalls the TLS handshake is dropped like a slow AMQP one
                        ssl_handshake_timeout=self.settings.handshake_timeout / 1000,
                    )
                    self.tls_servers.append(server)
        await self._start_http()
        self.shovels.start()

    async def open_direct(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A client connection to this broker with no listener in between (a socket pair):
        RabbitMQ's direct connection, which a shovel's ``amqp://`` URI asks for."""
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        try:
            _, protocol = await loop.connect_accepted_socket(
                lambda: AMQPServerProtocol(self.broker), theirs
            )
        except BaseException:
            ours.close()
            theirs.close()
            raise
        if protocol.connection is None:  # refused by admit(): no descriptor to spare
            ours.close()
            raise ConnectionRefusedError("the broker refuses new connections")
        protocol.connection.direct = True
        return await asyncio.open_connection(sock=ours)

    async def _start_http(self) -> None:
        """The management API and Prometheus metrics, on this loop (port 0: a free port)."""
        settings = self.settings
        mgmt = self.management
        mgmt.listeners = self.addresses
        if settings.management_port is not None:
            from warren.broker.ops.management.api import management_app  # aiohttp only when used

            site = management_app(mgmt, lambda: admit(self.broker, handshake=False))
            self.http_sites.append(site)
            where = (settings.management_ip, settings.management_port)
            with naming(*where, "management.tcp.port", "--management-port"):
                mgmt.management_port = await site.start(*where)
        if settings.prometheus_port is not None:
            from warren.broker.ops.management.app import HttpSite
            from warren.broker.ops.metrics import MetricsApp

            site = HttpSite(MetricsApp(mgmt).app, lambda: admit(self.broker, handshake=False))
            self.http_sites.append(site)
            where = (settings.prometheus_ip, settings.prometheus_port)
            with naming(*where, "prometheus.tcp.port", "--prometheus-port"):
                mgmt.prometheus_port = await site.start(*where)
        if self.http_sites:
            mgmt.rates.start()

    @property
    def management_port(self) -> int | None:
        return self.management.management_port

    @property
    def prometheus_port(self) -> int | None:
        return self.management.prometheus_port

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return _addresses(self.servers)

    @property
    def tls_addresses(self) -> list[tuple[str, int]]:
        return _addresses(self.tls_servers)

    async def stop(self) -> None:
        """Stop listening, close every client with 320 CONNECTION_FORCED, and wait briefly."""
        await self.shovels.stop()
        for server in self.servers + self.tls_servers:
            server.close()
        await self.management.rates.stop()
        for site in self.http_sites:
            await site.stop()
        self.http_sites.clear()
        for connection in list(self.broker.connections):
            connection.force_close()
        for server in self.servers + self.tls_servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 0.5)
        for connection in list(self.broker.connections):
            connection.connection_lost()
            connection.transport.close()
        self.broker.monitor.stop()
        self.broker.tracing.close()  # after the connections: their channels' events are in
        self.broker.close_store()


def _addresses(servers: list[asyncio.AbstractServer]) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for server in servers:
        for sock in getattr(server, "sockets", ()):
            name: Any = sock.getsockname()
            out.append((name[0], name[1]))
    return out
