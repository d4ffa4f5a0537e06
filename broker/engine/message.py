"""A message as a queue holds it: the bytes received plus per-queue state."""

from __future__ import annotations

from typing import Any, Final

from mypy_extensions import mypyc_attr

from warren.broker.engine.stats import QueueStats
from warren.protocol.constants import PRECONDITION_FAILED
from warren.protocol.errors import ChannelError
from warren.protocol.methods import shortstr
from warren.protocol.properties import (
    FLAG_HEADERS,
    decode_field,
    has_flag,
    join_properties,
    split_properties,
)
from warren.protocol.tables import TYPE_NAMES, array_longstrs, join_entries, table_entries

READY: Final = 0
UNACKED: Final = 1
GONE: Final = 2
DELAYED: Final = 3  # returned, waiting for its retry delay before it is ready again


# What a message knows of where it is, as base classes rather than imports of the engine's
# Queue, Channel and Consumer: this module, and the store and tracing that read messages,
# stay below the engine (tests/import_graph.py, docs/architecture.md). Compiled, an
# attribute declared here is a load and a method a call through the class, as on the
# subclass itself; the engine narrows to its own classes where it needs more.
@mypyc_attr(allow_interpreted_subclasses=True)  # as Queue's (a build without stream.py)
class QueueBase:
    """The queue holding a message (Queue, broker/engine/queue.py), as the message, the
    message store and tracing see it."""

    __slots__ = ("name", "paged_bytes", "paged_count", "ready_bytes", "stats", "store_id")
    name: str
    store_id: int  # the queue's id in the message store (0: none)
    stats: QueueStats
    ready_bytes: int
    paged_count: int  # ready messages on disk only, and their bytes
    paged_bytes: int

    def page_in(self, msg: Message) -> bytes:
        """``msg``'s body, read back from the message store."""
        raise NotImplementedError

    def expire(self, msg: Message, withdrawn: bool = False) -> None:
        """Remove a ready message wherever it is (Queue.expire)."""
        raise NotImplementedError


class ChannelBase:
    """The channel a message was delivered on (Channel, broker/engine/channel.py)."""

    __slots__ = ("id",)
    id: int


class ConsumerBase:
    """The consumer holding a message unacked (Consumer, broker/engine/consumer.py)."""

    __slots__ = ("tag", "unacked")
    tag: str
    unacked: int  # deliveries not yet settled


class Message:
    """One copy of a message in one queue.

    ``properties`` and ``body`` are the bytes the publisher sent and are never
    re-encoded on the way to a consumer; fan-out copies share them.
    """

    __slots__ = (
        "_body",
        "_ex_rk",
        "_headers",
        "channel",
        "consumer",
        "delivery_count",
        "exchange",
        "expires_at",
        "paged_size",
        "priority",
        "properties",
        "queue",
        "redelivered",
        "retries",
        "routing_key",
        "sender_keys",
        "seq",
        "state",
        "store_id",
        "store_offset",
        "store_segment",
        "tag",
        "trace_id",
    )

    def __init__(
        self,
        exchange: str,
        routing_key: str,
        properties: bytes,
        body: bytes,
        ex_rk: bytes | None = None,  # the two short strings, when the publish frame had them
    ) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties = properties
        self._body = body
        # -1: the body is in memory; else its size, the body being on disk only (page_out)
        self.paged_size = -1
        self._ex_rk = ex_rk
        self._headers: dict[str, Any] | None = None
        self.seq = 0
        self.redelivered = False
        self.expires_at: float | None = None  # broker-clock seconds (vhost.timers.now())
        self.delivery_count = 0
        self.retries = 0  # delayed retries so far
        self.priority = 0  # read from the properties by priority queues only
        self.store_id = 0  # id in the message store when persisted
        self.store_segment = 0
        self.store_offset = 0  # where the body starts in that segment file
        self.state = READY
        self.tag = 0
        self.channel: ChannelBase | None = None
        self.consumer: ConsumerBase | None = None
        self.queue: QueueBase | None = None  # the queue holding this copy
        self.trace_id = 0  # broker-assigned id when the vhost traces (broker/tracing/tracer.py)
        # the CC and BCC headers' routing keys, when the publisher gave any (routing_headers)
        self.sender_keys: tuple[list[str], list[str]] | None = None

    @property
    def body(self) -> bytes:
        """The body; a paged-out one is read back from its segment file (and stays in
        memory). Queues read ahead in batches (Pager.read_ahead, broker/store/paging.py); this
        is the path for everything else (dead-lettering, the management API...)."""
        if self.paged_size < 0:
            return self._body
        queue = self.queue
        assert queue is not None
        return queue.page_in(self)

    @body.setter
    def body(self, value: bytes) -> None:
        if self.paged_size < 0:
            self._body = value
        else:
            unpage(self, value)

    @property
    def ex_rk(self) -> bytes:
        """Exchange and routing key as short strings, encoded once for every delivery."""
        if self._ex_rk is None:
            self._ex_rk = shortstr(self.exchange) + shortstr(self.routing_key)
        return self._ex_rk

    def routing_keys(self) -> list[str]:
        """The routing key, then those of the CC and BCC headers (RabbitMQ's order)."""
        if self.sender_keys is None:
            return [self.routing_key]
        cc, bcc = self.sender_keys
        return [self.routing_key, *cc, *bcc]

    @property
    def headers(self) -> dict[str, Any]:
        if self._headers is None:
            self._headers = {}
            if has_flag(self.properties, FLAG_HEADERS):
                raw = split_properties(self.properties).get("headers")
                if raw is not None:
                    value = decode_field("headers", raw)
                    if isinstance(value, dict):
                        self._headers = value
        return self._headers

    def get_headers(self) -> dict[str, Any]:
        """``headers`` as a callable for Exchange.route: a bound method is cheaper than a
        lambda, and through its ``__self__`` an exchange hashing a property finds the message."""
        return self.headers

    def body_size(self) -> int:
        """The body's length, without reading a paged-out body back."""
        return len(self._body) if self.paged_size < 0 else self.paged_size

    def copy(self) -> Message:
        """Another queue's copy: same bytes, fresh queue state."""
        other = Message(self.exchange, self.routing_key, self.properties, self.body, self._ex_rk)
        other._headers = self._headers
        other.trace_id = self.trace_id  # one message, many queues: one id
        other.sender_keys = self.sender_keys
        return other


def routing_headers(properties: bytes) -> tuple[bytes, tuple[list[str], list[str]] | None]:
    """RabbitMQ's sender-selected distribution: the CC and BCC headers' extra routing keys.

    Returns the properties without BCC (RabbitMQ removes it on arrival; only then are
    the header bytes re-encoded) and (CC keys, BCC keys), or None when there are none.
    Arrays count, with their long strings only; any other type of value is refused, as
    rabbit_basic.erl's header_routes does. Called only when the property bytes hold "CC".
    """
    fields = split_properties(properties)
    raw = fields.get("headers")
    if raw is None:
        return properties, None
    entries, _ = table_entries(raw)
    found: list[list[str]] = []
    for name in ("CC", "BCC"):
        value = entries.get(name)
        if value is None:
            found.append([])
        elif value[:1] == b"A":
            found.append(array_longstrs(value))
        else:
            kind = TYPE_NAMES.get(chr(value[0]), "unknown")
            raise ChannelError(
                PRECONDITION_FAILED,
                f'invalid message: {{unacceptable_type_in_header,"{name}",{kind}}}',
            )
    if "BCC" in entries:
        del entries["BCC"]
        fields["headers"] = join_entries(entries)
        properties = join_properties(fields)
    cc, bcc = found
    return properties, (cc, bcc) if cc or bcc else None


def page_out(msg: Message, size: int = -1) -> int:
    """Drop the body from memory (its publish record is on disk); returns its size.

    A persistent message of a long durable queue (TTL or priority: other queues pack
    their paged messages into runs, broker/store/paged.py) keeps its place and state; reading
    ``body`` reads it back from its segment file (broker/store/segments.py)."""
    if size < 0:
        size = len(msg._body)
    msg.paged_size = size
    msg._body = b""
    return size


def unpage(msg: Message, body: bytes) -> None:
    """Back in memory with ``body`` (the body read back, or b"" for a message that is gone)."""
    queue = msg.queue
    if queue is not None:
        queue.paged_count -= 1
        queue.paged_bytes -= msg.paged_size
    msg.paged_size = -1
    msg._body = body
