"""Exchanges and their routing: direct, fanout, topic and headers.

A binding's destination is a queue or another exchange (exchange-to-exchange
bindings); ``route`` returns the destinations a message goes to directly and
the vhost follows exchange destinations.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Callable
from typing import Any

HeadersFn = Callable[[], dict[str, Any]]

_ROUTE_CACHE_MAX = 4096


class Binding:
    __slots__ = ("arguments", "destination", "routing_key")

    def __init__(self, destination: Any, routing_key: str, arguments: dict[str, Any]) -> None:
        self.destination = destination
        self.routing_key = routing_key
        self.arguments = arguments

    def key(self) -> tuple[int, str, str]:
        return (id(self.destination), self.routing_key, _freeze(self.arguments))


def _freeze(arguments: dict[str, Any]) -> str:
    return repr(sorted((k, _typed(v)) for k, v in arguments.items()))


def _typed(value: Any) -> Any:
    if isinstance(value, dict):
        return ("F", sorted((k, _typed(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("A", [_typed(v) for v in value])
    return (type(value).__name__, value)


class Exchange:
    kind = ""

    def __init__(
        self,
        name: str,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = arguments or {}
        self.bindings: dict[tuple[int, str, str], Binding] = {}
        self.deleted = False
        self.has_exchange_destinations = False  # any exchange-to-exchange binding from here

    # hooks for the types in broker/exchange_plugins.py
    delays = False  # x-delayed-message: a publish asks delay() first, then hold() or route

    @classmethod
    def validate(cls, arguments: dict[str, Any]) -> None:
        """Reject a declaration's arguments (raise an AMQP error)."""

    def validate_binding(
        self, destination: Any, routing_key: str, arguments: dict[str, Any]
    ) -> None:
        """Reject a binding this type cannot take (raise an AMQP error)."""

    def attach(self, vhost: Any) -> None:
        """The exchange now belongs to ``vhost`` (declared or restored)."""

    def close(self) -> None:
        """The exchange was deleted."""

    def delay(self, msg: Any) -> int:
        """How long (ms) to keep a published message back before routing it; 0: not at all."""
        return 0

    def hold(self, msg: Any, ttl: int | None, delay: int) -> None:
        """Keep the message back for ``delay`` ms, then route it (delays only)."""

    @property
    def alternate_exchange(self) -> str | None:
        value = self.arguments.get("alternate-exchange")
        return value if isinstance(value, str) else None

    def bind(self, binding: Binding) -> bool:
        """Add a binding; False if it was there already."""
        key = binding.key()
        if key in self.bindings:
            return False
        self.bindings[key] = binding
        self._bindings_changed()
        return True

    def has_binding(self, destination: Any, routing_key: str, arguments: dict[str, Any]) -> bool:
        return (id(destination), routing_key, _freeze(arguments)) in self.bindings

    def unbind(self, destination: Any, routing_key: str, arguments: dict[str, Any]) -> bool:
        removed = self.bindings.pop((id(destination), routing_key, _freeze(arguments)), None)
        if removed is not None:
            self._bindings_changed()
        return removed is not None

    def unbind_destination(self, destination: Any) -> None:
        """Forget every binding to a deleted queue or exchange."""
        stale = [k for k, b in self.bindings.items() if b.destination is destination]
        for key in stale:
            del self.bindings[key]
        if stale:
            self._bindings_changed()

    def _bindings_changed(self) -> None:
        self.has_exchange_destinations = any(
            isinstance(b.destination, Exchange) for b in self.bindings.values()
        )
        self._changed()

    def _changed(self) -> None:
        """Rebuild the type's routing index."""

    def route(self, routing_key: str, headers: HeadersFn) -> list[Any]:
        raise NotImplementedError


class DirectExchange(Exchange):
    kind = "direct"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._by_key: dict[str, list[Any]] = {}

    def _changed(self) -> None:
        by_key: dict[str, list[Any]] = {}
        for binding in self.bindings.values():
            dests = by_key.setdefault(binding.routing_key, [])
            if binding.destination not in dests:
                dests.append(binding.destination)
        self._by_key = by_key

    def route(self, routing_key: str, headers: HeadersFn) -> list[Any]:
        return self._by_key.get(routing_key, [])


class FanoutExchange(Exchange):
    kind = "fanout"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._all: list[Any] = []

    def _changed(self) -> None:
        dests: list[Any] = []
        for binding in self.bindings.values():
            if binding.destination not in dests:
                dests.append(binding.destination)
        self._all = dests

    def route(self, routing_key: str, headers: HeadersFn) -> list[Any]:
        return self._all


def _words(key: str) -> list[str]:
    # RabbitMQ: the empty key has no words, so '*' does not match it and '#' does
    return key.split(".") if key else []


def topic_matches(pattern: str, routing_key: str) -> bool:
    pat = _words(pattern)
    words = _words(routing_key)
    # positions in `words` reachable after each pattern word (NFA over the word list)
    states = {0}
    for p in pat:
        nxt: set[int] = set()
        if p == "#":
            for s in states:
                nxt.update(range(s, len(words) + 1))
        else:
            for s in states:
                if s < len(words) and (p == "*" or p == words[s]):
                    nxt.add(s + 1)
        if not nxt:
            return False
        states = nxt
    return len(words) in states


class TopicExchange(Exchange):
    kind = "topic"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cache: dict[str, list[Any]] = {}

    def _changed(self) -> None:
        self._cache = {}

    def route(self, routing_key: str, headers: HeadersFn) -> list[Any]:
        cached = self._cache.get(routing_key)
        if cached is not None:
            return cached
        dests: list[Any] = []
        for binding in self.bindings.values():
            if binding.destination not in dests and topic_matches(binding.routing_key, routing_key):
                dests.append(binding.destination)
        if len(self._cache) >= _ROUTE_CACHE_MAX:
            self._cache.clear()
        self._cache[routing_key] = dests
        return dests


def _same_value(bound: Any, actual: Any) -> bool:
    # AMQP types matter: 1 (an integer) is not "1", and True is not 1
    if isinstance(bound, bool) or isinstance(actual, bool):
        return type(bound) is type(actual) and bound == actual
    if isinstance(bound, int) and isinstance(actual, int):
        return bound == actual
    if isinstance(bound, str | bytes) or isinstance(actual, str | bytes):
        return type(bound) is type(actual) and bound == actual
    if isinstance(bound, float | decimal.Decimal | datetime.datetime | dict | list):
        return type(bound) is type(actual) and bound == actual
    return bool(bound == actual)


def headers_match(arguments: dict[str, Any], headers: dict[str, Any]) -> bool:
    mode = arguments.get("x-match", "all")
    if isinstance(mode, bytes):
        mode = mode.decode(errors="replace")
    with_x = mode in ("all-with-x", "any-with-x")
    want_any = mode in ("any", "any-with-x")
    checked = 0
    for key, bound in arguments.items():
        if key == "x-match" or (key.startswith("x-") and not with_x):
            continue
        checked += 1
        present = key in headers
        ok = present and (bound is None or _same_value(bound, headers[key]))
        if want_any and ok:
            return True
        if not want_any and not ok:
            return False
    return not want_any


class HeadersExchange(Exchange):
    kind = "headers"

    def route(self, routing_key: str, headers: HeadersFn) -> list[Any]:
        if not self.bindings:
            return []
        message_headers = headers()
        dests: list[Any] = []
        for binding in self.bindings.values():
            if binding.destination not in dests and headers_match(
                binding.arguments, message_headers
            ):
                dests.append(binding.destination)
        return dests


EXCHANGE_TYPES: dict[str, type[Exchange]] = {
    "direct": DirectExchange,
    "fanout": FanoutExchange,
    "topic": TopicExchange,
    "headers": HeadersExchange,
}
