"""Durable state under the data directory: definitions in SQLite, messages in segment files."""

from warren.broker.store.definitions import DefinitionStore
from warren.broker.store.segments import MessageStore, StoredMessage

__all__ = ["DefinitionStore", "MessageStore", "StoredMessage"]
