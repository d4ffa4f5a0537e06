"""Fixtures: one Warren broker per test session, in-process on an ephemeral port.

Set ``WARREN_TEST_URL`` to point the same tests at another broker (a local
RabbitMQ, say) and check that they assert what RabbitMQ does.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from urllib.parse import urlparse

import pytest

# warren-report's class caches (pipeline/jvm.py) in the user's cache,
# also for the runs of pytester, which gives its inner runs a HOME of their own
os.environ.setdefault(
    "WARREN_REPORT_CACHE",
    os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "warren"),
)


@pytest.fixture(scope="session")
def amqp_url() -> Iterator[str]:
    external = os.environ.get("WARREN_TEST_URL")
    if external:
        yield external
        return
    from warren.broker.testkit import run_broker

    # record=False: the conformance tests do not read the test kit's record, and a session
    # of them would keep every message in memory
    with run_broker(record=False) as running:
        yield running.url


@pytest.fixture(scope="session")
def amqp_addr(amqp_url: str) -> tuple[str, int]:
    parsed = urlparse(amqp_url)
    return parsed.hostname or "127.0.0.1", parsed.port or 5672


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A unique queue/exchange name prefix for this test."""
    return f"t.{request.node.name[:40]}.{uuid.uuid4().hex[:8]}"


def pytest_configure(config: pytest.Config) -> None:
    """The in-process broker logs through the standard library, so pytest captures it."""
    import logging

    import structlog

    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.processors.KeyValueRenderer()],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        cache_logger_on_first_use=False,
    )
