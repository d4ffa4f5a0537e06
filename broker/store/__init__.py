"""Durable state under the data directory: definitions in SQLite, messages in segment files
(and the paged-out backlog of long queues)."""

from warren.broker.store.definition_store import DefinitionStore
from warren.broker.store.segments import MessageStore, StoredMessage

__all__ = ["DefinitionStore", "MessageStore", "StoredMessage"]
