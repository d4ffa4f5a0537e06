"""The broker: settings, virtual hosts, users and the live connections."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import structlog

from warren.broker.alarms import ResourceMonitor
from warren.broker.auth import AccessControl
from warren.broker.persistence import Persistence
from warren.broker.timers import Timers
from warren.broker.tracing import Tracing
from warren.broker.vhost import VirtualHost
from warren.config import Settings

if TYPE_CHECKING:
    from warren.broker.channel import Channel
    from warren.broker.connection import Connection


class BrokerStats:
    """Cumulative message counters (Prometheus' rabbitmq_global_messages_*_total)."""

    __slots__ = (
        "acked",
        "confirmed",
        "consumer_timeouts",
        "dead_lettered",
        "delivered",
        "expired",
        "received",
        "redelivered",
        "retried",
        "routed",
        "unroutable_dropped",
        "unroutable_returned",
    )

    def __init__(self) -> None:
        self.received = 0
        self.routed = 0
        self.unroutable_dropped = 0
        self.unroutable_returned = 0
        self.delivered = 0
        self.redelivered = 0
        self.acked = 0
        self.confirmed = 0
        self.consumer_timeouts = 0
        self.expired = 0
        self.retried = 0
        self.dead_lettered: dict[str, int] = {}  # by reason

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


class Broker:
    def __init__(self, settings: Settings | None = None, timers: Timers | None = None) -> None:
        self.settings = settings or Settings()
        self.timers = timers or Timers()
        self.log: Any = structlog.get_logger("warren")
        self.vhosts: dict[str, VirtualHost] = {}
        self.access = AccessControl()
        settings = self.settings
        self.access.add_user(
            settings.default_user, settings.default_pass, tags=settings.default_user_tags
        )
        self.persistence: Persistence | None = None
        self.alarms: set[str] = set()  # "memory", "disk": publishers are blocked while any is on
        self.monitor = ResourceMonitor(self)
        self.stats = BrokerStats()
        self.started_at = time.time()
        self.connections: set[Connection] = set()
        self.reply_channels: dict[str, Channel] = {}  # direct reply-to token -> channel
        self.tracing = Tracing(self.settings, self.timers)
        self.add_vhost(settings.default_vhost)
        self.access.set_permissions(
            settings.default_user, settings.default_vhost, *settings.default_permissions
        )

    def add_vhost(self, name: str, persist: bool = True) -> VirtualHost:
        vhost = self.vhosts.get(name)
        if vhost is None:
            vhost = self.vhosts[name] = VirtualHost(
                name, self.timers, self.settings.consumer_timeout
            )
            vhost.persistence = self.persistence
            vhost.stats = self.stats
            self.tracing.attach(vhost)
            if persist and self.persistence is not None:
                self.persistence.vhost_added(name)
        return vhost

    def open_store(self) -> None:
        """Open the data directory and rebuild what it holds (before listening)."""
        data_dir = self.settings.data_dir
        if not data_dir:
            return
        self.persistence = Persistence(data_dir, self.log, segment_size=self.settings.segment_size)
        self.persistence.restore(self)
        self.access.persistence = self.persistence
        for vhost in self.vhosts.values():
            vhost.persistence = self.persistence
        # a dead store writer blocks publishers, as a full disk would (alarm set until restart)
        self.persistence.messages.on_failure = lambda _: self.set_alarm("message_store", True)
        self.persistence.start(self.timers.loop)

    def close_store(self) -> None:
        if self.persistence is not None:
            self.persistence.close()
            self.persistence = None

    def delete_vhost(self, name: str) -> bool:
        """Delete a vhost: its connections are closed (320), its queues and exchanges go."""
        vhost = self.vhosts.pop(name, None)
        if vhost is None:
            return False
        self.tracing.disable(vhost)
        # RabbitMQ 4.3's order (rabbit_vhost.erl): the queues go first, so their consumers
        # get basic.cancel, then the connections are closed
        for queue in list(vhost.queues.values()):
            vhost.delete_queue(queue)
        for connection in list(self.connections):
            if connection.vhost is vhost:
                connection.force_close(f"vhost '{name}' is deleted")
        for user, vhost_name in list(self.access.permissions):
            if vhost_name == name:
                self.access.clear_permissions(user, vhost_name)
        if self.persistence is not None:
            self.persistence.vhost_deleted(name)
        return True

    def set_alarm(self, name: str, active: bool) -> None:
        if active == (name in self.alarms):
            return
        if active:
            self.alarms.add(name)
        else:
            self.alarms.discard(name)
        self.log.warning(
            "resource alarm " + ("set" if active else "cleared"),
            alarm=name,
            memory_used=self.monitor.memory_used,
            memory_limit=self.monitor.memory_limit,
            disk_free=self.monitor.disk_free,
            disk_limit=self.monitor.disk_limit,
        )
        for connection in list(self.connections):
            connection.alarms_changed()

    def default_vhost_obj(self) -> VirtualHost:
        vhost = self.vhosts.get(self.settings.default_vhost)
        return vhost if vhost is not None else self.add_vhost(self.settings.default_vhost)

    def authenticate(self, user: str, password: str) -> bool:
        return self.access.authenticate(user, password) is not None

    def connection_opened(self, connection: Connection) -> None:
        self.connections.add(connection)

    def connection_closed(self, connection: Connection) -> None:
        self.connections.discard(connection)
