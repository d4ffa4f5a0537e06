"""docs/architecture.md's tree names every module of the rooms a newcomer reads first.

A module added to the engine, the store, streams, tracing, the server shell or the
protocol without a line in the tree fails here, so the tree stays the map of the code.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROOMS = (
    "protocol",
    "broker/engine",
    "broker/store",
    "broker/streams",
    "broker/tracing",
    "broker/server",
    "broker/testkit",
)


def test_the_tree_names_every_module_of_the_rooms() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    tree = doc.split("```")[1]
    missing = [
        f"{room}/{path.name}"
        for room in ROOMS
        for path in sorted((ROOT / room).glob("*.py"))
        if path.name != "__init__.py" and path.name not in tree
    ]
    assert missing == []
