"""Topic permissions: per (user, vhost, exchange), a write and a read pattern on routing keys.

RabbitMQ 4.3 (rabbit_auth_backend_internal:check_topic_access/4,
rabbit_channel:check_topic_authorisation/5):
- only exchanges of type ``topic`` are checked; write on basic.publish (each of the
  message's routing keys: the routing key, then CC and BCC), read on queue.bind,
  queue.unbind, exchange.bind and exchange.unbind (the binding key);
- no topic permission for the (user, vhost, exchange): allowed;
- an empty pattern is ``^$``; patterns match anywhere (unanchored);
- ``{username}`` and ``{vhost}`` in a pattern are replaced by the connection's, escaped as
  regex literals (expand_topic_permission/2). Other variables come from the connection's
  AMQP params, which only direct connections (MQTT, STOMP) have: a network AMQP 0-9-1 channel
  gets none (rabbit_channel_sup:start_link/1, ``tcp``), so ``{client_id}`` stays as written;
- a refusal is ``403 ACCESS_REFUSED - write access to topic 'k' in exchange 'x' in vhost 'v'
  refused for user 'u'`` (rabbit_access_control:check_topic_access/4), a channel error.

A channel asks for its rule once per exchange and permissions version (broker/engine/
channel.py), so a publisher without topic permissions pays one attribute test per message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from warren.protocol.constants import ACCESS_REFUSED
from warren.protocol.errors import ChannelError


@dataclass(frozen=True)
class TopicPermission:
    exchange: str
    write: str
    read: str


def validate_pattern(pattern: str) -> str | None:
    """re's complaint about ``pattern``, or None if it compiles."""
    try:
        re.compile(pattern)
    except re.error as exc:
        return str(exc)
    return None


def _expand(pattern: str, user: str, vhost: str) -> re.Pattern[str]:
    if pattern == "":
        pattern = "^$"
    pattern = pattern.replace("{username}", re.escape(user)).replace("{vhost}", re.escape(vhost))
    return re.compile(pattern)


class TopicRule:
    """One user's topic permission on one exchange, expanded for its connection."""

    __slots__ = ("exchange", "read", "user", "vhost", "write")

    def __init__(self, permission: TopicPermission, user: str, vhost: str) -> None:
        self.exchange = permission.exchange
        self.user = user
        self.vhost = vhost
        self.write = _expand(permission.write, user, vhost)
        self.read = _expand(permission.read, user, vhost)

    def check(self, kind: str, routing_key: str) -> None:
        pattern = self.write if kind == "write" else self.read
        if pattern.search(routing_key) is None:
            raise ChannelError(
                ACCESS_REFUSED,
                f"{kind} access to topic '{routing_key}' in exchange '{self.exchange}' "
                f"in vhost '{self.vhost}' refused for user '{self.user}'",
            )

    def check_publish(
        self, routing_key: str, sender_keys: tuple[list[str], list[str]] | None
    ) -> None:
        """mc:routing_keys/1 of an AMQP 0-9-1 message: its routing key, then CC, then BCC."""
        self.check("write", routing_key)
        if sender_keys is not None:
            for key in (*sender_keys[0], *sender_keys[1]):
                self.check("write", key)
