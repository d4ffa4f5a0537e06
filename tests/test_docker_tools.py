"""docker/rabbitmqctl and docker/rabbitmq-plugins, run as the image runs them (shell scripts
over warrenctl and warren-healthcheck), against a broker started here. The broker is found
through RABBITMQ_CONFIG_FILE at testcontainers' path name, rabbitmq-custom.conf.

Exit codes are rabbitmq_cli's (deps/rabbitmq_cli/lib/rabbitmq/cli/core/exit_codes.ex, 4.3.5):
64 usage, 69 unavailable ({:error, _}, e.g. a plugin that is not there), 75 timeout."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from warren.broker.testkit import RunningBroker, run_broker

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"


@pytest.fixture(scope="module")
def warren() -> Iterator[RunningBroker]:
    with run_broker(management_port=0) as running:
        yield running


@pytest.fixture(scope="module")
def conf(warren: RunningBroker, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("etc") / "rabbitmq-custom.conf"
    path.write_text(
        f"listeners.tcp.default = {warren.port}\n"
        f"management.tcp.port = {warren.server.management_port}\n"
    )
    return path


def run(script: str, conf: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RABBITMQ_CONFIG_FILE": str(conf), "PYTHONPATH": str(ROOT)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("WARREN_DATA_DIR", None)
    return subprocess.run(
        [str(DOCKER / script), *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_rabbitmqctl_await_startup_and_testcontainers_verbs(conf: Path) -> None:
    # testcontainers-java's withVhost / withUser / withPermission / withQueue run these
    assert run("rabbitmqctl", conf, "await_startup").returncode == 0
    for args in (
        ("add_vhost", "tc-vhost"),
        ("add_user", "tc-user", "tc-pass"),
        ("set_permissions", "-p", "tc-vhost", "tc-user", ".*", ".*", ".*"),
        ("set_policy", "-p", "tc-vhost", "tc-ttl", "^ttl", '{"message-ttl": 1000}'),
    ):
        result = run("rabbitmqctl", conf, *args)
        assert result.returncode == 0, (args, result.stdout, result.stderr)
    listed = run("rabbitmqctl", conf, "list_users", "-q")
    assert "tc-user" in listed.stdout
    assert "tc-ttl" in run("rabbitmqctl", conf, "list_policies", "-p", "tc-vhost").stdout
    assert run("rabbitmqctl", conf, "delete_user", "tc-user").returncode == 0
    assert run("rabbitmqctl", conf, "delete_vhost", "tc-vhost").returncode == 0
    assert "tc-user" not in run("rabbitmqctl", conf, "list_users", "-q").stdout


def test_rabbitmqctl_eval_refused(conf: Path) -> None:
    result = run("rabbitmqctl", conf, "eval", "1 + 1.")
    assert result.returncode == 64
    assert "Erlang" in result.stderr


def test_rabbitmqctl_await_startup_times_out(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    conf = tmp_path / "rabbitmq-custom.conf"
    conf.write_text(f"listeners.tcp.default = {port}\n")
    result = run("rabbitmqctl", conf, "await_startup", "-t", "1")
    assert result.returncode == 75, result.stderr


def test_rabbitmq_plugins(conf: Path) -> None:
    listed = run("rabbitmq-plugins", conf, "list")
    assert listed.returncode == 0
    assert "[E*] rabbitmq_management" in listed.stdout.splitlines()
    enabled = run("rabbitmq-plugins", conf, "enable", "rabbitmq_management", "rabbitmq_prometheus")
    assert enabled.returncode == 0, enabled.stderr
    # dynamic shovels are built in (broker/ops/shovel); federation is not
    shovel = run(
        "rabbitmq-plugins", conf, "enable", "rabbitmq_shovel", "rabbitmq_shovel_management"
    )
    assert shovel.returncode == 0, shovel.stderr
    unknown = run("rabbitmq-plugins", conf, "enable", "rabbitmq_federation")
    assert unknown.returncode == 69
    assert "rabbitmq_federation is not built into Warren" in unknown.stderr
    assert run("rabbitmq-plugins", conf, "frobnicate").returncode == 64


def test_rabbitmq_diagnostics_commands_that_exited_64(warren: RunningBroker, conf: Path) -> None:
    for args in (("is_running",), ("check_port_listener", str(warren.port)), ("-q", "ping")):
        result = run("rabbitmq-diagnostics", conf, *args)
        assert result.returncode == 0, (args, result.stderr)
    for verb in ("status", "cluster_status", "listeners"):
        result = run("rabbitmq-diagnostics", conf, verb)
        assert result.returncode == 0, (verb, result.stderr)
        assert str(warren.port) in result.stdout, result.stdout  # the AMQP listener is shown
    from warren import __version__

    assert run("rabbitmq-diagnostics", conf, "server_version").stdout.strip() == __version__
    assert run("rabbitmq-diagnostics", conf, "erlang_version").returncode == 64


RABBITMQADMIN = ROOT / "build" / "rabbitmqadmin"  # make test: docker/fetch-rabbitmqadmin


def admin(warren: RunningBroker, *args: str) -> subprocess.CompletedProcess[str]:
    """RabbitMQ's own rabbitmqadmin (v1), the file the image ships, against Warren's API."""
    assert RABBITMQADMIN.is_file(), "make build/rabbitmqadmin (docker/fetch-rabbitmqadmin)"
    port = str(warren.server.management_port)
    command = [sys.executable, str(RABBITMQADMIN), "-H", "127.0.0.1", "-P", port, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_rabbitmqadmin_as_testcontainers_runs_it(warren: RunningBroker) -> None:
    # testcontainers-java's RabbitMQContainer.withVhost/withUser/withPermission/withExchange/
    # withQueue/withBinding/withPolicy run these in the container; testcontainers-python's
    # declare_queue checks for the "queue declared" line
    steps = [
        ("declare vhost name=tc-admin", "vhost declared"),
        ("declare user name=tc-u password=tc-p tags=administrator", "user declared"),
        (
            "declare permission vhost=tc-admin user=tc-u configure=.* write=.* read=.*",
            "permission declared",
        ),
        ("-V tc-admin declare exchange name=tc.ex type=direct", "exchange declared"),
        (
            "-V tc-admin declare queue name=tc.q durable=true "
            """'arguments={"x-max-length": 10}'""",
            "queue declared",
        ),
        (
            "-V tc-admin declare binding source=tc.ex destination=tc.q routing_key=k",
            "binding declared",
        ),
        (
            "-V tc-admin declare policy name=tc-pol pattern=^tc apply-to=queues "
            """'definition={"max-length": 5}'""",
            "policy declared",
        ),
        ("-V tc-admin publish exchange=tc.ex routing_key=k payload=hello", "Message published"),
    ]
    for line, said in steps:
        args = shlex.split(line)
        result = admin(warren, *args)
        assert result.returncode == 0, (args, result.stdout, result.stderr)
        assert said in result.stdout, (args, result.stdout)
    listed = admin(warren, *shlex.split("-V tc-admin -f tsv -q list queues name messages"))
    assert listed.stdout.split() == ["tc.q", "1"], listed.stdout
    got = admin(warren, "-V", "tc-admin", "get", "queue=tc.q", "ackmode=ack_requeue_false")
    assert got.returncode == 0 and "hello" in got.stdout, got.stdout
    shown = admin(warren, "-f", "raw_json", "show", "overview")
    assert shown.returncode == 0 and '"management_version"' in shown.stdout, shown.stdout
    assert admin(warren, "-V", "tc-admin", "delete", "queue", "name=tc.q").returncode == 0
    assert admin(warren, "delete", "vhost", "name=tc-admin").returncode == 0
    assert admin(warren, "delete", "user", "name=tc-u").returncode == 0
    # a queue that is not there: rabbitmqadmin's own refusal of the API's 404
    gone = admin(warren, "-V", "/", "delete", "queue", "name=tc.none")
    assert gone.returncode != 0 and "Not found" in gone.stdout + gone.stderr
