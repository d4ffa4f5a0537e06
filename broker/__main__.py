"""``warren-server`` / ``python -m broker``: run the broker until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from typing import Any

from broker.logging import configure_logging
from broker.server import Server
from config import ConfigError, Listener, Settings, load_settings


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="warren-server", description="Warren AMQP 0-9-1 broker")
    parser.add_argument("--config", metavar="PATH", help="rabbitmq.conf-style file")
    parser.add_argument("--port", type=int, help="AMQP port (overrides listeners.tcp.default)")
    parser.add_argument("--bind", metavar="ADDR", help="address to listen on")
    parser.add_argument("--data-dir", metavar="DIR", help="where durable state is kept")
    return parser.parse_args(argv)


def settings_from_args(args: argparse.Namespace) -> Settings:
    settings = load_settings(args.config)
    changes: dict[str, object] = {}
    if args.port is not None or args.bind is not None:
        first = (
            settings.listeners[0] if settings.listeners else Listener("default", "0.0.0.0", 5672)
        )
        changes["listeners"] = (
            Listener(
                first.name,
                args.bind if args.bind is not None else first.host,
                args.port if args.port is not None else first.port,
            ),
        )
    if args.data_dir is not None:
        changes["data_dir"] = args.data_dir
    return settings.replace(**changes) if changes else settings


async def serve(settings: Settings) -> None:
    server = Server(settings)
    log = server.broker.log
    for key in settings.ignored_keys:
        log.warning("config key not used by Warren", key=key)
    await server.start()
    for host, port in server.addresses:
        log.info("ready", address=f"{host}:{port}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down", connections=len(server.broker.connections))
    await server.stop()


def main(argv: list[str] | None = None) -> int:
    try:
        settings = settings_from_args(parse_args(argv))
    except ConfigError as exc:
        print(f"warren-server: configuration error: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_formatter, settings.log_console)
    runner: Any = asyncio.run
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        pass
    try:
        runner(serve(settings))
    except OSError as exc:
        print(f"warren-server: cannot listen: {exc}", file=sys.stderr)
        return 1
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
