"""The loop of imports among the broker's rooms does not grow back (tests/import_graph.py
computes it; docs/architecture.md, "What each room may import", says what remains)."""

from __future__ import annotations

from tests.import_graph import loops

# the largest strongly connected component, TYPE_CHECKING imports included
LARGEST = 50


def test_the_largest_import_loop_does_not_grow() -> None:
    found, _ = loops()
    largest = found[0] if found else []
    assert len(largest) <= LARGEST, "\n".join(largest)
