"""Prometheus metrics over HTTP: RabbitMQ's names where they share a meaning, warren_ others."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from collections.abc import Iterator

import pika
import pytest
from pamqp import commands

from tests.amqp_raw import RawClient
from tests.http_api import HttpApi
from warren.broker.testkit import RunningBroker, run_broker

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (-?[0-9.e+]+)$")


@pytest.fixture(scope="module")
def warren() -> Iterator[RunningBroker]:
    with run_broker(management_port=0, prometheus_port=0) as running:
        yield running


def scrape(warren: RunningBroker, path: str = "/metrics") -> tuple[dict[str, float], str]:
    port = warren.server.prometheus_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
        assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        text = resp.read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        match = SAMPLE.match(line)
        assert match, f"not Prometheus text format: {line!r}"
        samples[match.group(1) + (match.group(2) or "")] = float(match.group(4))
    return samples, text


def test_every_family_has_help_and_type(warren: RunningBroker) -> None:
    _, text = scrape(warren)
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
    for name in names:
        assert f"# HELP {name} " in text
    for required in (
        "rabbitmq_queue_messages_ready",
        "rabbitmq_queue_messages_unacked",
        "rabbitmq_queue_messages",
        "rabbitmq_queue_consumers",
        "rabbitmq_connections",
        "rabbitmq_channels",
        "rabbitmq_consumers",
        "rabbitmq_queues",
        "rabbitmq_global_messages_received_total",
        "rabbitmq_global_messages_routed_total",
        "rabbitmq_global_messages_delivered_total",
        "rabbitmq_global_messages_acknowledged_total",
        "rabbitmq_global_messages_confirmed_total",
        "rabbitmq_global_messages_redelivered_total",
        "rabbitmq_global_messages_unroutable_dropped_total",
        "rabbitmq_global_messages_unroutable_returned_total",
        "rabbitmq_global_messages_dead_lettered_expired_total",
        "rabbitmq_global_messages_dead_lettered_rejected_total",
        "rabbitmq_global_messages_dead_lettered_maxlen_total",
        "rabbitmq_global_messages_dead_lettered_delivery_limit_total",
        "rabbitmq_identity_info",
        "warren_consumer_timeouts_total",
        "warren_messages_retried_total",
        "warren_messages_expired_total",
        "warren_messages_dead_lettered_total",
        "warren_queue_messages_delayed",
    ):
        assert required in names, required


def test_counts_follow_traffic(warren: RunningBroker) -> None:
    before, _ = scrape(warren)
    conn = pika.BlockingConnection(pika.URLParameters(warren.url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("m.work", durable=True)
        for _ in range(3):
            ch.basic_publish("", "m.work", b"x")
        ch.basic_publish("amq.direct", "nowhere", b"x")
        method, _, _ = ch.basic_get("m.work")
        assert method is not None
        ch.basic_ack(method.delivery_tag)
        ch.basic_get("m.work")  # left unacked
        after, _ = scrape(warren)
        total = '{protocol="amqp091"}'
        assert (
            after[f"rabbitmq_global_messages_received_total{total}"]
            - before[f"rabbitmq_global_messages_received_total{total}"]
            == 4
        )
        assert (
            after[f"rabbitmq_global_messages_routed_total{total}"]
            - before[f"rabbitmq_global_messages_routed_total{total}"]
            == 3
        )
        assert (
            after[f"rabbitmq_global_messages_unroutable_dropped_total{total}"]
            - before[f"rabbitmq_global_messages_unroutable_dropped_total{total}"]
            == 1
        )
        assert (
            after[f"rabbitmq_global_messages_confirmed_total{total}"]
            - before[f"rabbitmq_global_messages_confirmed_total{total}"]
            == 4
        )
        assert (
            after[f"rabbitmq_global_messages_delivered_total{total}"]
            - before[f"rabbitmq_global_messages_delivered_total{total}"]
            == 2
        )
        assert (
            after[f"rabbitmq_global_messages_acknowledged_total{total}"]
            - before[f"rabbitmq_global_messages_acknowledged_total{total}"]
            == 1
        )
        assert after["rabbitmq_connections"] >= 1 and after["rabbitmq_channels"] >= 1
        per_object, _ = scrape(warren, "/metrics/per-object")
        labels = '{vhost="/",queue="m.work"}'
        assert per_object[f"rabbitmq_queue_messages_ready{labels}"] == 1
        assert per_object[f"rabbitmq_queue_messages_unacked{labels}"] == 1
        assert per_object[f"rabbitmq_queue_messages{labels}"] == 2
        assert per_object[f"rabbitmq_queue_messages_published_total{labels}"] == 3
        assert per_object[f"rabbitmq_queue_consumers{labels}"] == 0
        channel = [k for k in per_object if k.startswith("rabbitmq_channel_messages_unacked{")]
        assert channel and per_object[channel[0]] == 1
        assert "rabbitmq_queue_messages_ready{" not in scrape(warren)[1]  # aggregated there
    finally:
        conn.close()


def test_dead_letters_expiry_and_retries_by_reason(warren: RunningBroker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(warren.url))
    try:
        ch = conn.channel()
        ch.queue_declare("m.dlq", durable=True)
        ch.queue_declare(
            "m.ttl",
            arguments={
                "x-message-ttl": 0,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": "m.dlq",
            },
            durable=True,
        )
        ch.queue_declare(
            "m.reject",
            arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "m.dlq"},
            durable=True,
        )
        ch.queue_declare(
            "m.retry",
            arguments={"x-delayed-retry-type": "all", "x-delayed-retry-min": 60000},
            durable=True,
        )
        ch.basic_publish("", "m.ttl", b"x")
        ch.basic_publish("", "m.reject", b"x")
        ch.basic_publish("", "m.retry", b"x")
        method, _, _ = ch.basic_get("m.reject")
        ch.basic_reject(method.delivery_tag, requeue=False)
        method, _, _ = ch.basic_get("m.retry")
        ch.basic_nack(method.delivery_tag, requeue=True)
        ch.basic_qos(prefetch_count=1)  # a round trip: the broker has handled the above
        samples, _ = scrape(warren)
        classic = '{queue_type="rabbit_classic_queue",dead_letter_strategy="at_most_once"}'
        assert samples[f"rabbitmq_global_messages_dead_lettered_expired_total{classic}"] >= 1
        assert samples[f"rabbitmq_global_messages_dead_lettered_rejected_total{classic}"] >= 1
        assert samples['warren_messages_dead_lettered_total{reason="rejected"}'] >= 1
        assert samples["warren_messages_expired_total"] >= 1
        assert samples["warren_messages_retried_total"] >= 1
        assert samples["warren_queue_messages_delayed"] >= 1
        per_object, _ = scrape(warren, "/metrics/per-object")
        assert (
            per_object[
                'warren_queue_messages_dead_lettered_total{vhost="/",queue="m.reject",reason="rejected"}'
            ]
            == 1
        )
        assert per_object['warren_queue_messages_delayed{vhost="/",queue="m.retry"}'] == 1
        # deleting the queues does not take their counts away from the global counters
        for name in ("m.ttl", "m.reject", "m.retry"):
            ch.queue_delete(name)
        after, _ = scrape(warren)
        assert after["warren_messages_expired_total"] >= samples["warren_messages_expired_total"]
        assert after['warren_messages_dead_lettered_total{reason="rejected"}'] >= 1
        warren.call(warren.server.management.rates.sample)
        later, _ = scrape(warren)
        assert later["warren_messages_retried_total"] == samples["warren_messages_retried_total"]
        assert later["warren_messages_expired_total"] == samples["warren_messages_expired_total"]
    finally:
        conn.close()


def test_consumer_timeouts_counted(warren: RunningBroker) -> None:
    with RawClient.connect((warren.host, warren.port)) as client:
        client.declare_queue(1, "m.slow", durable=True, arguments={"x-queue-type": "quorum"})
        client.publish(1, b"slow", routing_key="m.slow")
        client.consume(1, "m.slow", "slow", arguments={"x-consumer-timeout": 50})
        client.read_delivery(1)
        client.expect_method(commands.Basic.Cancel, 1, 5)
        samples, _ = scrape(warren)
        assert samples["warren_consumer_timeouts_total"] >= 1
        per_object, _ = scrape(warren, "/metrics/per-object")
        labels = '{vhost="/",queue="m.slow"}'
        assert per_object[f"warren_queue_consumer_timeouts_total{labels}"] == 1
        assert per_object[f"warren_queue_consumers_timed_out{labels}"] == 1


def test_other_paths_are_404(warren: RunningBroker) -> None:
    port = warren.server.prometheus_port
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/nothing", timeout=5)
    assert missing.value.code == 404


def test_metrics_port_without_management_and_off_by_default() -> None:
    with run_broker(prometheus_port=0) as running:
        assert running.server.management_port is None
        samples, _ = scrape(running)
        assert samples["rabbitmq_queues"] == 0
    with run_broker() as running:
        assert running.server.prometheus_port is None
        assert running.management_url is None


def test_management_and_metrics_ports_are_released_on_stop() -> None:
    with run_broker(management_port=0, prometheus_port=0) as running:
        port = running.server.management_port
        assert port
        assert HttpApi(port).ok("GET", "/api/whoami")["name"] == "guest"
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/api/overview", timeout=2)
