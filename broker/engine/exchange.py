"""Exchanges and their routing: direct, fanout, topic and headers.

A binding's destination is a queue or another exchange (exchange-to-exchange
bindings); ``route`` returns the destinations a message goes to directly and
the vhost follows exchange destinations. Direct, fanout and topic exchanges keep
an index updated binding by binding, so that routing costs the same with ten
bindings or a hundred thousand (docs/performance-routing.md); headers exchanges
test every binding, as RabbitMQ's do.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, TypeAlias

if TYPE_CHECKING:
    from warren.broker.engine.confirms import Confirms
    from warren.broker.engine.queue import Queue

HeadersFn = Callable[[], dict[str, Any]]
# where a binding leads: a queue, or another exchange (exchange-to-exchange bindings)
Destination: TypeAlias = "Queue | Exchange"


class Binding:
    __slots__ = ("arguments", "destination", "routing_key")

    def __init__(
        self, destination: Destination, routing_key: str, arguments: dict[str, Any]
    ) -> None:
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


class Destinations:
    """The distinct destinations of a set of bindings, in binding order.

    One destination can be bound several times (bindings differing in arguments), so
    each is counted. ``as_list`` is what ``route`` hands out: made once after a change
    and shared until the next, so a route result is never mutated afterwards.
    """

    __slots__ = ("_list", "counts", "dests")

    def __init__(self) -> None:
        self.dests: dict[int, Destination] = {}  # id(destination) -> destination
        self.counts: dict[int, int] = {}
        self._list: list[Destination] | None = None

    def add(self, destination: Destination) -> None:
        key = id(destination)
        count = self.counts.get(key, 0)
        self.counts[key] = count + 1
        if not count:
            self.dests[key] = destination
            self._list = None

    def remove(self, destination: Destination) -> None:
        key = id(destination)
        count = self.counts.get(key, 0)
        if count > 1:
            self.counts[key] = count - 1
        elif count:
            del self.counts[key], self.dests[key]
            self._list = None

    def as_list(self) -> list[Destination]:
        found = self._list
        if found is None:
            found = self._list = list(self.dests.values())
        return found


class Declared(NamedTuple):
    """What an exchange is declared with: every type's constructor takes it whole, so that
    each states its signature once (mypyc-compiled code would pass a subclass's ``*args``
    to a compiled base's ``__init__`` as one tuple argument)."""

    name: str
    durable: bool = False
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] | None = None


class Exchange:
    # read through the class (EXCHANGE_TYPES[...].kind): a class attribute for mypyc too
    kind: ClassVar[str] = ""

    def __init__(self, declared: Declared) -> None:
        self.name = declared.name
        self.durable = declared.durable
        self.auto_delete = declared.auto_delete
        self.internal = declared.internal
        self.arguments = declared.arguments or {}
        self.policy: Any = None  # the vhost's policy that applies to it (broker/engine/policy.py)
        self.bindings: dict[tuple[int, str, str], Binding] = {}
        self.deleted = False
        self.has_exchange_destinations = False  # any exchange-to-exchange binding from here
        # id(destination) -> keys of its bindings: a deleted queue's are found without a scan
        self._by_destination: dict[int, dict[tuple[int, str, str], None]] = {}
        self._exchange_bindings = 0
        # exchanges with a binding to this one (bind keeps it, as for a queue's): deleting
        # this exchange visits them, not every exchange of the vhost
        self.sources: dict[Exchange, None] = {}
        # Prometheus' exchange_metrics, counted by the publishing channel
        self.published = self.confirmed = self.unroutable_returned = self.unroutable_dropped = 0

    # hooks for the types in broker/engine/exchange_plugins.py
    delays = False  # x-delayed-message: a publish asks delay() first, then hold() or route
    # route() calls its ``headers``: False spares the message path a bound method per publish
    reads_headers = True

    @classmethod
    def validate(cls, arguments: dict[str, Any]) -> None:
        """Reject a declaration's arguments (raise an AMQP error)."""

    def validate_binding(
        self, destination: Destination, routing_key: str, arguments: dict[str, Any]
    ) -> None:
        """Reject a binding this type cannot take (raise an AMQP error)."""

    def attach(self, vhost: Any) -> None:
        """The exchange now belongs to ``vhost`` (declared or restored)."""

    def close(self) -> None:
        """The exchange was deleted."""

    def delay(self, msg: Any) -> int:
        """How long (ms) to keep a published message back before routing it; 0: not at all."""
        return 0

    def hold(self, msg: Any, ttl: int | None, delay: int, confirm: Confirms | None = None) -> None:
        """Keep the message back for ``delay`` ms, then route it (delays only); a stored one
        counts on the publisher's ``confirm`` token as a queue's copy does."""

    @property
    def alternate_exchange(self) -> str | None:
        """The argument, else the policy's key: rabbit_policy:get_arg/3, the argument wins."""
        value = self.arguments.get("alternate-exchange")
        if value is None and self.policy is not None:
            value = self.policy.definition.get("alternate-exchange")
        return value if isinstance(value, str) else None

    def bind(self, binding: Binding) -> bool:
        """Add a binding; False if it was there already."""
        key = binding.key()
        if key in self.bindings:
            return False
        self.bindings[key] = binding
        keys = self._by_destination.get(key[0])
        if keys is None:
            self._by_destination[key[0]] = keys = {}
            binding.destination.sources[self] = None
        keys[key] = None
        if isinstance(binding.destination, Exchange):
            self._exchange_bindings += 1
            self.has_exchange_destinations = True
        self._added(binding)
        return True

    def has_binding(
        self, destination: Destination, routing_key: str, arguments: dict[str, Any]
    ) -> bool:
        return (id(destination), routing_key, _freeze(arguments)) in self.bindings

    def binds_to(self, destination: Destination) -> bool:
        """Whether any binding from here leads to ``destination``."""
        return id(destination) in self._by_destination

    def unbind(self, destination: Destination, routing_key: str, arguments: dict[str, Any]) -> bool:
        removed = self.bindings.pop((id(destination), routing_key, _freeze(arguments)), None)
        if removed is not None:
            self._forget(removed)
        return removed is not None

    def unbind_destination(self, destination: Destination) -> None:
        """Forget every binding to a deleted queue or exchange."""
        for key in list(self._by_destination.get(id(destination), ())):
            self._forget(self.bindings.pop(key))

    def _forget(self, binding: Binding) -> None:
        key = id(binding.destination)
        keys = self._by_destination[key]
        del keys[binding.key()]
        if not keys:
            del self._by_destination[key]
            del binding.destination.sources[self]
        if isinstance(binding.destination, Exchange):
            self._exchange_bindings -= 1
            self.has_exchange_destinations = self._exchange_bindings > 0
        self._removed(binding)

    def unbind_all(self) -> None:
        """The exchange is deleted: every binding from it goes."""
        for binding in self.bindings.values():
            binding.destination.sources.pop(self, None)
        self.bindings.clear()
        self._by_destination = {}
        self._exchange_bindings = 0
        self.has_exchange_destinations = False
        self._changed()

    def _changed(self) -> None:
        """Rebuild the type's routing index from ``bindings``."""

    def _added(self, binding: Binding) -> None:
        """Update the routing index for one new binding (a type without one rebuilds it)."""
        self._changed()

    def _removed(self, binding: Binding) -> None:
        """Update the routing index for one removed binding."""
        self._changed()

    def route(self, routing_key: str, headers: HeadersFn) -> list[Destination]:
        raise NotImplementedError


class DirectExchange(Exchange):
    kind = "direct"
    reads_headers = False

    def __init__(self, declared: Declared) -> None:
        super().__init__(declared)
        self._by_key: dict[str, Destinations] = {}
        self._lists: dict[str, list[Destination]] = {}  # route's answers, per key, until it changes

    def _changed(self) -> None:
        self._by_key = {}
        self._lists = {}
        for binding in self.bindings.values():
            self._added(binding)

    def _added(self, binding: Binding) -> None:
        key = binding.routing_key
        dests = self._by_key.get(key)
        if dests is None:
            dests = self._by_key[key] = Destinations()
        dests.add(binding.destination)
        self._lists.pop(key, None)

    def _removed(self, binding: Binding) -> None:
        key = binding.routing_key
        dests = self._by_key[key]
        dests.remove(binding.destination)
        if not dests.dests:
            del self._by_key[key]
        self._lists.pop(key, None)

    def route(self, routing_key: str, headers: HeadersFn) -> list[Destination]:
        found = self._lists.get(routing_key)
        if found is not None:
            return found
        dests = self._by_key.get(routing_key)
        if dests is None:
            return []
        found = self._lists[routing_key] = dests.as_list()
        return found


class FanoutExchange(Exchange):
    kind = "fanout"
    reads_headers = False

    def __init__(self, declared: Declared) -> None:
        super().__init__(declared)
        self._dests = Destinations()

    def _changed(self) -> None:
        self._dests = Destinations()
        for binding in self.bindings.values():
            self._dests.add(binding.destination)

    def _added(self, binding: Binding) -> None:
        self._dests.add(binding.destination)

    def _removed(self, binding: Binding) -> None:
        self._dests.remove(binding.destination)

    def route(self, routing_key: str, headers: HeadersFn) -> list[Destination]:
        return self._dests.as_list()


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


_NO_CHILDREN: dict[str, _Node] = {}  # shared by every node without literal children


class _Node:
    """A node of the topic trie: the binding keys that start with the words leading here."""

    __slots__ = ("children", "dests", "hash", "is_hash", "star")

    def __init__(self, is_hash: bool) -> None:
        # kept apart so that a leaf under '#' (``user.<i>.#``) has no dictionary of its own
        self.children = _NO_CHILDREN  # literal word -> node
        self.star: _Node | None = None
        self.hash: _Node | None = None
        self.is_hash = is_hash  # reached by '#': takes any number of words
        self.dests: Destinations | None = None  # bindings whose key ends here

    def child(self, word: str) -> _Node | None:
        if word == "*":
            return self.star
        if word == "#":
            return self.hash
        return self.children.get(word)


class TopicTrie:
    """Topic binding keys as a trie of words, as RabbitMQ's topic exchange keeps them.

    ``match`` runs the trie as an automaton over the routing key's words: the set of
    nodes reached so far (each at most once, so ``#.#.#`` patterns stay polynomial),
    where a '#' node keeps itself for every word and is entered without consuming one.
    The cost depends on the key and the wildcards along its path, not on how many
    bindings the exchange has.
    """

    def __init__(self) -> None:
        self.root = _Node(False)

    def add(self, pattern: str, destination: Destination) -> None:
        node = self.root
        for word in _words(pattern):
            child = node.child(word)
            if child is None:
                child = _Node(word == "#")
                if word == "*":
                    node.star = child
                elif word == "#":
                    node.hash = child
                else:
                    if node.children is _NO_CHILDREN:
                        node.children = {}
                    node.children[word] = child
            node = child
        if node.dests is None:
            node.dests = Destinations()
        node.dests.add(destination)

    def remove(self, pattern: str, destination: Destination) -> None:
        words = _words(pattern)
        path = [self.root]
        for word in words:
            child = path[-1].child(word)
            assert child is not None
            path.append(child)
        node = path[-1]
        assert node.dests is not None
        node.dests.remove(destination)
        if not node.dests.dests:
            node.dests = None
        # prune the nodes that lead nowhere any more, from the leaf up
        for depth in range(len(words), 0, -1):
            node = path[depth]
            if node.dests is not None or node.children or node.star or node.hash:
                break
            parent, word = path[depth - 1], words[depth - 1]
            if word == "*":
                parent.star = None
            elif word == "#":
                parent.hash = None
            else:
                del parent.children[word]
                if not parent.children:
                    parent.children = _NO_CHILDREN

    def empty(self) -> bool:
        root = self.root
        return not (root.children or root.star or root.hash or root.dests)

    def match(self, routing_key: str) -> list[Destination]:
        reached: dict[_Node, None] = {}
        node: _Node | None = self.root
        while node is not None:  # the root and the '#' nodes under it take no word
            reached[node] = None
            node = node.hash
        for word in routing_key.split(".") if routing_key else ():
            now, reached = reached, {}
            for at in now:  # unrolled: this loop is the message path
                node = at if at.is_hash else None
                while node is not None and node not in reached:
                    reached[node] = None
                    node = node.hash
                node = at.children.get(word)
                while node is not None and node not in reached:
                    reached[node] = None
                    node = node.hash
                node = at.star
                while node is not None and node not in reached:
                    reached[node] = None
                    node = node.hash
            if not reached:
                return []
        found = [n.dests for n in reached if n.dests is not None]
        if len(found) == 1:
            return found[0].as_list()
        if not found:
            return []
        merged: dict[int, Destination] = {}  # by identity, in order: each destination once
        for dests in found:
            merged.update(dests.dests)
        return list(merged.values())


class TopicExchange(Exchange):
    kind = "topic"
    reads_headers = False

    def __init__(self, declared: Declared) -> None:
        super().__init__(declared)
        self._trie = TopicTrie()

    def _changed(self) -> None:
        self._trie = TopicTrie()
        for binding in self.bindings.values():
            self._trie.add(binding.routing_key, binding.destination)

    def _added(self, binding: Binding) -> None:
        self._trie.add(binding.routing_key, binding.destination)

    def _removed(self, binding: Binding) -> None:
        self._trie.remove(binding.routing_key, binding.destination)

    def route(self, routing_key: str, headers: HeadersFn) -> list[Destination]:
        return self._trie.match(routing_key)


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
    """Every binding's arguments are tested against the message's headers: the cost grows
    with the bindings, as it does in RabbitMQ's headers exchange."""

    kind = "headers"

    def route(self, routing_key: str, headers: HeadersFn) -> list[Destination]:
        if not self.bindings:
            return []
        message_headers = headers()
        found: dict[int, Destination] = {}  # by identity, in binding order: each destination once
        for binding in self.bindings.values():
            dest = binding.destination
            if id(dest) not in found and headers_match(binding.arguments, message_headers):
                found[id(dest)] = dest
        return list(found.values())


EXCHANGE_TYPES: dict[str, type[Exchange]] = {
    "direct": DirectExchange,
    "fanout": FanoutExchange,
    "topic": TopicExchange,
    "headers": HeadersExchange,
}
