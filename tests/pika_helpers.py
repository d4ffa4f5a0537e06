"""What several fault tests do with pika: a confirm-mode publisher that records
connection.blocked/unblocked, and emptying a queue with basic.get."""

from __future__ import annotations

import pika
from pika.adapters.blocking_connection import BlockingChannel


def watched_publisher(
    url: str,
) -> tuple[pika.BlockingConnection, BlockingChannel, list[bool]]:
    """A connection, its confirm-mode channel, and the blocked (True) and unblocked
    (False) notifications the broker sends it, in order."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    states: list[bool] = []
    conn.add_on_connection_blocked_callback(lambda *_: states.append(True))
    conn.add_on_connection_unblocked_callback(lambda *_: states.append(False))
    ch = conn.channel()
    ch.confirm_delivery()
    return conn, ch, states


def drain(url: str, queue: str, auto_ack: bool = True) -> list[bytes]:
    """Every body basic.get takes from ``queue``, in order, on a connection of its own
    (closed after: messages not acked go back to the queue)."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    bodies = []
    while True:
        method, _, body = ch.basic_get(queue, auto_ack=auto_ack)
        if method is None:
            break
        bodies.append(body)
    conn.close()
    return bodies
