"""Run a Warren broker inside a test process, on 127.0.0.1 and a free port.

Blocking (the broker gets its own thread and event loop, so blocking
clients such as pika and asyncio clients in any loop can both use it)::

    with run_broker() as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))

Async (the broker runs on the current event loop; no thread)::

    async with run_broker() as broker:
        connection = await aio_pika.connect(broker.url)

What happened is recorded (``published()``, ``outcomes(queue)``), ``reset()``
empties the vhost in a millisecond, ``wait_for(predicate)`` waits on the broker's
own events, and with ``clock="manual"`` broker time stands still until
``clock.advance(seconds)`` (docs/test-kit.md).

Keyword arguments are :class:`config.Settings` fields. Unless given as
keywords, the AMQP listener is 127.0.0.1 on a free port, the management
and Prometheus endpoints are off (``management_port=0`` turns management
on at a free port) and nothing is kept on disk (``data_dir=None``); pass
``data_dir=...`` for durable queues and messages that survive ``restart()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

from warren.broker.engine.timers import ManualTimers
from warren.broker.server.shell import Server
from warren.broker.testkit.recorder import recording_of, start_recording
from warren.config import Listener, Settings

if TYPE_CHECKING:
    from warren.broker.testkit.recorder import Outcome, Published, Recording

__all__ = [
    "BrokerRunner",
    "Clock",
    "QueueDepth",
    "RunningBroker",
    "run_broker",
    "run_broker_async",
]

T = TypeVar("T")
START_TIMEOUT = 10.0  # seconds; a start that takes longer is a failure, not a slow machine


@dataclasses.dataclass(frozen=True)
class QueueDepth:
    ready: int  # waiting to be delivered
    unacked: int  # delivered, not yet acknowledged

    @property
    def total(self) -> int:
        return self.ready + self.unacked


class _Engine:
    """The state every view of one running broker shares: a restart swaps ``server``."""

    def __init__(
        self, settings: Settings, loop: asyncio.AbstractEventLoop, record: bool = True
    ) -> None:
        self.settings = settings
        self.loop = loop
        # made on the loop's own thread: calls from there need no hop (RunningBroker.call)
        self.loop_thread = threading.get_ident()
        self.server: Server | None = None
        self.record = record
        # the manual clock belongs to the engine: a restart keeps broker time where it is
        self.manual: ManualTimers | None = (
            ManualTimers(loop) if settings.clock == "manual" else None
        )

    async def start(self) -> Server:
        server = Server(self.settings, self.manual)
        if self.record:
            start_recording(server.broker)
        try:
            await server.start()
        except BaseException:
            # e.g. AMQP bound but a management port taken: release what did start
            with contextlib.suppress(Exception):
                await server.stop()
            raise
        self.server = server
        return server

    async def restart(self) -> None:
        assert self.server is not None
        old = self.server
        # the same addresses again, so that clients reconnect to the URL they have
        listeners = tuple(Listener(f"l{i}", h, p) for i, (h, p) in enumerate(old.addresses))
        tls = tuple(Listener(f"s{i}", h, p) for i, (h, p) in enumerate(old.tls_addresses))
        changes: dict[str, object] = {"listeners": listeners, "ssl_listeners": tls}
        for endpoint in ("management_port", "prometheus_port"):
            port = getattr(old, endpoint, None)
            if port:
                changes[endpoint] = port
        await old.stop()
        self.settings = self.settings.replace(**changes)
        if self.manual is not None:  # the old broker's timers stay behind with it
            self.manual = self.manual.fork()
        await self.start()


class RunningBroker:
    """A running broker as a test sees it, for one vhost (the default one unless chosen)."""

    def __init__(self, engine: _Engine, vhost: str | None = None) -> None:
        self._engine = engine
        self.vhost: str = engine.settings.default_vhost if vhost is None else vhost

    @property
    def server(self) -> Server:
        assert self._engine.server is not None, "the broker is not running"
        return self._engine.server

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._engine.loop

    @property
    def settings(self) -> Settings:
        return self._engine.settings

    @property
    def host(self) -> str:
        return self.server.addresses[0][0]

    @property
    def port(self) -> int:
        return self.server.addresses[0][1]

    @property
    def user(self) -> str:
        return self.settings.default_user

    @property
    def password(self) -> str:
        return self.settings.default_pass

    @property
    def url(self) -> str:
        """``amqp://user:pass@127.0.0.1:port/vhost``, as pika, aio-pika and kombu read it."""
        # clients read an empty path as the default vhost "/"; others are percent-encoded
        path = "" if self.vhost == "/" else quote(self.vhost, safe="")
        auth = f"{quote(self.user, safe='')}:{quote(self.password, safe='')}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"amqp://{auth}@{host}:{self.port}/{path}"

    @property
    def tls_port(self) -> int | None:
        """The first TLS listener's port (``ssl_listeners=...``), else None."""
        addresses = self.server.tls_addresses
        return addresses[0][1] if addresses else None

    @property
    def amqps_url(self) -> str | None:
        """``amqps://user:pass@localhost:port/vhost`` for the TLS listener, else None.

        ``localhost``, not an address: the name a test certificate is made out to.
        """
        port = self.tls_port
        if port is None:
            return None
        auth, path = self.url.removeprefix("amqp://").split("@", 1)
        return f"amqps://{auth}@localhost:{port}/{path.split('/', 1)[1]}"

    @property
    def management_url(self) -> str | None:
        """``http://user:pass@127.0.0.1:port`` if the management API is listening, else None."""
        port = getattr(self.server, "management_port", None)
        if not port:
            return None
        auth = f"{quote(self.user, safe='')}:{quote(self.password, safe='')}"
        return f"http://{auth}@127.0.0.1:{port}"

    @property
    def prometheus_url(self) -> str | None:
        """``http://127.0.0.1:port/metrics`` if the Prometheus endpoint is listening, else None."""
        port = getattr(self.server, "prometheus_port", None)
        return f"http://127.0.0.1:{port}/metrics" if port else None

    # ---- running code in the broker ----

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the broker's loop and return its result.

        Engine objects belong to that loop; touch them only through here.
        """
        if threading.get_ident() == self._engine.loop_thread:
            return fn(*args)  # async mode: we are on the broker's loop already
        future = asyncio.run_coroutine_threadsafe(_call(fn, *args), self.loop)
        return future.result(timeout=10)

    def restart(self) -> None:
        """Stop and start the broker on the same ports and data_dir (threaded mode).

        Open connections are closed with 320 CONNECTION_FORCED, as when
        RabbitMQ restarts; clients reconnect to the same ``url``. Durable
        queues and persistent messages survive if there is a ``data_dir``.
        """
        if threading.get_ident() == self._engine.loop_thread:
            raise RuntimeError("in async mode use `await broker.restart_async()`")
        asyncio.run_coroutine_threadsafe(self._engine.restart(), self.loop).result(START_TIMEOUT)

    async def restart_async(self) -> None:
        """:meth:`restart` for a broker started with ``async with``."""
        await self._engine.restart()

    # ---- the test kit: clock, what happened, reset, waiting ----

    @property
    def clock(self) -> Clock:
        """Broker time; with ``clock="manual"`` it moves only when the test advances it."""
        return Clock(self)

    @property
    def recording(self) -> Recording:
        recording = recording_of(self.server.broker)
        if recording is None:
            raise RuntimeError("this broker does not record (run_broker(record=False))")
        return recording

    def published(
        self, exchange: str | None = None, routing_key: str | None = None
    ) -> list[Published]:
        """What was published in this vhost since start or the last :meth:`reset`, in order.

        Each has ``.exchange``, ``.routing_key``, ``.body`` (bytes), ``.properties``
        (decoded, ``headers`` included), ``.headers``, ``.routed_to`` (queue names) and
        ``.vhost``. ``exchange`` and ``routing_key`` filter when given.
        """

        def read() -> list[Published]:
            return [
                p
                for p in self.recording.published(self.vhost)
                if (exchange is None or p.exchange == exchange)
                and (routing_key is None or p.routing_key == routing_key)
            ]

        return self.call(read)

    def outcomes(self, queue: str) -> list[Outcome]:
        """Every message that reached ``queue`` (since start or reset), in arrival order,
        with ``.outcome`` (acked, nacked, rejected, requeued, expired, dead-lettered,
        timed-out, dropped, ready, unacked) and its details."""
        return self.call(lambda: self.recording.outcomes(self.vhost, queue))

    def outcome_names(self, queue: str) -> list[str]:
        """Just the ``.outcome`` of each message of ``queue``, in order (for asserts)."""
        return [o.outcome for o in self.outcomes(queue)]

    def reset(self, close_connections: bool = True) -> dict[str, int]:
        """Back to a fresh vhost without a restart: same port, same URL, in about a millisecond.

        Queues, messages, exchanges (the built-in ones stay), bindings, policies, limits
        and the record go. Connections to this vhost are closed with 320
        CONNECTION_FORCED, unless ``close_connections=False`` keeps them (consumers of
        deleted queues then get basic.cancel). Broker time is not turned back.
        Returns how many queues, exchanges, policies and connections went.
        """
        from warren.broker.testkit.recorder import reset_vhost

        return self._run(lambda: reset_vhost(self.server.broker, self.vhost, close_connections))

    def wait_for(self, predicate: Callable[[], T], timeout: float = 5.0, poll: float = 0.05) -> T:
        """Return ``predicate()``'s value once it is true, re-checked after every broker
        event (publish, delivery, ack, expiry...) and every ``poll`` seconds; TimeoutError
        after ``timeout`` seconds. Threaded mode; ``await wait_for_async`` on the
        broker's own loop."""
        if threading.get_ident() == self._engine.loop_thread:
            raise RuntimeError("on the broker's loop use `await broker.wait_for_async(...)`")
        woke = threading.Event()
        wake = woke.set
        deadline = time.monotonic() + timeout
        self.call(self.recording.wakers.add, wake)
        try:
            while True:
                woke.clear()  # before the check: an event after it wakes the wait below
                result = predicate()
                if result:
                    return result
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"the condition was not met within {timeout} s")
                woke.wait(min(left, poll))
        finally:
            self.call(self.recording.wakers.discard, wake)

    async def wait_for_async(
        self, predicate: Callable[[], T], timeout: float = 5.0, poll: float = 0.05
    ) -> T:
        """:meth:`wait_for` for async tests, in either mode (the broker's loop or another)."""
        loop = asyncio.get_running_loop()
        woke = asyncio.Event()
        if self.loop is loop:
            wake: Callable[[], None] = woke.set
        else:

            def wake() -> None:
                loop.call_soon_threadsafe(woke.set)

        deadline = loop.time() + timeout
        self.call(self.recording.wakers.add, wake)
        try:
            while True:
                woke.clear()
                result = predicate()
                if result:
                    return result
                left = deadline - loop.time()
                if left <= 0:
                    raise TimeoutError(f"the condition was not met within {timeout} s")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woke.wait(), min(left, poll))
        finally:
            self.call(self.recording.wakers.discard, wake)

    def _run(self, fn: Callable[[], T]) -> T:
        """``call``, and in threaded mode one more turn of the broker's loop after it,
        so that the frames it wrote (basic.cancel, connection.close) are sent on return."""
        if threading.get_ident() == self._engine.loop_thread:
            return fn()

        async def run() -> T:
            result = fn()
            await asyncio.sleep(0)
            return result

        future = asyncio.run_coroutine_threadsafe(run(), self.loop)
        return future.result(timeout=10)

    # ---- vhosts ----

    def add_vhost(self, name: str) -> RunningBroker:
        """Create vhost ``name``, give the default user full rights on it; return its view."""

        def add() -> None:
            broker = self.server.broker
            broker.add_vhost(name)
            broker.access.set_permissions(self.user, name, ".*", ".*", ".*")

        self.call(add)
        return RunningBroker(self._engine, name)

    def delete_vhost(self, name: str) -> bool:
        """Delete vhost ``name``; its connections are closed with 320 CONNECTION_FORCED."""
        return self.call(self.server.broker.delete_vhost, name)

    # ---- queues ----

    def queues(self) -> dict[str, QueueDepth]:
        """Every queue in this view's vhost with its depth, read in one go."""

        def read() -> dict[str, QueueDepth]:
            vhost = self.server.broker.vhosts.get(self.vhost)
            if vhost is None:
                return {}
            return {n: QueueDepth(q.ready_count, q.unacked_count) for n, q in vhost.queues.items()}

        return self.call(read)

    def queue_counts(self, name: str) -> QueueDepth:
        """Ready and unacknowledged messages of queue ``name``; KeyError if there is none."""
        depth = self.queues().get(name)
        if depth is None:
            raise KeyError(f"no queue {name!r} in vhost {self.vhost!r}")
        return depth

    def queue_depth(self, name: str) -> int:
        """Messages ready for delivery in queue ``name`` (RabbitMQ's ``messages_ready``)."""
        return self.queue_counts(name).ready

    def __repr__(self) -> str:
        running = self._engine.server is not None
        where = f"{self.host}:{self.port}" if running else "stopped"
        return f"<RunningBroker {where} vhost={self.vhost!r}>"


async def _call(fn: Callable[..., T], *args: Any) -> T:
    return fn(*args)


class Clock:
    """Broker time as a test sees it: what message TTLs, x-expires, consumer timeouts,
    delayed retries and delivery limits wait for. Heartbeats and the handshake timeout
    stay on real time, so advancing an hour never costs the test its connection."""

    def __init__(self, broker: RunningBroker) -> None:
        self._broker = broker

    @property
    def manual(self) -> bool:
        return self._broker._engine.manual is not None

    def _manual(self) -> ManualTimers:
        manual = self._broker._engine.manual
        if manual is None:
            raise RuntimeError(
                "broker time is real here: start the broker with clock='manual' "
                "(@pytest.mark.warren(clock='manual'), run_broker(clock='manual'))"
            )
        return manual

    def now(self) -> float:
        """Broker time in seconds (monotonic: only differences mean something)."""
        return self._broker.call(lambda: self._broker.server.broker.clock.now())

    def wall(self) -> float:
        """Broker time as seconds since the epoch (what x-death's ``time`` shows)."""
        return self._broker.call(lambda: self._broker.server.broker.clock.wall())

    @property
    def advanced(self) -> float:
        """Seconds advanced so far (0 with the real clock)."""
        manual = self._broker._engine.manual
        return manual.advanced if manual is not None else 0.0

    def advance(self, seconds: float) -> int:
        """Move broker time on by ``seconds`` and, before returning, fire everything that
        falls due, in deadline order (the frames it sends are on their way on return);
        returns how many timers fired. Manual clock only."""
        manual = self._manual()
        return self._broker._run(lambda: manual.advance(seconds))

    def next_due(self) -> float | None:
        """Seconds until the next broker timer falls due (None: none is set). Manual only."""
        manual = self._manual()
        return self._broker.call(manual.next_due)

    def __repr__(self) -> str:
        return f"<Clock {'manual' if self.manual else 'real'}>"


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


class BrokerRunner:
    """What :func:`run_broker` returns: use it with ``with`` or ``async with``."""

    def __init__(
        self, settings: Settings | None, changes: dict[str, Any], record: bool = True
    ) -> None:
        self._base = settings or Settings()
        self._changes = dict(changes)
        self._record = record
        self._engine: _Engine | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None

    def _settings(self) -> Settings:
        changes = dict(self._changes)
        # ports a test run could collide on are chosen here, never taken from the base
        changes.setdefault("listeners", (Listener("default", "127.0.0.1", 0),))
        changes.setdefault("management_port", None)
        changes.setdefault("prometheus_port", None)
        if changes["management_port"] is not None or changes["prometheus_port"] is not None:
            changes.setdefault("management_ip", "127.0.0.1")
            changes.setdefault("prometheus_ip", "127.0.0.1")
        # in memory unless asked: tests stay fast and cannot see each other's state
        changes.setdefault("data_dir", None)
        return self._base.replace(**changes)

    # ---- in a thread ----

    def __enter__(self) -> RunningBroker:
        settings = self._settings()
        ready = threading.Event()
        failure: list[BaseException] = []
        loop = _new_loop()
        stop = asyncio.Event()

        async def main() -> None:
            engine = _Engine(settings, loop, self._record)
            await engine.start()
            self._engine = engine
            ready.set()
            await stop.wait()
            if engine.server is not None:
                await engine.server.stop()
                engine.server = None

        def target() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(main())
            except BaseException as exc:  # a start-up failure is raised in the caller
                failure.append(exc)
            finally:
                ready.set()
                loop.close()

        thread = threading.Thread(target=target, name="warren-broker", daemon=True)
        self._thread, self._stop = thread, stop
        thread.start()
        ready.wait(START_TIMEOUT)
        if self._engine is None:
            if not failure:  # hung in start(): stopping the loop ends the thread
                loop.call_soon_threadsafe(loop.stop)
            thread.join(START_TIMEOUT)
            self._thread = None
            if failure:
                raise failure[0]
            raise RuntimeError(f"the broker did not start within {START_TIMEOUT} s")
        return RunningBroker(self._engine)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        engine, thread, stop = self._engine, self._thread, self._stop
        self._engine = self._thread = self._stop = None
        if engine is not None and stop is not None and not engine.loop.is_closed():
            engine.loop.call_soon_threadsafe(stop.set)
        if thread is not None:
            thread.join(START_TIMEOUT)

    # ---- on the current loop ----

    async def __aenter__(self) -> RunningBroker:
        settings = self._settings()
        engine = _Engine(settings, asyncio.get_running_loop(), self._record)
        await engine.start()
        self._engine = engine
        return RunningBroker(engine)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        engine, self._engine = self._engine, None
        if engine is not None and engine.server is not None:
            await engine.server.stop()
            engine.server = None


def run_broker(
    settings: Settings | None = None, *, record: bool = True, **changes: Any
) -> BrokerRunner:
    """A broker for a test: ``with run_broker() as b`` (own thread) or ``async with`` (this loop).

    ``settings`` is the base (default: RabbitMQ's defaults); keyword arguments
    are Settings fields that replace its values (``clock="manual"``: broker time
    moves only with ``b.clock.advance``). See the module docstring for the ports
    and data_dir chosen unless given as keywords. ``record=False``: no
    ``published()``/``outcomes()``, the message path exactly as in production.
    """
    return BrokerRunner(settings, changes, record)


def run_broker_async(
    settings: Settings | None = None, *, record: bool = True, **changes: Any
) -> BrokerRunner:
    """The same as :func:`run_broker`; a name that says ``async with`` is meant."""
    return BrokerRunner(settings, changes, record)
