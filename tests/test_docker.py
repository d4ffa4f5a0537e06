"""docker/: what the image runs, run here without Docker.

No Docker engine runs on these machines, so the pieces are tested one by
one: the entrypoint script with the rabbitmq image's environment variables
(as a subprocess, against a real warren-server), the health check against
live and broken brokers, the image's config layout, and a parse of the
Dockerfile and compose file for what they must declare.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
import yaml

from warren.broker.testkit import RunningBroker, run_broker
from warren.broker.tools.healthcheck import Unhealthy, check
from warren.broker.tools.healthcheck import main as healthcheck_main
from warren.config import Listener, load_settings

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
BIN = Path(sys.executable).parent  # warren-server, warren-healthcheck
SH = shutil.which("dash") or "/bin/sh"  # the slim image's /bin/sh is dash


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --------------------------------------------------------------------------
# the health check


@pytest.fixture(scope="module")
def app_broker() -> Iterator[RunningBroker]:
    with run_broker(default_user="app", default_pass="s3cret", default_vhost="orders") as broker:
        yield broker


def test_healthcheck_completes_a_handshake(app_broker: RunningBroker) -> None:
    took = check("127.0.0.1", app_broker.port, "app", "s3cret", "orders", timeout=2)
    assert 0 < took < 2


@pytest.mark.parametrize(
    ("user", "password", "vhost", "reason"),
    [
        ("app", "wrong", "orders", "403"),
        ("nobody", "s3cret", "orders", "403"),
        ("app", "s3cret", "missing", "530"),
    ],
)
def test_healthcheck_fails_when_the_broker_refuses(
    app_broker: RunningBroker, user: str, password: str, vhost: str, reason: str
) -> None:
    with pytest.raises(Unhealthy, match=f"refused: {reason}"):
        check("127.0.0.1", app_broker.port, user, password, vhost, timeout=2)


def test_healthcheck_fails_on_a_closed_port() -> None:
    with pytest.raises(Unhealthy, match="cannot connect"):
        check("127.0.0.1", free_port(), timeout=1)


@contextmanager
def fake_server(behaviour: str) -> Iterator[int]:
    """A TCP listener that is not a broker: it stays silent, hangs up, or speaks HTTP."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            if behaviour == "hang up":
                conn.close()
            elif behaviour == "http":
                conn.recv(64)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                held.append(conn)
            else:
                held.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accept(); close() alone does not
        listener.close()
        thread.join(5)
        for conn in held:
            conn.close()


@pytest.mark.parametrize(
    ("behaviour", "reason"),
    [
        ("silent", "timed out"),
        ("hang up", "closed the connection|reset by peer"),
        ("http", "not an AMQP broker"),
    ],
)
def test_healthcheck_is_not_a_port_probe(behaviour: str, reason: str) -> None:
    with fake_server(behaviour) as port:
        started = time.monotonic()
        with pytest.raises(Unhealthy, match=reason):
            check("127.0.0.1", port, timeout=0.5)
        assert time.monotonic() - started < 2


def test_healthcheck_takes_its_defaults_from_the_broker_config(
    app_broker: RunningBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "rabbitmq.conf"
    conf.write_text(f"listeners.tcp.default = {app_broker.port}\n")  # all interfaces
    monkeypatch.setenv("RABBITMQ_CONFIG_FILE", str(conf))
    monkeypatch.setenv("RABBITMQ_DEFAULT_USER", "app")
    monkeypatch.setenv("RABBITMQ_DEFAULT_PASS", "s3cret")
    monkeypatch.setenv("RABBITMQ_DEFAULT_VHOST", "orders")
    assert healthcheck_main(["--quiet"]) == 0
    assert healthcheck_main(["--password", "wrong"]) == 1
    monkeypatch.setenv("RABBITMQ_DEFAULT_PASS", "wrong")
    assert healthcheck_main([]) == 1
    conf.write_text("heartbeat = often\n")
    assert healthcheck_main([]) == 1


def test_healthcheck_command_exit_status(app_broker: RunningBroker) -> None:
    """The console script, as Docker runs it: 0 healthy, 1 unhealthy, one line on why."""
    args = ["--port", str(app_broker.port), "--user", "app", "--password", "s3cret"]
    ok = subprocess.run(
        [BIN / "warren-healthcheck", *args, "--vhost", "orders"], capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(f"warren-healthcheck: healthy (127.0.0.1:{app_broker.port}")
    bad = subprocess.run(
        [sys.executable, "-m", "warren.broker.tools.healthcheck", *args, "--vhost", "nope"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1
    assert bad.stderr.startswith("warren-healthcheck: unhealthy: the broker refused: 530")


# --------------------------------------------------------------------------
# the entrypoint, with the rabbitmq image's environment


@dataclass
class Image:
    """The image's /etc/rabbitmq and environment, laid out in a temporary directory."""

    etc: Path
    data: Path
    port: int
    env: dict[str, str]


@pytest.fixture
def image(tmp_path: Path) -> Image:
    etc = tmp_path / "etc" / "rabbitmq"
    (etc / "conf.d").mkdir(parents=True)
    shutil.copy(DOCKER / "10-defaults.conf", etc / "conf.d" / "10-defaults.conf")
    port = free_port()
    # the image's own rabbitmq.conf listens on 5672 and 15672, which may be taken here
    (etc / "rabbitmq.conf").write_text(
        f"listeners.tcp.default = 127.0.0.1:{port}\n"
        "management.tcp.port = none\n"
        "prometheus.tcp.port = none\n"
        "log.console.formatter = json\n"
        "cluster_name = from-a-rabbitmq-conf\n"
    )
    env = {
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "RABBITMQ_CONFIG_FILE": str(etc / "rabbitmq.conf"),
        "RABBITMQ_DEFAULT_USER": "app",
        "RABBITMQ_DEFAULT_PASS": "s3cret",
        "RABBITMQ_DEFAULT_VHOST": "orders",
        "WARREN_DATA_DIR": str(tmp_path / "var" / "lib" / "warren"),
    }
    return Image(etc, tmp_path / "var" / "lib" / "warren", port, env)


def read_events(stream: Any, until: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    """JSON log lines up to and including the event ``until``."""
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    for line in stream:
        events.append(json.loads(line))  # every line is JSON
        if events[-1]["event"] == until:
            return events
        assert time.monotonic() < deadline, events
    raise AssertionError(f"no {until!r} event: {events}")


def test_entrypoint_runs_the_broker_as_the_rabbitmq_image_does(image: Image) -> None:
    proc = subprocess.Popen(
        [SH, DOCKER / "entrypoint.sh"], env=image.env, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        events = read_events(proc.stderr, "ready")
        assert events[-1]["address"] == f"127.0.0.1:{image.port}"
        assert events[0]["event"] == "starting warren-server"  # with the build it runs
        assert {"event": "config key not used by Warren", "key": "cluster_name"}.items() <= (
            events[1].items()
        )
        # exec: the broker itself is the process Docker signals, with the data dir given
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert [b"--data-dir", str(image.data).encode()] == cmdline[-3:-1]

        # the user and vhost from RABBITMQ_DEFAULT_*, reachable over the network: conf.d's
        # loopback_users.guest = false does not matter to app, and guest is gone
        url = f"amqp://app:s3cret@127.0.0.1:{image.port}/orders"
        conn = pika.BlockingConnection(pika.URLParameters(url))
        conn.channel().queue_declare("hello", durable=True)
        conn.close()
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(
                pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{image.port}/")
            )

        # the image's HEALTHCHECK and a rabbitmq-style one, in the same environment
        health = subprocess.run(
            ["warren-healthcheck", "--quiet", "--timeout", "4"], env=image.env, capture_output=True
        )
        assert health.returncode == 0, health.stderr
        diagnostics_status = {"-q ping": 0, "check_port_connectivity": 0, "list_queues": 64}
        for command, status in diagnostics_status.items():
            diagnostics = subprocess.run(
                [SH, DOCKER / "rabbitmq-diagnostics", *command.split()],
                env=image.env,
                capture_output=True,
            )
            assert diagnostics.returncode == status, (command, diagnostics.stderr)

        proc.send_signal(signal.SIGTERM)  # docker stop
        assert proc.wait(10) == 0
        assert read_events(proc.stderr, "shutting down")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture
def fake_server_command(tmp_path: Path) -> dict[str, str]:
    """An environment whose warren-server prints its arguments instead of serving."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "warren-server"
    stub.write_text('#!/bin/sh\necho warren-server "$@"\n')
    stub.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "WARREN_DATA_DIR": "/data"}


@pytest.mark.parametrize(
    ("args", "runs"),
    [
        ("", "warren-server --data-dir /data"),
        ("--port 5673", "warren-server --data-dir /data --port 5673"),
        ("warren-server --bind ::", "warren-server --data-dir /data --bind ::"),
        ("rabbitmq-server", "warren-server --data-dir /data"),
        ("echo hello", "hello"),
    ],
)
def test_entrypoint_picks_the_command(
    fake_server_command: dict[str, str], args: str, runs: str
) -> None:
    out = subprocess.run(
        [SH, DOCKER / "entrypoint.sh", *args.split()],
        env=fake_server_command,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == runs


def test_entrypoint_leaves_data_dir_to_the_config_if_unset(
    fake_server_command: dict[str, str],
) -> None:
    env = {**fake_server_command, "WARREN_DATA_DIR": ""}
    out = subprocess.run(
        [SH, DOCKER / "entrypoint.sh"], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "warren-server"


def test_the_image_config_layout_loads_as_in_the_rabbitmq_image(tmp_path: Path) -> None:
    etc = tmp_path / "etc" / "rabbitmq"
    (etc / "conf.d").mkdir(parents=True)
    shutil.copy(DOCKER / "rabbitmq.conf", etc / "rabbitmq.conf")
    shutil.copy(DOCKER / "10-defaults.conf", etc / "conf.d" / "10-defaults.conf")
    env = {"RABBITMQ_CONFIG_FILE": str(etc / "rabbitmq.conf"), "RABBITMQ_DEFAULT_USER": "app"}
    settings = load_settings(environ=env)
    assert settings.listeners == (Listener("default", "", 5672),)
    assert (settings.management_port, settings.prometheus_port) == (15672, 15692)
    assert settings.loopback_users == ()  # guest may connect from other containers
    assert settings.log_console is True
    assert settings.default_user == "app"
    assert settings.ignored_keys == ()


# --------------------------------------------------------------------------
# the Dockerfile and compose file, by parsing


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = (DOCKER / "Dockerfile").read_text()
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), " ".join(rest.split())))
    return out


def instructions(name: str) -> list[str]:
    return [args for word, args in dockerfile() if word == name]


def env_of(args: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in shlex.split(args))


def test_dockerfile_base_user_ports_volume() -> None:
    build, final = instructions("FROM")
    assert re.fullmatch(r"python:3\.1[1-9]-slim AS build", build), build
    assert re.fullmatch(r"python:3\.1[1-9]-slim", final), final
    user = instructions("USER")[-1]
    assert user.split(":")[0] not in ("root", "0")
    uid = re.search(r"useradd .*--uid (\d+)", " ".join(instructions("RUN")))
    assert uid is not None and user == f"{uid[1]}:{uid[1]}"
    assert instructions("EXPOSE") == ["5672 15672 15692"]
    # the rabbitmq image's data dir: a volume mounted there for RabbitMQ keeps Warren's data
    assert instructions("VOLUME") == ["/var/lib/rabbitmq"]
    env = {k: v for args in instructions("ENV") for k, v in env_of(args).items()}
    assert env["WARREN_DATA_DIR"] == env["HOME"] == "/var/lib/rabbitmq"
    assert "chown warren:warren /var/lib/rabbitmq" in " ".join(instructions("RUN"))
    assert env["RABBITMQ_CONFIG_FILE"] == "/etc/rabbitmq/rabbitmq.conf"


def final_stage() -> list[tuple[str, str]]:
    steps = dockerfile()
    last = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last:]


def test_dockerfile_compiles_in_a_build_stage_and_ships_only_the_wheel() -> None:
    targets = {}
    for args in instructions("COPY"):
        *sources, target = [a for a in args.split() if not a.startswith("--")]
        if args.startswith("--from="):
            continue
        for source in sources:
            assert (ROOT / source).exists(), source  # the build context is the repository
            targets[source] = target
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    included = project["tool"]["setuptools"]["packages"]["find"]["include"]
    for package in {name.split(".")[0] for name in included}:
        assert targets[package] == f"/tmp/warren/{package}", package
    assert targets["pyproject.toml"] == targets["setup.py"] == "/tmp/warren/"
    runs = instructions("RUN")
    assert any("gcc" in a and "apt-get install" in a for a in runs)
    assert any(a.startswith("pip wheel --no-deps -w /wheels /tmp/warren") for a in runs)
    assert any("the wheel is not compiled" in a for a in runs)
    # the image itself: the wheel, no compiler, no source tree
    final = final_stage()
    final_runs = " ".join(args for word, args in final if word == "RUN")
    assert "pip install /tmp/wheels/*.whl" in final_runs and "gcc" not in final_runs
    copied = [args for word, args in final if word == "COPY"]
    assert "--from=build /wheels /tmp/wheels" in copied
    assert not [c for c in copied if c.split()[0] in ("broker", "protocol", "config", "warren")]
    assert targets["docker/rabbitmq.conf"] == "/etc/rabbitmq/rabbitmq.conf"
    assert targets["docker/10-defaults.conf"] == "/etc/rabbitmq/conf.d/10-defaults.conf"
    # RabbitMQ's rabbitmqadmin, taken out of Debian's package in the build stage by the
    # script make test runs too (tests/test_docker_tools.py runs the file it makes)
    assert targets["docker/fetch-rabbitmqadmin"] == "/tmp/fetch-rabbitmqadmin"
    assert any("/tmp/fetch-rabbitmqadmin /rabbitmqadmin" in a for a in runs)
    assert "--from=build /rabbitmqadmin /usr/local/bin/rabbitmqadmin" in copied


def test_dockerfile_healthcheck_and_entrypoint() -> None:
    (health,) = instructions("HEALTHCHECK")
    options, _, command = health.partition(" CMD ")
    assert "--timeout=5s" in options.split()
    argv = json.loads(command)
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert argv[0] == "warren-healthcheck" and argv[0] in scripts
    timeout = float(argv[argv.index("--timeout") + 1])
    assert timeout < 5  # answers before Docker gives up on it
    assert json.loads(instructions("ENTRYPOINT")[0]) == ["docker-entrypoint.sh"]
    assert json.loads(instructions("CMD")[0]) == ["warren-server"]
    copies = {a.split()[-2]: a.split()[-1] for a in instructions("COPY")}
    assert copies["docker/entrypoint.sh"] == "/usr/local/bin/docker-entrypoint.sh"
    for tool in ("rabbitmq-diagnostics", "rabbitmqctl", "rabbitmq-plugins"):
        assert copies[f"docker/{tool}"] == f"/usr/local/bin/{tool}"
    for script in ("entrypoint.sh", "rabbitmq-diagnostics", "rabbitmqctl", "rabbitmq-plugins"):
        assert os.access(DOCKER / script, os.X_OK)
        subprocess.run([SH, "-n", DOCKER / script], check=True)  # parses as POSIX sh


def test_testcontainers_compose_file() -> None:
    """docker/compose.testcontainers.yml: built from docker/Dockerfile, the config at the path
    testcontainers writes, and rabbitmqctl await_startup as the health check (the script is
    run against a live broker in tests/test_docker_tools.py)."""
    loaded = yaml.safe_load((DOCKER / "compose.testcontainers.yml").read_text())
    service = loaded["services"]["rabbitmq"]
    assert service["build"]["dockerfile"] == "docker/Dockerfile"
    assert (DOCKER / service["build"]["context"] / "docker" / "Dockerfile").is_file()
    config = service["environment"]["RABBITMQ_CONFIG_FILE"]
    assert config == "/etc/rabbitmq/rabbitmq-custom.conf"
    assert any(v.split(":")[1] == config for v in service["volumes"])
    assert service["healthcheck"]["test"][:3] == ["CMD", "rabbitmqctl", "await_startup"]


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())
    return loaded


def test_compose_service_is_healthchecked_and_gates_the_app() -> None:
    services = compose()["services"]
    broker = services["rabbitmq"]  # the name apps already use as host name
    build = broker["build"]
    assert (DOCKER / build["context"] / build["dockerfile"]).resolve() == DOCKER / "Dockerfile"
    assert set(broker["environment"]) == {
        "RABBITMQ_DEFAULT_USER",
        "RABBITMQ_DEFAULT_PASS",
        "RABBITMQ_DEFAULT_VHOST",
    }
    assert [p.split(":")[1] for p in broker["ports"]] == ["5672", "15672", "15692"]
    assert "rabbitmq-data:/var/lib/rabbitmq" in broker["volumes"]
    assert "rabbitmq-data" in compose()["volumes"]
    health = broker["healthcheck"]
    assert health["test"][:2] == ["CMD", "warren-healthcheck"]
    assert {"interval", "timeout", "retries", "start_period"} <= set(health)
    app = services["app"]
    assert app["depends_on"] == {"rabbitmq": {"condition": "service_healthy"}}
    env = broker["environment"]
    vhost = "%2F" if env["RABBITMQ_DEFAULT_VHOST"] == "/" else env["RABBITMQ_DEFAULT_VHOST"]
    user, password = env["RABBITMQ_DEFAULT_USER"], env["RABBITMQ_DEFAULT_PASS"]
    assert app["environment"]["AMQP_URL"] == f"amqp://{user}:{password}@rabbitmq:5672/{vhost}"


def test_compose_app_command_publishes(tmp_path: Path) -> None:
    """The example app's Python, run here against a broker with the service's credentials."""
    app = compose()["services"]["app"]
    env = compose()["services"]["rabbitmq"]["environment"]
    script = app["command"][2]
    code = re.search(r'python -c "(.*)"$', script, re.DOTALL)
    assert code is not None and script.startswith("pip install -q pika &&")
    with run_broker(
        default_user=env["RABBITMQ_DEFAULT_USER"], default_pass=env["RABBITMQ_DEFAULT_PASS"]
    ) as broker:
        url = app["environment"]["AMQP_URL"].replace("rabbitmq:5672", f"127.0.0.1:{broker.port}")
        out = subprocess.run(
            [sys.executable, "-c", code[1]],
            env={**os.environ, "AMQP_URL": url},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        assert broker.queue_depth("hello") == 1


def test_entrypoint_keeps_using_a_volume_at_the_old_data_dir(
    fake_server_command: dict[str, str], tmp_path: Path
) -> None:
    """Images before this one kept data in /var/lib/warren: a volume still mounted there
    is used rather than starting empty at /var/lib/rabbitmq."""
    old = tmp_path / "old"
    env = {
        **fake_server_command,
        "WARREN_DATA_DIR": "/var/lib/rabbitmq",
        "WARREN_OLD_DATA_DIR": str(old),
    }
    run = [SH, DOCKER / "entrypoint.sh"]
    out = subprocess.run(run, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "warren-server --data-dir /var/lib/rabbitmq"
    old.mkdir()
    (old / "definitions.sqlite3").write_bytes(b"")
    out = subprocess.run(run, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"warren-server --data-dir {old}"
    assert f"using the data in {old}" in out.stderr


def dockerignored() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def test_dockerignore_keeps_local_state_out_but_not_what_the_image_copies() -> None:
    ignored = dockerignored()
    for local in (".venv", "data", ".git", "build"):
        assert local in ignored, local
    for args in instructions("COPY"):
        *sources, _ = [a for a in args.split() if not a.startswith("--")]
        for source in sources:
            assert not any(
                source == pattern or source.startswith(pattern + "/") for pattern in ignored
            ), source
