"""JSON shapes of Warren's objects, with RabbitMQ's field names.

Reading only: nothing here changes the engine. Values decoded from AMQP
tables (bytes, decimals, timestamps) are turned into what RabbitMQ's API
prints for them.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import hashlib
import json
import sys
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import quote_plus

from warren.broker.engine.exchange import Exchange
from warren.broker.engine.message import READY, Message
from warren.broker.ops.management.core import (
    CHANNEL_FIELDS,
    QUEUE_FIELDS,
    channel_values,
    queue_values,
)
from warren.broker.ops.management.errors import bad_request
from warren.broker.server.listen import transport_address
from warren.protocol.properties import (
    PROPERTIES,
    PropertiesError,
    encode_shortstr,
    read_properties,
    timestamp_of,
)
from warren.protocol.tables import encode_table

if TYPE_CHECKING:
    from warren.broker.engine.channel import Channel
    from warren.broker.engine.consumer import Consumer
    from warren.broker.engine.queue import Queue
    from warren.broker.engine.vhost import VirtualHost
    from warren.broker.ops.management.core import Management
    from warren.broker.server.amqp_connection import Connection


def json_value(value: Any) -> Any:
    """An AMQP field value as RabbitMQ's JSON shows it."""
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, datetime.datetime):
        return int(value.timestamp())
    return value


def table_from_json(value: Any) -> dict[str, Any]:
    """A JSON object given as AMQP arguments; RabbitMQ takes ``[]`` or null for an empty table."""
    if value is None or value == []:
        return {}
    if not isinstance(value, dict):
        raise bad_request(["not_a_table", json_value(value)])
    return dict(value)


def parse_bool(value: Any, default: bool = False) -> bool:
    """RabbitMQ's parse_bool: true/false or their strings; anything else is a 400."""
    if value is None:
        return default
    if value in (True, "true"):
        return True
    if value in (False, "false"):
        return False
    raise bad_request(["not_boolean", json_value(value)])


def rate(value: float) -> dict[str, float]:
    return {"rate": round(value, 1)}


def with_details(out: dict[str, Any], name: str, value: int, rates: dict[str, float]) -> None:
    out[name] = value
    out[name + "_details"] = rate(rates.get(name, 0.0))


def message_stats(counts: dict[str, int], rates: dict[str, float]) -> dict[str, Any]:
    stats: dict[str, Any] = {}
    for name, value in counts.items():
        with_details(stats, name, value, rates)
    return stats


# ---- connections, channels, consumers ----


def _address(conn: Connection, which: str) -> tuple[str, int]:
    return transport_address(conn.transport, which)


def connection_name(conn: Connection) -> str:
    return conn.name


def channel_name(channel: Channel) -> str:
    return f"{connection_name(channel.conn)} ({channel.id})"


def connected_at_ms(mgmt: Management, conn: Connection) -> int:
    """When it was opened (connected, if it never was), on the loop's monotonic clock; the API
    shows wall-clock milliseconds."""
    since = conn.opened_at if conn.opened_at is not None else conn.connected_at
    age = mgmt.broker.timers.now() - since
    return int((mgmt.wall_clock() - age) * 1000)


def send_pending(conn: Connection) -> int:
    """Bytes written but not yet taken by the socket (RabbitMQ's send_pend, inet's
    send_pend: the port's queue); a transport without a buffer has none."""
    size = getattr(conn.transport, "get_write_buffer_size", None)
    return int(size()) if size is not None else 0


def connection_json(mgmt: Management, conn: Connection) -> dict[str, Any]:
    props = conn.client_properties
    host, port = conn.peer if conn.peer else ("?", 0)
    local_host, local_port = _address(conn, "sockname")
    out: dict[str, Any] = {
        "name": connection_name(conn),
        "node": mgmt.node,
        "vhost": conn.vhost.name,
        "user": conn.user,
        "user_who_performed_action": conn.user,
        "state": "closing" if conn.closing else "running",
        "type": "direct" if conn.direct else "network",  # direct: a shovel's amqp://
        "protocol": "AMQP 0-9-1",
        "auth_mechanism": "PLAIN",
        "host": local_host,
        "port": local_port,
        "peer_host": host,
        "peer_port": port,
        "ssl": False,
        "channels": len(conn.channels),
        "channel_max": conn.channel_max,
        "frame_max": conn.frame_max,
        "timeout": conn.heartbeat,
        "connected_at": connected_at_ms(mgmt, conn),
        "client_properties": json_value(props),
        # socket traffic, counted per read and per write (Connection.data_received, flush)
        "recv_cnt": conn.recv_cnt,
        "send_cnt": conn.send_cnt,
        "send_pend": send_pending(conn),
    }
    rates = mgmt.rates.rates(conn)
    with_details(out, "recv_oct", conn.recv_oct, rates)
    with_details(out, "send_oct", conn.send_oct, rates)
    provided = props.get("connection_name")
    if provided is not None:
        out["user_provided_name"] = json_value(provided)
    return out


def _connection_details(conn: Connection) -> dict[str, Any]:
    host, port = conn.peer if conn.peer else ("?", 0)
    return {"name": connection_name(conn), "peer_host": host, "peer_port": port}


def channel_json(mgmt: Management, channel: Channel, full: bool = False) -> dict[str, Any]:
    conn = channel.conn
    out: dict[str, Any] = {
        "name": channel_name(channel),
        "node": mgmt.node,
        "number": channel.id,
        "vhost": channel.vhost.name,
        "user": conn.user,
        "user_who_performed_action": conn.user,
        "connection_details": _connection_details(conn),
        "state": "running" if channel.flow_active else "flow",
        "confirm": channel.confirm,
        "transactional": channel.tx,
        "consumer_count": len(channel.consumers),
        "messages_unacknowledged": len(channel.unacked),
        "messages_unconfirmed": channel.confirms.unconfirmed if channel.confirm else 0,
        "messages_uncommitted": len(channel.tx_publishes),
        "acks_uncommitted": sum(len(msgs) for _, msgs, _ in channel.tx_settles),
        "prefetch_count": channel.limiter.prefetch_count,
        "global_prefetch_count": channel.limiter.prefetch_global,
        "message_stats": message_stats(
            dict(zip(CHANNEL_FIELDS, channel_values(channel.stats), strict=True)),
            mgmt.rates.rates(channel),
        ),
    }
    idle = mgmt.rates.idle_since(channel)
    if idle is not None:
        out["idle_since"] = time_text(idle)
    if full:
        out["consumer_details"] = [consumer_json(mgmt, c) for c in channel.consumers.values()]
    return out


def consumer_json(mgmt: Management, consumer: Consumer) -> dict[str, Any]:
    channel = consumer.channel
    conn = channel.conn
    host, port = conn.peer if conn.peer else ("?", 0)
    queue = consumer.queue
    active = True
    status = "up"
    if queue.single_active_consumer:
        active = bool(queue.consumers) and queue.consumers[0] is consumer
        status = "single_active" if active else "waiting"
    return {
        "consumer_tag": consumer.tag,
        "queue": {"name": queue.name, "vhost": queue.vhost.name},
        "channel_details": {
            "name": channel_name(channel),
            "number": channel.id,
            "connection_name": connection_name(conn),
            "peer_host": host,
            "peer_port": port,
            "user": conn.user,
            "node": mgmt.node,
        },
        "ack_required": not consumer.no_ack,
        "exclusive": consumer.exclusive,
        "prefetch_count": consumer.prefetch,
        "active": active,
        "activity_status": status,
        "arguments": json_value(consumer.arguments),
        # Warren's own: the consumer timeout (quorum queues) and its timeout state
        "priority": consumer.priority,
        "messages_unacknowledged": consumer.unacked,
        "timed_out": consumer.timed_out > 0,
        "timed_out_deliveries": consumer.timed_out,
        # Warren's own: how long its oldest unsettled delivery has waited (0: none), and
        # whether that is past warren.consumer_stuck_after (broker/ops/management/stuck.py)
        "oldest_unacked_ms": (age := mgmt.unacked_ages.age_ms(consumer, mgmt.broker.clock.now())),
        "stuck": age >= mgmt.stuck_after_ms,
        # only when it has one: rabbitmqadmin 3.10's ``list consumers`` measures every value
        # with len() and crashes on a null
        **({} if consumer.timeout is None else {"consumer_timeout": consumer.timeout}),
    }


# ---- queues, exchanges, bindings ----


def queue_counts(queue: Queue) -> dict[str, int]:
    # the message counters (the sampler's fields before the lengths)
    return dict(zip(QUEUE_FIELDS[:QUEUE_COUNTERS], queue_values(queue), strict=False))


QUEUE_COUNTERS = QUEUE_FIELDS.index("messages")
# what a message object costs in memory beside its body: the object with its slots and
# the queue's reference to it (sys.getsizeof of an empty Message, measured once)
MESSAGE_OVERHEAD = sys.getsizeof(Message("", "", b"", b"")) + 8


def time_text(ms: int) -> str:
    """RabbitMQ's rabbit_mgmt_format:now_to_str/1: RFC 3339, milliseconds, local offset."""
    moment = datetime.datetime.fromtimestamp(ms / 1000).astimezone()
    return moment.isoformat(timespec="milliseconds")


def oldest_unacked(mgmt: Management) -> dict[Queue, Message]:
    """Each queue's oldest unacknowledged message, read off the channels (once a request)."""
    found: dict[Queue, Message] = {}
    for conn in mgmt.connections():
        for channel in conn.channels.values():
            for msg in channel.unacked.values():
                queue = cast("Queue | None", msg.queue)
                if queue is not None:
                    oldest = found.get(queue)
                    if oldest is None or msg.seq < oldest.seq:
                        found[queue] = msg
    return found


def head_message_timestamp(queue: Queue, oldest: Message | None) -> int | None:
    """rabbit_variable_queue:head_message_timestamp/2 (4.3): the smaller timestamp property
    of the ready head and of the oldest unacknowledged message, of those in memory; none
    without one. A paged-out head is not in memory there either."""
    stamps = []
    for msg in queue.ready:
        if msg.state == READY:
            if msg.paged_size < 0 and (stamp := timestamp_of(msg.properties)) is not None:
                stamps.append(stamp)
            break
    if oldest is not None and (stamp := timestamp_of(oldest.properties)) is not None:
        stamps.append(stamp)
    return min(stamps) if stamps else None


def queue_json(
    mgmt: Management,
    queue: Queue,
    full: bool = False,
    unacked: dict[Queue, Message] | None = None,
) -> dict[str, Any]:
    """``full``: the single queue's form (RabbitMQ 4.3's detail stats, with idle_since);
    a listing is the basic form (rabbit_mgmt_format:format_queue_basic_stats/1), which
    leaves out idle_since and a head_message_timestamp the queue does not have.
    ``unacked``: oldest_unacked() of the request, when it lists many queues."""
    rates = mgmt.rates.rates(queue)
    stats = queue.stats
    policy = queue.policy
    owner: Any = queue.exclusive_owner
    if unacked is None:
        unacked = oldest_unacked(mgmt)
    quorum = queue.queue_type == "quorum"
    ready_ram = queue.ready_count - queue.paged_count
    bytes_ram = queue.ready_bytes - queue.paged_bytes + queue.unacked_bytes
    messages_ram = ready_ram + queue.unacked_count
    out: dict[str, Any] = {
        "name": queue.name,
        "vhost": queue.vhost.name,
        "node": mgmt.node,
        "type": queue.queue_type,
        "durable": queue.durable,
        "auto_delete": queue.auto_delete,
        "exclusive": owner is not None,
        "arguments": json_value(queue.arguments),
        "state": "running",
        "consumers": len(queue.consumers),
        "exclusive_consumer_tag": (
            queue.exclusive_consumer.tag if queue.exclusive_consumer is not None else None
        ),
        "single_active_consumer_tag": (
            queue.consumers[0].tag if queue.single_active_consumer and queue.consumers else None
        ),
        "policy": policy.name if policy is not None else None,
        "operator_policy": (
            queue.operator_policy.name if queue.operator_policy is not None else None
        ),
        # rabbit_policy:effective_definition/1: the policy merged with the operator policy
        "effective_policy_definition": dict(queue.effective_definition()),
        # consumer capacity: rabbit_queue_consumers:capacity/1, 0 without consumers
        # (rabbit_amqqueue_process:i/2); consumer_utilisation is its older name
        "consumer_capacity": queue.use.capacity(queue) if queue.consumers else 0,
        "consumer_utilisation": queue.use.capacity(queue) if queue.consumers else 0,
        "message_bytes": queue.ready_bytes + queue.unacked_bytes,
        "message_bytes_ready": queue.ready_bytes,
        "message_bytes_unacknowledged": queue.unacked_bytes,
        # every message of a quorum queue is persistent (rabbit_quorum_queue:i/2)
        "messages_persistent": (
            queue.ready_count + queue.unacked_count if quorum else stats.persistent
        ),
        "message_bytes_persistent": (
            queue.ready_bytes + queue.unacked_bytes if quorum else stats.persistent_bytes
        ),
        "messages_ram": messages_ram,
        "message_bytes_ram": bytes_ram,
        # an estimate: the bodies and message objects held in memory (Warren has no queue
        # process whose memory could be measured)
        "memory": sys.getsizeof(queue) + bytes_ram + messages_ram * MESSAGE_OVERHEAD,
        "messages_paged_out": queue.paged_count,
        "message_bytes_paged_out": queue.paged_bytes,
        "message_stats": message_stats(queue_counts(queue), rates),
        # Warren's own counters: retries, expiries, dead-letters, consumer timeouts
        "messages_delayed": queue.delayed_count,
        "messages_retried": stats.retried,
        "messages_expired": stats.expired,
        "messages_dead_lettered": dict(stats.dead_lettered),
        "consumer_timeouts": stats.consumer_timeouts,
        # rabbit_variable_queue's disk_reads/disk_writes, which rabbitmqctl list_queues shows
        # (RabbitMQ's API leaves them out; warrenctl reads them here)
        "disk_reads": stats.disk_reads,
        "disk_writes": stats.disk_writes,
    }
    with_details(out, "messages", queue.ready_count + queue.unacked_count, rates)
    with_details(out, "messages_ready", queue.ready_count, rates)
    with_details(out, "messages_unacknowledged", queue.unacked_count, rates)
    if not quorum:  # rabbit_quorum_queue has no such keys (its ?STATISTICS_KEYS, handle_tick)
        out["messages_ready_ram"] = ready_ram
        out["messages_unacknowledged_ram"] = queue.unacked_count  # delivered: in memory
        head = head_message_timestamp(queue, unacked.get(queue))
        if head is not None or full:
            out["head_message_timestamp"] = head
    if owner is not None and hasattr(owner, "peer"):
        out["owner_pid_details"] = _connection_details(owner)
    if full:
        out["consumer_details"] = [consumer_json(mgmt, c) for c in queue.consumers]
        idle = mgmt.rates.idle_since(queue)
        if idle is not None:
            out["idle_since"] = time_text(idle)
    if queue.queue_type == "stream":  # segments, offsets, readers (broker/streams/stream.py)
        out.update(queue.stream_info(mgmt.node))  # type: ignore[attr-defined]
    return out


def exchange_json(vhost: VirtualHost, exchange: Exchange) -> dict[str, Any]:
    out = {
        "name": exchange.name,
        "vhost": vhost.name,
        "type": exchange.kind,
        "durable": exchange.durable,
        "auto_delete": exchange.auto_delete,
        "internal": exchange.internal,
        "arguments": json_value(exchange.arguments),
        "user_who_performed_action": "rmq-internal",
    }
    if exchange.policy is not None:
        out["policy"] = exchange.policy.name
    if exchange.delays:  # the delayed-message plugin adds its exchange's held count
        out["messages_delayed"] = getattr(exchange, "messages_delayed", 0)
    return out


def props_key(routing_key: str, arguments: dict[str, Any]) -> str:
    """The binding's id in URLs; opaque to clients, as RabbitMQ's (an arguments hash)."""
    if not arguments:
        return "~" if routing_key == "" else _quote(routing_key)
    canonical = json.dumps(json_value(arguments), sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).digest()[:4]
    return _quote(routing_key) + "~" + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def _quote(name: str) -> str:
    return quote_plus(name).replace("~", "%7E")


def binding_json(
    vhost: str, source: str, destination: str, kind: str, key: str, args: dict[str, Any]
) -> dict[str, Any]:
    return {
        "source": source,
        "vhost": vhost,
        "destination": destination,
        "destination_type": kind,
        "routing_key": key,
        "arguments": json_value(args),
        "properties_key": props_key(key, args),
    }


def vhost_bindings(vhost: VirtualHost) -> list[dict[str, Any]]:
    """Every binding of a vhost, the default exchange's implicit ones first (as RabbitMQ)."""
    out = [binding_json(vhost.name, "", q.name, "queue", q.name, {}) for q in vhost.queues.values()]
    for exchange in vhost.exchanges.values():
        if exchange.name == "":
            continue
        for binding in exchange.bindings.values():
            dest = binding.destination
            kind = "exchange" if isinstance(dest, Exchange) else "queue"
            out.append(
                binding_json(
                    vhost.name,
                    exchange.name,
                    dest.name,
                    kind,
                    binding.routing_key,
                    binding.arguments,
                )
            )
    return out


# ---- message properties (publish and get) ----

_OCTETS = {"delivery_mode", "priority"}


def properties_from_json(value: Any) -> bytes:
    """Basic properties from the JSON of /publish, encoded for the queue as a client would."""
    props = table_from_json(value)
    fields: dict[str, bytes] = {}
    for name, _, kind in PROPERTIES:
        if name not in props or props[name] is None:
            continue
        item = props[name]
        try:
            if kind == "shortstr":
                fields[name] = encode_shortstr(str(item))
            elif kind == "octet":
                if not isinstance(item, int) or isinstance(item, bool) or not 0 <= item <= 255:
                    raise bad_request(["not_int", name])
                fields[name] = bytes((item,))
            elif kind == "timestamp":
                if not isinstance(item, int) or isinstance(item, bool) or item < 0:
                    raise bad_request(["not_int", name])
                fields[name] = item.to_bytes(8, "big")
            else:
                fields[name] = encode_table(table_from_json(item))
        except ValueError as exc:  # too long a short string, an unencodable header
            raise bad_request(f"invalid property '{name}': {exc}") from None
    flags = 0
    parts = []
    for name, flag, _ in PROPERTIES:
        if name in fields:
            flags |= flag
            parts.append(fields[name])
    return flags.to_bytes(2, "big") + b"".join(parts)


def properties_json(raw: bytes) -> Any:
    """RabbitMQ prints a message without properties as ``[]``."""
    try:
        props = read_properties(raw)
    except PropertiesError:
        return []
    return {k: json_value(v) for k, v in props.items()} or []
