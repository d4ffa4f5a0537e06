"""``warren-server`` / ``python -m warren``: run the broker until SIGTERM or SIGINT.

The engine, structlog and uvloop are imported only once the arguments are
parsed, so ``--help`` and configuration errors answer at once; start-up time
is what CI jobs and container health checks wait for.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from warren.config import ConfigError, Settings


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="warren-server", description="Warren AMQP 0-9-1 broker")
    parser.add_argument("--version", action="version", version=_version())
    parser.add_argument(
        "--config", metavar="PATH", help="rabbitmq.conf-style file (default: $RABBITMQ_CONFIG_FILE)"
    )
    parser.add_argument("--port", type=int, help="AMQP port (overrides listeners.tcp.default)")
    parser.add_argument("--bind", metavar="ADDR", help="address to listen on")
    parser.add_argument("--data-dir", metavar="DIR", help="where durable state is kept")
    for endpoint, default in (("management", 15672), ("prometheus", 15692)):
        parser.add_argument(
            f"--{endpoint}-port",
            type=_port_or_none,
            default=argparse.SUPPRESS,  # absent unless given: None means "off"
            metavar="PORT",
            help=f"{endpoint}.tcp.port: 0 for a free port, 'none' for off (default {default})",
        )
    return parser.parse_args(argv)


def _version() -> str:
    from warren import __version__, compiled_modules

    compiled = compiled_modules()
    build = f"compiled with mypyc: {', '.join(compiled)}" if compiled else "pure Python"
    return f"warren-server {__version__} ({build})"


def _port_or_none(text: str) -> int | None:
    if text == "none":
        return None
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535 or 'none', got {text!r}")
    return int(text)


def settings_from_args(args: argparse.Namespace) -> Settings:
    from warren.config import Listener, load_settings

    settings = load_settings(args.config)
    changes: dict[str, object] = {}
    if args.port is not None or args.bind is not None:
        first = settings.listeners[0] if settings.listeners else Listener("default", "", 5672)
        changes["listeners"] = (
            Listener(
                first.name,
                args.bind if args.bind is not None else first.host,
                args.port if args.port is not None else first.port,
            ),
        )
    if args.data_dir is not None:
        changes["data_dir"] = args.data_dir
    for field in ("management_port", "prometheus_port"):
        if hasattr(args, field):
            changes[field] = getattr(args, field)
    return settings.replace(**changes) if changes else settings


# The cyclic collector's schedule in the broker's process. Python's default (700, 10, 10)
# considers a full collection every 70,000 container allocations: while a backlog builds,
# one runs each time the heap has grown by a quarter, and each walks every queued message.
# Here a full collection is considered every 6 million allocations (2 x 301 x 10,001: a
# few million messages); garbage cycles wait that long, so the engine makes none where it
# churns (Queue.close lets go of its timers). The middle 0 collects the middle generation
# every other young collection, so that no collection short of a full one walks more than
# the last 20,000 new objects: (50000, 10, 10) would walk 500,000 queued messages at a time,
# a 60 ms stall every 2 s of a growing backlog, long enough for a publisher's TCP to change
# pace. Measured in docs/performance.md ("Garbage collection"). Not set by the test kit's in-process
# broker, whose process is the user's. WARREN_GC_THRESHOLDS=700,10,10 puts Python's default
# back (as RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS tunes Erlang's collector).
GC_THRESHOLDS = (10_000, 0, 300)


def gc_thresholds(env: str | None) -> tuple[int, int, int]:
    if not env:
        return GC_THRESHOLDS
    try:
        first, second, third = (int(part) for part in env.split(","))
    except ValueError:
        raise ValueError(
            f"WARREN_GC_THRESHOLDS={env!r}: expected three integers, as in 10000,0,300"
        ) from None
    if min(first, second, third) < 0:
        raise ValueError(f"WARREN_GC_THRESHOLDS={env!r}: a threshold cannot be negative")
    return first, second, third


async def serve(settings: Settings) -> None:
    import asyncio
    import signal

    from warren.broker.server.shell import Server

    # handlers first: whoever reads the first log line may send SIGTERM at once
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    import structlog

    from warren import __version__, build, compiled_modules

    # the first line says which build runs (docs/building.md), before the engine logs anything
    log = structlog.get_logger("warren")
    if build() == "compiled":
        log.info("starting warren-server", version=__version__, build="compiled",
                 compiled_modules=len(compiled_modules()))  # fmt: skip
    else:
        log.info("starting warren-server", version=__version__, build="pure",
                 hint="pure Python: see docs/building.md for the compiled build")  # fmt: skip
    server = Server(settings)
    for key in settings.ignored_keys:
        log.warning("config key not used by Warren", key=key)
    await server.start()
    for host, port in server.addresses:
        log.info("ready", address=f"{host}:{port}")
    for host, port in server.tls_addresses:
        log.info("TLS listener ready", address=f"{host}:{port}")
    for name, ip, http_port in (
        ("management API", settings.management_ip, server.management_port),
        ("prometheus metrics", settings.prometheus_ip, server.prometheus_port),
    ):
        if http_port:
            log.info(f"{name} listening", address=f"{ip}:{http_port}")
    # Last, once every listener accepts: testcontainers and compose set-ups wait for this line
    # (rabbit.erl, log_broker_started/1: one message, a line per plugin after the count).
    plugins = started_plugins(server.management_port, server.prometheus_port)
    log.info(f"Server startup complete; {len(plugins)} plugins started.")
    for plugin in plugins:
        log.info(f" * {plugin}")
    endpoints = _write_endpoints(settings, server.management_port)
    try:
        await stop.wait()
    finally:
        if endpoints is not None:
            endpoints.unlink(missing_ok=True)
    log.info("shutting down", connections=len(server.broker.connections))
    await server.stop()


# The RabbitMQ plugins whose work Warren does itself, by what they need to be running.
ALWAYS_STARTED = (
    "rabbitmq_consistent_hash_exchange",
    "rabbitmq_delayed_message_exchange",
    "rabbitmq_shovel",  # dynamic shovels: broker/ops/shovel
)
MANAGEMENT_PLUGINS = (
    "rabbitmq_management",
    "rabbitmq_management_agent",
    "rabbitmq_shovel_management",
    "rabbitmq_web_dispatch",
)


def started_plugins(management_port: int | None, prometheus_port: int | None) -> list[str]:
    """The plugin names a RabbitMQ node doing what this one does would have started."""
    names = list(ALWAYS_STARTED)
    if management_port:
        names += MANAGEMENT_PLUGINS
    if prometheus_port:
        names += ("rabbitmq_prometheus", "rabbitmq_web_dispatch")
    return sorted(set(names))


def _write_endpoints(settings: Settings, management_port: int | None) -> Path | None:
    """Where warrenctl on this machine finds this broker's API, even on a port given on
    the command line or chosen by the OS (port 0)."""
    import json
    import os

    from warren.broker.tools import ENDPOINTS_FILE  # not warrenctl: urllib is slow to import

    if not settings.data_dir or not management_port:
        return None
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(
        settings.management_ip, settings.management_ip
    )
    host = f"[{host}]" if ":" in host else host
    path = Path(settings.data_dir) / ENDPOINTS_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"pid": os.getpid(), "management": f"http://{host}:{management_port}"})
        path.write_text(text + "\n")
    except OSError:
        return None  # a read-only data dir: warrenctl falls back to the config
    return path


def _print_config_errors(exc: ConfigError) -> None:
    """One line per mistake, all of them, as cuttlefish lists them."""
    if len(exc.errors) == 1:
        print(f"warren-server: configuration error: {exc}", file=sys.stderr)
        return
    print(f"warren-server: {len(exc.errors)} configuration errors:", file=sys.stderr)
    for error in exc.errors:
        print(f"  {error}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from warren.config import ConfigError

    try:
        settings = settings_from_args(args)
    except ConfigError as exc:
        _print_config_errors(exc)
        return 2
    import gc
    import os

    try:
        gc.set_threshold(*gc_thresholds(os.environ.get("WARREN_GC_THRESHOLDS")))
    except ValueError as exc:
        print(f"warren-server: {exc}", file=sys.stderr)
        return 2
    from warren.broker.server.logging import configure_logging

    configure_logging(settings.log_level, settings.log_formatter, settings.log_console)
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:
        import asyncio

        runner = asyncio.run
    try:
        runner(serve(settings))
    except ConfigError as exc:  # e.g. a load_definitions file that does not import
        _print_config_errors(exc)
        return 2
    except OSError as exc:
        from warren.broker.server.listen import ListenError

        if isinstance(exc, ListenError):  # names the address, the port, setting and flag
            print(f"warren-server: cannot listen on {exc.strerror}", file=sys.stderr)
        else:
            print(f"warren-server: cannot listen: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
