"""Users, password hashes, tags and per-vhost permissions, checked the way RabbitMQ does.

Password hashes use RabbitMQ's format (base64 of a 4-octet salt followed by
SHA-256(salt + password)), so users exported from RabbitMQ import as they are.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from warren.broker.engine.stats import Version
from warren.broker.engine.topic_permissions import TopicPermission, TopicRule
from warren.protocol.constants import ACCESS_REFUSED
from warren.protocol.errors import ChannelError

if TYPE_CHECKING:
    from warren.broker.engine.persistence import Persistence

HASHING_ALGORITHM = "rabbit_password_hashing_sha256"
TAGS = ("administrator", "monitoring", "management", "policymaker", "impersonator")


class InternalUser(str):
    """The user of an in-process connection that names none (a shovel's ``amqp://``): RabbitMQ's
    direct connections as ``none`` (rabbit_auth_backend_dummy:user/0) may do anything. A type
    of its own, so that no user created over the API or definitions can be mistaken for it."""


INTERNAL_USER = InternalUser("none")


def hash_password(password: str, salt: bytes | None = None) -> str:
    salt = os.urandom(4) if salt is None else salt
    digest = hashlib.sha256(salt + password.encode()).digest()
    return base64.b64encode(salt + digest).decode()


def password_matches(password_hash: str, password: str) -> bool:
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except ValueError:
        return False
    if len(raw) != 36:
        return False
    expected = hash_password(password, raw[:4])
    return hmac.compare_digest(expected.encode(), password_hash.encode())


@dataclass
class User:
    name: str
    password_hash: str
    tags: tuple[str, ...] = ()

    def check_password(self, password: str) -> bool:
        return bool(self.password_hash) and password_matches(self.password_hash, password)


@dataclass
class Permission:
    configure: str = ".*"
    write: str = ".*"
    read: str = ".*"
    _compiled: dict[str, re.Pattern[str]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for kind in ("configure", "write", "read"):
            self._compiled[kind] = re.compile(getattr(self, kind))

    def allows(self, kind: str, name: str) -> bool:
        # RabbitMQ runs the regex unanchored; an empty pattern grants nothing
        pattern = self._compiled[kind]
        return pattern.pattern != "" and pattern.search(name) is not None


_DUMMY_HASH = hash_password("no such user")


class AccessControl:
    def __init__(self) -> None:
        self.users: dict[str, User] = {}
        self.permissions: dict[tuple[str, str], Permission] = {}  # (user, vhost)
        # (user, vhost) -> exchange -> its topic permission (broker/engine/topic_permissions.py)
        self.topic_permissions: dict[tuple[str, str], dict[str, TopicPermission]] = {}
        # user -> {"max-connections": n, "max-channels": n} (rabbit_auth_backend_internal)
        self.user_limits: dict[str, dict[str, int]] = {}
        # bumped on every change, so channels can cache decisions; connections keep it
        self.changes = Version()
        self.persistence: Persistence | None = None  # when there is a data dir

    @property
    def version(self) -> int:
        return self.changes.n

    @version.setter
    def version(self, value: int) -> None:
        self.changes.n = value

    def add_user(
        self,
        name: str,
        password: str | None = None,
        *,
        password_hash: str | None = None,
        tags: tuple[str, ...] = (),
        persist: bool = True,
    ) -> User:
        if password_hash is None:
            password_hash = hash_password(password) if password else ""
        user = User(name, password_hash, tags)
        self.users[name] = user
        self.version += 1
        if persist and self.persistence is not None:
            self.persistence.user_saved(user)
        return user

    def delete_user(self, name: str) -> bool:
        removed = self.users.pop(name, None) is not None
        for key in [k for k in self.permissions if k[0] == name]:
            del self.permissions[key]
        for key in [k for k in self.topic_permissions if k[0] == name]:
            del self.topic_permissions[key]
        self.user_limits.pop(name, None)
        self.version += 1
        if removed and self.persistence is not None:
            self.persistence.user_deleted(name)  # its permissions, topic ones and limits too
        return removed

    def authenticate(self, name: str, password: str) -> User | None:
        user = self.users.get(name)
        if user is None:
            # the same hash and comparison as for a known user: no timing oracle for names
            password_matches(_DUMMY_HASH, password)
            return None
        return user if user.check_password(password) else None

    def set_permissions(
        self, user: str, vhost: str, configure: str, write: str, read: str, persist: bool = True
    ) -> None:
        self.permissions[(user, vhost)] = Permission(configure, write, read)
        self.version += 1
        if persist and self.persistence is not None:
            self.persistence.permission_saved(user, vhost, configure, write, read)

    def clear_permissions(self, user: str, vhost: str) -> bool:
        removed = self.permissions.pop((user, vhost), None) is not None
        self.version += 1
        if removed and self.persistence is not None:
            self.persistence.permission_deleted(user, vhost)
        return removed

    # ---- topic permissions ----

    def set_topic_permission(
        self, user: str, vhost: str, permission: TopicPermission, persist: bool = True
    ) -> None:
        self.topic_permissions.setdefault((user, vhost), {})[permission.exchange] = permission
        self.version += 1  # channels ask for their rules again
        if persist and self.persistence is not None:
            self.persistence.definitions.save_topic_permission(
                user, vhost, permission.exchange, permission.write, permission.read
            )

    def clear_topic_permissions(self, user: str, vhost: str, exchange: str | None = None) -> bool:
        """Clear one exchange's topic permission, or all of (user, vhost); False if none."""
        current = self.topic_permissions.get((user, vhost))
        if not current or (exchange is not None and exchange not in current):
            return False
        if exchange is None:
            current.clear()
        else:
            del current[exchange]
        if not current:
            del self.topic_permissions[(user, vhost)]
        self.version += 1
        if self.persistence is not None:
            self.persistence.definitions.delete_topic_permissions(user, vhost, exchange)
        return True

    def vhost_deleted(self, vhost: str) -> None:
        """A deleted vhost's topic permissions go with it (its store rows go with the vhost's)."""
        for key in [k for k in self.topic_permissions if k[1] == vhost]:
            del self.topic_permissions[key]
        self.version += 1

    def topic_rule(self, user: str, vhost: str, exchange: str) -> TopicRule | None:
        """The rule a channel checks routing keys against on ``exchange``; None: no checks."""
        per_vhost = self.topic_permissions.get((user, vhost))
        permission = per_vhost.get(exchange) if per_vhost else None
        return TopicRule(permission, user, vhost) if permission is not None else None

    # ---- user limits ----

    def set_user_limits(self, user: str, limits: dict[str, int], persist: bool = True) -> None:
        if limits:
            self.user_limits[user] = dict(limits)
        else:
            self.user_limits.pop(user, None)
        if persist and self.persistence is not None:
            self.persistence.definitions.save_user_limits(user, limits)

    def user_limit(self, user: str, name: str) -> int | None:
        """A limit in force (rabbit_auth_backend_internal:get_user_limit/2: negative is none)."""
        limits = self.user_limits.get(user)
        value = limits.get(name) if limits else None
        return value if value is not None and value >= 0 else None

    def can_access_vhost(self, user: str, vhost: str) -> bool:
        return (user, vhost) in self.permissions or type(user) is InternalUser

    def check(self, user: str, vhost: str, kind: str, resource: str, name: str) -> None:
        """Raise 403 unless ``user`` has ``kind`` (configure/write/read) on the resource."""
        if type(user) is InternalUser:
            return
        permission = self.permissions.get((user, vhost))
        if permission is None or not permission.allows(kind, name):
            raise ChannelError(
                ACCESS_REFUSED,
                f"access to {resource} '{name}' in vhost '{vhost}' refused for user '{user}'",
            )
