"""warrenctl as a subprocess against a live broker: rabbitmqctl's verbs, output and exit codes."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.http_api import HttpApi
from warren.broker.testkit import RunningBroker, run_broker

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def warren() -> Iterator[RunningBroker]:
    with run_broker(management_port=0) as running:
        yield running


@pytest.fixture(scope="module")
def api(warren: RunningBroker) -> HttpApi:
    port = warren.server.management_port
    assert port
    return HttpApi(port)


def ctl(
    warren: RunningBroker | None,
    *args: str,
    stdin: str | None = None,
    url: str | None = None,
) -> subprocess.CompletedProcess[str]:
    if url is None:
        assert warren is not None
        url = f"http://127.0.0.1:{warren.server.management_port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RABBITMQ_CONFIG_FILE", None)
    return subprocess.run(
        [sys.executable, "-m", "warren.broker.tools.warrenctl", "--url", url, *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=30,
        env=env,
    )


def ok(warren: RunningBroker, *args: str, stdin: str | None = None) -> str:
    result = ctl(warren, *args, stdin=stdin)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result.stdout


def rows(output: str) -> list[list[str]]:
    """Table output without the informational "Listing ..." line."""
    return [line.split("\t") for line in output.splitlines() if not line.endswith("...")]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---- errors ----


def test_unreachable_broker_names_the_address_and_is_69() -> None:
    port = free_port()
    result = ctl(None, "list_queues", url=f"http://127.0.0.1:{port}")
    assert result.returncode == 69
    assert result.stderr.count("\n") == 2
    assert result.stderr.startswith(
        f"Error:\nunable to reach Warren at http://127.0.0.1:{port} (--url): "
    )


def test_bad_credentials_are_77(warren: RunningBroker) -> None:
    url = f"http://guest:wrong@127.0.0.1:{warren.server.management_port}"
    result = ctl(None, "list_queues", url=url)
    assert (result.returncode, result.stderr) == (
        77,
        f"Error:\nnot authorised by http://127.0.0.1:{warren.server.management_port} (--url): "
        "Login failed\n",
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["list_foo"], "argument command: invalid choice: 'list_foo'"),
        (["add_user"], "the following arguments are required: username"),
        (["set_policy", "--apply-to", "nothing", "p", "^x", "{}"], "argument --apply-to"),
        (["list_queues", "nosuchcolumn"], "Info key(s) nosuchcolumn are not supported"),
    ],
)
def test_bad_arguments_are_64(
    warren: RunningBroker, api: HttpApi, args: list[str], message: str
) -> None:
    api.ok("PUT", "/api/queues/%2F/ctl-columns", {"durable": True})
    result = ctl(warren, *args)
    assert result.returncode == 64, result.stderr
    assert result.stderr.count("\n") == 1
    assert message in result.stderr


def test_refused_policy_is_69(warren: RunningBroker, api: HttpApi) -> None:
    """rabbitmqctl set_policy exits 69 when the node refuses the definition, for an unknown
    key and for an ill-typed one alike (checked with RabbitMQ 3.10's rabbitmqctl)."""
    result = ctl(warren, "set_policy", "bad", "^x", '{"no-such-key": 1}')
    assert result.returncode == 69
    assert result.stderr == "Error:\nValidation failed\n\nunknown policy key 'no-such-key'\n\n"
    result = ctl(warren, "set_policy", "bad", "^x", '{"max-length": "x"}')
    assert result.returncode == 69
    assert result.stderr.startswith("Error:\nValidation failed\n")
    assert api.get("/api/policies/%2F/bad").status == 404  # nothing was set


def test_add_user_reads_the_password_from_stdin(warren: RunningBroker, api: HttpApi) -> None:
    """rabbitmqctl add_user without a password reads one line of standard input; with
    none there it exits 65 (EX_DATAERR)."""
    result = ctl(warren, "add_user", "ctl-nopass", stdin="")
    assert result.returncode == 65
    assert result.stderr == "Error:\nPassword is not provided via argument or stdin\n"
    assert api.get("/api/users/ctl-nopass").status == 404
    ok(warren, "add_user", "ctl-stdin", stdin="s3cret\n")
    ok(warren, "set_user_tags", "ctl-stdin", "management")  # to ask the API who it is
    check = api.as_user("ctl-stdin", "s3cret").request("GET", "/api/whoami")
    assert check.status == 200 and check.body["name"] == "ctl-stdin"
    ok(warren, "delete_user", "ctl-stdin")


def test_import_of_a_missing_file_is_65(warren: RunningBroker, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.json"
    result = ctl(warren, "import_definitions", str(missing))
    assert result.returncode == 65
    assert result.stderr == (
        f"Error (argument validation): Bad argument: File {missing} does not exist\n"
    )
    assert result.stdout == ""


# ---- status ----


def test_ping_and_status(warren: RunningBroker) -> None:
    assert ok(warren, "ping").splitlines()[-1] == "Ping succeeded"
    status = ok(warren, "status")
    assert status.startswith("Status of node warren@")
    assert f"Broker: http://127.0.0.1:{warren.server.management_port} (--url)" in status
    # rabbitmqctl status's sections, those that apply
    lines = status.splitlines()
    for section in ("Runtime", "Alarms", "Memory", "Free Disk Space", "Totals", "Listeners"):
        assert section in lines
    assert lines[lines.index("Alarms") + 2] == "(none)"
    assert "Is under maintenance?: false" in lines
    assert "Calculation strategy: rss" in lines
    assert any(re.fullmatch(r"Total memory used: \d+\.\d{4} gb", line) for line in lines)
    assert any(re.fullmatch(r"Virtual host count: \d+", line) for line in lines)
    assert (
        f"Interface: 127.0.0.1, port: {warren.port}, protocol: amqp, purpose: AMQP 0-9-1" in lines
    )
    document = json.loads(ok(warren, "--formatter", "json", "status"))
    assert document["product_name"] == "Warren"
    assert document["alarms"] == []


def test_default_url_comes_from_the_config(warren: RunningBroker, tmp_path: Path) -> None:
    conf = tmp_path / "rabbitmq.conf"
    conf.write_text(
        f"management.tcp.port = {warren.server.management_port}\n"
        "management.tcp.ip = 127.0.0.1\n"
        "default_user = guest\ndefault_pass = guest\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "warren.broker.tools.warrenctl", "--config", str(conf), "ping"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert "Ping succeeded" in result.stdout


def test_finds_a_running_server_through_its_data_dir(tmp_path: Path) -> None:
    """A port chosen at start (0 here) is found from the data dir, and status says where."""
    data = tmp_path / "data"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RABBITMQ_CONFIG_FILE", None)
    args = ["--port", "0", "--bind", "127.0.0.1", "--data-dir", str(data)]
    args += ["--management-port", "0", "--prometheus-port", "none"]
    server = subprocess.Popen(
        [sys.executable, "-m", "warren", *args], stderr=subprocess.PIPE, text=True, env=env
    )
    endpoints = data / "warren-endpoints.json"
    try:
        assert server.stderr is not None
        for line in server.stderr:
            if "management API listening" in line:
                break
        port = line.rsplit(":", 1)[1].split()[0]
        while not endpoints.exists():  # written right after that line
            assert server.poll() is None
        ctl_args = ["-m", "warren.broker.tools.warrenctl", "--data-dir", str(data), "status"]
        result = subprocess.run(
            [sys.executable, *ctl_args], capture_output=True, text=True, timeout=30, env=env
        )
        assert result.returncode == 0, result.stderr
        assert (
            f"Broker: http://127.0.0.1:{port} (from {endpoints}, pid {server.pid})"
            in result.stdout.splitlines()
        )
    finally:
        server.terminate()
        assert server.wait(10) == 0
    assert not endpoints.exists()  # gone with the server: the config's port is used
    conf = tmp_path / "rabbitmq.conf"
    free = free_port()
    conf.write_text(f"management.tcp.port = {free}\n")
    ctl_args = ["-m", "warren.broker.tools.warrenctl", "--data-dir", str(data)]
    result = subprocess.run(
        [sys.executable, *ctl_args, "--config", str(conf), "ping"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert result.returncode == 69
    assert result.stderr.startswith(
        f"Error:\nunable to reach Warren at http://127.0.0.1:{free} "
        f"(management.tcp.port in {conf}): "
    )


# ---- users, vhosts, permissions ----


def test_user_commands(warren: RunningBroker, api: HttpApi) -> None:
    out = ok(warren, "add_user", "ctl-bob", "pw1")
    assert out.startswith('Adding user "ctl-bob" ...\nDone.')
    result = ctl(warren, "add_user", "ctl-bob", "pw1")
    assert (result.returncode, result.stderr) == (70, 'Error:\nUser "ctl-bob" already exists\n')
    ok(warren, "set_user_tags", "ctl-bob", "management", "policymaker")
    assert api.as_user("ctl-bob", "pw1").ok("GET", "/api/whoami")["tags"] == [
        "management",
        "policymaker",
    ]
    ok(warren, "change_password", "ctl-bob", "pw2")
    assert api.as_user("ctl-bob", "pw1").get("/api/whoami").status == 401
    assert api.as_user("ctl-bob", "pw2").ok("GET", "/api/whoami")["tags"] == [
        "management",
        "policymaker",
    ]
    listed = rows(ok(warren, "list_users"))
    assert listed[0] == ["user", "tags"]
    assert ["ctl-bob", "[management, policymaker]"] in listed
    assert ["guest", "[administrator]"] in listed
    users = json.loads(ok(warren, "list_users", "--formatter", "json"))
    assert {"user": "ctl-bob", "tags": ["management", "policymaker"]} in users
    ok(warren, "set_user_tags", "ctl-bob")
    assert api.ok("GET", "/api/users/ctl-bob")["tags"] == []
    ok(warren, "delete_user", "ctl-bob")
    result = ctl(warren, "delete_user", "ctl-bob")
    assert (result.returncode, result.stderr) == (67, 'Error:\nUser "ctl-bob" does not exist\n')
    assert ctl(warren, "change_password", "ctl-bob", "x").returncode == 67


def test_vhost_and_permission_commands(warren: RunningBroker, api: HttpApi) -> None:
    ok(warren, "add_vhost", "ctl-vh", "--description", "made by warrenctl", "--tags", "a,b")
    vhost = api.ok("GET", "/api/vhosts/ctl-vh")
    assert (vhost["description"], vhost["tags"]) == ("made by warrenctl", ["a", "b"])
    assert ["ctl-vh"] in rows(ok(warren, "list_vhosts"))
    assert ["ctl-vh", "made by warrenctl"] in rows(ok(warren, "list_vhosts", "name", "description"))
    ok(warren, "add_user", "ctl-carol", "pw")
    ok(warren, "set_permissions", "-p", "ctl-vh", "ctl-carol", "^c", "^w", ".*")
    listed = rows(ok(warren, "list_permissions", "-p", "ctl-vh"))
    assert listed[0] == ["user", "configure", "write", "read"]
    assert ["ctl-carol", "^c", "^w", ".*"] in listed
    assert rows(ok(warren, "-q", "--no-table-headers", "list_user_permissions", "ctl-carol")) == [
        ["ctl-vh", "^c", "^w", ".*"]
    ]
    result = ctl(warren, "set_permissions", "-p", "no-such-vh", "ctl-carol", ".*", ".*", ".*")
    assert result.returncode == 69
    ok(warren, "clear_permissions", "-p", "ctl-vh", "ctl-carol")
    assert api.get("/api/permissions/ctl-vh/ctl-carol").status == 404
    ok(warren, "delete_vhost", "ctl-vh")
    result = ctl(warren, "delete_vhost", "ctl-vh")
    assert (result.returncode, result.stderr) == (65, "Virtual host 'ctl-vh' does not exist\n")
    result = ctl(warren, "list_queues", "-p", "ctl-vh")
    assert (result.returncode, result.stdout.splitlines()[-1]) == (
        0,
        "Listing queues for vhost ctl-vh ...",
    )


# ---- queues, policies, bindings ----


def test_queue_commands(warren: RunningBroker, api: HttpApi) -> None:
    api.ok("PUT", "/api/queues/%2F/ctl-q", {"durable": True})
    for i in range(3):
        api.ok(
            "POST",
            "/api/exchanges/%2F/amq.default/publish",
            {
                "routing_key": "ctl-q",
                "properties": {},
                "payload": str(i),
                "payload_encoding": "string",
            },
        )
    out = ok(warren, "list_queues")
    assert out.splitlines()[:2] == ["Timeout: 60.0 seconds ...", "Listing queues for vhost / ..."]
    assert ["ctl-q", "3"] in rows(out)
    listed = rows(
        ok(warren, "list_queues", "name", "messages_ready", "durable", "consumers", "type")
    )
    assert listed[0] == ["name", "messages_ready", "durable", "consumers", "type"]
    assert ["ctl-q", "3", "true", "0", "classic"] in listed
    as_json = json.loads(ok(warren, "--formatter", "json", "list_queues", "name", "messages"))
    assert {"name": "ctl-q", "messages": 3} in as_json
    result = ctl(warren, "delete_queue", "ctl-q", "--if-empty")
    assert result.returncode == 65
    assert result.stderr == "Error:\nqueue 'ctl-q' in vhost '/' not empty\n"
    assert ok(warren, "purge_queue", "ctl-q") == "Purging queue 'ctl-q' in vhost '/' ...\n"
    assert api.ok("GET", "/api/queues/%2F/ctl-q")["messages"] == 0
    out = ok(warren, "delete_queue", "-e", "ctl-q")
    assert out.splitlines()[-1] == "Queue was successfully deleted with 0 ready messages"
    result = ctl(warren, "purge_queue", "ctl-q")
    assert (result.returncode, result.stderr) == (69, "Error:\nnot_found\n")
    result = ctl(warren, "delete_queue", "ctl-q")
    assert (result.returncode, result.stderr) == (64, "Error:\nQueue not found\n")


def test_policy_commands(warren: RunningBroker, api: HttpApi) -> None:
    out = ok(
        warren,
        "set_policy",
        "--priority",
        "3",
        "--apply-to",
        "queues",
        "ctl-ttl",
        "^ctl\\.",
        '{"message-ttl": 60000}',
    )
    assert out == (
        'Setting policy "ctl-ttl" for pattern "^ctl\\." to "{"message-ttl": 60000}" with '
        'priority "3" for vhost "/" ...\n'
    )
    assert api.ok("GET", "/api/policies/%2F/ctl-ttl") == {
        "vhost": "/",
        "name": "ctl-ttl",
        "pattern": "^ctl\\.",
        "apply-to": "queues",
        "definition": {"message-ttl": 60000},
        "priority": 3,
    }
    listed = rows(ok(warren, "list_policies"))
    assert listed[0] == ["vhost", "name", "pattern", "apply-to", "definition", "priority"]
    assert ["/", "ctl-ttl", "^ctl\\.", "queues", '{"message-ttl":60000}', "3"] in listed
    ok(warren, "clear_policy", "ctl-ttl")
    result = ctl(warren, "clear_policy", "ctl-ttl")
    assert (result.returncode, result.stderr) == (
        69,
        "Error:\nParameter does not exist\n",
    )
    assert (
        ctl(warren, "set_policy", "-p", "no-such-vh", "p", "x", '{"max-length": 1}').returncode
        == 69
    )


def test_exchange_binding_connection_channel_consumer_lists(
    warren: RunningBroker, api: HttpApi
) -> None:
    api.ok("PUT", "/api/exchanges/%2F/ctl-x", {"type": "topic"})
    api.ok("PUT", "/api/queues/%2F/ctl-bq", {"durable": True})
    api.ok("POST", "/api/bindings/%2F/e/ctl-x/q/ctl-bq", {"routing_key": "a.#"})
    assert ["ctl-x", "topic"] in rows(ok(warren, "list_exchanges"))
    bindings = rows(ok(warren, "list_bindings"))
    assert bindings[0] == [
        "source_name",
        "source_kind",
        "destination_name",
        "destination_kind",
        "routing_key",
        "arguments",
    ]
    assert ["ctl-x", "exchange", "ctl-bq", "queue", "a.#", "[]"] in bindings
    assert ["", "exchange", "ctl-bq", "queue", "ctl-bq", "[]"] in bindings
    conn = pika.BlockingConnection(pika.URLParameters(warren.url))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=4)
        ch.basic_consume("ctl-bq", lambda *a: None, consumer_tag="ctl-tag")
        conn.process_data_events(0.1)
        (connection,) = [
            r
            for r in rows(ok(warren, "list_connections", "name", "user", "state", "channels"))
            if r[1] == "guest"
        ]
        assert connection[2:] == ["running", "1"]
        name = connection[0]
        channels = rows(ok(warren, "list_channels"))
        # rabbitmqctl's default columns (3.10.8: `pid user consumer_count messages_unacknowledged`)
        assert channels[0] == ["pid", "user", "consumer_count", "messages_unacknowledged"]
        assert [f"{name} (1)", "guest", "1", "0"] in channels
        consumers = rows(ok(warren, "list_consumers"))
        assert ["ctl-bq", f"{name} (1)", "ctl-tag", "true", "4", "true", "[]"] in consumers
        out = ok(warren, "close_connection", name, "maintenance window")
        assert out == f"Closing connection {name}, reason: maintenance window...\n"
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            conn.process_data_events(2)
        assert closed.value.reply_text == "CONNECTION_FORCED - maintenance window"
        result = ctl(warren, "close_connection", name, "again")
        assert result.returncode == 69
    finally:
        if conn.is_open:
            conn.close()


# ---- definitions ----


def test_definitions_round_trip_through_the_cli(tmp_path: Path) -> None:
    with run_broker(management_port=0) as running:
        port = running.server.management_port
        assert port
        api = HttpApi(port)
        ok(running, "add_vhost", "dv")
        ok(running, "add_user", "dv-user", "pw")
        ok(running, "set_user_tags", "dv-user", "monitoring")
        ok(running, "set_permissions", "-p", "dv", "dv-user", ".*", ".*", ".*")
        ok(running, "set_permissions", "-p", "dv", "guest", ".*", ".*", ".*")
        ok(running, "set_policy", "-p", "dv", "lim", "^q", '{"max-length": 3}')
        api.ok("PUT", "/api/queues/dv/q1", {"durable": True})
        api.ok("PUT", "/api/exchanges/dv/x1", {"type": "fanout", "durable": True})
        api.ok("POST", "/api/bindings/dv/e/x1/q/q1", {"routing_key": ""})
        path = tmp_path / "defs.json"
        out = ok(running, "export_definitions", str(path))
        assert out == f'Exporting definitions in JSON to a file at "{path}" ...\n'
        exported = json.loads(path.read_text())
        assert json.loads(ok(running, "export_definitions", "-")) == exported
        ok(running, "delete_vhost", "dv")
        ok(running, "delete_user", "dv-user")
        assert api.get("/api/queues/dv/q1").status == 404
        out = ok(running, "import_definitions", str(path))
        assert out.splitlines()[-1] == "Successfully imported definitions."
        assert api.ok("GET", "/api/definitions") == exported
        assert api.as_user("dv-user", "pw").ok("GET", "/api/whoami")["tags"] == ["monitoring"]
        # from standard input too, and a broken file is refused before any request
        ok(running, "delete_vhost", "dv")
        ok(running, "import_definitions", stdin=path.read_text())
        assert api.ok("GET", "/api/queues/dv/q1")["durable"] is True
        broken = tmp_path / "broken.json"
        broken.write_text("{nope")
        result = ctl(running, "import_definitions", str(broken))
        assert result.returncode == 65
        assert result.stderr.startswith(f"Error:\n{broken} is not valid JSON")


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "warrenctl"  # make test installs the package
    assert script.exists(), "warrenctl is not installed: run `make test` (pip install -e .)"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    for verb in ("list_queues", "set_policy", "export_definitions", "close_connection"):
        assert verb in result.stdout


# ---- word for word against rabbitmqctl ----

# where Warren cannot say the same thing: stderr is not compared, stdout and status are
STDERR_DIFFERS = {
    # rabbitmqctl prints Erlang's parse error of a process id; Warren's connection names
    # are not Erlang pids, so it says there is no such connection
    ("close_connection", "nosuch", "bye"): "Error:\nno connection named 'nosuch'\n",
}


def _unordered(out: str) -> tuple[list[str], list[str]]:
    """The heading lines and the column header as they are, the rows in any order:
    rabbitmqctl lists in its tables' order, which is no contract."""
    lines = out.splitlines()
    head = 0
    while head < len(lines) and lines[head].endswith("..."):
        head += 1
    return lines[: head + 1], sorted(lines[head + 1 :])


def test_verbs_match_recorded_rabbitmqctl() -> None:
    """Each step of tests/rabbitmqctl_table.py: warrenctl's stdout, stderr and exit status
    against rabbitmqctl 3.10.8's, recorded on this machine in tests/data/."""
    from tests import rabbitmqctl_table as table

    recorded = json.loads(table.RECORDED.read_text())["steps"]
    assert [tuple(s["args"]) for s in recorded] == list(table.SCRIPT)
    mismatches = []
    with run_broker(management_port=0) as broker:
        for i, step in enumerate(recorded):
            if i == table.SETUP_BEFORE:
                table.setup_queue(broker.url.rstrip("/") + "/ux")
            got = ctl(broker, *step["args"])
            args = tuple(step["args"])
            want_err = STDERR_DIFFERS.get(args, step["err"])
            # where rabbitmqctl names itself, warrenctl names itself
            out = step["out"].replace("'rabbitmqctl help", "'warrenctl help")
            want = (step["rc"], _unordered(out), want_err)
            if (got.returncode, _unordered(got.stdout), got.stderr) != want:
                mismatches.append((args, want, (got.returncode, got.stdout, got.stderr)))
    assert not mismatches, "\n".join(
        f"{' '.join(args)}\n  rabbitmqctl {want!r}\n  warrenctl   {got!r}"
        for args, want, got in mismatches
    )


def test_browse_queue_and_replay_dead_letters(warren: RunningBroker, api: HttpApi) -> None:
    api.ok("PUT", "/api/queues/%2F/ctl-browse", {"durable": True})
    for i in range(3):
        api.ok(
            "POST",
            "/api/exchanges/%2F/amq.default/publish",
            {
                "routing_key": "ctl-browse",
                "properties": {"message_id": f"id{i}"},
                "payload": f"m{i}",
                "payload_encoding": "string",
            },
        )
    out = ok(warren, "browse_queue", "ctl-browse", "--offset", "1", "--count", "5")
    table = rows(out)
    assert table[0] == [
        "position", "seq", "redelivered", "delivery_count", "message_id", "payload_encoding",
        "payload",
    ]  # fmt: skip
    assert [(r[0], r[2], r[3], r[4], r[6]) for r in table[1:]] == [
        ("1", "false", "0", "id1", "m1"),
        ("2", "false", "0", "id2", "m2"),
    ]
    out = ok(warren, "browse_queue", "ctl-browse", "--search", "id2")
    assert [r[4] for r in rows(out)[1:]] == ["id2"]
    assert api.ok("GET", "/api/queues/%2F/ctl-browse")["messages_ready"] == 3
    # none of them died: all stay, counted
    out = ok(warren, "--formatter", "json", "replay_dead_letters", "ctl-browse")
    assert json.loads(out) == {"replayed": 0, "unroutable": 0, "without_x_death": 3, "to": []}
    result = ctl(warren, "browse_queue", "ctl-nowhere")
    assert (result.returncode, result.stderr) == (69, "Error:\nnot_found\n")


def test_delete_move_and_send_one_message_to_the_tail(warren: RunningBroker, api: HttpApi) -> None:
    api.ok("PUT", "/api/queues/%2F/ctl-one", {"durable": True})
    api.ok("PUT", "/api/queues/%2F/ctl-one-dst", {"durable": True})
    for i in range(4):
        api.ok(
            "POST",
            "/api/exchanges/%2F/amq.default/publish",
            {
                "routing_key": "ctl-one",
                "properties": {"message_id": f"id{i}"},
                "payload": f"m{i}",
                "payload_encoding": "string",
            },
        )
    out = ok(warren, "--formatter", "json", "delete_message", "ctl-one", "--message-id", "id1")
    assert json.loads(out)["deleted"] == 1
    out = ok(warren, "move_message", "ctl-one", "--position", "0", "--to-queue", "ctl-one-dst")
    assert '"moved": 1' in out
    ok(warren, "message_to_tail", "ctl-one", "--message-id", "id2")
    browsed = api.ok("GET", "/api/queues/%2F/ctl-one/messages")
    assert [m["payload"] for m in browsed] == ["m3", "m2"]
    assert [m["payload"] for m in api.ok("GET", "/api/queues/%2F/ctl-one-dst/messages")] == ["m0"]
    gone = ctl(warren, "delete_message", "ctl-one", "--message-id", "id1")
    assert gone.returncode == 69 and "No ready message with message_id 'id1'" in gone.stderr
    missing = ctl(warren, "delete_message", "ctl-nowhere", "--position", "0")
    assert (missing.returncode, missing.stderr) == (69, "Error:\nnot_found\n")
    usage = ctl(warren, "delete_message", "ctl-one")
    assert usage.returncode == 64  # argparse: one of --position, --seq, --message-id


# ---- issue 38: rabbitmqctl's info keys, JSON rows, status keys, await_startup ----

# RabbitMQ 4.3's rabbitmq_cli list_*_command.ex @info_keys
QUEUE_INFO_KEYS = [
    "name", "durable", "auto_delete", "arguments", "policy", "operator_policy",
    "effective_policy_definition", "pid", "owner_pid", "exclusive", "exclusive_consumer_pid",
    "exclusive_consumer_tag", "messages_ready", "messages_unacknowledged", "messages",
    "messages_ready_ram", "messages_unacknowledged_ram", "messages_ram", "messages_persistent",
    "message_bytes", "message_bytes_ready", "message_bytes_unacknowledged", "message_bytes_ram",
    "message_bytes_persistent", "head_message_timestamp", "disk_reads", "disk_writes", "consumers",
    "consumer_utilisation", "consumer_capacity", "memory", "state", "type", "leader", "members",
    "online"
]
EXCHANGE_INFO_KEYS = ["name", "type", "durable", "auto_delete", "internal", "arguments", "policy"]
CONNECTION_INFO_KEYS = [
    "pid", "name", "port", "host", "peer_port", "peer_host", "ssl", "ssl_protocol",
    "ssl_key_exchange", "ssl_cipher", "ssl_hash", "peer_cert_subject", "peer_cert_issuer",
    "peer_cert_serial_number", "peer_cert_validity", "state", "channels", "protocol",
    "auth_mechanism", "user", "vhost", "container_id", "timeout", "frame_max", "channel_max",
    "client_properties", "recv_oct", "recv_cnt", "send_oct", "send_cnt", "send_pend",
    "connected_at"
]
CHANNEL_INFO_KEYS = [
    "pid", "connection", "name", "number", "user", "vhost", "transactional", "confirm",
    "consumer_count", "messages_unacknowledged", "messages_uncommitted", "acks_uncommitted",
    "messages_unconfirmed", "prefetch_count"
]


def json_rows(output: str) -> list[dict[str, object]]:
    """rabbitmqctl's JSON listing: '[', one object a line (',' before all but the first),
    ']'; the whole is one JSON array."""
    lines = output.splitlines()
    assert lines[0] == "[" and lines[-1] == "]", output
    found = []
    for i, line in enumerate(lines[1:-1]):
        assert line.startswith(",") == (i > 0), line
        found.append(json.loads(line.lstrip(",")))
    assert json.loads(output) == found
    return found


def test_every_info_key_of_the_four_listings(warren: RunningBroker) -> None:
    params = pika.URLParameters(warren.url)
    params.client_properties = {"connection_name": "ctl-keys"}
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.queue_declare("ctl-keys", durable=True)
        ch.queue_declare("ctl-keys-qq", durable=True, arguments={"x-queue-type": "quorum"})
        ch.basic_publish("", "ctl-keys", b"12345", pika.BasicProperties(timestamp=1_700_000_000))
        ch.basic_consume("ctl-keys-qq", lambda *a: None, exclusive=True, consumer_tag="ctl-tag")
        conn.process_data_events(0)
        queues = {
            r["name"]: r
            for r in json_rows(ok(warren, "--formatter", "json", "list_queues", *QUEUE_INFO_KEYS))
        }
        classic, quorum = queues["ctl-keys"], queues["ctl-keys-qq"]
        assert set(classic) == set(QUEUE_INFO_KEYS)
        assert classic["message_bytes"] == classic["message_bytes_ready"] == 5
        assert classic["head_message_timestamp"] == 1_700_000_000
        assert classic["type"] == "classic" and classic["leader"] == ""
        assert quorum["leader"] == quorum["pid"].split(".")[0][1:]  # the node
        assert quorum["members"] == quorum["online"] == [quorum["leader"]]
        assert quorum["exclusive_consumer_tag"] == "ctl-tag"
        assert quorum["exclusive_consumer_pid"] != ""
        assert quorum["consumer_capacity"] == 1.0
        exchanges = json_rows(
            ok(warren, "--formatter", "json", "list_exchanges", *EXCHANGE_INFO_KEYS)
        )
        assert {"name": "amq.direct", "type": "direct", "durable": True, "auto_delete": False,
                "internal": False, "arguments": {}, "policy": ""} in exchanges  # fmt: skip
        connections = json_rows(
            ok(warren, "--formatter", "json", "list_connections", *CONNECTION_INFO_KEYS)
        )
        [mine] = [c for c in connections if c["client_properties"].get("connection_name")
                  == "ctl-keys"]  # type: ignore[union-attr]  # fmt: skip
        assert set(mine) == set(CONNECTION_INFO_KEYS)
        assert mine["recv_oct"] > 0 and mine["send_cnt"] > 0  # type: ignore[operator]
        assert (mine["ssl"], mine["ssl_protocol"], mine["container_id"]) == (False, "", "")
        channels = json_rows(
            ok(warren, "--formatter", "json", "list_channels", *CHANNEL_INFO_KEYS)
        )
        [channel] = [c for c in channels if c["connection"] == mine["name"]]
        assert set(channel) == set(CHANNEL_INFO_KEYS)
        assert channel["consumer_count"] == 1 and channel["number"] == ch.channel_number
        # the table formatter takes them all as well
        assert rows(ok(warren, "list_queues", *QUEUE_INFO_KEYS))[0] == QUEUE_INFO_KEYS
    finally:
        conn.close()


def test_unknown_info_keys_are_64_before_asking(warren: RunningBroker) -> None:
    result = ctl(warren, "list_channels", "foo", "bar", "name")
    assert result.returncode == 64
    assert result.stderr == "Error (argument validation): Info key(s) bar,foo are not supported\n"
    assert result.stdout == ""


def test_status_json_has_rabbitmqctls_keys(warren: RunningBroker) -> None:
    """rabbitmqctl status --formatter json's 29 keys (RabbitMQ 3.10 on this machine, the same
    in 4.3), on one line; Warren adds where it found the broker."""
    out = ok(warren, "--formatter", "json", "status")
    assert out.count("\n") == 1
    document = json.loads(out)
    assert set(document) - {"broker", "found"} == {
        "active_plugins", "alarms", "config_files", "crypto_lib_version", "data_directory",
        "disk_free", "disk_free_limit", "enabled_plugin_file", "erlang_version",
        "file_descriptors", "is_under_maintenance", "listeners", "log_files", "memory",
        "net_ticktime", "os", "pid", "processes", "product_name", "product_version",
        "rabbitmq_version", "raft_data_directory", "release_series_support_status",
        "run_queue", "totals", "uptime", "vm_memory_calculation_strategy",
        "vm_memory_high_watermark_limit", "vm_memory_high_watermark_setting",
    }  # fmt: skip
    assert document["pid"] == os.getpid()  # the test's broker runs in this process
    assert document["file_descriptors"]["total_used"] > 0
    assert document["totals"]["virtual_host_count"] >= 1
    assert {"port": warren.port, "protocol": "amqp"}.items() <= document["listeners"][0].items()


def test_await_startup(tmp_path: Path) -> None:
    """Waits for a broker that is not there yet, then exits 0 once it answers; exits 69
    when nothing answers within --timeout."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    result = ctl(None, "await_startup", "-t", "0.5", url=url)
    assert result.returncode == 69, result.stderr
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    waiting = subprocess.Popen(
        [sys.executable, "-m", "warren.broker.tools.warrenctl", "--url", url, "await_startup"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        # something takes warrenctl's first try and hangs up on it, then the broker starts
        with socket.socket() as listener:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", port))
            listener.listen(1)
            listener.settimeout(30)
            tried, _ = listener.accept()
            tried.close()
        assert waiting.poll() is None  # still waiting: a hang-up is no answer
        with run_broker(management_port=port):
            out, err = waiting.communicate(timeout=60)
            assert waiting.returncode == 0, err
            assert out == ""
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()
