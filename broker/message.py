"""A message as a queue holds it: the bytes received plus per-queue state."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from protocol.methods import shortstr
from protocol.properties import FLAG_HEADERS, decode_field, has_flag, split_properties

if TYPE_CHECKING:
    from broker.channel import Channel
    from broker.consumer import Consumer
    from broker.queue import Queue

READY = 0
UNACKED = 1
GONE = 2
DELAYED = 3  # returned, waiting for its retry delay before it is ready again


class Message:
    """One copy of a message in one queue.

    ``properties`` and ``body`` are the bytes the publisher sent and are never
    re-encoded on the way to a consumer; fan-out copies share them.
    """

    __slots__ = (
        "_ex_rk",
        "_headers",
        "body",
        "channel",
        "consumer",
        "delivery_count",
        "exchange",
        "expires_at",
        "priority",
        "properties",
        "queue",
        "redelivered",
        "retries",
        "routing_key",
        "seq",
        "state",
        "store_id",
        "store_segment",
        "tag",
        "trace_id",
    )

    def __init__(self, exchange: str, routing_key: str, properties: bytes, body: bytes) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties = properties
        self.body = body
        self._ex_rk: bytes | None = None
        self._headers: dict[str, Any] | None = None
        self.seq = 0
        self.redelivered = False
        self.expires_at: float | None = None  # monotonic seconds
        self.delivery_count = 0
        self.retries = 0  # delayed retries so far
        self.priority = 0  # read from the properties by priority queues only
        self.store_id = 0  # id in the message store when persisted
        self.store_segment = 0
        self.state = READY
        self.tag = 0
        self.channel: Channel | None = None
        self.consumer: Consumer | None = None
        self.queue: Queue | None = None  # the queue holding this copy
        self.trace_id = 0  # broker-assigned id when the vhost traces (broker/tracing.py)

    @property
    def ex_rk(self) -> bytes:
        """Exchange and routing key as short strings, encoded once for every delivery."""
        if self._ex_rk is None:
            self._ex_rk = shortstr(self.exchange) + shortstr(self.routing_key)
        return self._ex_rk

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

    def copy(self) -> Message:
        """Another queue's copy: same bytes, fresh queue state."""
        other = Message(self.exchange, self.routing_key, self.properties, self.body)
        other._ex_rk = self._ex_rk
        other._headers = self._headers
        other.trace_id = self.trace_id  # one message, many queues: one id
        return other
