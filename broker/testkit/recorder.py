"""What happened in a vhost, as data: the test kit's record of publishes and outcomes.

A :class:`Recorder` is installed as the vhost's tracer (``vhost.tracer``, the hooks of
broker/tracing/tracer.py), so it sees every event the lifecycle trace sees and the message
path pays nothing while nothing records: the one ``vhost.tracer`` test it pays anyway.
When the vhost also traces, the recorder hands each event to the real :class:`Tracer`
first. Bodies and properties are held as the bytes received, not copied.

Recording is on in the test kit (``run_broker``, the pytest fixtures) and with
``warren.test_api = true``; ``warren-server`` does not record otherwise.

Each message that reached a queue has one :class:`Outcome` there, whose ``outcome`` is
its latest state (docs/test-kit.md has the table):

ready, unacked, acked, nacked, rejected, requeued, timed-out, expired, dead-lettered, dropped
"""

from __future__ import annotations

import base64
import copy
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from warren.broker.engine.exchange import Declared, TopicExchange
from warren.broker.engine.message import DELAYED, GONE, READY, Message, QueueBase
from warren.broker.engine.queue_backlog import ready_messages
from warren.broker.tracing.firehose import TRACE_EXCHANGE
from warren.broker.tracing.tracer import Relay, Tracer, close_why
from warren.protocol.properties import read_properties

if TYPE_CHECKING:
    from warren.broker.engine.broker import Broker
    from warren.broker.engine.channel import Channel
    from warren.broker.engine.consumer import Consumer
    from warren.broker.engine.queue import Queue
    from warren.broker.engine.vhost import VirtualHost


# The firehose stays off while only the recorder listens (it is on while tracing): an
# exchange of the firehose's type that nothing binds to, so that ``Tracer.firehose`` is an
# Exchange, as the compiled channel checks.
NO_FIREHOSE = TopicExchange(Declared(TRACE_EXCHANGE, durable=True, internal=True))


def _properties(raw: bytes) -> dict[str, Any]:
    try:
        return read_properties(raw)
    except Exception:  # bytes a client sent and the broker passed on: show what it can
        return {}


class _DecodedProperties:
    """``properties`` and ``headers`` decoded on demand from the bytes the publisher sent."""

    raw_properties: bytes

    @property
    def properties(self) -> dict[str, Any]:
        """The basic properties, decoded (``headers`` is a dict)."""
        return _properties(self.raw_properties)

    @property
    def headers(self) -> dict[str, Any]:
        headers = self.properties.get("headers")
        return headers if isinstance(headers, dict) else {}


@dataclass
class Published(_DecodedProperties):
    """One basic.publish (or a publish through the management API), as it arrived."""

    exchange: str
    routing_key: str
    body: bytes
    raw_properties: bytes = field(repr=False)
    routed_to: list[str]  # queue names, in routing order; empty: unroutable
    vhost: str
    mandatory: bool = False
    id: int = 0  # the message's id: its outcomes in each queue carry the same
    order: int = field(default=0, repr=False)  # broker-wide publish order

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "vhost": self.vhost,
            "exchange": self.exchange,
            "routing_key": self.routing_key,
            **_payload(self.body),
            "properties": _jsonable(self.properties),
            "routed_to": self.routed_to,
            "mandatory": self.mandatory,
        }


@dataclass
class Outcome(_DecodedProperties):
    """A message's story in one queue; ``outcome`` is where it stands now."""

    queue: str
    body: bytes
    raw_properties: bytes = field(repr=False)
    exchange: str  # as it reached the queue (for a dead-lettered copy: the DLX)
    routing_key: str
    id: int
    outcome: str = "ready"
    reason: str | None = None  # why it expired, was dead-lettered, dropped or came back
    count: int = 0  # times delivered (basic.deliver or basic.get-ok)
    consumer_tag: str | None = None  # the last consumer it was delivered to (None: basic.get)
    delivery_tag: int = 0  # of the last delivery
    dead_letter_exchange: str | None = None
    timeout_ms: int | None = None  # the consumer timeout that took it back
    retry_delay_ms: int | None = None  # the last delayed-retry wait
    history: list[str] = field(default_factory=list)  # every event, oldest first
    _msg: Message | None = field(default=None, repr=False, compare=False)
    _got: bool = field(default=False, repr=False, compare=False)

    def snapshot(self) -> Outcome:
        """A copy as of now; a basic.get with no-ack has no ack event: it shows as acked."""
        view = copy.copy(self)
        view.history = list(self.history)
        view._msg = None
        msg = self._msg
        # gone without ever getting a tag: no-ack (an unacked one keeps its tag)
        got_no_ack = self._got and msg is not None and msg.state == GONE and msg.tag == 0
        if got_no_ack and self.outcome == "unacked":
            view.outcome = "acked"
        return view

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "queue": self.queue,
            **_payload(self.body),
            "properties": _jsonable(self.properties),
            "exchange": self.exchange,
            "routing_key": self.routing_key,
            "outcome": self.outcome,
            "reason": self.reason,
            "count": self.count,
            "consumer_tag": self.consumer_tag,
            "delivery_tag": self.delivery_tag,
            "dead_letter_exchange": self.dead_letter_exchange,
            "timeout_ms": self.timeout_ms,
            "retry_delay_ms": self.retry_delay_ms,
            "history": self.history,
        }


def _payload(body: bytes) -> dict[str, str]:
    """As RabbitMQ's /api/queues/.../get shows a body: text if it is UTF-8, else base64."""
    try:
        return {"payload": body.decode("utf-8"), "payload_encoding": "string"}
    except UnicodeDecodeError:
        return {"payload": base64.b64encode(body).decode(), "payload_encoding": "base64"}


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)  # decimals, timestamps


class Recording:
    """The broker's recording switch: a Recorder per vhost, and who waits for news."""

    def __init__(self) -> None:
        self.ids = itertools.count(1)  # message ids while no tracer gives them
        self.order = itertools.count()
        self.recorders: dict[str, Recorder] = {}
        # called (on the broker's loop) after every recorded event: RunningBroker.wait_for
        self.wakers: set[Callable[[], None]] = set()

    def attach(self, vhost: VirtualHost) -> None:
        current = self.recorders.get(vhost.name)
        if current is not None and current.host is vhost:
            return  # (a recovered store makes its vhosts anew: those are attached again)
        recorder = Recorder(self, vhost, vhost.tracer)
        vhost.tracer = recorder
        self.recorders[vhost.name] = recorder

    def detach(self, vhost: VirtualHost) -> None:
        recorder = self.recorders.pop(vhost.name, None)
        if recorder is not None and vhost.tracer is recorder:
            vhost.tracer = recorder.inner

    def close(self) -> None:
        for recorder in list(self.recorders.values()):
            self.detach(recorder.host)

    def changed(self) -> None:
        for wake in list(self.wakers):
            wake()

    def published(self, vhost: str | None = None) -> list[Published]:
        names = [vhost] if vhost is not None else list(self.recorders)
        out: list[Published] = []
        for name in names:
            recorder = self.recorders.get(name)
            if recorder is not None:
                out.extend(recorder.publishes)
        out.sort(key=_by_order)
        return out

    def outcomes(self, vhost: str, queue: str) -> list[Outcome]:
        recorder = self.recorders.get(vhost)
        if recorder is None:
            return []
        return [o.snapshot() for o in recorder.by_queue.get(queue, ())]


def _by_order(p: Published) -> int:
    return p.order


class Recorder(Relay):
    """One vhost's record; the engine calls it where it calls the tracer (same methods)."""

    __slots__ = ("by_queue", "host", "publishes", "recording", "records")

    def __init__(self, recording: Recording, vhost: VirtualHost, inner: Tracer | None) -> None:
        super().__init__(inner, NO_FIREHOSE)
        self.recording = recording
        self.host = vhost
        self.vhost = vhost.name
        self.publishes: list[Published] = []
        self.by_queue: dict[str, list[Outcome]] = {}
        self.records: dict[tuple[str, int], Outcome] = {}

    def clear(self) -> None:
        self.publishes.clear()
        self.by_queue.clear()
        self.records.clear()

    # ---- bookkeeping ----

    def _new(self, queue: str, msg: Message, first: str) -> Outcome:
        body = b"" if msg.paged_size >= 0 else msg.body  # never read back from disk
        record = Outcome(
            queue, body, msg.properties, msg.exchange, msg.routing_key, msg.trace_id, _msg=msg
        )
        record.history.append(first)
        self.records[(queue, msg.trace_id)] = record
        self.by_queue.setdefault(queue, []).append(record)
        return record

    def _rec(self, queue: QueueBase | None, msg: Message) -> Outcome:
        """The message's record in ``queue``; one that arrived before recording is adopted."""
        name = queue.name if queue is not None else ""
        if not msg.trace_id:
            msg.trace_id = next(self.recording.ids)
        record = self.records.get((name, msg.trace_id))
        if record is None:
            record = self._new(name, msg, "adopted")
        record._msg = msg
        return record

    def _publish(self, msg: Message, queues: list[Queue], mandatory: bool) -> None:
        if not msg.trace_id:
            msg.trace_id = next(self.recording.ids)
        names = [q.name for q in queues]
        self.publishes.append(
            Published(
                msg.exchange, msg.routing_key, msg.body, msg.properties, names, self.vhost,
                mandatory, msg.trace_id, next(self.recording.order),
            )
        )  # fmt: skip
        for name in names:
            self._new(name, msg, "published")
        self.recording.changed()

    # ---- the tracer's methods ----

    def published(
        self, channel: Channel, msg: Message, queues: list[Queue], mandatory: bool, seq: int
    ) -> None:
        if self.inner is not None:
            self.inner.published(channel, msg, queues, mandatory, seq)
        else:
            msg.trace_id = next(self.recording.ids)  # a fresh id, as the tracer gives
        self._publish(msg, queues, mandatory)

    def published_by_api(self, msg: Message, queues: list[Queue]) -> None:
        if self.inner is not None:
            self.inner.published_by_api(msg, queues)
        else:
            msg.trace_id = next(self.recording.ids)
        self._publish(msg, queues, False)

    def delivered(self, channel: Channel, consumer: Consumer, msg: Message, tag: int) -> None:
        if self.inner is not None:
            self.inner.delivered(channel, consumer, msg, tag)
        record = self._rec(consumer.queue, msg)
        record.count += 1
        record.consumer_tag = consumer.tag
        record.delivery_tag = tag
        record.history.append("delivered")
        if consumer.no_ack:
            record.outcome = "acked"
            record.history.append("acked")
        else:
            record.outcome = "unacked"
        self.recording.changed()

    def got(self, channel: Channel, queue: Queue, msg: Message, tag: int) -> None:
        if self.inner is not None:
            self.inner.got(channel, queue, msg, tag)
        record = self._rec(queue, msg)
        record.count += 1
        record.consumer_tag = None
        record.delivery_tag = tag
        record.outcome = "unacked"
        record._got = True  # with no-ack it is settled at once, without an event
        record.history.append("got")
        self.recording.changed()

    def acked(self, channel: Channel, msgs: list[Message]) -> None:
        if self.inner is not None:
            self.inner.acked(channel, msgs)
        for msg in msgs:
            record = self._rec(msg.queue, msg)
            record.outcome = "acked"
            record.history.append("acked")
        self.recording.changed()

    def delayed(self, msg: Message, exchange: str, delay_ms: int) -> None:
        if self.inner is not None:
            self.inner.delayed(msg, exchange, delay_ms)

    def released(self, msg: Message, exchange: str, queues: list[Queue]) -> None:
        """A delayed message routed at last: it reaches its queues now."""
        if self.inner is not None:
            self.inner.released(msg, exchange, queues)
        if not msg.trace_id:
            msg.trace_id = next(self.recording.ids)
        names = [q.name for q in queues]
        for publish in reversed(self.publishes):  # the publish found no queue at first
            if publish.id == msg.trace_id:
                publish.routed_to = names
                break
        for name in names:
            self._new(name, msg, "released")
        self.recording.changed()

    def dead_letter_routed(self, copy: Message, targets: list[Queue]) -> None:
        if self.inner is not None:
            self.inner.dead_letter_routed(copy, targets)
        if not copy.trace_id:
            copy.trace_id = next(self.recording.ids)
        for queue in targets:
            self._new(queue.name, copy, "dead-letter-routed")
        self.recording.changed()

    def confirmed(self, channel: Channel, first: int, last: int, ack: bool) -> None:
        if self.inner is not None:
            self.inner.confirmed(channel, first, last, ack)
        self.recording.changed()

    def nacked(
        self, queue: Queue, msgs: list[Message], requeue: bool, rejected: bool = False
    ) -> None:
        if self.inner is not None:
            self.inner.nacked(queue, msgs, requeue)
        event = "rejected" if rejected else "nacked"
        for msg in msgs:
            record = self._rec(queue, msg)
            record.history.append(event)
            if not requeue:  # with requeue the requeue (or a retry, a limit) says what follows
                record.outcome = event
        self.recording.changed()

    def requeued(self, queue: Queue, msgs: list[Message], why: str) -> None:
        if self.inner is not None:
            self.inner.requeued(queue, msgs, why)
        for msg in msgs:
            record = self._rec(queue, msg)
            record.outcome = "timed-out" if why == "consumer_timeout" else "requeued"
            record.reason = why
            record.history.append("requeued")
        self.recording.changed()

    def retry_scheduled(self, queue: Queue, msg: Message, delay_ms: int, why: str) -> None:
        if self.inner is not None:
            self.inner.retry_scheduled(queue, msg, delay_ms, why)
        record = self._rec(queue, msg)
        record.outcome = "timed-out" if why == "consumer_timeout" else "requeued"
        record.reason = why
        record.retry_delay_ms = delay_ms
        record.history.append("retry-scheduled")
        self.recording.changed()

    def dead_lettered(self, queue: Queue, msg: Message, reason: str) -> None:
        if self.inner is not None:
            self.inner.dead_lettered(queue, msg, reason)
        record = self._rec(queue, msg)
        dlx = queue.dead_letter_exchange
        if dlx is not None and dlx in self.host.exchanges:
            record.outcome = "dead-lettered"
            record.dead_letter_exchange = dlx
            record.history.append("dead-lettered")
        elif reason == "expired":
            record.outcome = "expired"
            record.history.append("expired")
        elif reason != "rejected":  # a rejection without a DLX stays rejected (or nacked)
            record.outcome = "dropped"
            record.history.append("dropped")
        record.reason = reason
        self.recording.changed()

    def dropped(self, queue: Queue, msg: Message, reason: str) -> None:
        if self.inner is not None:
            self.inner.dropped(queue, msg, reason)
        record = self._rec(queue, msg)
        record.outcome = "dropped"
        record.reason = reason
        record.history.append("dropped")
        self.recording.changed()

    def purged(self, queue: Queue) -> None:
        if self.inner is not None:
            self.inner.purged(queue)
        reason = "queue_deleted" if queue.deleted else "purged"
        gone = [m for m in ready_messages(queue) if m.state == READY]
        gone += [m for _, _, m in queue.deadlines.delayed if m.state == DELAYED]
        for msg in gone:
            record = self._rec(queue, msg)
            record.outcome = "dropped"
            record.reason = reason
            record.history.append("dropped")
        self.recording.changed()

    def consumer_added(self, consumer: Consumer) -> None:
        if self.inner is not None:
            self.inner.consumer_added(consumer)
        self.recording.changed()

    def consumer_timed_out(
        self, channel: Channel, consumer: Consumer | None, msgs: list[Message], timeout: int
    ) -> None:
        if self.inner is not None:
            self.inner.consumer_timed_out(channel, consumer, msgs, timeout)
        for msg in msgs:
            record = self._rec(msg.queue, msg)
            record.outcome = "timed-out"
            record.reason = "consumer_timeout"
            record.timeout_ms = timeout
            record.history.append("timed-out")
        self.recording.changed()

    def consumer_cancelled(self, consumer: Consumer, why: str) -> None:
        if self.inner is not None:
            self.inner.consumer_cancelled(consumer, why)
        self.recording.changed()

    def channel_closed(self, channel: Channel) -> str:
        why = self.inner.channel_closed(channel) if self.inner is not None else close_why(channel)
        self.recording.changed()
        return why

    def queue_expired(self, queue: Queue) -> None:
        if self.inner is not None:
            self.inner.queue_expired(queue)
        self.recording.changed()

    def queue_deleted(self, queue: Queue) -> None:
        if self.inner is not None:
            self.inner.queue_deleted(queue)
        self.recording.changed()

    def mark(self, event: str) -> None:
        if self.inner is not None:
            self.inner.mark(event)


# ---- reset ----


# the key of the recording among the broker's vhost observers (Broker.observers)
RECORDING = "testkit.recording"


def recording_of(broker: Broker) -> Recording | None:
    """The broker's recording, None if it does not record."""
    observer = broker.observers.get(RECORDING)
    return observer if isinstance(observer, Recording) else None


def start_recording(broker: Broker) -> Recording:
    """Record publishes and outcomes in every vhost, now and as they are made.

    Before clients connect: a recording broker reads every publish as it comes
    (``read_coalescing`` off for connections made from now on), so a test that asks what
    was published right after publishing finds it.
    """
    recording = recording_of(broker)
    if recording is None:
        recording = Recording()
        broker.observe(RECORDING, recording)
        broker.read_coalescing = 0.0
    return recording


def stop_recording(broker: Broker) -> None:
    broker.observe(RECORDING, None)


def reset_vhost(broker: Broker, name: str, close_connections: bool = True) -> dict[str, int]:
    """Back to a fresh vhost, on the running broker: no restart, the same port.

    Its queues (with their messages and consumers), its own exchanges, every binding,
    its policies and limits and what was recorded in it go; the built-in exchanges
    stay. Its connections are closed with 320 CONNECTION_FORCED unless
    ``close_connections`` is False: then they stay open, and consumers of the deleted
    queues get basic.cancel (clients that announce consumer_cancel_notify).
    Returns what went, by kind.
    """
    vhost = broker.vhosts.get(name)
    if vhost is None:
        raise KeyError(f"no vhost {name!r}")
    closed = 0
    if close_connections:
        for connection in list(broker.connections):
            if connection.vhost is vhost:
                connection.force_close(f"vhost '{name}' is reset")
                closed += 1
    queues = list(vhost.queues.values())
    for queue in queues:
        vhost.delete_queue(queue)
    exchanges = 0
    for exchange in list(vhost.exchanges.values()):
        if exchange.name == "" or exchange.deleted:
            continue
        if exchange.name.startswith("amq."):  # built in: they stay, without bindings
            for binding in list(exchange.bindings.values()):
                vhost.unbind(
                    exchange.name, binding.destination, binding.routing_key, binding.arguments
                )
        else:
            vhost.delete_exchange(exchange.name, if_unused=False)
            exchanges += 1
    policies = list(vhost.policies)
    for policy in policies:
        vhost.clear_policy(policy)
    vhost.limits.clear()
    recording = recording_of(broker)
    if recording is not None and (recorder := recording.recorders.get(name)) is not None:
        recorder.clear()
        recording.changed()
    return {
        "queues": len(queues),
        "exchanges": exchanges,
        "policies": len(policies),
        "connections": closed,
    }
