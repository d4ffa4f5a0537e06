"""Topology: exchange.declare, delete, bind, unbind and queue.declare, bind, unbind, purge,
delete on a channel: permissions, RabbitMQ's order of checks, and the replies; the
vhost (broker/engine/vhost.py) does the work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pamqp import commands

from warren.broker.engine import reply_to
from warren.protocol.constants import ACCESS_REFUSED, PRECONDITION_FAILED
from warren.protocol.errors import ChannelError
from warren.protocol.methods import cancel_frame, make

if TYPE_CHECKING:
    from warren.broker.engine.channel import Channel

# ---- exchanges ----


def exchange_declare(ch: Channel, method: commands.Exchange.Declare) -> None:
    if not method.passive and method.exchange:
        ch.allow("configure", "exchange", method.exchange)
        alternate = (method.arguments or {}).get("alternate-exchange")
        if isinstance(alternate, str):  # RabbitMQ: the exchange passes messages on to it
            ch.allow("read", "exchange", method.exchange)
            ch.allow("write", "exchange", alternate)
    ch.vhost.declare_exchange(
        method.exchange,
        method.exchange_type,
        passive=method.passive,
        durable=method.durable,
        auto_delete=method.auto_delete,
        internal=method.internal,
        arguments=method.arguments or {},
    )
    if not method.nowait:
        ch.reply(commands.Exchange.DeclareOk())


def exchange_delete(ch: Channel, method: commands.Exchange.Delete) -> None:
    ch.vhost.not_default(method.exchange)
    if method.exchange.startswith("amq."):  # checked before permissions, as RabbitMQ does
        raise ChannelError(
            ACCESS_REFUSED,
            f"deletion of system exchange '{method.exchange}' in vhost "
            f"'{ch.vhost.name}' not allowed",
        )
    ch.allow("configure", "exchange", method.exchange)
    ch.vhost.delete_exchange(method.exchange, method.if_unused)
    if not method.nowait:
        ch.reply(commands.Exchange.DeleteOk())


def _exchange_binding_allowed(
    ch: Channel, method: commands.Exchange.Bind | commands.Exchange.Unbind
) -> None:
    # RabbitMQ's order: write on the destination, neither end the default, read on the source
    ch.allow("write", "exchange", method.destination)
    ch.vhost.not_default(method.destination)
    ch.vhost.not_default(method.source)
    ch.allow("read", "exchange", method.source)
    _topic_read(ch, method.source, method.routing_key)


def exchange_bind(ch: Channel, method: commands.Exchange.Bind) -> None:
    _exchange_binding_allowed(ch, method)
    destination = ch.vhost.exchange(method.destination)
    ch.vhost.bind(method.source, destination, method.routing_key, method.arguments or {})
    if not method.nowait:
        ch.reply(commands.Exchange.BindOk())


def exchange_unbind(ch: Channel, method: commands.Exchange.Unbind) -> None:
    _exchange_binding_allowed(ch, method)
    destination = ch.vhost.exchanges.get(method.destination)
    if destination is not None:  # RabbitMQ: unbinding what is not there succeeds
        ch.vhost.unbind(method.source, destination, method.routing_key, method.arguments or {})
    if not method.nowait:
        ch.reply(commands.Exchange.UnbindOk())


def _topic_read(ch: Channel, exchange: str, routing_key: str) -> None:
    """Read on a topic exchange's binding key, after read on the exchange (RabbitMQ 4.3,
    rabbit_channel:binding_action_with_checks/10); a missing exchange is not checked."""
    access = ch.conn.broker.access
    if access.topic_permissions:
        rule = access.topic_rule(ch.conn.user, ch.vhost.name, exchange)
        found = ch.vhost.exchanges.get(exchange) if rule is not None else None
        if rule is not None and found is not None and found.kind == "topic":
            rule.check("read", routing_key)


# ---- queues ----


def queue_declare(ch: Channel, method: commands.Queue.Declare) -> None:
    name = method.queue
    if name == reply_to.REPLY_TO or name.startswith(reply_to.REPLY_TO_PREFIX):
        reply_to.queue_declare(ch, method)  # direct reply-to's pseudo-queue
        return
    server_named = not name and not method.passive
    if server_named:
        name = ch.vhost.new_queue_name()
    if method.passive:
        ch.allow_any("queue", name)
    else:
        if name.startswith("amq.") and not server_named:
            # RabbitMQ 4.3 (rabbit_channel.erl, handle_method queue.declare): check_name/2
            # comes before check_configure_permitted/3
            raise ChannelError(
                ACCESS_REFUSED, f"queue name '{name}' contains reserved prefix 'amq.*'"
            )
        ch.allow("configure", "queue", name)
        ch.conn.broker.stats.queues_declared += 1  # as RabbitMQ: once permitted
        dlx = (method.arguments or {}).get("x-dead-letter-exchange")
        if isinstance(dlx, str):  # RabbitMQ: the queue passes messages on to it
            ch.allow("read", "queue", name)
            ch.allow("write", "exchange", dlx or "amq.default")
    queue = ch.vhost.declare_queue(
        ch.queue_name(name),
        server_named=server_named,
        connection=ch.conn,
        passive=method.passive,
        # RabbitMQ makes an exclusive queue transient (rabbit_channel, queue.declare)
        durable=method.durable and not method.exclusive,
        exclusive=method.exclusive,
        auto_delete=method.auto_delete,
        arguments=method.arguments or {},
    )
    if queue.exclusive_owner is ch.conn:
        ch.conn.exclusive_queues[queue.name] = queue
    ch.last_queue = queue.name
    if not method.nowait:
        ch.reply(
            make(
                commands.Queue.DeclareOk,
                queue=queue.name,
                message_count=queue.ready_count,
                consumer_count=len(queue.consumers),
            )
        )


def _not_volatile(queue: str) -> None:
    """RabbitMQ 4.3 (rabbit_channel.erl, reject_volatile_queue_as_binding_target/2): a
    direct reply-to address is never a binding's destination; checked before permissions."""
    if queue.startswith(reply_to.REPLY_TO_PREFIX):
        raise ChannelError(
            ACCESS_REFUSED, "cannot bind or unbind to a volatile (direct reply-to) queue"
        )


def queue_bind(ch: Channel, method: commands.Queue.Bind) -> None:
    _not_volatile(method.queue)
    ch.allow("write", "queue", ch.queue_name(method.queue))
    ch.vhost.not_default(method.exchange)
    ch.allow("read", "exchange", method.exchange)
    _topic_read(ch, method.exchange, method.routing_key)
    ch.vhost.exchange(method.exchange)  # RabbitMQ names a missing exchange first
    queue = ch.vhost.queue(ch.queue_name(method.queue), ch.conn)
    ch.vhost.bind(method.exchange, queue, method.routing_key, method.arguments or {})
    if not method.nowait:
        ch.reply(commands.Queue.BindOk())


def queue_unbind(ch: Channel, method: commands.Queue.Unbind) -> None:
    _not_volatile(method.queue)
    ch.allow("write", "queue", ch.queue_name(method.queue))
    ch.vhost.not_default(method.exchange)
    ch.allow("read", "exchange", method.exchange)
    _topic_read(ch, method.exchange, method.routing_key)
    queue = ch.vhost.queues.get(ch.queue_name(method.queue))
    exchange = ch.vhost.exchanges.get(method.exchange)
    arguments = method.arguments or {}
    # RabbitMQ: unbinding what is not there succeeds, before exclusivity is checked
    if (
        queue is not None
        and exchange is not None
        and exchange.has_binding(queue, method.routing_key, arguments)
    ):
        ch.vhost.check_exclusive(queue, ch.conn)
        ch.vhost.unbind(method.exchange, queue, method.routing_key, arguments)
    ch.reply(commands.Queue.UnbindOk())


def queue_purge(ch: Channel, method: commands.Queue.Purge) -> None:
    ch.allow("read", "queue", ch.queue_name(method.queue))
    queue = ch.vhost.queue(ch.queue_name(method.queue), ch.conn)
    count = queue.purge()
    if not method.nowait:
        ch.reply(commands.Queue.PurgeOk(message_count=count))


def queue_delete(ch: Channel, method: commands.Queue.Delete) -> None:
    name = ch.queue_name(method.queue)
    ch.allow("configure", "queue", name)
    queue = ch.vhost.queues.get(name)
    count = 0
    if queue is not None:
        ch.vhost.check_exclusive(queue, ch.conn)
        where = f"queue '{name}' in vhost '{ch.vhost.name}'"
        if method.if_unused and queue.consumers:
            raise ChannelError(PRECONDITION_FAILED, f"{where} in use")
        if method.if_empty and queue.ready_count:
            raise ChannelError(PRECONDITION_FAILED, f"{where} not empty")
        ch.cancels_after = []
        try:
            count = ch.vhost.delete_queue(queue)
        finally:
            cancels, ch.cancels_after = ch.cancels_after, None
        ch.conn.exclusive_queues.pop(name, None)
    else:
        cancels = []
    if not method.nowait:
        ch.reply(commands.Queue.DeleteOk(message_count=count))
    for tag in cancels:
        ch.conn.write(cancel_frame(ch.id, tag))
