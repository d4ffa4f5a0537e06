"""The sizes issue 42 set for the product's code, kept: no engine module over 700 lines,
no class over 500, at most 12 modules directly in broker/ (the rest in its rooms)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("protocol", "broker", "config", "pipeline")


def product_modules() -> list[Path]:
    return sorted(p for d in PRODUCT for p in (ROOT / d).rglob("*.py"))


def test_no_engine_module_is_over_700_lines() -> None:
    sizes = {
        p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines())
        for p in (ROOT / "broker" / "engine").glob("*.py")
    }
    assert sizes and {m: n for m, n in sizes.items() if n > 700} == {}


def test_no_class_is_over_500_lines() -> None:
    big = {}
    for path in product_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > 500:
                    big[f"{path.relative_to(ROOT).as_posix()}:{node.name}"] = lines
    assert big == {}


def test_broker_keeps_at_most_12_modules_at_its_top() -> None:
    top = sorted(p.name for p in (ROOT / "broker").glob("*.py"))
    assert 0 < len(top) <= 12, top
