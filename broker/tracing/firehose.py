"""RabbitMQ's firehose: a copy of every publish and delivery sent to ``amq.rabbitmq.trace``.

On while the vhost traces (``trace_on``, as in RabbitMQ). The copies carry RabbitMQ's
routing keys (``publish.<exchange>``, ``deliver.<queue>``) and headers, so tools written
for RabbitMQ's firehose work unchanged. Nothing is built unless a queue is bound to the
trace exchange, and copies are published after the current event, never from inside a
queue's dispatch (a queue may itself be bound to the trace exchange).
"""

from __future__ import annotations

import platform
import struct
from typing import TYPE_CHECKING

from warren.broker.engine.message import Message
from warren.broker.engine.queue import fan_out
from warren.protocol.errors import SURROGATES
from warren.protocol.properties import join_properties, split_properties
from warren.protocol.tables import join_entries

if TYPE_CHECKING:
    from warren.broker.engine.channel import Channel
    from warren.broker.engine.exchange import Exchange
    from warren.broker.engine.queue import Queue
    from warren.broker.engine.vhost import VirtualHost

TRACE_EXCHANGE = "amq.rabbitmq.trace"
NODE = "warren@" + platform.node()
NO_PROPERTIES = b"\x00\x00"

_i32 = struct.Struct(">i")
_u32 = struct.Struct(">I")


# The engine calls these with the vhost's trace exchange (``Tracer.firehose``), and only
# while something is bound to it: with nothing listening a copy is never built.


def published(exchange: Exchange, channel: Channel, msg: Message, queues: list[Queue]) -> None:
    """basic.publish seen: ``publish.<exchange>`` with the queues it reached."""
    extra = {**_who(channel), "routed_queues": _array([q.name for q in queues])}
    _tap(exchange, channel.vhost, "publish." + msg.exchange, msg, extra)


def delivered(exchange: Exchange, channel: Channel, queue: str, msg: Message) -> None:
    """basic.deliver or basic.get-ok sent: ``deliver.<queue>``."""
    if msg.exchange == TRACE_EXCHANGE:
        return  # a trace copy is not traced again
    extra = {"redelivered": _signedint(1 if msg.redelivered else 0), **_who(channel)}
    _tap(exchange, channel.vhost, "deliver." + queue, msg, extra)


def _tap(
    exchange: Exchange, vhost: VirtualHost, routing_key: str, msg: Message, extra: dict[str, bytes]
) -> None:
    copy = Message(TRACE_EXCHANGE, routing_key, NO_PROPERTIES, msg.body)
    targets = vhost.route(exchange, copy)
    if not targets:
        return
    entries = {
        "exchange_name": _longstr(msg.exchange),
        "routing_keys": _array(msg.routing_keys()),
        "properties": b"F" + join_entries(_properties(msg.properties)),
        "node": _longstr(NODE),
        **extra,
    }
    copy.properties = join_properties({"headers": join_entries(entries)})
    # the vhost's own list: several brokers (threads, event loops) may share this process
    pending = vhost.firehose_pending
    if not pending:
        vhost.timers.call_soon(lambda: _flush(vhost))
    pending.append((list(targets), copy))


def _flush(vhost: VirtualHost) -> None:
    batch = vhost.firehose_pending[:]
    vhost.firehose_pending.clear()
    for targets, copy in batch:
        live = [q for q in targets if vhost.queues.get(q.name) is q]  # some deleted meanwhile?
        if live:
            fan_out(live, copy, None)


def _who(channel: Channel) -> dict[str, bytes]:
    conn = channel.conn
    return {
        "vhost": _longstr(channel.vhost.name),
        "connection": _longstr(conn.name),
        "channel": _signedint(channel.id),
        "user": _longstr(conn.user),
    }


def _properties(raw: bytes) -> dict[str, bytes]:
    """The message's properties as RabbitMQ's trace table types them."""
    out: dict[str, bytes] = {}
    for name, value in split_properties(raw).items():
        if name == "headers":
            out[name] = b"F" + value
        elif name in ("delivery_mode", "priority"):
            out[name] = _signedint(value[0])
        elif name == "timestamp":
            stamp = int.from_bytes(value, "big")
            out[name] = _signedint(stamp) if stamp < 2**31 else b"l" + value
        else:  # short strings become long strings
            out[name] = b"S" + _u32.pack(len(value) - 1) + value[1:]
    return out


def _signedint(value: int) -> bytes:
    return b"I" + _i32.pack(value)


def _longstr(value: str) -> bytes:
    raw = value.encode("utf-8", SURROGATES)
    return b"S" + _u32.pack(len(raw)) + raw


def _array(values: list[str]) -> bytes:
    body = b"".join(_longstr(v) for v in values)
    return b"A" + _u32.pack(len(body)) + body
