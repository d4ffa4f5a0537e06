"""Incoming message interceptors from rabbitmq.conf (RabbitMQ 4.2+, deps/rabbit/src/
rabbit_msg_interceptor_timestamp.erl and rabbit_msg_interceptor_routing_node.erl).

Built once from the settings; a channel calls it per publish only when one is configured,
as RabbitMQ runs its configured interceptors on every incoming message.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable

from warren.config import Settings
from warren.protocol.properties import (
    FLAG_TIMESTAMP,
    has_flag,
    join_properties,
    read_properties,
    set_header,
    split_properties,
)

Interceptor = Callable[[bytes], bytes]


def node_name() -> str:
    """The node name shown in x-routed-by (and in the management API)."""
    return f"warren@{platform.node() or 'localhost'}"


def incoming(settings: Settings) -> Interceptor | None:
    """The properties rewrite for ``settings``' interceptors, None when none is set."""
    stamp = settings.interceptor_timestamp
    routed = settings.interceptor_routing_node
    if stamp is None and routed is None:
        return None
    node = node_name()

    def intercept(props: bytes) -> bytes:
        if stamp is not None:
            now_ms = int(time.time() * 1000)
            if stamp or "timestamp_in_ms" not in _headers(props):
                props = set_header(props, "timestamp_in_ms", now_ms)
            if stamp or not has_flag(props, FLAG_TIMESTAMP):
                fields = split_properties(props)
                fields["timestamp"] = (now_ms // 1000).to_bytes(8, "big")  # 0-9-1: seconds
                props = join_properties(fields)
        if routed is not None and (routed or "x-routed-by" not in _headers(props)):
            props = set_header(props, "x-routed-by", node)
        return props

    return intercept


def _headers(props: bytes) -> dict[str, object]:
    headers = read_properties(props).get("headers")
    return headers if isinstance(headers, dict) else {}
