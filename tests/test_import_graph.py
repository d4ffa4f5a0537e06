"""The loop of imports in the engine does not grow back (tests/import_graph.py computes it;
docs/architecture.md, "What each room may import", says what remains and why)."""

from __future__ import annotations

from tests.import_graph import loops

# the largest strongly connected component, TYPE_CHECKING imports included
LARGEST = 37
# below the engine's loop: a message, the counters, the confirms and the store (the
# import contracts in pyproject.toml keep the store and message.py below the engine too)
BELOW = (
    "warren.broker.engine.message",
    "warren.broker.engine.stats",
    "warren.broker.engine.confirms",
    "warren.broker.store",
    "warren.broker.streams.log",
)


def test_the_largest_import_loop_does_not_grow() -> None:
    found, _ = loops()
    largest = found[0] if found else []
    assert len(largest) <= LARGEST, "\n".join(largest)


def test_messages_counters_confirms_and_the_store_are_out_of_the_engines_loop() -> None:
    found, _ = loops()
    engine = next(c for c in found if "warren.broker.engine.queue" in c)
    inside = [m for m in engine if m.startswith(BELOW)]
    assert inside == []
