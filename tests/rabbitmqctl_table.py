"""rabbitmqctl's output and exit status per verb, recorded, for warrenctl to match.

``python -m tests.rabbitmqctl_table`` runs SCRIPT with the real ``rabbitmqctl`` against
the RabbitMQ on this machine (guest/guest on 127.0.0.1:5672) and writes RECORDED;
tests/test_warrenctl.py runs the same script with warrenctl against Warren and compares
stdout, stderr and exit status line by line. The steps share one state: vhost ``ux``
gets queue ``q1`` with two messages (published over AMQP, as SETUP says) after step 2.
``trace_on`` is left out: rabbitmqctl's switches the firehose, Warren's its lifecycle trace.
``ping`` and ``status`` name the node and are checked field by field instead; the
connection and channel listings depend on who else is connected. Where rabbitmqctl names
itself (``See 'rabbitmqctl help set_permissions'``), warrenctl names itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

RECORDED = Path(__file__).resolve().parent / "data" / "rabbitmqctl-3.10.json"

# steps before which the AMQP setup (queue q1 in ux, two messages) runs
SETUP_BEFORE = 2

SCRIPT: tuple[tuple[str, ...], ...] = (
    ("add_vhost", "ux"),
    ("set_permissions", "-p", "ux", "guest", ".*", ".*", ".*"),
    ("list_queues", "-p", "ux"),
    ("list_queues", "-p", "ux", "name", "messages", "consumers"),
    ("list_queues", "-p", "novhost"),
    ("list_exchanges", "-p", "ux"),
    ("list_bindings", "-p", "ux"),
    ("list_policies", "-p", "ux"),
    ("list_permissions", "-p", "ux"),
    ("list_consumers", "-p", "ux"),
    ("list_user_permissions", "nosuchuser"),
    ("set_policy", "-p", "ux", "p1", ".*", "notjson"),
    ("set_policy", "-p", "ux", "p1", "^q", '{"max-length":10}'),
    ("list_policies", "-p", "ux"),
    ("clear_policy", "-p", "ux", "p1"),
    ("clear_policy", "-p", "ux", "nosuch"),
    ("purge_queue", "-p", "ux", "q1"),
    ("purge_queue", "-p", "ux", "nosuch"),
    ("delete_queue", "-p", "ux", "nosuch"),
    ("delete_queue", "-p", "ux", "q1"),
    ("list_queues", "-p", "ux"),
    ("add_user", "ux-user", "pw"),
    ("set_user_tags", "ux-user", "management"),
    ("change_password", "ux-user", "pw2"),
    ("list_user_permissions", "ux-user"),
    ("set_permissions", "-p", "ux", "ux-user", "^a", "^b", "^c"),
    ("list_user_permissions", "ux-user"),
    ("clear_permissions", "-p", "ux", "ux-user"),
    ("clear_permissions", "-p", "ux", "ux-user"),
    ("set_user_tags", "ux-user"),
    ("delete_user", "ux-user"),
    ("add_user", "guest", "x"),
    ("delete_user", "nosuchuser"),
    ("change_password", "nosuchuser", "x"),
    ("set_user_tags", "nosuchuser", "administrator"),
    ("set_permissions", "-p", "novhost", "guest", ".*", ".*", ".*"),
    ("set_permissions", "-p", "ux", "nosuchuser", ".*", ".*", ".*"),
    ("clear_permissions", "-p", "ux", "nosuchuser"),
    ("close_connection", "nosuch", "bye"),
    ("add_vhost", "ux"),
    ("list_exchanges", "-p", "novhost"),
    ("list_bindings", "-p", "novhost"),
    ("list_policies", "-p", "novhost"),
    ("list_permissions", "-p", "novhost"),
    ("list_consumers", "-p", "novhost"),
    ("clear_permissions", "-p", "novhost", "guest"),
    ("purge_queue", "-p", "novhost", "q"),
    ("delete_queue", "-p", "novhost", "q"),
    ("clear_policy", "-p", "novhost", "p"),
    ("list_user_permissions", "guest"),
    ("delete_vhost", "novhost"),
    ("delete_vhost", "ux"),
)


def setup_queue(url: str) -> None:
    """Queue q1 in vhost ux with two messages, over AMQP."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("q1", durable=True)
    for _ in range(2):
        ch.basic_publish("", "q1", b"m")
    conn.close()


def record() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for i, step in enumerate(SCRIPT):
        if i == SETUP_BEFORE:
            setup_queue("amqp://guest:guest@127.0.0.1:5672/ux")
        done = subprocess.run(["rabbitmqctl", *step], capture_output=True, text=True, timeout=60)
        rows.append(
            {"args": list(step), "rc": done.returncode, "out": done.stdout, "err": done.stderr}
        )
    return rows


if __name__ == "__main__":
    version = subprocess.run(["rabbitmqctl", "version"], capture_output=True, text=True)
    table = {"rabbitmqctl": version.stdout.strip(), "steps": record()}
    RECORDED.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{len(table['steps'])} steps recorded in {RECORDED}", file=sys.stderr)
