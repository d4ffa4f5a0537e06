"""Warren's test kit: a broker inside the test process, and the pytest plugin.

``run_broker`` (runner.py) starts one on a free port; ``plugin.py`` is the
``pytest11`` entry point with the ``warren_broker`` fixtures. Attributes are
loaded on first use, so importing the plugin does not import the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from warren.broker.testkit.runner import (
        BrokerRunner,
        Clock,
        QueueDepth,
        RunningBroker,
        run_broker,
        run_broker_async,
    )

__all__ = [
    "BrokerRunner",
    "Clock",
    "QueueDepth",
    "RunningBroker",
    "run_broker",
    "run_broker_async",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from warren.broker.testkit import runner

        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
