"""RabbitMQ 4.3 writes ``x-queue-type`` into every queue it declares, and compares it on
redeclaration, as a client sees it: queue.declare-ok or 406, the arguments of
``GET /api/queues``, definitions, vhosts' ``default_queue_type``.

RabbitMQ 3.10 on this machine writes nothing (its rabbit_amqqueue:augment_declare_args/5
changes the arguments only under a vhost default), so the reference is the 4.3 source
(rabbitmq-server v4.3.5), cited next to each test:

- deps/rabbit/src/rabbit_channel.erl, handle_method/6 for queue.declare: every declare that
  is not passive goes through rabbit_amqqueue:augment_declare_args/5 before the equivalence
  check and before the queue is created;
- rabbit_amqqueue:augment_declare_args/5 and update_args_table_with_queue_type/5: without
  ``x-queue-type`` the vhost's default type (every 4.3 vhost has one, rabbit_vhost:do_add/3)
  is written where it fits the queue, else ``classic``;
- rabbit_amqqueue:assert_args_equivalence/2 checks the arguments of the existing queue's type
  (capabilities/0 queue_arguments, in that order); rabbit_misc:assert_field_equivalence/4
  lets a queue without ``x-queue-type`` (one from before 4.x) match ``classic``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands

from tests.amqp_raw import RawClient, build
from tests.http_api import HttpApi
from warren.broker.testkit import RunningBroker, run_broker
from warren.config import parse_config
from warren.protocol.tables import encode_table


@pytest.fixture(scope="module")
def broker() -> Iterator[RunningBroker]:
    with run_broker(management_port=0) as running:
        yield running


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    return f"qt.{request.node.name}"[:200]


def api(broker: RunningBroker) -> HttpApi:
    port = broker.server.management_port
    assert port
    return HttpApi(port)


def declare(
    broker: RunningBroker, queue: str, arguments: dict[str, Any] | None = None, **flags: bool
) -> tuple[Any, ...]:
    """queue.declare on a fresh connection: ("ok", queue name) or the channel.close fields."""
    with RawClient.connect((broker.host, broker.port)) as client:
        client.send_method(
            1, build(commands.Queue.Declare, queue=queue, arguments=arguments or {}, **flags)
        )
        _, frame = client.read_method()
        if isinstance(frame, commands.Queue.DeclareOk):
            return ("ok", frame.queue)
        assert isinstance(frame, commands.Channel.Close), frame
        return (frame.reply_code, frame.reply_text, frame.class_id, frame.method_id)


def inequivalent(queue: str, arg: str, detail: str) -> tuple[int, str, int, int]:
    return (
        406,
        f"PRECONDITION_FAILED - inequivalent arg '{arg}' for queue '{queue}' in vhost '/': "
        f"{detail}",
        50,
        10,
    )


def test_every_declared_queue_gets_its_type(broker: RunningBroker, name: str) -> None:
    http = api(broker)
    with RawClient.connect((broker.host, broker.port)) as client:
        for suffix, flags in (
            ("durable", {"durable": True}),
            ("auto-delete", {"durable": True, "auto_delete": True}),
            ("exclusive", {"exclusive": True}),
        ):
            client.declare_queue(1, f"{name}.{suffix}", **flags)
            shown = http.ok("GET", f"/api/queues/%2F/{name}.{suffix}")
            assert (shown["type"], shown["arguments"]) == ("classic", {"x-queue-type": "classic"})
        # an x-queue-type the client gives is kept as given
        client.declare_queue(
            1, f"{name}.quorum", durable=True, arguments={"x-queue-type": "quorum"}
        )
        assert http.ok("GET", f"/api/queues/%2F/{name}.quorum")["arguments"] == {
            "x-queue-type": "quorum"
        }
        # the management API declares through the same path (rabbit_mgmt_util:direct_request/6)
        http.ok("PUT", f"/api/queues/%2F/{name}.api", {"durable": True, "arguments": {"a": 1}})
        assert http.ok("GET", f"/api/queues/%2F/{name}.api")["arguments"] == {
            "a": 1,
            "x-queue-type": "classic",
        }
        exported = {q["name"]: q for q in http.ok("GET", "/api/definitions")["queues"]}
        # rabbit_definitions:queue_definition/1: the type, and the arguments as stored
        assert exported[f"{name}.durable"]["type"] == "classic"
        assert exported[f"{name}.durable"]["arguments"] == {"x-queue-type": "classic"}
        assert exported[f"{name}.quorum"]["type"] == "quorum"
        for suffix in ("durable", "auto-delete", "quorum", "api"):
            client.delete_queue(1, f"{name}.{suffix}")


def test_a_classic_queue_redeclared(broker: RunningBroker, name: str) -> None:
    assert declare(broker, name, durable=True) == ("ok", name)
    # augmented to classic: equal
    assert declare(broker, name, durable=True) == ("ok", name)
    assert declare(broker, name, {"x-queue-type": "classic"}, durable=True) == ("ok", name)
    # both carry the type: RabbitMQ names the two values (assert_args_equivalence1/4)
    assert declare(broker, name, {"x-queue-type": "quorum"}, durable=True) == inequivalent(
        name, "x-queue-type", "received 'quorum' but current is 'classic'"
    )
    # rabbit_classic_queue:capabilities/0 lists the leader locator, so it is compared
    assert declare(broker, name, {"x-queue-leader-locator": "balanced"}, durable=True) == (
        inequivalent(
            name,
            "x-queue-leader-locator",
            "received the value 'balanced' of type 'longstr' but current is none",
        )
    )
    api(broker).ok("DELETE", f"/api/queues/%2F/{name}")


def test_a_quorum_queue_redeclared_without_a_type_is_refused(
    broker: RunningBroker, name: str
) -> None:
    """The 4.x change that 3.x applications meet: the declare without x-queue-type is
    augmented to classic, which the quorum queue is not."""
    quorum = {"x-queue-type": "quorum"}
    assert declare(broker, name, quorum, durable=True) == ("ok", name)
    assert declare(broker, name, quorum, durable=True) == ("ok", name)
    assert declare(broker, name, durable=True) == inequivalent(
        name, "x-queue-type", "received 'classic' but current is 'quorum'"
    )
    api(broker).ok("DELETE", f"/api/queues/%2F/{name}")


def test_the_type_order_of_checks(broker: RunningBroker, name: str) -> None:
    """Two differing arguments: each type's capabilities/0 order decides which is named
    (classic: x-message-ttl before x-queue-type; quorum: x-queue-type before x-message-ttl)."""
    classic, quorum = f"{name}.c", f"{name}.q"
    assert declare(broker, classic, {"x-message-ttl": 1000}, durable=True) == ("ok", classic)
    got = declare(broker, classic, {"x-message-ttl": 2000, "x-queue-type": "quorum"}, durable=True)
    assert got == inequivalent(classic, "x-message-ttl", "received '2000' but current is '1000'")
    args = {"x-message-ttl": 1000, "x-queue-type": "quorum"}
    assert declare(broker, quorum, args, durable=True) == ("ok", quorum)
    got = declare(broker, quorum, {"x-message-ttl": 2000}, durable=True)
    assert got == inequivalent(quorum, "x-queue-type", "received 'classic' but current is 'quorum'")
    for queue in (classic, quorum):
        api(broker).ok("DELETE", f"/api/queues/%2F/{queue}")


def test_relaxed_checks_on_redeclaration(name: str) -> None:
    """quorum_queue.property_equivalence.relaxed_checks_on_redeclaration = true
    (rabbit_amqqueue:equivalence_check_level/2): a quorum queue redeclared as classic is
    compared on seven arguments only, its flags not at all."""
    settings = parse_config(
        "quorum_queue.property_equivalence.relaxed_checks_on_redeclaration = true"
    )
    assert settings.quorum_relaxed_checks_on_redeclaration is True
    with run_broker(quorum_relaxed_checks_on_redeclaration=True) as running:
        args = {"x-queue-type": "quorum", "x-message-ttl": 1000, "x-delivery-limit": 5}
        assert declare(running, name, args, durable=True) == ("ok", name)
        # x-delivery-limit is not among them, nor durable
        assert declare(running, name, {"x-message-ttl": 1000}, durable=True) == ("ok", name)
        transient = {"x-queue-type": "classic", "x-message-ttl": 1000}
        assert declare(running, name, transient) == ("ok", name)
        assert declare(running, name, {"x-message-ttl": 5}, durable=True) == inequivalent(
            name, "x-message-ttl", "received '5' but current is '1000'"
        )
        # another type than classic gets every check
        assert declare(running, name, {"x-queue-type": "stream"}, durable=True) == (
            inequivalent(name, "x-queue-type", "received 'stream' but current is 'quorum'")
        )


def test_server_named_queues_of_replicated_types_are_refused(broker: RunningBroker) -> None:
    # rabbit_channel queue.declare: rabbit_amqqueue:is_server_named_allowed/1
    for queue_type in ("quorum", "stream"):
        assert declare(broker, "", {"x-queue-type": queue_type}, durable=True) == (
            406,
            "PRECONDITION_FAILED - Cannot declare a server-named queue for type "
            f"rabbit_{queue_type}_queue",
            50,
            10,
        )
    assert declare(broker, "", exclusive=True)[0] == "ok"


def test_a_queue_from_an_older_data_dir(tmp_path: Path, name: str) -> None:
    """A durable queue stored without x-queue-type (an older Warren, as a 3.x RabbitMQ's
    records): 4.3 adds nothing on recovery, shows the arguments as stored, and takes it as
    classic on redeclaration (rabbit_misc:assert_field_equivalence/4)."""
    data = tmp_path / "data"
    with run_broker(data_dir=str(data)) as running:
        assert declare(running, name, {"x-max-length": 5}, durable=True) == ("ok", name)
    db = sqlite3.connect(data / "definitions.sqlite3")
    with db:
        db.execute(
            "UPDATE queues SET arguments = ? WHERE name = ?",
            (encode_table({"x-max-length": 5}), name),
        )
    db.close()
    with run_broker(data_dir=str(data), management_port=0) as running:
        shown = api(running).ok("GET", f"/api/queues/%2F/{name}")
        assert (shown["type"], shown["arguments"]) == ("classic", {"x-max-length": 5})
        assert declare(running, name, {"x-max-length": 5}, durable=True) == ("ok", name)
        args = {"x-max-length": 5, "x-queue-type": "classic"}
        assert declare(running, name, args, durable=True) == ("ok", name)
        args["x-queue-type"] = "quorum"
        assert declare(running, name, args, durable=True) == inequivalent(
            name,
            "x-queue-type",
            "received the value 'quorum' of type 'longstr' but current is none",
        )
        # the stored arguments are not rewritten by a redeclaration
        assert api(running).ok("GET", f"/api/queues/%2F/{name}")["arguments"] == {"x-max-length": 5}


def test_vhost_default_queue_type(broker: RunningBroker, name: str) -> None:
    http = api(broker)
    # every 4.3 vhost has one: the node's default unless it was given (rabbit_vhost:do_add/3);
    # rabbit_queue_type:vhosts_with_dqt/1 shows it at the top and in the metadata
    shown = http.ok("GET", "/api/vhosts/%2F")
    assert shown["default_queue_type"] == shown["metadata"]["default_queue_type"] == "classic"
    listed = {v["name"]: v for v in http.ok("GET", "/api/vhosts")}
    assert listed["/"]["metadata"]["default_queue_type"] == "classic"
    # rabbit_queue_type:validate_default_queue_type/1
    for value, reason in (
        ("", "default_queue_type must not be an empty string"),
        ("nope", "nope is not a valid queue type"),
        (5, "5 is not a valid default_queue_type value"),
    ):
        got = http.request("PUT", f"/api/vhosts/{name}", {"default_queue_type": value})
        assert (got.status, got.body) == (400, {"error": "bad_request", "reason": reason})
    assert name not in {v["name"] for v in http.ok("GET", "/api/vhosts")}
    http.ok("PUT", f"/api/vhosts/{name}", {"default_queue_type": "quorum"})
    # an update without one keeps it (rabbit_db_vhost:merge_metadata/2)
    http.ok("PUT", f"/api/vhosts/{name}", {"description": "d"})
    assert http.ok("GET", f"/api/vhosts/{name}")["default_queue_type"] == "quorum"
    exported = {v["name"]: v for v in http.ok("GET", "/api/definitions")["vhosts"]}
    assert exported[name]["metadata"]["default_queue_type"] == "quorum"
    assert exported["/"]["metadata"]["default_queue_type"] == "classic"
    single = http.ok("GET", f"/api/definitions/{name}")
    assert single["metadata"]["default_queue_type"] == "quorum"
    http.ok("PUT", f"/api/vhosts/{name}", {"defaultqueuetype": "stream"})  # 3.11's name
    assert http.ok("GET", f"/api/vhosts/{name}")["default_queue_type"] == "stream"
    http.ok("DELETE", f"/api/vhosts/{name}")


def test_a_stream_default(name: str) -> None:
    """default_queue_type = stream: durable queues become streams, others classic."""
    assert parse_config("default_queue_type = stream").default_queue_type == "stream"
    with run_broker(default_queue_type="stream", management_port=0) as running:
        assert declare(running, name, durable=True) == ("ok", name)
        assert declare(running, f"{name}.x", exclusive=True) == ("ok", f"{name}.x")
        http = api(running)
        assert http.ok("GET", f"/api/queues/%2F/{name}")["arguments"] == {"x-queue-type": "stream"}
        assert http.ok("GET", "/api/vhosts/%2F")["default_queue_type"] == "stream"


@pytest.mark.parametrize(
    ("queue_type", "arg", "value"),
    [
        ("classic", "x-max-age", "1D"),
        ("classic", "x-dead-letter-strategy", "at-least-once"),
        ("classic", "x-max-in-memory-length", 5),
        ("classic", "x-quorum-initial-group-size", 3),
        ("quorum", "x-max-age", "1D"),
        ("quorum", "x-stream-max-segment-size-bytes", 1000),
    ],
)
def test_arguments_of_other_queue_types_are_refused(
    broker: RunningBroker, name: str, queue_type: str, arg: str, value: object
) -> None:
    """rabbit_amqqueue:check_declare_arguments/3 -> check_arguments_key/4: any queue type's
    argument that is not the declared type's own. The classic texts are also what the
    RabbitMQ 3.10 on this machine answers."""
    arguments = (
        {arg: value} if queue_type == "classic" else {"x-queue-type": queue_type, arg: value}
    )
    assert declare(broker, name, arguments, durable=True) == (
        406,
        f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{name}' in vhost '/' of queue "
        f"type rabbit_{queue_type}_queue",
        50,
        10,
    )


def test_a_vhost_keeps_its_type_across_restarts(tmp_path: Path, name: str) -> None:
    """4.3 stores the type in the vhost's metadata: the one given, else the node's at creation
    (rabbit_vhost:do_add/3), so a later default_queue_type in rabbitmq.conf changes no
    existing vhost; a vhost stored without one (an older data directory) gets the node's at
    recovery (rabbit_vhost:recover/1)."""
    data = str(tmp_path / "data")
    with run_broker(data_dir=data, management_port=0) as running:
        api(running).ok("PUT", f"/api/vhosts/{name}", {"default_queue_type": "quorum"})
    with run_broker(data_dir=data, management_port=0, default_queue_type="stream") as running:
        http = api(running)
        assert http.ok("GET", f"/api/vhosts/{name}")["default_queue_type"] == "quorum"
        assert http.ok("GET", "/api/vhosts/%2F")["default_queue_type"] == "classic"
    db = sqlite3.connect(tmp_path / "data" / "definitions.sqlite3")
    with db:
        db.execute("DELETE FROM vhost_queue_types")  # as an older Warren stored them
    db.close()
    with run_broker(data_dir=data, management_port=0, default_queue_type="stream") as running:
        assert api(running).ok("GET", "/api/vhosts/%2F")["default_queue_type"] == "stream"
    with run_broker(data_dir=data, management_port=0) as running:
        assert api(running).ok("GET", "/api/vhosts/%2F")["default_queue_type"] == "stream"


@pytest.mark.parametrize("sent", ["", "undefined"], ids=["empty", "undefined"])
def test_empty_or_undefined_queue_type_takes_the_vhost_default(name: str, sent: str) -> None:
    """rabbit_amqqueue:get_queue_type/2 (4.3.5): x-queue-type "" or "undefined" is the
    vhost's default type (check_declare_arguments/3 validates with it injected), through pika."""
    import pika

    with run_broker(default_queue_type="quorum", management_port=0) as running:
        conn = pika.BlockingConnection(pika.ConnectionParameters(running.host, running.port))
        try:
            ch = conn.channel()
            ok = ch.queue_declare(name, durable=True, arguments={"x-queue-type": sent})
            assert ok.method.queue == name
        finally:
            conn.close()
        shown = api(running).ok("GET", f"/api/queues/%2F/{name}")
        assert shown["type"] == "quorum"
