"""Durable state under the data directory: definitions in SQLite, messages in segment files
(and the paged-out backlog of long queues). Below the engine: of it, imports only message.py,
stats.py and timers.py (import contracts)."""

from warren.broker.store.definition_store import DefinitionStore
from warren.broker.store.segments import MessageStore, StoredMessage

__all__ = ["DefinitionStore", "MessageStore", "StoredMessage"]
