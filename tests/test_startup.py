"""Start-up: in-process under 100 ms, warren-server under 500 ms, --help without the engine.

Times are the best of a few runs, so that a busy CI machine does not fail
the test while an accidental heavy import still does.
tests/benchmarks/startup.py reports medians and p95.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from warren.broker.testkit import run_broker

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))

from startup import fresh_process  # noqa: E402


def test_in_process_start_is_under_100_ms() -> None:
    times = []
    for _ in range(5):
        started = time.perf_counter()
        with run_broker() as b, socket.create_connection((b.host, b.port), timeout=1):
            times.append(time.perf_counter() - started)
    assert min(times) < 0.1, times


def test_warren_server_answers_amqp_within_500_ms(tmp_path: Path) -> None:
    config = tmp_path / "rabbitmq.conf"
    config.write_text(
        f"management.tcp.port = none\nprometheus.tcp.port = none\ndata_dir = {tmp_path}/data\n"
    )
    measure = fresh_process([str(Path(sys.executable).parent / "warren-server")], str(config))
    times = [measure() for _ in range(3)]
    assert min(times) < 0.5, times


def test_help_and_config_errors_do_not_load_the_engine(tmp_path: Path) -> None:
    bad = tmp_path / "bad.conf"
    bad.write_text("heartbeat = often\n")
    code = (
        "import sys\n"
        "from warren.broker.__main__ import main\n"
        f"status = main(['--config', {str(bad)!r}])\n"
        "mods = ('warren.broker.server', 'structlog', 'uvloop')\n"
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
    assert "warren-server: cannot listen" in out.stderr


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
