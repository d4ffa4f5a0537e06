"""A virtual host: its exchanges, queues and bindings, and routing between them."""

from __future__ import annotations

import base64
import os
from typing import TYPE_CHECKING, Any, Final

import structlog

import warren.broker.engine.exchange_plugins  # noqa: F401  (registers the plugins' exchange types)
from warren.broker.engine.arguments import (
    validate_queue_arguments,
)
from warren.broker.engine.arrivals import Ticks
from warren.broker.engine.dead_letter import dead_letter_copy
from warren.broker.engine.equivalence import (
    assert_exchange_equivalence,
    assert_queue_equivalence,
    augment_declare_args,
)
from warren.broker.engine.exchange import (
    EXCHANGE_TYPES,
    Binding,
    Declared,
    Destination,
    DirectExchange,
    Exchange,
)
from warren.broker.engine.message import Message
from warren.broker.engine.policy import Policy, pick
from warren.broker.engine.queue import Queue, fan_out
from warren.broker.engine.reaper import Reaper
from warren.broker.engine.timers import STAMP_EVERY
from warren.broker.streams.stream import StreamQueue, stream_directory, validate_stream_arguments
from warren.broker.tracing.firehose import TRACE_EXCHANGE
from warren.protocol.constants import (
    ACCESS_REFUSED,
    COMMAND_INVALID,
    NOT_FOUND,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
)
from warren.protocol.errors import ChannelError, ConnectionError_, erlang_binary

if TYPE_CHECKING:
    from warren.broker.engine.persistence import Persistence
    from warren.broker.engine.timers import Timers
    from warren.broker.tracing.tracer import Tracer

STANDARD_EXCHANGES: Final = (
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)


def _no_headers() -> dict[str, Any]:
    return {}  # what an exchange that ignores headers is given (VirtualHost.route)


# compiled, a constant: the function's name is looked up in the module's dict otherwise
_NO_HEADERS: Final = _no_headers


class DefaultExchange(DirectExchange):
    """The nameless exchange: routes to the queue named by the routing key."""

    def __init__(self, vhost: VirtualHost) -> None:
        super().__init__(Declared("", durable=True))
        self._queues = vhost.queues
        # the answer for the routing key routed last: publishes mostly repeat their queue
        # with the routing key object the protocol kept (protocol/methods.py), and a look-up
        # and a new list a message cost an allocation and a free. Read-only, as
        # DirectExchange's kept answers. The vhost calls ``forget`` wherever its table of
        # queues changes (a queue deleted, or restored over another).
        self._last_key: str | None = None
        self._last_answer: list[Destination] = []

    def route(self, routing_key: str, headers: Any) -> list[Destination]:
        if routing_key is self._last_key:
            return self._last_answer
        queue = self._queues.get(routing_key)
        if queue is None:
            return []
        self._last_key = routing_key
        self._last_answer = [queue]
        return self._last_answer

    def forget(self) -> None:
        self._last_key = None
        self._last_answer = []


class VirtualHost:
    def __init__(
        self, name: str, timers: Timers, default_consumer_timeout: int | None = 1800000
    ) -> None:
        self.name = name
        self.timers = timers
        # when messages arrive, to the second, without a clock read per message (arrivals.py);
        # the broker gives its vhosts one on real time
        self.ticks = Ticks(timers, STAMP_EVERY)
        self.default_consumer_timeout = default_consumer_timeout  # ms, None: off
        self.policies: dict[str, Policy] = {}
        # the operator_policy parameters' policies (broker/engine/operator_policy.py)
        self.operator_policies: dict[str, Policy] = {}
        self.limits: dict[str, int] = {}  # max-connections, max-queues (negative: no limit)
        self.stats: Any = None  # the broker's BrokerStats, for node-wide lifecycle counters
        self.persistence: Persistence | None = None  # with a data directory
        self.deprecated: Any = None  # the broker's DeprecatedFeatures (RabbitMQ 4.3's refusals)
        # x-queue-type of queues declared without one: the vhost's default_queue_type
        # metadata, else the config key (RabbitMQ 4.x, rabbit_amqqueue:augment_declare_args/5)
        self.default_queue_type = "classic"
        # quorum_queue.property_equivalence.relaxed_checks_on_redeclaration (RabbitMQ 4.x)
        self.relaxed_quorum_redeclare = False
        self.log: Any = structlog.get_logger("warren")
        self.tracer: Tracer | None = None  # set while this vhost traces (broker/tracing/tracer.py)
        # lets go of long purged queues a slice at a time (the broker's, shared by its vhosts)
        self.reaper = Reaper(timers)
        self.disabled_exchange_types: frozenset[str] = frozenset()  # by configuration
        # firehose copies waiting for the current event to end (broker/tracing/firehose.py)
        self.firehose_pending: list[tuple[list[Queue], Message]] = []
        self.queues: dict[str, Queue] = {}
        self.default_exchange = DefaultExchange(self)
        self.exchanges: dict[str, Exchange] = {"": self.default_exchange}
        for ex_name, kind in STANDARD_EXCHANGES:
            self.exchanges[ex_name] = EXCHANGE_TYPES[kind](Declared(ex_name, durable=True))
        # RabbitMQ's firehose target (broker/tracing/firehose.py): internal, so clients only
        # bind to it
        self.exchanges[TRACE_EXCHANGE] = EXCHANGE_TYPES["topic"](
            Declared(TRACE_EXCHANGE, durable=True, internal=True)
        )

    # ---- names and lookups ----

    def where(self) -> str:
        return f"in vhost '{self.name}'"

    def exchange(self, name: str) -> Exchange:
        exchange = self.exchanges.get(name)
        if exchange is None:
            raise ChannelError(NOT_FOUND, f"no exchange '{name}' {self.where()}")
        return exchange

    def queue(self, name: str, connection: object | None = None) -> Queue:
        queue = self.queues.get(name)
        if queue is None:
            raise ChannelError(NOT_FOUND, f"no queue '{name}' {self.where()}")
        if connection is not None:
            self.check_exclusive(queue, connection)
        return queue

    def check_exclusive(self, queue: Queue, connection: object) -> None:
        if queue.exclusive_owner is not None and queue.exclusive_owner is not connection:
            raise self.locked(queue)

    def locked(self, queue: Queue) -> ChannelError:
        return ChannelError(
            RESOURCE_LOCKED,
            f"cannot obtain exclusive access to locked queue '{queue.name}' {self.where()}. "
            "It could be originally declared on another connection or the exclusive "
            "property value does not match that of the original declaration.",
        )

    @staticmethod
    def not_default(name: str) -> None:
        if name == "":
            raise ChannelError(ACCESS_REFUSED, "operation not permitted on the default exchange")

    # ---- exchanges ----

    def declare_exchange(
        self,
        name: str,
        kind: str,
        *,
        passive: bool,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: dict[str, Any],
    ) -> Exchange:
        self.not_default(name)
        existing = self.exchanges.get(name)
        if passive:
            if existing is None:
                raise ChannelError(NOT_FOUND, f"no exchange '{name}' {self.where()}")
            return existing
        if name.startswith("amq.") and existing is None:
            raise ChannelError(
                ACCESS_REFUSED, f"exchange name '{name}' contains reserved prefix 'amq.*'"
            )
        cls = EXCHANGE_TYPES.get(kind)
        if cls is None:
            raise ConnectionError_(COMMAND_INVALID, f"unknown exchange type '{kind}'")
        if existing is not None:
            assert_exchange_equivalence(
                self, existing, kind, durable, auto_delete, internal, arguments
            )
            return existing
        if kind in self.disabled_exchange_types:  # 4.x: exchange_types.local_random.enabled
            raise ChannelError(PRECONDITION_FAILED, f"{kind} exchange is disabled by configuration")
        cls.validate(arguments)
        exchange = cls(Declared(name, durable, auto_delete, internal, arguments))
        self.exchanges[name] = exchange
        exchange.attach(self)
        self._apply_exchange_policy(exchange)
        if self.persistence is not None:
            self.persistence.exchange_declared(self.name, exchange)
        return exchange

    def restore_exchange(
        self, name: str, kind: str, auto_delete: bool, internal: bool, arguments: dict[str, Any]
    ) -> None:
        cls = EXCHANGE_TYPES.get(kind)
        if name.startswith("amq.") and name in self.exchanges:
            return  # built in: the tracer holds amq.rabbitmq.trace, which must stay the same
        if cls is not None:
            try:
                cls.validate(arguments)
            except (ChannelError, ConnectionError_) as exc:
                self.log.warning("stored exchange no longer valid", exchange=name, error=str(exc))
                return
            exchange = self.exchanges[name] = cls(
                Declared(name, True, auto_delete, internal, arguments)
            )
            exchange.attach(self)
            self._apply_exchange_policy(exchange)

    def restore_queue(self, name: str, auto_delete: bool, arguments: dict[str, Any]) -> Queue:
        cls = StreamQueue if arguments.get("x-queue-type") == "stream" else Queue
        queue = cls(self, name, durable=True, auto_delete=auto_delete, arguments=arguments)
        self.queues[name] = queue
        self.default_exchange.forget()
        self._apply_policy(queue)
        return queue

    def delete_exchange(self, name: str, if_unused: bool) -> None:
        self.not_default(name)
        exchange = self.exchanges.get(name)
        if exchange is None:
            return  # RabbitMQ: deleting a missing exchange succeeds
        if name.startswith("amq."):
            raise ChannelError(
                ACCESS_REFUSED, f"deletion of system exchange '{name}' {self.where()} not allowed"
            )
        if if_unused and exchange.bindings:  # being a binding's destination is not "use"
            raise ChannelError(PRECONDITION_FAILED, f"exchange '{name}' {self.where()} in use")
        self._remove_exchange(exchange)

    def _remove_exchange(self, exchange: Exchange) -> None:
        if self.persistence is not None:
            self.persistence.exchange_deleted(self.name, exchange)
        exchange.deleted = True
        exchange.close()
        self.exchanges.pop(exchange.name, None)
        exchange.unbind_all()
        for other in list(exchange.sources):
            other.unbind_destination(exchange)
            self._maybe_auto_delete(other)

    def _maybe_auto_delete(self, exchange: Exchange) -> None:
        if exchange.auto_delete and not exchange.bindings and not exchange.deleted:
            self._remove_exchange(exchange)

    # ---- queues ----

    def new_queue_name(self) -> str:
        while True:
            name = "amq.gen-" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
            if name not in self.queues:
                return name

    def declare_queue(
        self,
        name: str,
        *,
        connection: object,
        server_named: bool = False,
        passive: bool,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        arguments: dict[str, Any],
    ) -> Queue:
        existing = self.queues.get(name)
        if passive:
            if existing is None:
                raise ChannelError(NOT_FOUND, f"no queue '{name}' {self.where()}")
            self.check_exclusive(existing, connection)
            existing.touch()
            return existing
        arguments = augment_declare_args(self, arguments, durable, exclusive, auto_delete)
        if server_named and arguments.get("x-queue-type") in ("quorum", "stream"):
            # rabbit_channel queue.declare: is_server_named_allowed/1 (capabilities server_named)
            raise ChannelError(
                PRECONDITION_FAILED,
                "Cannot declare a server-named queue for type "
                f"rabbit_{arguments['x-queue-type']}_queue",
            )
        if name.startswith("amq.") and not server_named:
            raise ChannelError(
                ACCESS_REFUSED, f"queue name '{name}' contains reserved prefix 'amq.*'"
            )
        if existing is not None:
            assert_queue_equivalence(
                self, existing, durable, exclusive, auto_delete, arguments, connection
            )
            existing.touch()
            return existing
        # in the order of rabbit_amqqueue:declare/7: arguments, transient_nonexcl_queues,
        # the vhost's queue limit (rabbit_queue_type:declare/2), queue_master_locator
        stream = arguments.get("x-queue-type") == "stream"  # broker/streams/stream.py
        validate = validate_stream_arguments if stream else validate_queue_arguments
        validate(
            arguments,
            name,
            self.name,
            durable=durable,
            exclusive=exclusive,
            auto_delete=auto_delete,
        )
        if self.deprecated is not None:
            self.deprecated.check_transient_queue(durable, exclusive)
        max_queues = self.limits.get("max-queues")
        if max_queues is not None and 0 <= max_queues <= len(self.queues):
            raise ChannelError(
                PRECONDITION_FAILED,
                f"cannot declare queue '{name}': queue limit in vhost '{self.name}' "
                f"({max_queues}) is reached",
            )
        if self.deprecated is not None:
            self.deprecated.check_master_locator(arguments)
        queue = (StreamQueue if stream else Queue)(
            self,
            name,
            durable=durable,
            exclusive_owner=connection if exclusive else None,
            auto_delete=auto_delete,
            arguments=arguments,
        )
        self.queues[name] = queue
        self.default_exchange.forget()
        self._apply_policy(queue)
        if self.persistence is not None:
            self.persistence.queue_declared(self.name, queue)
        if self.stats is not None:
            self.stats.queues_created += 1
        if isinstance(queue, StreamQueue):
            store = queue.message_store
            queue.open_log(store, stream_directory(store, queue.store_id) if store else None)
        return queue

    def set_default_queue_type(self, queue_type: str, persist: bool = True) -> None:
        self.default_queue_type = queue_type
        if persist and self.persistence is not None:
            self.persistence.vhost_queue_type_set(self.name, queue_type)

    def delete_queue(self, queue: Queue) -> int:
        """Delete a queue with its bindings and messages; cancel its consumers."""
        if queue.deleted:
            return 0
        count = queue.ready_count
        if (tracer := self.tracer) is not None:
            tracer.queue_deleted(queue)
        if self.stats is not None:
            self.stats.queues_deleted += 1
        self.queues.pop(queue.name, None)
        self.default_exchange.forget()
        if self.persistence is not None:
            self.persistence.queue_deleted(self.name, queue)
        for exchange in list(queue.sources):
            exchange.unbind_destination(queue)
            self._maybe_auto_delete(exchange)
        queue.close()
        for consumer in list(queue.consumers):
            consumer.channel.consumer_cancelled_by_broker(consumer)
        queue.consumers.clear()
        return count

    # ---- policies ----

    def set_policy(self, policy: Policy, persist: bool = True) -> None:
        self.policies[policy.name] = policy
        if persist and self.persistence is not None:
            self.persistence.policy_saved(policy)
        self._reapply_policies(policy.name, policy)

    def clear_policy(self, name: str) -> bool:
        removed = self.policies.pop(name, None) is not None
        if removed:
            if self.persistence is not None:
                self.persistence.policy_deleted(self.name, name)
            self._reapply_policies(name, None)
        return removed

    def _reapply_policies(self, name: str, new: Policy | None) -> None:
        """Policy ``name`` was set to ``new`` (None: cleared). Only a queue or exchange that it
        governed, or that ``new`` matches, can get another policy: the others are left alone,
        so a change costs one pattern match per queue, not one per queue and policy."""
        for queue in list(self.queues.values()):
            current = queue.policy
            if (current is not None and current.name == name) or (
                new is not None and new.applies_to_queue(queue.name, queue.queue_type)
            ):
                self._apply_policy(queue)
        for exchange in self.exchanges.values():
            current = exchange.policy
            if (current is not None and current.name == name) or (
                new is not None and new.applies_to_exchange(exchange.name)
            ):
                self._apply_exchange_policy(exchange)

    def set_operator_policy(self, policy: Policy) -> None:
        """Stored by the parameter that holds it: re-pick every queue's (they are rare)."""
        self.operator_policies[policy.name] = policy
        self._reapply_operator_policies()

    def clear_operator_policy(self, name: str) -> None:
        if self.operator_policies.pop(name, None) is not None:
            self._reapply_operator_policies()

    def _reapply_operator_policies(self) -> None:
        for queue in list(self.queues.values()):
            self._apply_policy(queue)

    def _apply_policy(self, queue: Queue) -> None:
        def matches(p: Policy) -> bool:
            return p.applies_to_queue(queue.name, queue.queue_type)

        policy = pick(self.policies, matches)
        operator = pick(self.operator_policies, matches) if self.operator_policies else None
        if policy is not queue.policy or operator is not queue.operator_policy:
            queue.policy = policy
            queue.operator_policy = operator
            queue.apply_settings()

    def _apply_exchange_policy(self, exchange: Exchange) -> None:
        """Exchanges take a policy's alternate-exchange (RabbitMQ's only core exchange key)."""
        if exchange.name:  # the default exchange has no policy, as in RabbitMQ
            exchange.policy = pick(self.policies, lambda p: p.applies_to_exchange(exchange.name))

    # ---- bindings ----

    def bind(
        self,
        source: str,
        destination: Destination,
        routing_key: str,
        arguments: dict[str, Any],
        persist: bool = True,
    ) -> None:
        self.not_default(source)
        exchange = self.exchange(source)
        exchange.validate_binding(destination, routing_key, arguments)
        if getattr(exchange, "delayed_kind", exchange.kind) == "headers":
            match = arguments.get("x-match", "all")
            if match not in ("all", "any", "all-with-x", "any-with-x"):
                shown = erlang_binary(match.encode()) if isinstance(match, str) else repr(match)
                raise ChannelError(
                    PRECONDITION_FAILED,
                    f"Invalid x-match field value {shown}; expected all, any, all-with-x, or "
                    "any-with-x",
                )
        added = exchange.bind(Binding(destination, routing_key, arguments))
        if added and persist and self.persistence is not None:
            self.persistence.binding_changed(
                self.name, exchange, destination, routing_key, arguments, True
            )

    def unbind(
        self, source: str, destination: Destination, routing_key: str, arguments: dict[str, Any]
    ) -> None:
        self.not_default(source)
        exchange = self.exchange(source)
        if exchange.unbind(destination, routing_key, arguments) and self.persistence is not None:
            self.persistence.binding_changed(
                self.name, exchange, destination, routing_key, arguments, False
            )
        self._maybe_auto_delete(exchange)

    # ---- routing ----

    def route(self, exchange: Exchange, msg: Message) -> list[Queue]:
        """The queues a message published to ``exchange`` reaches."""
        if msg.sender_keys is None:
            # a bound method costs an allocation: only for an exchange that reads headers
            headers = msg.get_headers if exchange.reads_headers else _NO_HEADERS
            dests = exchange.route(msg.routing_key, headers)
            if not exchange.has_exchange_destinations and (
                dests or not exchange.alternate_exchange
            ):
                return dests  # type: ignore[return-value]  # no exchange among them: all queues
        queues: dict[int, Queue] = {}  # by identity, in order: each queue once
        self._route_into(exchange, msg, queues, {id(exchange)})
        return list(queues.values())

    def _route_into(
        self, exchange: Exchange, msg: Message, queues: dict[int, Queue], seen: set[int]
    ) -> None:
        """Depth first through exchange-to-exchange bindings and alternate exchanges.

        An explicit stack, not recursion: a chain of thousands of exchange bindings is
        legal and must not end in RecursionError. An exchange's alternate is tried once
        everything reached through it (nested exchanges included) found no queue.
        """
        rk = msg.routing_key
        keys = msg.routing_keys() if msg.sender_keys is not None else None
        headers = msg.get_headers

        def route(exchange: Exchange) -> list[Destination]:
            if keys is None:
                return exchange.route(rk, headers)
            return _route_keys(exchange, keys, headers)

        stack = [(exchange, len(queues), iter(route(exchange)))]
        while stack:
            current, before, dests = stack[-1]
            for dest in dests:
                if isinstance(dest, Exchange):
                    if id(dest) not in seen:
                        seen.add(id(dest))
                        stack.append((dest, len(queues), iter(route(dest))))
                        break  # back to this exchange's iterator once ``dest`` is done
                elif id(dest) not in queues:
                    queues[id(dest)] = dest
            else:
                stack.pop()
                if len(queues) == before and current.alternate_exchange is not None:
                    alternate = self.exchanges.get(current.alternate_exchange)
                    if alternate is not None and id(alternate) not in seen:
                        seen.add(id(alternate))
                        stack.append((alternate, len(queues), iter(route(alternate))))

    def publish(self, exchange_name: str, routing_key: str, properties: bytes, body: bytes) -> bool:
        """Publish from outside AMQP (management API); True if any queue took the message."""
        exchange = self.exchange(exchange_name)
        msg = Message(exchange_name, routing_key, properties, body)
        if exchange.delays and (delay := exchange.delay(msg)):
            if (tracer := self.tracer) is not None:
                tracer.published_by_api(msg, [])
                tracer.delayed(msg, exchange.name, delay)
            exchange.hold(msg, None, delay)
            return False  # taken, but the plugin's route/3 gives no queue: "routed": false
        queues = self.route(exchange, msg)
        if (tracer := self.tracer) is not None:
            tracer.published_by_api(msg, queues)
        return fan_out(queues, msg, None) > 0

    def dead_letter(self, queue: Queue, msg: Message, reason: str) -> None:
        """Route a dead-lettered copy through the queue's dead-letter exchange, if it exists."""
        dlx_name = queue.dead_letter_exchange
        if dlx_name is None:
            return
        exchange = self.exchanges.get(dlx_name)
        if exchange is None:
            return  # RabbitMQ drops the message silently
        routing_key = queue.dead_letter_routing_key
        copy, deaths = dead_letter_copy(
            msg,
            queue.name,
            reason,
            dlx_name,
            routing_key if routing_key is not None else msg.routing_key,
            self.timers.wall(),
        )
        if routing_key is None:  # RabbitMQ routes by the message's own keys, CC and BCC too
            copy.sender_keys = msg.sender_keys
        targets = self.route(exchange, copy)
        if reason != "rejected":
            # a cycle with no rejection in it would spin forever: drop those targets
            targets = [q for q in targets if not _is_cycle(q.name, deaths)]
        if (tracer := self.tracer) is not None:
            tracer.dead_letter_routed(copy, targets)
        if targets:
            fan_out(targets, copy, None)


def _route_keys(exchange: Exchange, keys: list[str], headers: Any) -> list[Destination]:
    """Destinations for any of ``keys`` (CC and BCC add keys), each once, in first-seen order."""
    dests: list[Destination] = []
    seen: set[int] = set()
    for key in keys:
        for dest in exchange.route(key, headers):
            if id(dest) not in seen:
                seen.add(id(dest))
                dests.append(dest)
    return dests


def _is_cycle(queue: str, deaths: list[dict[str, Any]]) -> bool:
    """RabbitMQ's test: back to ``queue`` with no rejection since the message last left it.

    ``deaths`` is newest first, the death happening now at its head.
    """
    for death in deaths:
        if death.get("reason") == "rejected":
            return False
        if death.get("queue") == queue:
            return True
    return False
