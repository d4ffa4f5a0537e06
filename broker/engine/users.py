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
        self.version = 0  # bumped on every change, so channels can cache decisions
        self.persistence: Persistence | None = None  # when there is a data dir

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
        self.version += 1
        if removed and self.persistence is not None:
            self.persistence.user_deleted(name)
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
