"""The broker: settings, virtual hosts, users and the live connections."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from warren.broker.engine.alarms import ResourceMonitor
from warren.broker.engine.arrivals import Ticks
from warren.broker.engine.deprecated import DeprecatedFeatures
from warren.broker.engine.global_parameters import GlobalParameters
from warren.broker.engine.interceptors import incoming
from warren.broker.engine.limits import VhostLimits
from warren.broker.engine.operator_policy import OperatorPolicies
from warren.broker.engine.parameters import Parameters
from warren.broker.engine.persistence import Persistence
from warren.broker.engine.reaper import Reaper
from warren.broker.engine.stats import BrokerStats, ChannelStats
from warren.broker.engine.timers import STAMP_EVERY, ManualTimers, Timers
from warren.broker.engine.users import AccessControl
from warren.broker.engine.vhost import VirtualHost
from warren.broker.tracing.tracer import Tracing
from warren.config import Settings

if TYPE_CHECKING:
    from warren.broker.engine.channel import Channel
    from warren.broker.server.amqp_connection import Connection


class VhostObserver(Protocol):
    """Something attached to every vhost while it exists (the test kit's recording)."""

    def attach(self, vhost: VirtualHost) -> None: ...

    def detach(self, vhost: VirtualHost) -> None: ...


class Broker:
    def __init__(
        self,
        settings: Settings | None = None,
        timers: Timers | None = None,
        clock: Timers | None = None,
    ) -> None:
        self.settings = settings or Settings()
        # message_interceptors.incoming.*: None (the default) costs a publish one test
        self.intercept = incoming(self.settings)
        self.timers = timers or Timers()  # real time: connections and resource checks
        # real time, so that a test's manual broker clock counts no timer of theirs
        self.ticks = Ticks(self.timers, STAMP_EVERY)
        if clock is None and self.settings.clock not in ("real", "manual"):
            raise ValueError(f"clock: expected 'real' or 'manual', got {self.settings.clock!r}")
        if clock is None:
            clock = ManualTimers() if self.settings.clock == "manual" else self.timers
        # broker time (broker/engine/timers.py): what messages and queues wait for, in every vhost
        self.clock: Timers = clock
        # attached to each vhost as it is made, by name (Broker.observe); none in warren-server
        self.observers: dict[str, VhostObserver] = {}
        # seconds a publishing connection's reads wait to take several segments at once
        # (server/amqp_connection.py); the test kit's recording turns it off
        self.read_coalescing = self.settings.read_coalescing_interval / 1000
        # connections with events left for the next loop turn (server/amqp_connection.py):
        # while there are any, a stream of deliveries is written once for several turns
        self.backlog = 0
        self.log: Any = structlog.get_logger("warren")
        self.deprecated = DeprecatedFeatures(self.settings.deprecated_features_permit, self.log)
        self.vhosts: dict[str, VirtualHost] = {}
        self.access = AccessControl()
        self.parameters = Parameters()  # runtime parameters and their components
        self.parameters.register(VhostLimits(self.vhosts))
        self.parameters.register(OperatorPolicies(self.vhosts))
        self.global_parameters = GlobalParameters()  # cluster_name and others
        settings = self.settings
        self.access.add_user(
            settings.default_user, settings.default_pass, tags=settings.default_user_tags
        )
        self.persistence: Persistence | None = None
        self.alarms: set[str] = set()  # "memory", "disk": publishers are blocked while any is on
        self.monitor = ResourceMonitor(self)
        self.stats = BrokerStats()
        self.stats.track_auth_attempt_source = settings.track_auth_attempt_source
        self.started_at = time.time()
        self.connections: set[Connection] = set()
        self.handshaking = 0  # connections not authenticated yet (warren.handshake_max)
        self.refusing = ""  # why new connections are closed at once now (broker/server/shell.py)
        self.refused_connections = 0
        self.reply_channels: dict[str, Channel] = {}  # direct reply-to token -> channel
        self.tracing = Tracing(self.settings, self.timers)
        self.reaper = Reaper(self.timers)  # broker/engine/reaper.py
        self._unopened_vhost: VirtualHost | None = None  # see default_vhost_obj
        self.add_vhost(settings.default_vhost)
        self.access.set_permissions(
            settings.default_user, settings.default_vhost, *settings.default_permissions
        )

    def add_vhost(self, name: str, persist: bool = True) -> VirtualHost:
        vhost = self.vhosts.get(name)
        if vhost is None:
            vhost = self.vhosts[name] = VirtualHost(
                name, self.clock, self.settings.consumer_timeout
            )
            vhost.ticks = self.ticks
            vhost.persistence = self.persistence
            vhost.reaper = self.reaper
            vhost.stats = self.stats
            vhost.deprecated = self.deprecated
            vhost.default_queue_type = self.settings.default_queue_type
            vhost.relaxed_quorum_redeclare = self.settings.quorum_relaxed_checks_on_redeclaration
            if not self.settings.local_random_exchange_enabled:
                vhost.disabled_exchange_types = frozenset({"x-local-random"})
            self.tracing.attach(vhost)
            for observer in self.observers.values():
                observer.attach(vhost)
            if persist and self.persistence is not None:
                self.persistence.vhost_added(name, vhost.default_queue_type)
        return vhost

    def observe(self, name: str, observer: VhostObserver | None) -> None:
        """Attach ``observer`` to every vhost, now and as they are made (None: detach it)."""
        old = self.observers.pop(name, None)
        if old is not None:
            for vhost in self.vhosts.values():
                old.detach(vhost)
        if observer is not None:
            self.observers[name] = observer
            for vhost in self.vhosts.values():
                observer.attach(vhost)

    def open_store(self) -> None:
        """Open the data directory and rebuild what it holds (before listening)."""
        data_dir = self.settings.data_dir
        if not data_dir:
            return
        self.persistence = Persistence(
            data_dir, self.log, clock=self.clock, segment_size=self.settings.segment_size
        )
        self.persistence.restore(self)
        self.access.persistence = self.persistence
        self.parameters.persistence = self.persistence
        self.global_parameters.persistence = self.persistence
        for vhost in self.vhosts.values():
            vhost.persistence = self.persistence
        # a store writer that cannot write blocks publishers, as a full disk would; the alarm
        # clears once it writes again (after a restart if the writer died of something else
        # than an OSError)
        store = self.persistence.messages
        store.on_failure = lambda _: self.set_alarm("message_store", True)
        store.on_recovery = lambda: self.set_alarm("message_store", False)
        store.compactor.low_on_disk = lambda: "disk" in self.alarms
        store.compactor.disk_free_limit = self.settings.disk_free_limit_absolute
        self.persistence.start(self.timers.loop)

    def close_store(self) -> None:
        self.reaper.finish()  # the removal records of purged messages go first
        if self.persistence is not None:
            self.persistence.close()
            self.persistence = None

    def delete_vhost(self, name: str) -> bool:
        """Delete a vhost: its connections are closed (320), its queues and exchanges go."""
        vhost = self.vhosts.pop(name, None)
        if vhost is None:
            return False
        self.tracing.disable(vhost)
        for observer in self.observers.values():
            observer.detach(vhost)
        # RabbitMQ 4.3's order (rabbit_vhost.erl): the queues go first, so their consumers
        # get basic.cancel, then the connections are closed
        for queue in list(vhost.queues.values()):
            vhost.delete_queue(queue)
        for connection in list(self.connections):
            if connection.vhost is vhost:
                connection.force_close(f"vhost '{name}' is deleted")
        for exchange in vhost.exchanges.values():
            exchange.close()  # x-delayed-message: its timer and held messages go
        self.parameters.vhost_deleted(name)
        self.access.vhost_deleted(name)
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
        """What a connection points at until connection.open picks its vhost.

        Never one of ``vhosts``, never persisted: a TCP connection (even one whose login
        fails) must not bring back a default vhost an operator deleted.
        """
        if self._unopened_vhost is None:
            self._unopened_vhost = VirtualHost(
                self.settings.default_vhost, self.timers, self.settings.consumer_timeout
            )
        return self._unopened_vhost

    def authenticate(self, user: str, password: str) -> bool:
        return self.access.authenticate(user, password) is not None

    def connection_opened(self, connection: Connection) -> None:
        self.connections.add(connection)
        self.stats.connections_opened += 1

    def connection_closed(self, connection: Connection) -> None:
        self.connections.discard(connection)
        if connection.opened:  # as connections_opened_total counted it
            self.stats.connections_closed += 1

    def message_totals(self) -> ChannelStats:
        """The node's message counters: closed channels' and the API's, plus open channels'."""
        totals = ChannelStats()
        totals.add(self.stats)
        for connection in self.connections:
            for channel in connection.channels.values():
                if not channel.closed:
                    totals.add(channel.stats)
                    if channel.confirm:
                        totals.received_confirm += channel.confirms.seq
        return totals
