"""The broker: settings, virtual hosts, users and the live connections."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog

from broker.auth import AccessControl
from broker.timers import Timers
from broker.vhost import VirtualHost
from config import Settings

if TYPE_CHECKING:
    from broker.channel import Channel
    from broker.connection import Connection


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
        self.connections: set[Connection] = set()
        self.reply_channels: dict[str, Channel] = {}  # direct reply-to token -> channel
        self.add_vhost(settings.default_vhost)
        self.access.set_permissions(
            settings.default_user, settings.default_vhost, *settings.default_permissions
        )

    def add_vhost(self, name: str) -> VirtualHost:
        vhost = self.vhosts.get(name)
        if vhost is None:
            vhost = self.vhosts[name] = VirtualHost(
                name, self.timers, self.settings.consumer_timeout
            )
        return vhost

    def default_vhost_obj(self) -> VirtualHost:
        return self.vhosts[self.settings.default_vhost]

    def authenticate(self, user: str, password: str) -> bool:
        return self.access.authenticate(user, password) is not None

    def connection_opened(self, connection: Connection) -> None:
        self.connections.add(connection)

    def connection_closed(self, connection: Connection) -> None:
        self.connections.discard(connection)
