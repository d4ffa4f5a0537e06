"""Exchange types users install RabbitMQ plugins for, built in.

- ``x-consistent-hash`` (rabbitmq_consistent_hash_exchange, 3.13/4.x): the binding key
  is a weight; a bucket ring in binding order; jump consistent hash of the routing
  key, a header or a property, with Erlang's own hash and RNG (broker/engine/erlang_hash.py).
- ``x-modulus-hash`` (RabbitMQ 4.3 core, rabbit_exchange_type_modulus_hash):
  ``phash2([routing key]) rem n`` over the destinations, sorted as RabbitMQ sorts them.
- ``x-local-random`` (RabbitMQ 4.0 core, rabbit_exchange_type_local_random): one bound
  classic queue at random; bindings need an empty key and a classic queue.
- ``x-delayed-message`` (rabbitmq-delayed-message-exchange): routes like its
  ``x-delayed-type`` once the ``x-delay`` header's milliseconds have passed. Held
  messages sit in one heap per exchange under one timer (broker/engine/timers.py); a durable
  exchange keeps persistent ones in the message log (broker/store/) under its own id.

The texts of errors are RabbitMQ's; docs/plugin-exchanges.md has the details.
"""

from __future__ import annotations

import datetime
import heapq
import random
import re
import sys
from typing import TYPE_CHECKING, Any, Final, cast

from warren.broker.engine.erlang_hash import jump_consistent_hash, phash2
from warren.broker.engine.exchange import (
    EXCHANGE_TYPES,
    Declared,
    Destination,
    Exchange,
    HeadersFn,
)
from warren.broker.engine.message import Message
from warren.broker.engine.timers import Deadline
from warren.protocol.constants import COMMAND_INVALID, PRECONDITION_FAILED
from warren.protocol.errors import ChannelError, ConnectionError_, erlang_binary
from warren.protocol.properties import (
    FLAG_EXPIRATION,
    decode_field,
    has_flag,
    is_persistent,
    set_header,
    split_properties,
)

if TYPE_CHECKING:
    from warren.broker.engine.confirms import Confirms
    from warren.broker.engine.vhost import VirtualHost
    from warren.broker.store import MessageStore, StoredMessage

MAX_BINDING_WEIGHT: Final = 10_000
_ROUTE_CACHE_MAX: Final = 4096
MAX_DELAY_MS: Final = 4294967295  # the plugin's limit (Erlang's longest timer); longer: no delay
RELEASE_BATCH: Final = 20_000  # releases in one loop turn before yielding to other work
_INTEGER: Final = re.compile(r"[+-]?[0-9]+")
_PROPERTIES: Final = ("correlation_id", "message_id", "timestamp")


def _precondition(text: str) -> ChannelError:
    return ChannelError(PRECONDITION_FAILED, text)


# ---- x-consistent-hash ----


def _hash_args(arguments: dict[str, Any]) -> tuple[str | None, str | None]:
    header = arguments.get("hash-header")
    prop = arguments.get("hash-property")
    return (
        header if isinstance(header, str) else None,
        prop if isinstance(prop, str) else None,
    )


def _header_key(value: Any) -> int | bytes | str | None:
    """What RabbitMQ 4.x hashes for a header value (mc:routing_headers)."""
    if value is None or isinstance(value, bool):
        return None if value is None else ("true" if value else "false")
    if isinstance(value, int):
        return value  # an integer seeds the RNG directly, unhashed
    if isinstance(value, datetime.datetime):
        return int(value.replace(tzinfo=datetime.UTC).timestamp()) * 1000
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, bytes):
        return value
    return repr(value).encode()  # floats, tables, arrays: stable, but not RabbitMQ's hash


class ConsistentHashExchange(Exchange):
    kind = "x-consistent-hash"

    def __init__(self, declared: Declared) -> None:
        super().__init__(declared)
        self._ring: list[Destination] = []
        self._cache: dict[int | bytes | str | None, list[Destination]] = {}
        self._header, self._property = _hash_args(self.arguments)

    @classmethod
    def validate(cls, arguments: dict[str, Any]) -> None:
        header, prop = _hash_args(arguments)
        if header is not None and prop is not None:
            raise _precondition("hash-header and hash-property are mutually exclusive")
        if prop is not None and prop not in _PROPERTIES:
            raise _precondition(f"Unsupported property: {prop}")

    def validate_binding(
        self, destination: Destination, routing_key: str, arguments: dict[str, Any]
    ) -> None:
        if not _INTEGER.fullmatch(routing_key):
            raw = routing_key.encode("utf-8", "surrogateescape")
            raise _precondition(f"The binding key must be an integer: {erlang_binary(raw)}")
        weight = int(routing_key)
        if weight < 1:
            raise _precondition("The binding key must be greater than 0")
        if weight > MAX_BINDING_WEIGHT:
            raise _precondition(f"The binding key must not exceed {MAX_BINDING_WEIGHT}")

    def _changed(self) -> None:
        # buckets in binding order; a destination bound again adds none (RabbitMQ: already_exists)
        ring: list[Destination] = []
        seen: set[int] = set()
        for binding in self.bindings.values():
            if id(binding.destination) not in seen:
                seen.add(id(binding.destination))
                ring.extend([binding.destination] * int(binding.routing_key))
        self._ring = ring
        self._cache = {}

    def _value(self, routing_key: str, headers: HeadersFn) -> int | bytes | str | None:
        """What is hashed: an int is the key itself (unhashed), anything else goes to phash2."""
        if self._header is not None:
            return _header_key(headers().get(self._header))
        if self._property is not None:
            return self._property_value(headers)
        return routing_key.encode("utf-8", "surrogateescape")

    def _property_value(self, headers: HeadersFn) -> bytes | None:
        msg = getattr(headers, "__self__", None)  # Message.get_headers, bound
        if not isinstance(msg, Message):
            return None
        raw = split_properties(msg.properties).get(cast(str, self._property))
        if raw is None:
            return None
        value = decode_field(cast(str, self._property), raw)
        if isinstance(value, datetime.datetime):
            return str(int(value.replace(tzinfo=datetime.UTC).timestamp())).encode()
        if isinstance(value, int):
            return str(value).encode()
        return value.encode("utf-8", "surrogateescape") if isinstance(value, str) else None

    def route(self, routing_key: str, headers: HeadersFn) -> list[Destination]:
        ring = self._ring
        if not ring:
            return []
        value = self._value(routing_key, headers)
        # Erlang's hash and RNG in Python cost ~8 us a message: remember recent keys' picks
        cached = self._cache.get(value)
        if cached is None:
            key = value if isinstance(value, int) else phash2(value)
            if len(self._cache) >= _ROUTE_CACHE_MAX:
                self._cache.clear()
            cached = self._cache[value] = [ring[jump_consistent_hash(key, len(ring))]]
        return cached


# ---- x-modulus-hash ----


def _sort_key(destination: Destination) -> tuple[int, bytes]:
    # RabbitMQ sorts #resource{} records: kind 'exchange' before 'queue', then name bytes
    return (0 if isinstance(destination, Exchange) else 1, destination.name.encode())


class ModulusHashExchange(Exchange):
    kind = "x-modulus-hash"

    def __init__(self, declared: Declared) -> None:
        super().__init__(declared)
        self._sorted: list[Destination] = []
        self._cache: dict[str, list[Destination]] = {}

    def _changed(self) -> None:
        self._sorted = sorted((b.destination for b in self.bindings.values()), key=_sort_key)
        self._cache = {}

    def route(self, routing_key: str, headers: HeadersFn) -> list[Destination]:
        dests = self._sorted
        if not dests:
            return []
        cached = self._cache.get(routing_key)
        if cached is None:
            key = phash2([routing_key.encode("utf-8", "surrogateescape")])
            if len(self._cache) >= _ROUTE_CACHE_MAX:
                self._cache.clear()
            cached = self._cache[routing_key] = [dests[key % len(dests)]]
        return cached


# ---- x-local-random ----

_QUEUE_MODULES: Final = {"quorum": "rabbit_quorum_queue", "stream": "rabbit_stream_queue"}


class LocalRandomExchange(Exchange):
    kind = "x-local-random"

    def __init__(self, declared: Declared) -> None:
        super().__init__(declared)
        self._queues: list[Destination] = []

    def validate_binding(
        self, destination: Destination, routing_key: str, arguments: dict[str, Any]
    ) -> None:
        if routing_key:
            raise _precondition(f"Non empty binding '{routing_key}' key not permitted")
        if isinstance(destination, Exchange):
            raise _precondition("Destination not found")
        kind = getattr(destination, "queue_type", "classic")
        if kind != "classic":
            module = _QUEUE_MODULES.get(kind, kind)
            raise _precondition(f"Queue type {module} not valid for this exchange type")

    def _changed(self) -> None:
        queues: list[Destination] = []
        for binding in self.bindings.values():
            if binding.destination not in queues:
                queues.append(binding.destination)
        self._queues = queues

    def route(self, routing_key: str, headers: HeadersFn) -> list[Destination]:
        queues = self._queues
        if len(queues) <= 1:
            return queues
        return [queues[random.randrange(len(queues))]]


# ---- x-delayed-message ----


def delay_of(headers: dict[str, Any]) -> int | None:
    """The x-delay header as the plugin reads it: integers, floats (truncated), numeric
    strings; None for no delay (absent, not a number, not in 1..2^32-1)."""
    value = headers.get("x-delay")
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float):
        value = int(value)
    elif isinstance(value, str | bytes):
        text = value.decode(errors="replace") if isinstance(value, bytes) else value
        if not _INTEGER.fullmatch(text):
            return None  # the plugin fails the publish here; Warren routes at once
        value = int(text)
    if not isinstance(value, int) or not 0 < value <= MAX_DELAY_MS:
        return None
    return value


# a held message: logged (due, seq, Message, ttl, delay), or, in memory only,
# (due, seq, routing key, properties, body, trace id, ttl, delay)
_Held = tuple[Any, ...]


def _ttl_of(properties: bytes) -> int | None:
    if not has_flag(properties, FLAG_EXPIRATION):
        return None
    raw = split_properties(properties).get("expiration")
    try:
        return int(str(decode_field("expiration", raw))) if raw is not None else None
    except ValueError:
        return None


class DelayedMessageExchange(Exchange):
    """Holds messages with an ``x-delay`` until due, then routes them like ``x-delayed-type``."""

    kind = "x-delayed-message"
    delays = True

    def __init__(self, declared: Declared) -> None:
        super().__init__(declared)
        inner = EXCHANGE_TYPES[str(self.arguments["x-delayed-type"])]
        self.delayed_kind = inner.kind
        self._inner = inner(Declared(self.name, arguments=self.arguments))
        self._inner.bindings = self.bindings  # one set of bindings, the inner type's index
        self._heap: list[_Held] = []
        self._seq = 0
        self.vhost: VirtualHost | None = None
        self.store_id = 0  # the message log's id for this exchange's held messages (durable)
        self.message_store: MessageStore | None = None
        self._deadline: Deadline | None = None

    @classmethod
    def validate(cls, arguments: dict[str, Any]) -> None:
        kind = arguments.get("x-delayed-type")
        if kind == "x-delayed-message":
            raise _precondition(
                "Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'"
            )
        if not isinstance(kind, str):
            raise _precondition(
                "Invalid argument, 'x-delayed-type' must be an existing exchange type"
            )
        inner = EXCHANGE_TYPES.get(kind)
        if inner is None:
            raise ConnectionError_(COMMAND_INVALID, f"unknown exchange type '{kind}'")
        inner.validate(arguments)

    @property
    def messages_delayed(self) -> int:
        return len(self._heap)

    def attach(self, vhost: VirtualHost) -> None:
        self.vhost = vhost
        self._deadline = Deadline(vhost.timers, self._release_due)
        persistence = vhost.persistence
        if self.durable and persistence is not None:
            self.store_id = persistence.delayed_exchange_id(vhost.name, self.name)
            self.message_store = persistence.messages

    def validate_binding(
        self, destination: Destination, routing_key: str, arguments: dict[str, Any]
    ) -> None:
        self._inner.validate_binding(destination, routing_key, arguments)

    def _changed(self) -> None:
        self._inner._changed()

    def route(self, routing_key: str, headers: HeadersFn) -> list[Destination]:
        return self._inner.route(routing_key, headers)

    # ---- holding ----

    def delay(self, msg: Message) -> int:
        """The delay ``msg`` asks for, in ms; 0: route it now."""
        return delay_of(msg.headers) or 0

    def hold(
        self, msg: Message, ttl: int | None, delay: int, confirm: Confirms | None = None
    ) -> None:
        """Keep ``msg`` for ``delay`` ms (after tracing: it carries its trace id)."""
        assert self.vhost is not None
        due = self.vhost.timers.now() + delay / 1000
        store = self.message_store
        self._seq += 1
        entry: _Held
        if store is not None and is_persistent(msg.properties):
            msg._headers = None
            msg.expires_at = due  # the log keeps the due time (wall clock) in its expiry
            store.publish(self.store_id, msg, self.vhost.timers.wall() + delay / 1000, confirm)
            store.hold(msg, self.store_id)  # compaction copies its record with this exchange's id
            entry = (due, self._seq, msg, ttl, delay)
        else:
            # plain values only: a tuple of them leaves the GC's tracking, a Message would not,
            # and a million tracked objects make every full collection a long pause
            rk = sys.intern(msg.routing_key) if len(msg.routing_key) < 64 else msg.routing_key
            entry = (due, self._seq, rk, msg.properties, msg.body, msg.trace_id, ttl, delay)
        heap = self._heap
        heapq.heappush(heap, entry)
        if heap[0] is entry and self._deadline is not None:
            self._deadline.arm(due)

    def restore_messages(self, records: list[StoredMessage], now_wall: float) -> list[Message]:
        """Held messages read back at start-up: due at their original time (now if past)."""
        assert self.vhost is not None
        now_mono = self.vhost.timers.now()
        store = self.message_store
        restored = []
        for record in records:
            body = record.body
            if body is None:
                assert store is not None
                body = store.pager.read_body(record.segment, record.body_offset, record.body_size)
            msg = Message(record.exchange, record.routing_key, record.properties, body)
            msg.store_id = record.msg_id
            msg.store_segment, msg.store_offset = record.segment, record.body_offset
            msg.trace_id = record.trace_id
            due = now_mono + max(0.0, record.expires_wall - now_wall)
            msg.expires_at = due
            if store is not None:
                store.hold(msg, self.store_id)
            self._seq += 1
            entry = (due, self._seq, msg, _ttl_of(record.properties), delay_of(msg.headers) or 0)
            msg._headers = None
            heapq.heappush(self._heap, entry)
            restored.append(msg)
        if self._heap and self._deadline is not None:
            self._deadline.arm(self._heap[0][0])
        return restored

    def _release_due(self) -> None:
        assert self.vhost is not None
        heap = self._heap
        # a timer may fire a fraction of a millisecond early (the loop's clock resolution)
        now = self.vhost.timers.now() + 0.0005
        released = 0
        while heap and heap[0][0] <= now and released < RELEASE_BATCH:
            self._release(heapq.heappop(heap))
            released += 1
        if heap and self._deadline is not None:
            self._deadline.arm(heap[0][0] if released < RELEASE_BATCH else now)

    def _release(self, entry: _Held) -> None:
        vhost = self.vhost
        assert vhost is not None
        if len(entry) == 5:  # logged: the Message itself
            _, _, msg, ttl, delay = entry
            if msg.store_id and self.message_store is not None:
                self.message_store.remove(msg)
            msg.expires_at = None
        else:
            _, _, rk, props, body, trace_id, ttl, delay = entry
            msg = Message(self.name, rk, props, body)
            msg.trace_id = trace_id
        if delay:  # the plugin hands it on with x-delay negated
            msg.properties = set_header(msg.properties, "x-delay", -delay)
        queues = vhost.route(self, msg)
        if (tracer := vhost.tracer) is not None:
            tracer.released(msg, self.name, queues)
        for i, queue in enumerate(queues):
            queue.publish(msg if i == 0 else msg.copy(), ttl)

    def close(self) -> None:
        """Deleted: the held messages go with it (their log records age out)."""
        if self._deadline is not None:
            self._deadline.cancel()
        store = self.message_store
        for entry in self._heap:
            if len(entry) == 5:
                msg = entry[2]
                if msg.store_id and store is not None:
                    store.forget(msg)
        self._heap.clear()


PLUGIN_EXCHANGE_TYPES: dict[str, type[Exchange]] = {
    "x-consistent-hash": ConsistentHashExchange,
    "x-modulus-hash": ModulusHashExchange,
    "x-local-random": LocalRandomExchange,
    "x-delayed-message": DelayedMessageExchange,
}
EXCHANGE_TYPES.update(PLUGIN_EXCHANGE_TYPES)
