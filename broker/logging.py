"""structlog set-up: plain lines for people, JSON for machines."""

from __future__ import annotations

import logging
import sys

import structlog

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50, "none": 100}


def configure_logging(
    level: str = "info", formatter: str = "plaintext", enabled: bool = True
) -> None:
    numeric = LEVELS.get(level, 20) if enabled else 100
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if formatter == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=numeric, stream=sys.stderr)
