"""Message interceptors from rabbitmq.conf (RabbitMQ 4.2+), seen by pika.

RabbitMQ 4.3.5: deps/rabbit/priv/schema/rabbit.schema (the message_interceptors mapping and
translation), deps/rabbit/src/rabbit_msg_interceptor_timestamp.erl intercept/4 (header
timestamp_in_ms and the timestamp property, both from the receive time; overwrite=false
keeps what the publisher set) and rabbit_msg_interceptor_routing_node.erl intercept/4
(header x-routed-by, the node's name)."""

from __future__ import annotations

import time
from typing import Any

import pika
import pytest

from warren.broker.testkit import run_broker
from warren.config import ConfigError, parse_config


def round_trip(properties: pika.BasicProperties, **settings: Any) -> pika.BasicProperties:
    with run_broker(**settings) as running:
        conn = pika.BlockingConnection(pika.ConnectionParameters(running.host, running.port))
        try:
            ch = conn.channel()
            queue = ch.queue_declare("", exclusive=True).method.queue
            ch.basic_publish("", queue, b"m", properties)
            for _ in range(100):
                _, props, body = ch.basic_get(queue, auto_ack=True)
                if body is not None:
                    return props
                conn.process_data_events(time_limit=0.05)
            raise AssertionError("message not delivered")
        finally:
            conn.close()


def test_config_keys_parse_and_validate() -> None:
    parsed = parse_config(
        "message_interceptors.incoming.set_header_timestamp.overwrite = true\n"
        "message_interceptors.incoming.set_header_routing_node.overwrite = false\n"
    )
    assert (parsed.interceptor_timestamp, parsed.interceptor_routing_node) == (True, False)
    with pytest.raises(ConfigError):
        parse_config("message_interceptors.incoming.set_header_timestamp.overwrite = maybe\n")


def test_set_header_timestamp_overwrites() -> None:
    before = int(time.time() * 1000)
    props = round_trip(
        pika.BasicProperties(timestamp=1, headers={"timestamp_in_ms": 5}),
        interceptor_timestamp=True,
    )
    assert props.headers is not None
    stamped = props.headers["timestamp_in_ms"]
    assert before <= stamped <= int(time.time() * 1000)
    assert props.timestamp == stamped // 1000  # the property is in seconds in AMQP 0-9-1


def test_set_header_timestamp_without_overwrite_keeps_the_publishers() -> None:
    props = round_trip(
        pika.BasicProperties(timestamp=1, headers={"timestamp_in_ms": 5}),
        interceptor_timestamp=False,
    )
    assert props.headers is not None and props.headers["timestamp_in_ms"] == 5
    assert props.timestamp == 1
    fresh = round_trip(pika.BasicProperties(), interceptor_timestamp=False)
    assert fresh.timestamp is not None and fresh.headers is not None
    assert fresh.headers["timestamp_in_ms"] // 1000 == fresh.timestamp


def test_set_header_routing_node() -> None:
    from warren.broker.engine.interceptors import node_name

    props = round_trip(pika.BasicProperties(), interceptor_routing_node=True)
    assert props.headers == {"x-routed-by": node_name()}
    kept = round_trip(
        pika.BasicProperties(headers={"x-routed-by": "elsewhere"}),
        interceptor_routing_node=False,
    )
    assert kept.headers == {"x-routed-by": "elsewhere"}


def test_no_interceptor_by_default() -> None:
    props = round_trip(pika.BasicProperties())
    assert props.headers is None and props.timestamp is None
