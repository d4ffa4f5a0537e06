"""Prometheus metrics over HTTP: RabbitMQ's names where they share a meaning, warren_ others."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from pamqp import commands

from tests.amqp_raw import RawClient
from tests.http_api import HttpApi
from warren.broker.testkit import RunningBroker, run_broker

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (-?[0-9.]+(?:e[+-]?[0-9]+)?|NaN)$")


@pytest.fixture(scope="module")
def warren() -> Iterator[RunningBroker]:
    with run_broker(management_port=0, prometheus_port=0) as running:
        yield running


@pytest.fixture(scope="module")
def api(warren: RunningBroker) -> HttpApi:
    port = warren.server.management_port
    assert port
    return HttpApi(port)


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


def test_failed_logins_are_counted(warren: RunningBroker) -> None:
    before, _ = scrape(warren)
    params = pika.URLParameters(warren.url.replace("guest:guest", "guest:wrong"))
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(params)
    after, per_object = scrape(warren)[0], scrape(warren, "/metrics/per-object")[0]
    # one row per protocol on every endpoint (the table read as it is: rabbitmq_prometheus'
    # prometheus_rabbitmq_core_metrics_collector:get_data/4 has no summing clause for it)
    name = 'rabbitmq_auth_attempts_failed_total{protocol="amqp091"}'
    assert _delta(after, before, name) == 1
    assert name in per_object


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


# ---- RabbitMQ's own Grafana dashboard ----

DASHBOARD = Path(__file__).resolve().parent / "data" / "grafana" / "RabbitMQ-Overview.panels.json"
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and"}
PROMQL_WORDS |= {"or", "unless", "offset", "inf", "nan"}


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers that are not functions,
    keywords, label names (in {...}, by(...), on(...)), durations or $variables."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\$\{?\w+\}?", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", expr):
        name, call = match.group(1), match.group(2)
        if call or name in PROMQL_WORDS:
            continue
        names.add(name)
    return names


def test_promql_metric_names() -> None:
    expr = (
        "sum(rate(rabbitmq_global_messages_received_total[60s]) * on(instance, job) "
        'group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$c"})'
        " by(rabbitmq_node) / 1e3 > bool 0"
    )
    assert promql_metric_names(expr) == {
        "rabbitmq_global_messages_received_total",
        "rabbitmq_identity_info",
    }


def test_every_overview_dashboard_panel_has_its_metrics(warren: RunningBroker) -> None:
    """Each of the 41 panels of RabbitMQ-Overview (10991): every metric its PromQL reads
    is on /metrics (the endpoint the dashboard's Prometheus scrapes)."""
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert len(panels) == 41
    _, text = scrape(warren)
    exposed = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    # a histogram's samples: name_bucket, name_sum, name_count
    exposed |= {re.split(r"[{ ]", line)[0] for line in text.splitlines() if line[:1] != "#"}
    missing = {}
    for panel in panels:
        names = set().union(*(promql_metric_names(e) for e in panel["exprs"]))
        assert names, panel["title"]
        absent = sorted(n for n in names if n not in exposed)
        if absent:
            missing[panel["title"]] = absent
    assert missing == {}
    # the identity labels every panel joins on
    assert re.search(
        r'^rabbitmq_identity_info\{rabbitmq_node="[^"]+",rabbitmq_cluster="[^"]+",'
        r'rabbitmq_cluster_permanent_id="[^"]+",rabbitmq_endpoint="aggregated"\} 1$',
        text,
        re.MULTILINE,
    )


# Metric names the one-node dashboards query that Warren does not have, and why
# (every other name a panel reads must be on /metrics)
NOT_APPLICABLE = {
    "erlang_vm_": "the Erlang VM's own metrics: Warren runs on CPython, not on the BEAM",
    "perftest_": "the PerfTest load tool's metrics, scraped from the tool, not from the broker",
    "rabbitmq_global_stream_error_": "errors of the stream protocol (port 5552): Warren has none",
    "http_request_duration_microseconds": "the third-party rabbitmq-exporter's own metric",
    "scrape_duration_seconds": "Prometheus' own series, made for every target it scrapes",
    # RabbitMQ 4.3's prometheus_process_collector has only process_start_time_seconds
    "process_open_fds": "RabbitMQ 4.3 has no such family either (rabbitmq_process_open_fds)",
    "process_max_fds": "RabbitMQ 4.3 has no such family either (rabbitmq_process_max_fds)",
}
# label matchers naming a protocol Warren does not speak: the panel's series stay empty
NOT_APPLICABLE_SELECTORS = {'protocol="stream"': "the stream protocol (port 5552)"}
ONE_NODE_DASHBOARDS = (
    "Erlang-BEAM",
    "Erlang-Memory-Allocators",
    "RabbitMQ-Stream",
    "RabbitMQ-PerfTest",
    "rabbitmq-exporter_vs_rabbitmq-prometheus",
)


def _not_applicable(name: str) -> str | None:
    for prefix, reason in NOT_APPLICABLE.items():
        if name.startswith(prefix):
            return reason
    return None


@pytest.mark.parametrize("dashboard", ONE_NODE_DASHBOARDS)
def test_other_one_node_dashboards_have_their_metrics_or_a_reason(
    warren: RunningBroker, dashboard: str
) -> None:
    """RabbitMQ's other dashboards that could apply to one node (nested panels
    included): each name a panel reads is on /metrics or /metrics/per-object, or is listed
    above with the reason it cannot apply; a panel that filters on a protocol Warren does
    not speak is listed too. Overview's 41 panels are checked above."""
    path = DASHBOARD.parent / f"{dashboard}.panels.json"
    panels = json.loads(path.read_text())["panels"]
    assert panels
    exposed: set[str] = set()
    for endpoint in ("/metrics", "/metrics/per-object"):
        _, text = scrape(warren, endpoint)
        exposed |= {re.split(r"[{ ]", line)[0] for line in text.splitlines() if line[:1] != "#"}
        exposed |= {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    missing: dict[str, list[str]] = {}
    reasons: dict[str, set[str]] = {}
    for panel in panels:
        title = panel["title"] or f"panel {panel['id']}"
        for expr in panel["exprs"]:
            for selector, reason in NOT_APPLICABLE_SELECTORS.items():
                if selector in expr.replace(" ", ""):
                    reasons.setdefault(title, set()).add(reason)
            for name in promql_metric_names(expr):
                reason = _not_applicable(name)
                if reason is not None:
                    reasons.setdefault(title, set()).add(reason)
                elif name not in exposed:
                    missing.setdefault(title, []).append(name)
    assert missing == {}
    # every panel that cannot show Warren's data says why (the table above), and
    # each dashboard has such a reason or none of its panels needs one
    if dashboard in ("Erlang-BEAM", "RabbitMQ-Stream", "RabbitMQ-PerfTest"):
        assert reasons, dashboard


def _delta(after: dict[str, float], before: dict[str, float], name: str) -> float:
    return after[name] - before.get(name, 0)


def test_delivery_modes_churn_and_channel_counters(warren: RunningBroker) -> None:
    """The split RabbitMQ's Overview charts: consume/get x auto/manual ack, empty gets,
    publishes expecting confirms, and opened/closed/declared/created/deleted totals;
    a closed channel's counts stay in the node's totals."""
    before, _ = scrape(warren)
    conn = pika.BlockingConnection(pika.URLParameters(warren.url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("m.modes", durable=True)
        ch.queue_declare("m.modes", durable=True)  # declared twice, created once
        for _ in range(4):
            ch.basic_publish("", "m.modes", b"x")
        auto = conn.channel()
        auto.basic_get("m.modes", auto_ack=True)
        method, _, _ = ch.basic_get("m.modes")
        ch.basic_ack(method.delivery_tag)
        got: list[int] = []
        ch.basic_qos(prefetch_count=1)  # one delivery, then the auto-ack consumer's turn
        tag = ch.basic_consume("m.modes", lambda c, m, p, b: got.append(m.delivery_tag))
        while not got:
            conn.process_data_events(0.05)
        ch.basic_cancel(tag)
        ch.basic_ack(got[0])
        auto.basic_consume("m.modes", lambda c, m, p, b: got.append(0), auto_ack=True)
        while len(got) < 2:
            conn.process_data_events(0.05)
        empty = conn.channel()
        empty.queue_declare("m.empty", durable=True)
        assert empty.basic_get("m.empty") == (None, None, None)
        per_channel, _ = scrape(warren, "/metrics/per-object")
        auto.close()
        empty.queue_delete("m.empty")
        after, _ = scrape(warren)
    finally:
        conn.close()
    p = '{protocol="amqp091"}'
    for name, expected in (
        ("delivered_consume_auto_ack", 1),
        ("delivered_consume_manual_ack", 1),
        ("delivered_get_auto_ack", 1),
        ("delivered_get_manual_ack", 1),
        ("delivered", 4),
        ("get_empty", 1),
        ("received_confirm", 4),
        ("received", 4),
    ):
        assert _delta(after, before, f"rabbitmq_global_messages_{name}_total{p}") == expected, name
    for name, expected in (
        ("connections_opened", 1),
        ("channels_opened", 3),
        ("channels_closed", 1),
        ("queues_declared", 3),
        ("queues_created", 2),
        ("queues_deleted", 1),
    ):
        assert _delta(after, before, f"rabbitmq_{name}_total") == expected, name
    assert after["rabbitmq_global_publishers" + p] >= 1
    assert _delta(after, before, 'rabbitmq_auth_attempts_succeeded_total{protocol="amqp091"}') == 1
    assert _delta(after, before, 'rabbitmq_auth_attempts_total{protocol="amqp091"}') == 1
    # per channel: the publishing channel's counters, labelled as RabbitMQ labels channels
    published = {
        k: v
        for k, v in per_channel.items()
        if k.startswith("rabbitmq_channel_messages_published_total{channel=")
    }
    assert 4 in published.values()
    assert any(
        k.startswith("rabbitmq_channel_get_empty_total{") and v == 1 for k, v in per_channel.items()
    )
    received = [
        v
        for k, v in per_channel.items()
        if k.startswith("rabbitmq_connection_incoming_bytes_total{")
    ]
    assert received and max(received) > 4 * 9  # the frames of four 1-byte messages at least
    assert any(
        k.startswith("rabbitmq_connection_outgoing_packets_total{") and v > 0
        for k, v in per_channel.items()
    )
    for name in ("process_open_fds", "process_max_fds", "process_resident_memory_bytes"):
        assert after[f"rabbitmq_{name}"] > 0
    assert (
        after["rabbitmq_resident_memory_limit_bytes"]
        > after["rabbitmq_process_resident_memory_bytes"]
    )
    assert after["rabbitmq_disk_space_available_bytes"] > 0


def test_detailed_endpoint_takes_family_vhost_and_queue(
    warren: RunningBroker, api: HttpApi
) -> None:
    api.ok("PUT", "/api/vhosts/m-detail")
    permissions = {"configure": ".*", "write": ".*", "read": ".*"}
    api.ok("PUT", "/api/permissions/m-detail/guest", permissions)
    api.ok("PUT", "/api/queues/m-detail/d.one", {"durable": True})
    api.ok("PUT", "/api/queues/m-detail/d.two", {"durable": True})
    api.ok("PUT", "/api/queues/%2F/d.root", {"durable": True})
    samples, text = scrape(
        warren, "/metrics/detailed?family=queue_coarse_metrics&vhost=m-detail&queue=%5Ed%5C.o"
    )
    assert samples['rabbitmq_detailed_queue_messages_ready{vhost="m-detail",queue="d.one"}'] == 0
    assert not any("d.two" in k or "d.root" in k for k in samples)
    assert "rabbitmq_detailed_queue_consumers" not in text  # another family
    assert "rabbitmq_queue_messages_ready" not in text
    assert 'rabbitmq_endpoint="detailed"' in text
    assert 'rabbitmq_detailed_queue_info{vhost="m-detail",queue="d.one"' in text
    _, nothing = scrape(warren, "/metrics/detailed")
    assert [line for line in nothing.splitlines() if not line.startswith("#")] == [
        line for line in nothing.splitlines() if "_info{" in line
    ]
    with pytest.raises(urllib.error.HTTPError) as bad:
        scrape(warren, "/metrics/detailed?family=queue_coarse_metrics&queue=(")
    assert bad.value.code == 400


# HELP texts and types as RabbitMQ 4.x's plugin has them (rabbitmq-server:
# deps/rabbitmq_prometheus/src/collectors/prometheus_rabbitmq_core_metrics_collector.erl,
# deps/rabbit/src/rabbit_global_counters.erl, deps/rabbit/include/rabbit_global_counters.hrl)
RABBITMQ_FAMILIES = {
    "rabbitmq_build_info": ("untyped", "RabbitMQ & Erlang/OTP version info"),
    "rabbitmq_identity_info": ("untyped", "RabbitMQ node & cluster identity info"),
    "rabbitmq_connections_opened_total": ("counter", "Total number of connections opened"),
    "rabbitmq_queues_declared_total": ("counter", "Total number of queues declared"),
    "rabbitmq_process_resident_memory_bytes": ("gauge", "Memory used in bytes"),
    "rabbitmq_resident_memory_limit_bytes": ("gauge", "Memory high watermark in bytes"),
    "rabbitmq_disk_space_available_limit_bytes": (
        "gauge",
        "Free disk space low watermark in bytes",
    ),
    "rabbitmq_process_max_fds": ("gauge", "Open file descriptors limit"),
    "rabbitmq_channel_acks_uncommitted": (
        "gauge",
        "Message acknowledgements in a transaction not yet committed",
    ),
    "rabbitmq_channel_get_empty_total": (
        "counter",
        "Total number of times basic.get operations fetched no message",
    ),
    "rabbitmq_global_messages_delivered_get_auto_ack_total": (
        "counter",
        "Total number of messages delivered to consumers using basic.get with automatic "
        "acknowledgment",
    ),
    "rabbitmq_global_messages_received_confirm_total": (
        "counter",
        "Total number of messages received from publishers expecting confirmations",
    ),
    "rabbitmq_global_publishers": ("gauge", "Current number of publishers"),
    "rabbitmq_global_messages_dead_lettered_expired_total": (
        "counter",
        "Total number of messages dead-lettered due to message TTL exceeded",
    ),
    "rabbitmq_alarms_memory_used_watermark": (
        "untyped",
        "is 1 if VM memory watermark alarm is in effect",
    ),
    "rabbitmq_queue_messages_ready": ("gauge", "Messages ready to be delivered to consumers"),
}


def test_families_have_rabbitmqs_types_and_help(warren: RunningBroker) -> None:
    _, text = scrape(warren)
    for name, (kind, help_text) in RABBITMQ_FAMILIES.items():
        assert f"# TYPE {name} {kind}\n" in text, name
        assert f"# HELP {name} {help_text}\n" in text, name


def test_message_sizes_are_a_histogram_with_rabbitmqs_buckets(warren: RunningBroker) -> None:
    """rabbitmq_message_size_bytes as RabbitMQ 4.x exposes it (rabbit_msg_size_metrics.erl):
    buckets le=100 ... le=1e8 and +Inf, cumulative, by protocol; the dashboard's two size
    panels read its _bucket, _sum and _count."""
    before, _ = scrape(warren)
    conn = pika.BlockingConnection(pika.URLParameters(warren.url))
    ch = conn.channel()
    ch.confirm_delivery()
    for size in (0, 100, 101, 5_000, 200_000, 1_000, 1_024, 65_536):
        ch.basic_publish("", "nowhere", b"x" * size)
    conn.close()
    after, text = scrape(warren)
    assert "# TYPE rabbitmq_message_size_bytes histogram" in text
    name = 'rabbitmq_message_size_bytes_bucket{protocol="amqp091",le="%s"}'
    grew = {le: after[name % le] - before.get(name % le, 0) for le in
            ("100", "1000", "10000", "100000", "1000000", "+Inf")}  # fmt: skip
    assert grew == {"100": 2, "1000": 4, "10000": 6, "100000": 7, "1000000": 8, "+Inf": 8}
    count = 'rabbitmq_message_size_bytes_count{protocol="amqp091"}'
    total = 'rabbitmq_message_size_bytes_sum{protocol="amqp091"}'
    assert after[count] - before.get(count, 0) == 8
    assert (
        after[total] - before.get(total, 0) == 100 + 101 + 5_000 + 200_000 + 1_000 + 1_024 + 65_536
    )
