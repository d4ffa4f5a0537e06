"""rabbitmq.conf.example: its last section lists every RabbitMQ key Warren ignores.

(tests/test_config.py checks that it loads as the defaults and shows every key Warren reads.)
"""

from __future__ import annotations

import re
from pathlib import Path

from warren.config import load_settings
from warren.config import parser as config_parser

EXAMPLE = Path(__file__).resolve().parent.parent / "rabbitmq.conf.example"
IGNORED_SECTION = "## RabbitMQ keys that Warren accepts and ignores"


def test_every_ignored_key_is_listed_at_the_end() -> None:
    text = EXAMPLE.read_text()
    _, sep, tail = text.partition(IGNORED_SECTION)
    assert sep and IGNORED_SECTION not in tail
    listed = set(re.findall(r"[a-z0-9_]+(?:\.[a-z0-9_]+)*", tail))
    for prefix in config_parser._IGNORED:
        assert prefix in listed, prefix
    # the section is comments only: it cannot change what the file sets
    assert all(not ln.strip() or ln.startswith("#") for ln in tail.splitlines())


def test_ignored_keys_are_accepted_with_a_warning(tmp_path: Path) -> None:
    conf = tmp_path / "rabbitmq.conf"
    keys = [f"{prefix}.x" for prefix in config_parser._IGNORED]  # a key below each
    conf.write_text("".join(f"{key} = 1\n" for key in keys))
    assert load_settings(conf, environ={}).ignored_keys == tuple(keys)
