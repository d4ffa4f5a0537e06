"""Start-up: what a fresh broker loads before it answers, and how it reports errors.

How long start-up takes is a benchmark, not a test (a loaded CI machine would fail a
timed test): tests/benchmarks/startup.py reports medians and p95. What makes start-up
slow by accident is a heavy import on the way to the listener, and that is checked
here exactly, from the interpreter's own import log.
"""

from __future__ import annotations

import ast
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))

from startup import free_port, wait_for_amqp  # noqa: E402

# Packages Warren has installed beside it (test and pipeline extras) that the broker
# itself never needs: importing one on the way to the listener costs hundreds of ms.
HEAVY = {"pyspark", "pyarrow", "matplotlib", "pandas", "numpy", "playwright", "celery", "kombu"}


def imported_top_level(importtime_log: str) -> set[str]:
    """Top-level package names from a ``-X importtime`` log (one line per import)."""
    names = set()
    for line in importtime_log.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name and name != "imported package":
                names.add(name.split(".")[0])
    return names


def test_in_process_broker_accepts_connections_without_heavy_imports() -> None:
    code = (
        "import socket, sys\n"
        "from warren.broker.testkit import run_broker\n"
        "with run_broker() as b, socket.create_connection((b.host, b.port), timeout=5):\n"
        "    print('modules:', sorted({m.split('.')[0] for m in sys.modules}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert out.returncode == 0, out.stderr
    # the broker logs to stdout too (its shutdown may close the socket after the print)
    (line,) = [line for line in out.stdout.splitlines() if line.startswith("modules: ")]
    loaded = set(ast.literal_eval(line.removeprefix("modules: ")))
    assert "warren" in loaded and "uvloop" in loaded
    assert not loaded & HEAVY, loaded & HEAVY


def test_warren_server_answers_amqp_without_heavy_imports(tmp_path: Path) -> None:
    config = tmp_path / "rabbitmq.conf"
    config.write_text(
        f"management.tcp.port = none\nprometheus.tcp.port = none\ndata_dir = {tmp_path}/data\n"
    )
    port = free_port()
    server = str(Path(sys.executable).parent / "warren-server")
    proc = subprocess.Popen(
        [server, "--config", str(config), "--port", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"},
    )
    try:
        wait_for_amqp(port)  # connection.start arrives for the protocol header
    finally:
        proc.send_signal(signal.SIGTERM)
        _, log = proc.communicate(timeout=30)
    assert proc.returncode == 0
    loaded = imported_top_level(log)
    assert {"warren", "uvloop", "structlog", "pamqp"} <= loaded
    # with the HTTP listeners off, neither is the web framework loaded
    assert not loaded & (HEAVY | {"aiohttp"}), loaded & (HEAVY | {"aiohttp"})


def test_help_and_config_errors_do_not_load_the_engine(tmp_path: Path) -> None:
    bad = tmp_path / "bad.conf"
    bad.write_text("heartbeat = often\n")
    code = (
        "import sys\n"
        "from warren.broker.server.main import main\n"
        f"status = main(['--config', {str(bad)!r}])\n"
        "mods = ('warren.broker.server.shell', 'structlog', 'uvloop')\n"
        "loaded = [m for m in mods if m in sys.modules]\n"
        "print(status, loaded)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "2 []"
    assert "configuration error" in out.stderr and "heartbeat = often" in out.stderr
    help_ = subprocess.run(
        [sys.executable, "-m", "warren", "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert help_.returncode == 0 and "--config" in help_.stdout


def test_a_taken_port_exits_1(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        args = ["--port", str(taken.getsockname()[1]), "--bind", "127.0.0.1"]
        args += ["--management-port", "none", "--prometheus-port", "none"]
        out = subprocess.run(
            [sys.executable, "-m", "warren", *args, "--data-dir", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert out.returncode == 1
    # the taken listener named: address, port, its setting and the flag that moves it
    port = args[1]
    assert f"warren-server: cannot listen on 127.0.0.1:{port}: Address already in use" in out.stderr
    assert "listeners.tcp.default" in out.stderr and "--port moves it" in out.stderr


def test_a_taken_metrics_port_is_named(tmp_path: Path) -> None:
    """The case met in practice: RabbitMQ's Prometheus plugin already holds 15692."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "rabbitmq.conf"
        config.write_text(f"prometheus.tcp.port = {port}\nprometheus.tcp.ip = 127.0.0.1\n")
        args = ["--config", str(config), "--port", "0", "--bind", "127.0.0.1"]
        args += ["--management-port", "none", "--data-dir", str(tmp_path)]
        out = subprocess.run(
            [sys.executable, "-m", "warren", *args], capture_output=True, text=True, timeout=30
        )
    assert out.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in out.stderr
    assert "prometheus.tcp.port" in out.stderr and "--prometheus-port moves it" in out.stderr


def test_readiness_line_as_rabbitmq_prints_it(tmp_path: Path) -> None:
    """rabbit.erl, log_broker_started/1 (4.3): "Server startup complete; ~b plugins
    started." then " * Plugin" per plugin, logged once the listeners accept (the line
    testcontainers' RabbitMQContainer waits for). Every listener accepts when it shows."""
    args = ["--port", "0", "--bind", "127.0.0.1", "--data-dir", str(tmp_path)]
    args += ["--management-port", "0", "--prometheus-port", "0"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "warren", *args], stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        assert proc.stderr is not None
        lines: list[str] = []
        for line in proc.stderr:
            lines.append(line)
            if "Server startup complete" in line:
                break
        ports = [
            int(line.split("address=")[1].split()[0].rsplit(":", 1)[1])
            for line in lines
            if "address=" in line
        ]
        assert len(ports) == 3, lines  # AMQP, management, prometheus
        for port in ports:  # each accepts before the line is out
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        count = int(lines[-1].split("Server startup complete; ")[1].split()[0])
        assert lines[-1].rstrip().endswith(f"Server startup complete; {count} plugins started.")
        plugins = [next(proc.stderr).rstrip() for _ in range(count)]
        names = [line.rsplit(" * ", 1)[1] for line in plugins]
        assert "rabbitmq_management" in names and "rabbitmq_prometheus" in names
        assert names == sorted(names)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0


def test_http_endpoint_ports_from_the_command_line(tmp_path: Path) -> None:
    args = ["--port", "0", "--bind", "127.0.0.1", "--data-dir", str(tmp_path)]
    args += ["--management-port", "0", "--prometheus-port", "none"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "warren", *args], stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        assert proc.stderr is not None
        lines: list[str] = []
        for line in proc.stderr:
            lines.append(line)
            if "management API listening" in line:
                break
        assert any("] ready" in line for line in lines), lines
        assert "address=0.0.0.0:" in lines[-1] and "address=0.0.0.0:15672" not in lines[-1]
        assert not any("prometheus" in line for line in lines)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0


def test_gc_thresholds_from_the_environment() -> None:
    """warren-server sets the collector's thresholds (broker/server/main.py GC_THRESHOLDS);
    WARREN_GC_THRESHOLDS overrides them, and a bad value stops start-up with exit 2."""
    from warren.broker.server.main import GC_THRESHOLDS, gc_thresholds

    assert gc_thresholds(None) == gc_thresholds("") == GC_THRESHOLDS
    assert gc_thresholds("700,10,10") == (700, 10, 10)
    for bad in ("700,10", "a,b,c", "700,10,-1"):
        out = subprocess.run(
            [sys.executable, "-m", "warren", "--port", "0", "--management-port", "none"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=30,
            env={**os.environ, "WARREN_GC_THRESHOLDS": bad},
        )
        assert out.returncode == 2
        assert out.stderr.startswith(f"warren-server: WARREN_GC_THRESHOLDS={bad!r}")
