"""Console logging: plain lines for people, JSON lines for log shippers.

``log.console.formatter = json`` makes every line on stderr one JSON object
(``timestamp``, ``level``, ``event`` and the event's fields), including
records from the standard library's logging (asyncio, uvloop, libraries),
so that a shipper never meets a line it cannot parse. Tracebacks go into
the ``exception`` field instead of spanning lines.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog

NONE = 100  # above CRITICAL: nothing is logged
LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50, "none": NONE}


def _drop(_logger: Any, _method: str, _event: Any) -> Any:
    raise structlog.DropEvent


def configure_logging(
    level: str = "info",
    formatter: str = "plaintext",
    enabled: bool = True,
    stream: TextIO | None = None,
) -> None:
    """Set up structlog and the standard library's logging (``log.console.*``)."""
    out = stream if stream is not None else sys.stderr
    numeric = LEVELS.get(level, logging.INFO) if enabled else NONE
    renderer: list[structlog.types.Processor]
    if formatter == "json":
        renderer = [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        renderer = [
            structlog.dev.ConsoleRenderer(
                colors=False, exception_formatter=structlog.dev.plain_traceback
            )
        ]
    stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
    structlog.configure(
        processors=[
            # structlog's filtering loggers stop at critical; "none" drops the rest
            *([_drop] if numeric > logging.CRITICAL else []),
            structlog.processors.add_log_level,
            stamp,
            *renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(min(numeric, logging.CRITICAL)),
        logger_factory=structlog.PrintLoggerFactory(out),
        # configured once, before the broker makes its loggers
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.stdlib.add_log_level,
                structlog.stdlib.add_logger_name,
                stamp,
            ],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderer],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
