"""Declares, deletes and bindings done over HTTP, as the requesting user.

RabbitMQ runs them as AMQP channel methods on the user's behalf, so the same
permission checks apply, in the same order (rabbit_channel): configure on the
object; for a new queue with a dead-letter exchange read on the queue and write
on the exchange; for a new exchange with an alternate exchange read on it and
write on the alternate; write on a binding's destination, read on its source.
``user=None`` skips the checks (definitions import, which needs administrator).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from warren.broker.engine.exchange import Exchange
from warren.broker.ops.management.errors import bad_request
from warren.broker.ops.management.formats import parse_bool, table_from_json

if TYPE_CHECKING:
    from warren.broker.engine.queue import Queue
    from warren.broker.engine.vhost import VirtualHost
    from warren.broker.ops.management.core import Management

# The "connection" the API declares on: it owns no exclusive queue, so exclusive
# queues of AMQP clients are locked to it (RabbitMQ's 405 RESOURCE_LOCKED, as a 400).
API_OWNER = object()


def allow(
    mgmt: Management, user: str | None, vhost: str, kind: str, resource: str, name: str
) -> None:
    if user is None:
        return
    if resource == "exchange" and name == "":
        name = "amq.default"
    mgmt.broker.access.check(user, vhost, kind, resource, name)


def _check_name(kind: str, name: str) -> None:
    if len(name.encode()) > 255:
        raise bad_request(f"{kind} name '{name[:40]}...' is longer than 255 octets")


def declare_queue(
    mgmt: Management, vhost: VirtualHost, name: str, body: dict[str, Any], user: str | None
) -> bool:
    """PUT /api/queues/{vhost}/{name}; True if the queue was created."""
    _check_name("queue", name)
    durable = parse_bool(body.get("durable"))
    auto_delete = parse_bool(body.get("auto_delete"))
    arguments = table_from_json(body.get("arguments"))
    allow(mgmt, user, vhost.name, "configure", "queue", name)
    existed = name in vhost.queues
    dlx = arguments.get("x-dead-letter-exchange")
    if not existed and isinstance(dlx, str):
        allow(mgmt, user, vhost.name, "read", "queue", name)
        allow(mgmt, user, vhost.name, "write", "exchange", dlx)
    vhost.declare_queue(
        name,
        connection=API_OWNER,
        passive=False,
        durable=durable,
        exclusive=False,  # an exclusive queue needs an AMQP connection to own it
        auto_delete=auto_delete,
        arguments=arguments,
    )
    return not existed


def delete_queue(
    mgmt: Management,
    vhost: VirtualHost,
    queue: Queue,
    user: str | None,
    if_unused: bool,
    if_empty: bool,
) -> None:
    allow(mgmt, user, vhost.name, "configure", "queue", queue.name)
    vhost.check_exclusive(queue, API_OWNER)
    where = f"queue '{queue.name}' in vhost '{vhost.name}'"
    if if_unused and queue.consumers:
        raise bad_request(f"{where} in use")
    if if_empty and queue.ready_count:
        raise bad_request(f"{where} not empty")
    vhost.delete_queue(queue)


def declare_exchange(
    mgmt: Management, vhost: VirtualHost, name: str, body: dict[str, Any], user: str | None
) -> bool:
    """PUT /api/exchanges/{vhost}/{name}; True if the exchange was created."""
    _check_name("exchange", name)
    kind = body.get("type") or "direct"
    if not isinstance(kind, str):
        raise bad_request(["not_a_string", kind])
    durable = parse_bool(body.get("durable"))
    auto_delete = parse_bool(body.get("auto_delete"))
    internal = parse_bool(body.get("internal"))
    arguments = table_from_json(body.get("arguments"))
    vhost.not_default(name)
    allow(mgmt, user, vhost.name, "configure", "exchange", name)
    existed = name in vhost.exchanges
    alternate = arguments.get("alternate-exchange")
    if not existed and isinstance(alternate, str):
        allow(mgmt, user, vhost.name, "read", "exchange", name)
        allow(mgmt, user, vhost.name, "write", "exchange", alternate)
    vhost.declare_exchange(
        name,
        kind,
        passive=False,
        durable=durable,
        auto_delete=auto_delete,
        internal=internal,
        arguments=arguments,
    )
    return not existed


def delete_exchange(
    mgmt: Management, vhost: VirtualHost, name: str, user: str | None, if_unused: bool
) -> None:
    vhost.not_default(name)
    allow(mgmt, user, vhost.name, "configure", "exchange", name)
    vhost.delete_exchange(name, if_unused)


def destination(vhost: VirtualHost, kind: str, name: str) -> Queue | Exchange:
    """A binding's destination; RabbitMQ names a missing one with a 404."""
    if kind == "q":
        queue = vhost.queue(name)  # NOT_FOUND if missing
        vhost.check_exclusive(queue, API_OWNER)
        return queue
    return vhost.exchange(name)


def bind(
    mgmt: Management,
    vhost: VirtualHost,
    source: str,
    kind: str,
    dest_name: str,
    routing_key: str,
    arguments: dict[str, Any],
    user: str | None,
) -> None:
    resource = "queue" if kind == "q" else "exchange"
    allow(mgmt, user, vhost.name, "write", resource, dest_name)
    if kind == "e":
        vhost.not_default(dest_name)
    vhost.not_default(source)
    allow(mgmt, user, vhost.name, "read", "exchange", source)
    vhost.exchange(source)  # a missing source is named first, as over AMQP
    vhost.bind(source, destination(vhost, kind, dest_name), routing_key, arguments)


def unbind(
    mgmt: Management,
    vhost: VirtualHost,
    source: str,
    kind: str,
    dest: Queue | Exchange,
    routing_key: str,
    arguments: dict[str, Any],
    user: str | None,
) -> None:
    resource = "queue" if kind == "q" else "exchange"
    allow(mgmt, user, vhost.name, "write", resource, dest.name)
    allow(mgmt, user, vhost.name, "read", "exchange", source)
    vhost.unbind(source, dest, routing_key, arguments)
