"""The ``shovel`` parameter component and one task per dynamic shovel.

RabbitMQ 4.3's shape (deps/rabbitmq_shovel/src): rabbit_shovel_parameters is the component
(validate, notify, notify_clear); rabbit_shovel_worker runs one shovel: connect the source,
then the destination, declare, consume, and report ``starting``, ``running`` or
``terminated`` with a reason to rabbit_shovel_status; rabbit_amqp091_shovel moves the
messages: forward each delivery, and ack it to the source on publish, or only once the
destination confirmed it (on-confirm: RabbitMQ's at-least-once). When a connection goes,
the worker reports why, waits ``reconnect-delay`` seconds (0: it stays terminated,
rabbit_shovel_dyn_worker_sup) and starts over. ``src-delete-after`` counts the messages
settled; at zero the shovel deletes its own parameter.

Each shovel is an asyncio task; deliveries and confirms are handled in the client's
callbacks as frames are read, with no task or future per message.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import structlog
from pamqp import commands

from warren.broker.engine.parameters import ParameterError
from warren.broker.ops.shovel.client import Channel, Client, ClientClosed, connect
from warren.broker.ops.shovel.definition import ShovelConfig, Uri, parse, validate
from warren.protocol.methods import make
from warren.protocol.properties import (
    encode_shortstr,
    join_properties,
    set_header,
    split_properties,
)
from warren.protocol.tables import encode_value, join_entries, table_entries

if TYPE_CHECKING:
    from warren.broker.ops.management.core import Management

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]
OpenDirect = Callable[[], Awaitable[Streams]]
Key = tuple[str, str]  # (vhost, name)

NOT_FOUND = 404
HIGH_WATER = 4 * 1024 * 1024  # bytes waiting for the destination: stop reading the source
log = structlog.get_logger("warren.shovel")


class Finished(Exception):
    """``src-delete-after`` reached: the shovel is done and deletes itself."""


class Restart(Exception):
    """The shovel stops and starts over after reconnect-delay; the text is its reason."""


class Shovels:
    """The ``shovel`` runtime parameter component (rabbit_shovel_parameters)."""

    name = "shovel"

    def __init__(self, mgmt: Management, open_direct: OpenDirect) -> None:
        self.mgmt = mgmt
        self.open_direct = open_direct
        self.workers: dict[Key, Worker] = {}
        self.running = False  # workers start once the server is up

    # -- the component ----------------------------------------------------------------------

    def validate(self, vhost: str, name: str, value: Any) -> None:
        errors = validate(name, value)
        if not errors:
            errors = self._direct_access(parse(vhost, name, value))
        if errors:
            raise ParameterError("\n".join(errors))

    def _direct_access(self, config: ShovelConfig) -> list[str]:
        """rabbit_shovel_util:validate_params_user/2: an in-process URI's vhost must exist and
        its user (if it names one) may connect to it."""
        access = self.mgmt.broker.access
        for uri in config.src_uris + config.dest_uris:
            if not uri.direct:
                continue
            user = uri.user or "none"
            exists = uri.vhost in self.mgmt.broker.vhosts
            allowed = uri.user is None or access.can_access_vhost(uri.user, uri.vhost)
            if not (exists and allowed):
                return [f'user "{user}" may not connect to vhost "{uri.vhost}"']
        return []

    def on_set(self, vhost: str, name: str, value: Any) -> None:
        self._stop((vhost, name))
        worker = Worker(self, parse(vhost, name, value))
        self.workers[(vhost, name)] = worker
        if self.running:
            worker.start()

    def on_clear(self, vhost: str, name: str) -> None:
        self._stop((vhost, name))

    def _stop(self, key: Key) -> None:
        worker = self.workers.pop(key, None)
        if worker is not None:
            worker.stop()

    # -- the server's side ------------------------------------------------------------------

    def start(self) -> None:
        self.running = True
        for worker in self.workers.values():
            worker.start()

    async def stop(self) -> None:
        self.running = False
        tasks = [w.stop() for w in self.workers.values()]
        for task in tasks:
            if task is not None:
                with contextlib.suppress(BaseException):
                    await task

    def restart(self, vhost: str, name: str) -> bool:
        """DELETE /api/shovels/vhost/{vhost}/{name}/restart (rabbit_shovel_util:restart_shovel)."""
        worker = self.workers.get((vhost, name))
        if worker is None:
            return False
        self.on_set(vhost, name, self.mgmt.broker.parameters.get(vhost, self.name, name))
        return True

    def statuses(self) -> list[dict[str, Any]]:
        return [w.status() for _, w in sorted(self.workers.items())]

    def finished(self, worker: Worker) -> None:
        """src-delete-after reached: the parameter goes (rabbit_shovel_worker:terminate/2)."""
        config = worker.config
        key = (config.vhost, config.name)
        if self.workers.get(key) is worker:
            del self.workers[key]
            self.mgmt.broker.parameters.clear(config.vhost, self.name, config.name)


class Worker:
    """One dynamic shovel: its task, its connections and what it reports."""

    def __init__(self, shovels: Shovels, config: ShovelConfig) -> None:
        self.shovels = shovels
        self.config = config
        self.task: asyncio.Task[None] | None = None
        self.state = "starting"
        self.reason = ""
        self.since = time.localtime()
        self.info: dict[str, Any] = {}
        self.forwarded = 0
        self.remaining: int | None = None  # None: unlimited
        self.remaining_unacked: int | None = None
        self.blocked = False
        self.src: Client | None = None
        self.dest: Client | None = None
        self.src_channel: Channel | None = None
        self.dest_channel: Channel | None = None
        self.unacked: dict[int, int] = {}  # destination publish seq -> source delivery tag
        self.done: asyncio.Future[None] | None = None
        self._paused = False
        self._drain_task: asyncio.Task[None] | None = None
        self._props_cache: tuple[bytes, bytes] | None = None
        self._ack_upto = 0  # on-publish: the last delivery published, acked at the turn's end
        self._ack_scheduled = False

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> asyncio.Task[None] | None:
        task = self.task
        if task is not None and not task.done():
            task.cancel()
        return task

    def _report(self, state: str, reason: str = "") -> None:
        self.state = state
        self.reason = reason
        self.since = time.localtime()

    async def _run(self) -> None:
        config = self.config
        where = {"shovel": config.name, "vhost": config.vhost}
        while True:
            self._report("starting")
            try:
                await self._session()
            except Finished:
                log.info("shovel finished: no messages left to transfer", **where)
                await self._close()
                self.shovels.finished(self)
                return
            except asyncio.CancelledError:
                await self._close()
                raise
            except Restart as exc:
                self._report("terminated", f'"{exc}"')
            except ClientClosed as exc:
                self._report("terminated", f'"{exc}"')
            except Exception as exc:  # a bug must not end the shovel for good
                log.exception("shovel failed", **where)
                self._report("terminated", f'"{exc}"')
            await self._close()
            log.warning("shovel terminated", reason=self.reason, **where)
            if config.reconnect_delay <= 0:
                return  # reconnect-delay 0: do not reconnect (rabbit_shovel_dyn_worker_sup)
            await asyncio.sleep(config.reconnect_delay)

    async def _close(self) -> None:
        for client in (self.src, self.dest):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.close()
        self.src = self.dest = None
        self.src_channel = self.dest_channel = None
        if self.done is not None and not self.done.done():
            self.done.cancel()  # and with it a src-delete-after-duration timer
        self.unacked.clear()
        self._ack_upto = 0
        self._paused = False
        if self._drain_task is not None:
            self._drain_task.cancel()
            self._drain_task = None

    async def _connect(self, uris: list[Uri], side: str) -> tuple[Client, Uri]:
        """rabbit_amqp091_shovel:make_conn_and_chan/2: a URI at random, then the others."""
        order = random.sample(uris, len(uris))
        error: Exception = Restart(f"failed to connect to {side}")
        for uri in order:
            try:
                client = await asyncio.wait_for(self._open(uri), uri.connection_timeout)
            except (TimeoutError, OSError, ClientClosed) as exc:
                log.warning(
                    "shovel could not connect", shovel=self.config.name, vhost=self.config.vhost,
                    uri=uri.redacted, error=str(exc) or type(exc).__name__,
                )  # fmt: skip
                continue
            return client, uri
        raise error

    async def _open(self, uri: Uri) -> Client:
        if uri.direct:
            reader, writer = await self.shovels.open_direct()
            user, password = uri.user or "", ""
        else:
            context = ssl.create_default_context() if uri.scheme == "amqps" else None
            port = uri.port or (5671 if context else 5672)
            reader, writer = await asyncio.open_connection(uri.host, port, ssl=context)
            user = uri.user if uri.user is not None else "guest"
            password = uri.password if uri.password is not None else "guest"
        try:
            return await connect(
                reader, writer, user=user, password=password, vhost=uri.vhost,
                heartbeat=uri.heartbeat, connection_name=f"Shovel {self.config.name}",
            )  # fmt: skip
        except BaseException:
            writer.close()
            raise

    async def _session(self) -> None:
        config = self.config
        self.src, src_uri = await self._connect(config.src_uris, "source")
        self.dest, dest_uri = await self._connect(config.dest_uris, "destination")
        # init_dest, then init_source (rabbit_shovel_worker, init_shovel)
        if config.dest_queue is not None:
            await self._ensure_queue(
                self.dest, config.dest_queue, config.dest_queue_args, config.dest_predeclared
            )
        dest = self.dest_channel = await self.dest.channel()
        if config.ack_mode == "on-confirm":
            await dest.call(commands.Confirm.Select(), commands.Confirm.SelectOk)
            dest.on_confirm = self._confirmed
        self.dest.on_blocked = self._dest_blocked
        src = self.src_channel = await self.src.channel()
        if config.src_queue is not None:
            queue = config.src_queue
            await self._ensure_queue(self.src, queue, config.src_queue_args, config.src_predeclared)
        else:
            declared = await src.call(
                make(commands.Queue.Declare, exclusive=True), commands.Queue.DeclareOk
            )
            queue = declared.queue
            bind = make(
                commands.Queue.Bind, queue=queue, exchange=config.src_exchange,
                routing_key=config.src_exchange_key,
            )  # fmt: skip
            await src.call(bind, commands.Queue.BindOk)
        no_ack = config.ack_mode == "no-ack"
        if not no_ack:
            await src.call(commands.Basic.Qos(prefetch_count=config.prefetch), commands.Basic.QosOk)
        self.remaining = await self._remaining(src, queue)
        self.remaining_unacked = self.remaining
        if self.remaining == 0:
            raise Finished()
        self.done = asyncio.get_running_loop().create_future()
        self.info = self._running_info(src_uri, dest_uri)  # forward headers name the URIs
        src.on_deliver = self._deliver
        src.on_cancel = self._cancelled
        consume = make(
            commands.Basic.Consume, queue=queue, consumer_tag=config.consumer_name,
            no_ack=no_ack, arguments=config.consumer_args,
        )  # fmt: skip
        await src.call(consume, commands.Basic.ConsumeOk)
        if config.delete_after_duration:  # sched_expire_after_duration/2: then autodelete
            timer = asyncio.get_running_loop().call_later(
                config.delete_after_duration, self._expired
            )
            self.done.add_done_callback(lambda _: timer.cancel())
        self._report("running")
        waits: list[asyncio.Future[Any]] = [self.src.closed, self.dest.closed, self.done]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if self.done.done():
            self.done.result()  # raises Finished or Restart
        if self.src.closed.done():
            raise Restart(f"source connection closed: {self.src.closed.result()}")
        raise Restart(f"destination connection closed: {self.dest.closed.result()}")

    async def _ensure_queue(
        self, client: Client, queue: str, arguments: dict[str, Any], predeclared: bool
    ) -> None:
        """ensure_queue/3: a passive declare; if the queue is missing, declare it durable
        (unless it must be predeclared: check_queue/3)."""
        channel = await client.channel()
        try:
            await channel.call(
                make(commands.Queue.Declare, queue=queue, passive=True), commands.Queue.DeclareOk
            )
        except ClientClosed as exc:
            if exc.code != NOT_FOUND or predeclared:
                raise Restart(f"failed to set up topology: {exc}") from None
            channel = await client.channel()
            declare = make(commands.Queue.Declare, queue=queue, durable=True, arguments=arguments)
            try:
                await channel.call(declare, commands.Queue.DeclareOk)
            except ClientClosed as again:
                raise Restart(f"failed to set up topology: {again}") from None
        await channel.close()

    async def _remaining(self, channel: Channel, queue: str) -> int | None:
        after = self.config.delete_after
        if after == "never":
            return None
        if after == "queue-length":
            declare = make(commands.Queue.Declare, queue=queue, passive=True)
            declared = await channel.call(declare, commands.Queue.DeclareOk)
            return int(declared.message_count)
        return int(after)

    def _running_info(self, src_uri: Uri, dest_uri: Uri) -> dict[str, Any]:
        """report_running/1: the URIs without credentials and the endpoints."""
        return {
            "src_uri": src_uri.redacted,
            "src_protocol": "amqp091",
            "dest_protocol": "amqp091",
            "dest_uri": dest_uri.redacted,
            **_endpoints(self.config, "_"),
        }

    def status(self) -> dict[str, Any]:
        """A row of GET /api/shovels (rabbit_shovel_mgmt_util:format/2)."""
        config = self.config
        t = self.since
        row: dict[str, Any] = {
            "node": self.shovels.mgmt.node,
            "timestamp": f"{t.tm_year}-{t.tm_mon:02}-{t.tm_mday:02} "
            f"{t.tm_hour}:{t.tm_min:02}:{t.tm_sec:02}",
            "name": config.name,
            "vhost": config.vhost,
            "type": "dynamic",
        }
        if self.state == "running":
            row.update(
                remaining="unlimited" if self.remaining is None else self.remaining,
                remaining_unacked=(
                    "unlimited" if self.remaining_unacked is None else self.remaining_unacked
                ),
                pending=0,
                forwarded=self.forwarded,
                state="blocked" if self.blocked else "running",
            )
            row.update(self.info)
        elif self.state == "terminated":
            row.update(state="terminated", reason=self.reason)
        else:
            row["state"] = self.state
        return row

    # -- the message path: callbacks of the clients -----------------------------------------

    def _deliver(self, _: int, method: Any, properties: bytes, body: bytes) -> None:
        config = self.config
        dest = self.dest_channel
        src = self.src_channel
        if dest is None or src is None:
            return
        if config.ack_mode == "on-confirm" and self.remaining_unacked == 0:
            return  # all it may move is published: the rest is requeued when it closes
        if config.dest_queue is not None:
            exchange, key = "", config.dest_queue
        else:
            exchange = config.dest_exchange if config.dest_exchange is not None else method.exchange
            key = config.dest_exchange_key or method.routing_key
            if config.dest_exchange_key is not None:
                key = config.dest_exchange_key
        try:
            seq = dest.publish(exchange, key, self._properties(properties), body)
        except ClientClosed:
            return  # the destination is gone; the worker restarts, the source requeues
        self.forwarded += 1
        tag = method.delivery_tag
        if self.remaining_unacked is not None and self.remaining_unacked > 0:
            self.remaining_unacked -= 1
        if config.ack_mode == "on-confirm":
            self.unacked[seq] = tag
        else:
            if config.ack_mode == "on-publish":
                # one ack (multiple) for all that this loop turn published: each is on its way
                self._ack_upto = tag
                if not self._ack_scheduled:
                    self._ack_scheduled = True
                    asyncio.get_running_loop().call_soon(self._ack_published)
            self._settled(1)
        dest_client = self.dest
        if not self._paused and dest_client and dest_client.write_buffer_size() > HIGH_WATER:
            self._pause()

    def _ack_published(self) -> None:
        self._ack_scheduled = False
        if self.src_channel is not None and self._ack_upto:
            self.src_channel.ack(self._ack_upto, multiple=True)

    def _confirmed(self, seq: int, multiple: bool, ack: bool) -> None:
        """confirm_to_inbound/4: a destination confirm settles the source's delivery."""
        src = self.src_channel
        if src is None:
            return
        if multiple:  # the dict is in publish order: stop at the first one past seq
            seqs = []
            for pending in self.unacked:
                if pending > seq:
                    break
                seqs.append(pending)
        else:
            seqs = [seq] if seq in self.unacked else []
        if not seqs:
            return
        tags = [self.unacked.pop(s) for s in seqs]
        if ack:
            src.ack(max(tags), multiple)
        else:
            src.nack(max(tags), multiple, requeue=True)
        self._settled(len(tags))

    def _settled(self, count: int) -> None:
        """decr_remaining/2: src-delete-after counts down to the end."""
        if self.remaining is None:
            return
        self.remaining -= count
        if self.remaining <= 0 and self.done is not None and not self.done.done():
            self.done.set_exception(Finished())

    def _expired(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(Finished())

    def _cancelled(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(Restart("the source cancelled the consumer"))

    def _dest_blocked(self, blocked: bool) -> None:
        """connection.blocked from the destination: stop reading the source meanwhile."""
        self.blocked = blocked
        if self.src is None:
            return
        if blocked:
            self.src.pause_reading()
        elif not self._paused:
            self.src.resume_reading()

    def _pause(self) -> None:
        """Too much waits for the destination's socket: read no more deliveries until it drains."""
        assert self.src is not None and self.dest is not None
        self._paused = True
        self.src.pause_reading()
        self._drain_task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        dest, src = self.dest, self.src
        if dest is None or src is None:
            return
        with contextlib.suppress(Exception):
            await dest.drain()
        self._paused = False
        self._drain_task = None
        if not self.blocked:
            src.resume_reading()

    def _properties(self, raw: bytes) -> bytes:
        config = self.config
        if not (config.add_forward_headers or config.add_timestamp_header
                or config.publish_properties):  # fmt: skip
            return raw
        if config.publish_properties:
            raw = _set_properties(raw, config.publish_properties)
        if config.add_forward_headers:
            raw = _prepend_shovelled(raw, self._forward_table())
        if config.add_timestamp_header:
            raw = set_header(raw, "x-shovelled-timestamp", int(time.time()))
        return raw

    def _forward_table(self) -> bytes:
        """The x-shovelled entry (rabbit_amqp091_shovel:props_fun/9, update_headers/5)."""
        config = self.config
        cached = self._props_cache
        key = repr(self.info).encode()
        if cached is not None and cached[0] == key:
            return cached[1]
        mgmt = self.shovels.mgmt
        cluster = mgmt.broker.global_parameters.values.get("cluster_name")
        table: dict[str, Any] = {
            "shovelled-by": cluster if isinstance(cluster, str) else mgmt.node,
            "shovel-type": "dynamic",
            "shovel-name": config.name,
            "shovel-vhost": config.vhost,
            "src-uri": self.info.get("src_uri", ""),
            "dest-uri": self.info.get("dest_uri", ""),
            **_endpoints(config, "-"),
        }
        encoded = encode_value(table)
        self._props_cache = (key, encoded)
        return encoded


def _endpoints(config: ShovelConfig, sep: str) -> dict[str, Any]:
    """The source and destination a running shovel names: the same fields in its status
    (report_running/1, words joined by ``_``) and in x-shovelled (props_fun/9, by ``-``)."""
    fields: dict[str, Any]
    if config.src_queue is not None:
        fields = {"src_queue": config.src_queue}
    else:
        fields = {"src_exchange": config.src_exchange, "src_exchange_key": config.src_exchange_key}
    for name, value in (
        ("dest_exchange", config.dest_exchange),
        ("dest_exchange_key", config.dest_exchange_key),
        ("dest_queue", config.dest_queue),
    ):
        if value is not None:
            fields[name] = value
    return {name.replace("_", sep): value for name, value in fields.items()}


def _prepend_shovelled(raw: bytes, entry: bytes) -> bytes:
    """rabbit_basic:prepend_table_header/3: the new table first in the x-shovelled array."""
    fields = split_properties(raw)
    entries: dict[str, bytes] = {}
    if "headers" in fields:
        entries, _ = table_entries(fields["headers"])
    old = entries.get("x-shovelled")
    rest = old[5:] if old is not None and old[:1] == b"A" else b""
    body = entry + rest
    entries["x-shovelled"] = b"A" + len(body).to_bytes(4, "big") + body
    fields["headers"] = join_entries(entries)
    return join_properties(fields)


def _set_properties(raw: bytes, properties: dict[str, Any]) -> bytes:
    """dest-publish-properties: these properties replace the message's own."""
    fields = split_properties(raw)
    for name, value in properties.items():
        if name in ("delivery_mode", "priority"):
            fields[name] = bytes((int(value) & 0xFF,))
        elif name == "timestamp":
            fields[name] = int(value).to_bytes(8, "big")
        else:
            fields[name] = encode_shortstr(str(value))
    return join_properties(fields)
