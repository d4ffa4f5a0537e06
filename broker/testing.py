"""Run a broker inside a test process: ``with run_broker() as b: connect(b.url)``.

The broker gets its own thread and event loop, so blocking clients (pika)
and asyncio clients in the test's own loop can both talk to it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from broker.server import Server
from config import Listener, Settings


@dataclass
class RunningBroker:
    host: str
    port: int
    server: Server
    loop: asyncio.AbstractEventLoop

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/"

    def call(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` on the broker's loop and return its result (for inspection)."""
        future: Any = asyncio.run_coroutine_threadsafe(_call(fn, *args), self.loop)
        return future.result(timeout=10)


async def _call(fn: Any, *args: Any) -> Any:
    return fn(*args)


@contextmanager
def run_broker(settings: Settings | None = None, **changes: Any) -> Iterator[RunningBroker]:
    """Start a broker on 127.0.0.1 and a free port; stop it on exit."""
    base = settings or Settings()
    changes.setdefault("listeners", (Listener("default", "127.0.0.1", 0),))
    final = base.replace(**changes)
    ready = threading.Event()
    holder: dict[str, Any] = {}

    def target() -> None:
        try:
            import uvloop

            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        except ImportError:
            loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        holder["loop"] = loop

        async def main() -> None:
            server = Server(final)
            await server.start()
            holder["server"] = server
            holder["stop"] = stop = asyncio.Event()
            ready.set()
            await stop.wait()
            await server.stop()

        try:
            loop.run_until_complete(main())
        except BaseException as exc:  # report start-up failures to the caller
            holder["error"] = exc
            ready.set()
        finally:
            loop.close()

    thread = threading.Thread(target=target, name="warren-broker", daemon=True)
    thread.start()
    ready.wait(10)
    if "error" in holder:
        raise holder["error"]
    server: Server = holder["server"]
    host, port = server.addresses[0]
    try:
        yield RunningBroker(host, port, server, holder["loop"])
    finally:
        holder["loop"].call_soon_threadsafe(holder["stop"].set)
        thread.join(10)
