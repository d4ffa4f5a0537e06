"""Keeps the on-disk stores in step with the engine, and rebuilds the engine from them.

The engine calls these hooks when something durable changes; at start-up
``restore`` recreates vhosts, users, permissions, policies, durable exchanges,
queues and bindings, then puts the persistent messages back in their queues.
"""

from __future__ import annotations

import gc
import os
import time
from typing import TYPE_CHECKING, Any

from warren.broker.engine.parameters import ParameterError
from warren.broker.engine.policy import Policy, PolicyError
from warren.broker.engine.queue_restore import expire_restored
from warren.broker.engine.topic_permissions import TopicPermission
from warren.broker.store import DefinitionStore, MessageStore

if TYPE_CHECKING:
    from warren.broker.engine.broker import Broker
    from warren.broker.engine.exchange import Exchange
    from warren.broker.engine.queue import Queue
    from warren.broker.engine.timers import Timers
    from warren.broker.engine.users import User


FREEZE_AFTER = 100_000  # recovered messages
RESTORE_CHUNK = 65536  # recovered records handed to their queues at once
# held messages of a durable x-delayed-message exchange are logged under this id + its row id,
# apart from queue ids (broker/engine/exchange_plugins.py)
DELAYED_ID_BASE = 1 << 31


def make_private(data_dir: str) -> None:
    """The data directory and all in it readable by the broker's user only (0700
    directories, 0600 files): definitions.sqlite3 holds password hashes, the segments
    message bodies. Files made later inherit the directories' protection (and the stores
    create theirs 0600)."""
    os.chmod(data_dir, 0o700)
    for root, dirs, files in os.walk(data_dir):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o700)
        for name in files:
            os.chmod(os.path.join(root, name), 0o600)


class Persistence:
    def __init__(
        self,
        data_dir: str,
        log: Any,
        *,
        clock: Timers,
        segment_size: int = 16 * 1024 * 1024,
        sync: bool = True,
    ) -> None:
        self.log = log
        self.definitions = DefinitionStore(data_dir)
        self.messages = MessageStore(
            os.path.join(data_dir, "messages"),
            log,
            clock=clock,
            segment_size=segment_size,
            sync=sync,
        )
        self._restored_queues: list[Queue] = []
        make_private(data_dir)

    # ---- hooks from the engine ----

    def vhost_added(self, name: str, default_queue_type: str) -> None:
        self.definitions.save_vhost(name, default_queue_type)

    def vhost_queue_type_set(self, name: str, default_queue_type: str) -> None:
        self.definitions.save_vhost_queue_type(name, default_queue_type)

    def vhost_deleted(self, name: str) -> None:
        self.definitions.delete_vhost(name)

    def user_saved(self, user: User) -> None:
        self.definitions.save_user(user.name, user.password_hash, user.tags)

    def user_deleted(self, name: str) -> None:
        self.definitions.delete_user(name)

    def permission_saved(
        self, user: str, vhost: str, configure: str, write: str, read: str
    ) -> None:
        self.definitions.save_permission(user, vhost, configure, write, read)

    def permission_deleted(self, user: str, vhost: str) -> None:
        self.definitions.delete_permission(user, vhost)

    def policy_saved(self, policy: Policy) -> None:
        self.definitions.save_policy(
            policy.vhost, policy.name, policy.pattern, policy.apply_to, policy.priority,
            policy.definition,
        )  # fmt: skip

    def policy_deleted(self, vhost: str, name: str) -> None:
        self.definitions.delete_policy(vhost, name)

    def exchange_declared(self, vhost: str, exchange: Exchange) -> None:
        if exchange.durable:
            self.definitions.save_exchange(
                vhost, exchange.name, exchange.kind, exchange.auto_delete, exchange.internal,
                exchange.arguments,
            )  # fmt: skip

    def exchange_deleted(self, vhost: str, exchange: Exchange) -> None:
        if exchange.durable:
            self.definitions.delete_exchange(vhost, exchange.name)
            if exchange.delays:
                self.definitions.delete_delayed_exchange(vhost, exchange.name)

    def delayed_exchange_id(self, vhost: str, name: str) -> int:
        return DELAYED_ID_BASE + self.definitions.delayed_exchange_id(vhost, name)

    def queue_declared(self, vhost: str, queue: Queue) -> None:
        if queue.durable and queue.exclusive_owner is None:
            queue.store_id = self.definitions.save_queue(
                vhost, queue.name, queue.auto_delete, queue.arguments
            )
            queue.message_store = self.messages

    def queue_deleted(self, vhost: str, queue: Queue) -> None:
        if queue.store_id:
            self.definitions.delete_queue(vhost, queue.name)

    def binding_changed(
        self,
        vhost: str,
        source: Exchange,
        destination: Any,
        routing_key: str,
        arguments: dict[str, Any],
        added: bool,
    ) -> None:
        from warren.broker.engine.exchange import Exchange

        if not source.durable or not destination.durable:
            return
        if isinstance(destination, Exchange):
            kind, name = "exchange", destination.name
        elif getattr(destination, "store_id", 0):
            kind, name = "queue", destination.name
        else:
            return
        if added:
            self.definitions.save_binding(vhost, source.name, kind, name, routing_key, arguments)
        else:
            self.definitions.delete_binding(vhost, source.name, kind, name, routing_key, arguments)

    # ---- start-up ----

    def restore(self, broker: Broker) -> None:
        """Rebuild the durable topology and its persistent messages."""
        # Millions of new long-lived objects would trigger ever longer full collections
        # that find nothing; a large store's objects also stay out of later ones.
        gc.disable()
        try:
            self._restore(broker)
        finally:
            if len(self.messages.messages) >= FREEZE_AFTER:
                gc.freeze()
            gc.enable()

    def _restore(self, broker: Broker) -> None:
        from warren.broker.streams.stream import (  # it imports queue.py
            StreamQueue,
            stream_directory,
        )

        started = time.monotonic()
        defs = self.definitions.load()
        access = broker.access
        # a store with neither vhosts nor users never got past its first start; one with
        # users but no vhost had them deleted, and RabbitMQ does not bring them back
        if self.definitions.fresh or not (defs.vhosts or defs.users):
            self._save_boot_state(broker)  # first start: the defaults become durable
            defs = self.definitions.load()
        else:
            # RabbitMQ creates the default user and vhost on first start only
            access.users.clear()
            access.permissions.clear()
            broker.vhosts.clear()
        for name in defs.vhosts:
            restored = broker.add_vhost(name, persist=False)
            # a vhost keeps the type it was created with; one stored without (an older
            # Warren) gets the node's, kept from now on (rabbit_vhost:recover/1)
            dqt = defs.vhost_queue_types.get(name)
            restored.set_default_queue_type(dqt or restored.default_queue_type, persist=not dqt)
        for name, password_hash, tags in defs.users:
            access.add_user(name, password_hash=password_hash, tags=tags, persist=False)
        for user_name, on_vhost, configure, write, read in defs.permissions:
            access.set_permissions(user_name, on_vhost, configure, write, read, persist=False)
        for user_name, on_vhost, exchange, write, read in defs.topic_permissions:
            access.set_topic_permission(
                user_name, on_vhost, TopicPermission(exchange, write, read), persist=False
            )
        for user_name, limits in defs.user_limits:
            access.set_user_limits(user_name, limits, persist=False)
        for vhost_name, name, pattern, apply_to, priority, definition in defs.policies:
            vhost = broker.vhosts.get(vhost_name)
            if vhost is None:
                continue
            try:
                vhost.set_policy(
                    Policy(vhost_name, name, pattern, definition, apply_to, priority),
                    persist=False,
                )
            except PolicyError as exc:
                self.log.warning("stored policy no longer valid", policy=name, error=str(exc))
        broker.global_parameters.values = dict(defs.global_parameters)
        parameters = broker.parameters
        parameters.values.clear()
        for vhost_name, component, name, value in defs.parameters:
            if vhost_name not in broker.vhosts:
                continue
            try:
                parameters.set(vhost_name, component, name, value, persist=False)
            except ParameterError as exc:
                self.log.warning(
                    "stored parameter no longer valid", component=component, parameter=name,
                    error=str(exc),
                )  # fmt: skip
        for vhost_name, name, kind, auto_delete, internal, arguments in defs.exchanges:
            vhost = broker.vhosts.get(vhost_name)
            if vhost is not None and name not in vhost.exchanges:
                vhost.restore_exchange(name, kind, auto_delete, internal, arguments)
        queues_by_id: dict[int, Queue] = {}
        for queue_id, vhost_name, name, auto_delete, arguments in defs.queues:
            vhost = broker.vhosts.get(vhost_name)
            if vhost is not None:
                queue = vhost.restore_queue(name, auto_delete, arguments)
                queue.store_id = queue_id
                queue.message_store = self.messages
                queues_by_id[queue_id] = queue
                if isinstance(queue, StreamQueue):  # its own log (broker/streams/stream.py)
                    queue.open_log(self.messages, stream_directory(self.messages, queue_id))
        for vhost_name, source, kind, destination, routing_key, arguments in defs.bindings:
            host = broker.vhosts.get(vhost_name)
            if host is None or source not in host.exchanges:
                continue
            target: Any = (host.exchanges if kind == "exchange" else host.queues).get(destination)
            if target is not None:
                host.bind(source, target, routing_key, arguments, persist=False)
        self.messages.pager.page_limit = broker.settings.queue_body_memory_limit
        delayed: dict[int, Any] = {
            getattr(ex, "store_id", 0): ex
            for host in broker.vhosts.values()
            for ex in host.exchanges.values()
            if getattr(ex, "store_id", 0)
        }
        # a queue that can pack its paged-out messages (broker/store/paged.py) takes those past its
        # memory limit as places in the log; so are those of a queue gone (only counted)
        packers = {
            queue_id for queue_id, queue in queues_by_id.items()
            if not queue.max_priority and not isinstance(queue, StreamQueue)
        }  # fmt: skip

        def packs(queue_id: int) -> bool:
            return queue_id in packers or (
                queue_id not in queues_by_id and queue_id not in delayed
            )  # fmt: skip

        stored = self.messages.recover(packs)
        for queue_id, count in self.messages.recover_losses().items():
            lost_from = queues_by_id.get(queue_id)
            self.log.error(
                "messages lost to damaged records in the message store",
                queue=lost_from.name if lost_from is not None else None,
                vhost=lost_from.vhost.name if lost_from is not None else None,
                queue_id=queue_id or None,
                lost=count,
                reason="checksum mismatch" if queue_id else "unreadable record header",
            )
        now_wall, now_mono = broker.clock.wall(), broker.clock.now()
        # each owner takes its messages in chunks, so that no more than RESTORE_CHUNK records
        # are out of the store's index at once
        by_queue: dict[Queue, list[Any]] = {}
        by_exchange: dict[Any, list[Any]] = {}
        taken: dict[Queue, None] = {}
        orphans: dict[int, int] = {}  # segment -> messages of queues gone in it
        waiting = 0

        def hand_over() -> None:
            for queue, records in by_queue.items():
                self.messages.adopt(queue.restore_messages(records, now_wall, now_mono))
                taken[queue] = None
            for exchange, records in by_exchange.items():
                self.messages.adopt(exchange.restore_messages(records, now_wall))
            by_queue.clear()
            by_exchange.clear()

        for record in stored:
            owner = queues_by_id.get(record.queue_id)
            if owner is not None:
                by_queue.setdefault(owner, []).append(record)
            elif (held_by := delayed.get(record.queue_id)) is not None:
                by_exchange.setdefault(held_by, []).append(record)
            else:  # its queue was deleted: the message goes with it
                orphans[record.segment] = orphans.get(record.segment, 0) + 1
                continue
            waiting += 1
            if waiting >= RESTORE_CHUNK:
                hand_over()
                waiting = 0
        hand_over()
        self.messages.finish_recovery(orphans)
        self._restored_queues = list(taken)
        self.log.info(
            "store recovered",
            queues=len(queues_by_id), messages=len(self.messages.messages),
            paged_out=sum(q.paged_count for q in taken),
            seconds=round(time.monotonic() - started, 3),
        )  # fmt: skip

    def expire_restored(self) -> None:
        """Once the store runs, expire what timed out during the downtime (it writes records)."""
        for queue in self._restored_queues:
            expire_restored(queue)
        self._restored_queues = []

    def _save_boot_state(self, broker: Broker) -> None:
        """First start on this data directory: what the settings created becomes durable."""
        for name, vhost in broker.vhosts.items():
            self.vhost_added(name, vhost.default_queue_type)
        for user in broker.access.users.values():
            self.user_saved(user)
        for (user_name, vhost_name), perm in broker.access.permissions.items():
            self.permission_saved(user_name, vhost_name, perm.configure, perm.write, perm.read)

    def start(self, loop: Any) -> None:
        self.messages.start(loop)
        self.expire_restored()

    def close(self) -> None:
        self.messages.close()
        self.definitions.close()
