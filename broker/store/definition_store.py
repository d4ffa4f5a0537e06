"""Definitions (vhosts, users, permissions, policies, durable exchanges, queues, bindings): SQLite.

Each change is one committed transaction (WAL, synchronous=FULL) before the
client's -ok goes out. Definitions change rarely, so the write happens on the
event loop; the message log, which changes all the time, has its own thread.
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from warren.protocol.tables import decode_table, encode_table

SCHEMA = """
CREATE TABLE IF NOT EXISTS vhosts (name TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS vhost_queue_types (name TEXT PRIMARY KEY, default_queue_type TEXT);
CREATE TABLE IF NOT EXISTS users (name TEXT PRIMARY KEY, password_hash TEXT, tags TEXT);
CREATE TABLE IF NOT EXISTS permissions (
    user TEXT, vhost TEXT, configure TEXT, write TEXT, read TEXT, PRIMARY KEY (user, vhost));
CREATE TABLE IF NOT EXISTS policies (
    vhost TEXT, name TEXT, pattern TEXT, apply_to TEXT, priority INTEGER, definition TEXT,
    PRIMARY KEY (vhost, name));
CREATE TABLE IF NOT EXISTS exchanges (
    vhost TEXT, name TEXT, type TEXT, auto_delete INTEGER, internal INTEGER, arguments BLOB,
    PRIMARY KEY (vhost, name));
CREATE TABLE IF NOT EXISTS queues (
    id INTEGER PRIMARY KEY AUTOINCREMENT, vhost TEXT, name TEXT, auto_delete INTEGER,
    arguments BLOB, UNIQUE (vhost, name));
CREATE TABLE IF NOT EXISTS delayed_exchanges (
    id INTEGER PRIMARY KEY AUTOINCREMENT, vhost TEXT, name TEXT, UNIQUE (vhost, name));
CREATE TABLE IF NOT EXISTS parameters (
    vhost TEXT, component TEXT, name TEXT, value TEXT, PRIMARY KEY (vhost, component, name));
CREATE TABLE IF NOT EXISTS global_parameters (name TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS topic_permissions (
    user TEXT, vhost TEXT, exchange TEXT, write TEXT, read TEXT,
    PRIMARY KEY (user, vhost, exchange));
CREATE TABLE IF NOT EXISTS user_limits (user TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS bindings (
    vhost TEXT, source TEXT, destination_type TEXT, destination TEXT, routing_key TEXT,
    arguments BLOB, PRIMARY KEY (vhost, source, destination_type, destination, routing_key,
    arguments));
"""


def _blob(arguments: dict[str, Any]) -> bytes:
    return encode_table(dict(arguments))


def _table(blob: bytes) -> dict[str, Any]:
    return decode_table(blob, typed=True)[0] if blob else {}


@dataclass
class Definitions:
    vhosts: list[str] = field(default_factory=list)
    # each vhost's default_queue_type; none for a vhost stored by an older Warren
    vhost_queue_types: dict[str, str] = field(default_factory=dict)
    users: list[tuple[str, str, tuple[str, ...]]] = field(default_factory=list)
    permissions: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    policies: list[tuple[str, str, str, str, int, dict[str, Any]]] = field(default_factory=list)
    exchanges: list[tuple[str, str, str, bool, bool, dict[str, Any]]] = field(default_factory=list)
    queues: list[tuple[int, str, str, bool, dict[str, Any]]] = field(default_factory=list)
    bindings: list[tuple[str, str, str, str, str, dict[str, Any]]] = field(default_factory=list)
    # runtime parameters (broker/engine/parameters.py): (vhost, component, name, JSON value)
    parameters: list[tuple[str, str, str, Any]] = field(default_factory=list)
    global_parameters: list[tuple[str, Any]] = field(default_factory=list)
    topic_permissions: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    user_limits: list[tuple[str, dict[str, int]]] = field(default_factory=list)


class DefinitionStore:
    def __init__(self, directory: str) -> None:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self.path = os.path.join(directory, "definitions.sqlite3")
        self.fresh = not os.path.exists(self.path)
        self.db = sqlite3.connect(self.path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)

    def _run(self, sql: str, *params: Any) -> sqlite3.Cursor:
        return self.db.execute(sql, params)

    # ---- writes: each call is one transaction ----

    def save_vhost(self, name: str, queue_type: str) -> None:
        self.db.execute("BEGIN")  # one transaction, one sync
        self._run("INSERT OR IGNORE INTO vhosts VALUES (?)", name)
        self._run("INSERT OR REPLACE INTO vhost_queue_types VALUES (?, ?)", name, queue_type)
        self.db.execute("COMMIT")

    def save_vhost_queue_type(self, name: str, queue_type: str) -> None:
        self._run("INSERT OR REPLACE INTO vhost_queue_types VALUES (?, ?)", name, queue_type)

    def delete_vhost(self, name: str) -> None:
        self.db.execute("BEGIN")
        for table in ("vhosts", "vhost_queue_types"):
            self._run(f"DELETE FROM {table} WHERE name = ?", name)
        tables = (
            "permissions", "topic_permissions", "policies", "parameters", "exchanges",
            "delayed_exchanges", "queues", "bindings",
        )  # fmt: skip
        for table in tables:
            self._run(f"DELETE FROM {table} WHERE vhost = ?", name)
        self.db.execute("COMMIT")

    def save_user(self, name: str, password_hash: str, tags: tuple[str, ...]) -> None:
        self._run(
            "INSERT OR REPLACE INTO users VALUES (?, ?, ?)", name, password_hash, ",".join(tags)
        )

    def delete_user(self, name: str) -> None:
        self.db.execute("BEGIN")
        self._run("DELETE FROM users WHERE name = ?", name)
        self._run("DELETE FROM permissions WHERE user = ?", name)
        self._run("DELETE FROM topic_permissions WHERE user = ?", name)
        self._run("DELETE FROM user_limits WHERE user = ?", name)
        self.db.execute("COMMIT")

    def save_permission(self, user: str, vhost: str, configure: str, write: str, read: str) -> None:
        self._run(
            "INSERT OR REPLACE INTO permissions VALUES (?, ?, ?, ?, ?)",
            user,
            vhost,
            configure,
            write,
            read,
        )

    def delete_permission(self, user: str, vhost: str) -> None:
        self._run("DELETE FROM permissions WHERE user = ? AND vhost = ?", user, vhost)

    def save_policy(
        self,
        vhost: str,
        name: str,
        pattern: str,
        apply_to: str,
        priority: int,
        definition: dict[str, Any],
    ) -> None:
        self._run(
            "INSERT OR REPLACE INTO policies VALUES (?, ?, ?, ?, ?, ?)",
            vhost,
            name,
            pattern,
            apply_to,
            priority,
            json.dumps(definition),
        )

    def delete_policy(self, vhost: str, name: str) -> None:
        self._run("DELETE FROM policies WHERE vhost = ? AND name = ?", vhost, name)

    def save_parameter(self, vhost: str, component: str, name: str, value: Any) -> None:
        self._run(
            "INSERT OR REPLACE INTO parameters VALUES (?, ?, ?, ?)",
            vhost,
            component,
            name,
            json.dumps(value),
        )

    def delete_parameter(self, vhost: str, component: str, name: str) -> None:
        self._run(
            "DELETE FROM parameters WHERE vhost = ? AND component = ? AND name = ?",
            vhost,
            component,
            name,
        )

    def save_topic_permission(
        self, user: str, vhost: str, exchange: str, write: str, read: str
    ) -> None:
        self._run(
            "INSERT OR REPLACE INTO topic_permissions VALUES (?, ?, ?, ?, ?)",
            user,
            vhost,
            exchange,
            write,
            read,
        )

    def delete_topic_permissions(self, user: str, vhost: str, exchange: str | None) -> None:
        if exchange is None:
            self._run("DELETE FROM topic_permissions WHERE user = ? AND vhost = ?", user, vhost)
        else:
            self._run(
                "DELETE FROM topic_permissions WHERE user = ? AND vhost = ? AND exchange = ?",
                user,
                vhost,
                exchange,
            )

    def save_user_limits(self, user: str, limits: dict[str, int]) -> None:
        if limits:
            self._run("INSERT OR REPLACE INTO user_limits VALUES (?, ?)", user, json.dumps(limits))
        else:
            self._run("DELETE FROM user_limits WHERE user = ?", user)

    def save_global_parameter(self, name: str, value: Any) -> None:
        self._run("INSERT OR REPLACE INTO global_parameters VALUES (?, ?)", name, json.dumps(value))

    def delete_global_parameter(self, name: str) -> None:
        self._run("DELETE FROM global_parameters WHERE name = ?", name)

    def save_exchange(
        self,
        vhost: str,
        name: str,
        kind: str,
        auto_delete: bool,
        internal: bool,
        arguments: dict[str, Any],
    ) -> None:
        self._run(
            "INSERT OR REPLACE INTO exchanges VALUES (?, ?, ?, ?, ?, ?)",
            vhost,
            name,
            kind,
            auto_delete,
            internal,
            _blob(arguments),
        )

    def delete_exchange(self, vhost: str, name: str) -> None:
        self.db.execute("BEGIN")
        self._run("DELETE FROM exchanges WHERE vhost = ? AND name = ?", vhost, name)
        self._run(
            "DELETE FROM bindings WHERE vhost = ? AND (source = ? OR "
            "(destination_type = 'exchange' AND destination = ?))",
            vhost,
            name,
            name,
        )
        self.db.execute("COMMIT")

    def delayed_exchange_id(self, vhost: str, name: str) -> int:
        """The row id of a durable x-delayed-message exchange (made on first use)."""
        self._run(
            "INSERT OR IGNORE INTO delayed_exchanges (vhost, name) VALUES (?, ?)", vhost, name
        )
        row = self._run(
            "SELECT id FROM delayed_exchanges WHERE vhost = ? AND name = ?", vhost, name
        ).fetchone()
        return int(row[0])

    def delete_delayed_exchange(self, vhost: str, name: str) -> None:
        self._run("DELETE FROM delayed_exchanges WHERE vhost = ? AND name = ?", vhost, name)

    def save_queue(
        self, vhost: str, name: str, auto_delete: bool, arguments: dict[str, Any]
    ) -> int:
        cursor = self._run(
            "INSERT INTO queues (vhost, name, auto_delete, arguments) VALUES (?, ?, ?, ?)",
            vhost,
            name,
            auto_delete,
            _blob(arguments),
        )
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def delete_queue(self, vhost: str, name: str) -> None:
        self.db.execute("BEGIN")
        self._run("DELETE FROM queues WHERE vhost = ? AND name = ?", vhost, name)
        self._run(
            "DELETE FROM bindings WHERE vhost = ? AND destination_type = 'queue' "
            "AND destination = ?",
            vhost,
            name,
        )
        self.db.execute("COMMIT")

    def save_binding(
        self,
        vhost: str,
        source: str,
        destination_type: str,
        destination: str,
        routing_key: str,
        arguments: dict[str, Any],
    ) -> None:
        self._run(
            "INSERT OR IGNORE INTO bindings VALUES (?, ?, ?, ?, ?, ?)",
            vhost,
            source,
            destination_type,
            destination,
            routing_key,
            _blob(arguments),
        )

    def delete_binding(
        self,
        vhost: str,
        source: str,
        destination_type: str,
        destination: str,
        routing_key: str,
        arguments: dict[str, Any],
    ) -> None:
        self._run(
            "DELETE FROM bindings WHERE vhost = ? AND source = ? AND destination_type = ? "
            "AND destination = ? AND routing_key = ? AND arguments = ?",
            vhost,
            source,
            destination_type,
            destination,
            routing_key,
            _blob(arguments),
        )

    # ---- read back ----

    def load(self) -> Definitions:
        d = Definitions()
        d.vhosts = [row[0] for row in self._run("SELECT name FROM vhosts")]
        d.vhost_queue_types = dict(self._run("SELECT * FROM vhost_queue_types").fetchall())
        d.users = [
            (name, password_hash, tuple(t for t in tags.split(",") if t))
            for name, password_hash, tags in self._run("SELECT * FROM users")
        ]
        d.permissions = [tuple(row) for row in self._run("SELECT * FROM permissions")]
        d.policies = [
            (vhost, name, pattern, apply_to, priority, json.loads(definition))
            for vhost, name, pattern, apply_to, priority, definition in self._run(
                "SELECT * FROM policies"
            )
        ]
        d.exchanges = [
            (vhost, name, kind, bool(auto_delete), bool(internal), _table(arguments))
            for vhost, name, kind, auto_delete, internal, arguments in self._run(
                "SELECT * FROM exchanges"
            )
        ]
        d.queues = [
            (queue_id, vhost, name, bool(auto_delete), _table(arguments))
            for queue_id, vhost, name, auto_delete, arguments in self._run(
                "SELECT * FROM queues ORDER BY id"
            )
        ]
        d.bindings = [
            (vhost, source, destination_type, destination, routing_key, _table(arguments))
            for vhost, source, destination_type, destination, routing_key, arguments in self._run(
                "SELECT * FROM bindings"
            )
        ]
        d.parameters = [
            (vhost, component, name, json.loads(value))
            for vhost, component, name, value in self._run("SELECT * FROM parameters")
        ]
        d.global_parameters = [
            (name, json.loads(value))
            for name, value in self._run("SELECT * FROM global_parameters")
        ]
        d.topic_permissions = [tuple(row) for row in self._run("SELECT * FROM topic_permissions")]
        d.user_limits = [
            (user, json.loads(value)) for user, value in self._run("SELECT * FROM user_limits")
        ]
        return d

    def close(self) -> None:
        self.db.close()
