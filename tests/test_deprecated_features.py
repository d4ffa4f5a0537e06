"""RabbitMQ 4.3's deprecated features over real sockets, denied by default and permitted by
``deprecated_features.permit.<name>``.

RabbitMQ 3.10 on this machine has no deprecated features, so the reference is the 4.3
source (rabbitmq-server v4.3.5), cited next to each test. The reply texts are cut to
255 octets as 4.3 cuts them (rabbit_binary_generator:amqp_exception_explanation/2, io_lib
chars_limit 255: the text ends in "..."); the log line carries the whole text.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from pamqp import commands
from pika.exceptions import ConnectionClosedByBroker

from tests.amqp_raw import RawClient, build, frame_bytes, header_payload
from tests.http_api import HttpApi
from warren.broker.testkit import RunningBroker, run_broker
from warren.config import parse_config
from warren.protocol.constants import FRAME_HEADER

ROOT = Path(__file__).resolve().parent.parent
PERMIT_ALL = (
    ("transient_nonexcl_queues", True),
    ("global_qos", True),
    ("queue_master_locator", True),
    ("classic_queue_mirroring", True),
)

# rabbit_deprecated_features:generate_warnings1/3, denied_by_default, when_denied
TRANSIENT_DENIED = (
    "Feature `transient_nonexcl_queues` is deprecated.\n"
    "By default, this feature is not permitted anymore.\n"
    "The feature will be removed from a future major RabbitMQ version, regardless of the "
    "configuration; actual version to be determined.\n"
    "To continue using this feature when it is not permitted by default, set the following "
    "parameter in your configuration:\n"
    '    "deprecated_features.permit.transient_nonexcl_queues = true"'
)
# the same, when_permitted
TRANSIENT_PERMITTED = (
    "Feature `transient_nonexcl_queues` is deprecated.\n"
    "Its use is permitted per the configuration (overriding the default, which is not "
    "permitted):\n"
    '    "deprecated_features.permit.transient_nonexcl_queues = true"\n'
    "The feature will be removed from a future major RabbitMQ version, regardless of the "
    "configuration."
)
GLOBAL_QOS_DENIED = TRANSIENT_DENIED.replace("transient_nonexcl_queues", "global_qos")
LOCATOR_DENIED = TRANSIENT_DENIED.replace("transient_nonexcl_queues", "queue_master_locator")


def reply_text(detail: str) -> str:
    """``INTERNAL_ERROR - <detail>`` as 4.3 sends it: at most 255 characters."""
    text = f"INTERNAL_ERROR - {detail}"
    return text if len(text) <= 255 else text[:252] + "..."


@pytest.fixture(scope="module")
def default() -> Iterator[RunningBroker]:
    with run_broker(management_port=0) as running:
        yield running


@pytest.fixture(scope="module")
def permitted() -> Iterator[RunningBroker]:
    with run_broker(management_port=0, deprecated_features_permit=PERMIT_ALL) as running:
        yield running


def api(broker: RunningBroker) -> HttpApi:
    port = broker.server.management_port
    assert port
    return HttpApi(port)


def channel(broker: RunningBroker) -> pika.adapters.blocking_connection.BlockingChannel:
    return pika.BlockingConnection(pika.URLParameters(broker.url)).channel()


# ---- transient_nonexcl_queues ----


def test_transient_non_exclusive_queue_is_refused_with_541(
    default: RunningBroker, name: str
) -> None:
    # rabbit_amqqueue:declare/7 -> is_queue_args_combination_permitted/1 -> protocol_error
    # internal_error "~ts" with get_warning(transient_nonexcl_queues): a connection close
    ch = channel(default)
    with pytest.raises(ConnectionClosedByBroker) as caught:
        ch.queue_declare(name)
    assert caught.value.reply_code == 541
    assert caught.value.reply_text == reply_text(TRANSIENT_DENIED)
    assert name not in default.queues()


def test_checks_of_a_new_queue_in_4_3_order(name: str) -> None:
    """rabbit_amqqueue:declare/7: the arguments (406), then transient_nonexcl_queues (541),
    then the vhost's queue limit (rabbit_queue_type:check_queue_limits/1, 406), then
    queue_master_locator (rabbit_classic_queue:declare/2, 541)."""
    with run_broker() as broker:
        vhost = broker.server.broker.vhosts["/"]
        broker.call(lambda: vhost.limits.update({"max-queues": 0}))
        addr = (broker.host, broker.port)

        def declare(arguments: dict[str, object], durable: bool) -> tuple[int, str, int, int]:
            with RawClient.connect(addr) as client:
                method = commands.Queue.Declare(queue=name, durable=durable, arguments=arguments)
                client.send_method(1, method)
                _, close = client.read_method()
                assert isinstance(close, commands.Connection.Close | commands.Channel.Close)
                return (close.reply_code, close.reply_text, close.class_id, close.method_id)

        assert declare({"x-max-length": -1}, durable=False)[0] == 406  # invalid arg
        assert declare({}, durable=False)[:2] == (541, reply_text(TRANSIENT_DENIED))
        limit = "cannot declare queue '{}': queue limit in vhost '/' (0) is reached"
        locator = {"x-queue-master-locator": "min-masters"}
        assert declare(locator, durable=True)[:2] == (
            406,
            f"PRECONDITION_FAILED - {limit.format(name)}",
        )
        broker.call(lambda: vhost.limits.update({"max-queues": -1}))
        assert declare(locator, durable=True)[:2] == (541, reply_text(LOCATOR_DENIED))


def test_exclusive_durable_and_existing_queues_stay_allowed(
    default: RunningBroker, permitted: RunningBroker, name: str
) -> None:
    ch = channel(default)
    ch.queue_declare(f"{name}.excl", exclusive=True)  # transient but exclusive
    ch.queue_declare("", exclusive=True)  # server-named
    ch.queue_declare(f"{name}.durable", durable=True)
    ch.queue_declare(f"{name}.durable", durable=True, passive=True)
    ch.queue_delete(f"{name}.durable")
    ch.connection.close()


def test_transient_queue_is_declared_once_permitted(
    permitted: RunningBroker, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    permitted.server.broker.deprecated._logged.clear()  # logged once a day: make it now
    ch = channel(permitted)
    with caplog.at_level(logging.WARNING, logger="warren"):
        assert ch.queue_declare(name).method.queue == name
    # rabbit_deprecated_features:maybe_log_warning/2: a warning when permitted
    logged = [r for r in caplog.records if "Deprecated features" in r.getMessage()]
    assert logged and logged[0].levelno == logging.WARNING
    text = f"Deprecated features: `transient_nonexcl_queues`: {TRANSIENT_PERMITTED}"
    assert f"event={text!r}" in logged[0].getMessage()  # the test's KeyValueRenderer
    ch.queue_delete(name)
    ch.connection.close()


def test_management_api_refuses_a_transient_queue(default: RunningBroker, name: str) -> None:
    reply = api(default).request("PUT", f"/api/queues/%2F/{name}", {"durable": False})
    assert reply.status == 400
    assert "transient_nonexcl_queues" in reply.body["reason"]
    assert api(default).request("PUT", f"/api/queues/%2F/{name}", {"durable": True}).status == 201


# ---- global_qos ----


def _deliveries_with_global_qos(broker: RunningBroker, name: str) -> int:
    """Deliveries to two consumers under basic.qos(prefetch_count=1, global=true)."""
    ch = channel(broker)
    got: list[str] = []
    ch.basic_qos(prefetch_count=1, global_qos=True)
    for i in range(2):
        queue = f"{name}.{i}"
        ch.queue_declare(queue, durable=True)
        ch.basic_publish("", queue, b"m")
        ch.basic_consume(queue, lambda c, m, p, b: got.append(m.routing_key))
    ch.basic_publish("", f"{name}.0", b"m")  # a round trip: both consumers had their turn
    ch.connection.process_data_events(time_limit=0.3)
    for i in range(2):
        ch.queue_delete(f"{name}.{i}")
    ch.connection.close()
    return len(got)


def test_global_qos_is_applied_per_consumer_by_default(default: RunningBroker, name: str) -> None:
    # rabbit_channel:handle_method/3 basic.qos global=true: not permitted -> the same method
    # with global=false, basic.qos-ok and no error (the use is logged at error level)
    assert _deliveries_with_global_qos(default, name) == 2


def test_global_qos_is_shared_once_permitted(permitted: RunningBroker, name: str) -> None:
    assert _deliveries_with_global_qos(permitted, name) == 1


def test_a_consumer_qos_lifts_the_channel_limit(permitted: RunningBroker, name: str) -> None:
    """basic.qos(global=false) unlimits the channel's prefetch (rabbit_channel:handle_method/3
    calls rabbit_limiter:unlimit_prefetch/1, in 4.3 as in 3.10: the 3.10 on this machine
    delivers all three messages here too)."""
    ch = channel(permitted)
    ch.queue_declare(name, durable=True)
    for _ in range(3):
        ch.basic_publish("", name, b"m")
    ch.basic_qos(prefetch_count=1, global_qos=True)
    ch.basic_qos(prefetch_count=10, global_qos=False)
    got: list[bytes] = []
    ch.basic_consume(name, lambda c, m, p, b: got.append(b))
    deadline = time.monotonic() + 5
    while len(got) < 3 and time.monotonic() < deadline:
        ch.connection.process_data_events(time_limit=0.05)
    assert len(got) == 3
    ch.queue_delete(name)
    ch.connection.close()


def test_denied_global_qos_is_logged_as_an_error(
    default: RunningBroker, caplog: pytest.LogCaptureFixture
) -> None:
    default.server.broker.deprecated._logged.clear()
    ch = channel(default)
    with caplog.at_level(logging.WARNING, logger="warren"):
        ch.basic_qos(prefetch_count=10, global_qos=True)
    ch.connection.close()
    logged = [r for r in caplog.records if "`global_qos`" in r.getMessage()]
    assert logged[0].levelno == logging.ERROR
    text = f"Deprecated features: `global_qos`: {GLOBAL_QOS_DENIED}"
    assert f"event={text!r}" in logged[0].getMessage()


# ---- queue_master_locator ----


def test_queue_master_locator_argument_is_refused_with_541(
    default: RunningBroker, name: str
) -> None:
    # rabbit_classic_queue:validate_arguments/1 (from declare/2)
    ch = channel(default)
    with pytest.raises(ConnectionClosedByBroker) as caught:
        ch.queue_declare(name, durable=True, arguments={"x-queue-master-locator": "min-masters"})
    assert (caught.value.reply_code, caught.value.reply_text) == (541, reply_text(LOCATOR_DENIED))


def test_queue_master_locator_argument_once_permitted(permitted: RunningBroker, name: str) -> None:
    ch = channel(permitted)
    ch.queue_declare(name, durable=True, arguments={"x-queue-master-locator": "min-masters"})
    ch.queue_delete(name)
    ch.connection.close()


def test_queue_master_locator_policy_key(
    default: RunningBroker, permitted: RunningBroker, name: str
) -> None:
    # rabbit_classic_queue:validate_policy/1
    body = {"pattern": "^x$", "definition": {"queue-master-locator": "min-masters"}}
    reply = api(default).request("PUT", f"/api/policies/%2F/{name}", body)
    assert reply.status == 400
    assert reply.body["reason"] == (
        "Validation failed\n\nuse of deprecated queue-master-locator argument is not permitted\n"
    )
    assert api(permitted).request("PUT", f"/api/policies/%2F/{name}", body).status == 201
    bad = {"pattern": "^x$", "definition": {"queue-master-locator": "nearest"}}
    reply = api(permitted).request("PUT", f"/api/policies/%2F/{name}.bad", bad)
    assert (
        reply.body["reason"] == 'Validation failed\n\n<<"nearest">> is not a valid master locator\n'
    )


# ---- classic_queue_mirroring ----


def test_ha_policy_keys_are_not_recognised(
    default: RunningBroker, permitted: RunningBroker, name: str
) -> None:
    # removed in 4.x: no validator for ha-*, so rabbit_policy:validation0/2 lists them
    body = {"pattern": "^x$", "definition": {"ha-mode": "exactly", "ha-params": 2}}
    reply = api(default).request("PUT", f"/api/policies/%2F/{name}", body)
    assert reply.status == 400
    assert reply.body["reason"] == (
        'Validation failed\n\n[{<<"ha-mode">>,<<"exactly">>},{<<"ha-params">>,2}] are not '
        "recognised policy settings\n"
    )
    # 3.x allowance (docs/features.md "Where Warren differs"): accepted, no effect on one node
    assert api(permitted).request("PUT", f"/api/policies/%2F/{name}", body).status == 201


# ---- configuration, listing ----


def test_permit_keys_are_read_from_rabbitmq_conf() -> None:
    settings = parse_config(
        "deprecated_features.permit.transient_nonexcl_queues = true\n"
        "deprecated_features.permit.global_qos = false\n"
    )
    assert settings.deprecated_features_permit == (
        ("transient_nonexcl_queues", True),
        ("global_qos", False),
    )
    assert settings.ignored_keys == ()  # no more "config key not used by Warren"


def test_api_lists_deprecated_features_as_4_3(
    default: RunningBroker, permitted: RunningBroker, name: str
) -> None:
    # rabbit_depr_ff_extra:cli_info/1 via rabbit_mgmt_wm_deprecated_features
    listed = api(default).ok("GET", "/api/deprecated-features")
    assert [f["name"] for f in listed] == [
        "amqp_address_v1",
        "amqp_filter_set_bug",
        "classic_queue_mirroring",
        "global_qos",
        "management_metrics_collection",
        "queue_master_locator",
        "ram_node_type",
        "transient_nonexcl_queues",
    ]
    by_name = {f["name"]: f for f in listed}
    assert by_name["transient_nonexcl_queues"] == {
        "name": "transient_nonexcl_queues",
        "desc": "",
        "deprecation_phase": "denied_by_default",
        "doc_url": "https://blog.rabbitmq.com/posts/2021/08/4.0-deprecation-announcements/"
        "#removal-of-transient-non-exclusive-queues",
        "provided_by": "rabbit",
        "state": "denied",
    }
    assert by_name["management_metrics_collection"]["state"] == "permitted"
    assert by_name["classic_queue_mirroring"]["deprecation_phase"] == "removed"
    states = {f["name"]: f["state"] for f in api(permitted).ok("GET", "/api/deprecated-features")}
    assert states["transient_nonexcl_queues"] == states["global_qos"] == "permitted"
    assert api(default).ok("GET", "/api/deprecated-features/used") == []
    ch = channel(permitted)
    ch.queue_declare(name)
    used = api(permitted).ok("GET", "/api/deprecated-features/used")
    assert [f["name"] for f in used] == ["transient_nonexcl_queues"] and "state" not in used[0]
    ch.queue_delete(name)
    ch.connection.close()


def test_warrenctl_list_deprecated_features(default: RunningBroker) -> None:
    url = f"http://127.0.0.1:{default.server.management_port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RABBITMQ_CONFIG_FILE", None)
    ctl = [sys.executable, "-m", "warren.broker.tools.warrenctl", "--url", url]
    result = subprocess.run(
        [*ctl, "list_deprecated_features"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert "global_qos\tdenied_by_default\tdenied" in result.stdout.splitlines()


# ---- other 4.x defaults ----


def _header_only(broker: RunningBroker, body_size: int) -> tuple[int, str, int, int]:
    """basic.publish and a content header announcing body_size; no body is needed."""
    with RawClient.connect((broker.host, broker.port)) as client:
        client.send_method(1, build(commands.Basic.Publish, exchange="", routing_key="x"))
        client.send(frame_bytes(FRAME_HEADER, 1, header_payload(body_size)))
        return client.expect_channel_close(1)


def test_default_max_message_size_is_16_mib(default: RunningBroker) -> None:
    # rabbit_channel:check_msg_size/2; 4.x's default max_message_size is 16 MiB
    assert _header_only(default, 16 * 1024 * 1024 + 1) == (
        406,
        "PRECONDITION_FAILED - message size 16777217 is larger than configured max size 16777216",
        60,
        40,
    )


def test_max_message_size_at_the_ceiling_is_not_called_configured() -> None:
    # rabbit_channel:check_msg_size/2: ?MAX_MSG_SIZE (536870912) reads "max size"
    with run_broker(max_message_size=536870912) as broker:
        assert _header_only(broker, 536870913)[1] == (
            "PRECONDITION_FAILED - message size 536870913 is larger than max size 536870912"
        )


def test_only_classic_queue_version_2(default: RunningBroker, name: str) -> None:
    # rabbit_amqqueue:check_queue_version/2 (4.x): version 1 is gone
    with RawClient.connect((default.host, default.port)) as client:
        client.declare_queue(1, f"{name}.v2", arguments={"x-queue-version": 2})
        client.send_method(
            1,
            build(
                commands.Queue.Declare,
                queue=f"{name}.v1",
                durable=True,
                arguments={"x-queue-version": 1},
            ),
        )
        assert client.expect_channel_close(1) == (
            406,
            f"PRECONDITION_FAILED - invalid arg 'x-queue-version' for queue '{name}.v1' in "
            "vhost '/': \"unsupported queue version '1'\"",
            50,
            10,
        )
        client.channel_open(1)
        client.delete_queue(1, f"{name}.v2")


def _declared_type(broker: RunningBroker, vhost: str, queue: str, **flags: bool) -> str:
    params = pika.URLParameters(broker.url)
    params.virtual_host = vhost
    connection = pika.BlockingConnection(params)
    connection.channel().queue_declare(queue, **flags)
    queue_type = str(broker.server.broker.vhosts[vhost].queues[queue].queue_type)
    connection.close()
    return queue_type


def test_default_queue_type_from_the_config_key(name: str) -> None:
    # rabbit_amqqueue:augment_declare_args/5: the default applies where the type fits
    with run_broker(default_queue_type="quorum") as broker:
        assert _declared_type(broker, "/", f"{name}.d", durable=True) == "quorum"
        assert _declared_type(broker, "/", f"{name}.e", exclusive=True) == "classic"
        assert _declared_type(broker, "/", f"{name}.a", durable=True, auto_delete=True) == (
            "classic"
        )
    assert parse_config("default_queue_type = quorum").default_queue_type == "quorum"


def test_default_queue_type_of_a_vhost(default: RunningBroker, name: str) -> None:
    http = api(default)
    http.ok("PUT", f"/api/vhosts/{name}", {"default_queue_type": "quorum"})
    http.ok(
        "PUT", f"/api/permissions/{name}/guest", {"configure": ".*", "write": ".*", "read": ".*"}
    )
    assert http.ok("GET", f"/api/vhosts/{name}")["default_queue_type"] == "quorum"
    assert _declared_type(default, name, "q", durable=True) == "quorum"
    assert _declared_type(default, "/", f"{name}.q", durable=True) == "classic"
    exported = {v["name"]: v for v in http.ok("GET", "/api/definitions")["vhosts"]}
    assert exported[name]["metadata"]["default_queue_type"] == "quorum"
    http.ok("DELETE", f"/api/vhosts/{name}")


def test_quorum_queue_priorities_without_x_max_priority(default: RunningBroker, name: str) -> None:
    # rabbit_fifo:msg_priority/1 (min(P, 31), 4 without the property) and rabbit_fifo_pq
    # (strict, highest first, FIFO within a priority): 4.3 needs no x-max-priority
    ch = channel(default)
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    for body, priority in (("none", None), ("p0", 0), ("p5", 5), ("p40", 40), ("p31", 31)):
        ch.basic_publish("", name, body.encode(), pika.BasicProperties(priority=priority))
    got = []
    while (message := ch.basic_get(name, auto_ack=True))[0] is not None:
        got.append(message[2].decode())
    assert got == ["p40", "p31", "p5", "none", "p0"]
    ch.queue_delete(name)
    ch.connection.close()


def test_warren_server_reads_the_permit_keys(tmp_path: Path) -> None:
    """A fresh ``warren-server --config``: refuses by default, accepts with the keys."""
    for permit, expect_refusal in ((False, True), (True, False)):
        conf = tmp_path / "rabbitmq.conf"
        value = "true" if permit else "false"
        conf.write_text(f"deprecated_features.permit.transient_nonexcl_queues = {value}\n")
        port = _free_port()
        args = ["--config", str(conf), "--port", str(port), "--bind", "127.0.0.1"]
        args += ["--data-dir", str(tmp_path / "data"), "--management-port", "none"]
        server = subprocess.Popen(
            [sys.executable, "-m", "warren", *args, "--prometheus-port", "none"],
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        try:
            assert server.stderr is not None
            log = []
            for line in server.stderr:
                log.append(line)
                if "ready" in line:
                    break
            assert not any("not used" in line for line in log), log
            url = f"amqp://guest:guest@127.0.0.1:{port}/"
            ch = pika.BlockingConnection(pika.URLParameters(url)).channel()
            if expect_refusal:
                with pytest.raises(ConnectionClosedByBroker):
                    ch.queue_declare("transient")
            else:
                ch.queue_declare("transient")
                ch.connection.close()
        finally:
            server.terminate()
            server.wait(timeout=10)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(
    ("arg", "value"),
    [("x-max-priority", 10), ("x-queue-mode", "lazy"), ("x-queue-version", 2)],
)
def test_classic_arguments_on_a_quorum_queue_are_refused(
    default: RunningBroker, name: str, arg: str, value: object
) -> None:
    # rabbit_amqqueue:check_declare_arguments/3 -> check_arguments_key/4: an argument of
    # another queue type (rabbit_classic_queue:capabilities/0) is refused
    with RawClient.connect((default.host, default.port)) as client:
        arguments = {"x-queue-type": "quorum", arg: value}
        client.send_method(
            1, build(commands.Queue.Declare, queue=name, durable=True, arguments=arguments)
        )
        assert client.expect_channel_close(1) == (
            406,
            f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{name}' in vhost '/' of "
            "queue type rabbit_quorum_queue",
            50,
            10,
        )


def test_an_exclusive_queue_declared_durable_is_transient(
    default: RunningBroker, name: str
) -> None:
    """rabbit_channel handle_method queue.declare (v4.3.5): Durable = DurableDeclare andalso
    not ExclusiveDeclare; 3.10 does the same. A redeclare with durable=true still matches."""
    conn = pika.BlockingConnection(pika.URLParameters(default.url))
    ch = conn.channel()
    ch.queue_declare(name, durable=True, exclusive=True)
    ch.queue_declare(name, durable=True, exclusive=True)  # equivalent: the same coercion
    ch.queue_declare(name, durable=False, exclusive=True)
    assert api(default).ok("GET", f"/api/queues/%2F/{name}")["durable"] is False
    conn.close()
