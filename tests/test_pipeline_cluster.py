"""warren-report on a Spark standalone cluster whose workers have nothing of Warren.

A master and one worker are started with pyspark's own ``spark-class`` on ephemeral ports.
The executors' Python is this venv's with ``-S`` and the site-packages on PYTHONPATH:
PySpark and pyarrow import there, Warren (an editable install, found through a .pth file
that ``-S`` skips) does not, so the job must ship its own package (job.package_zip).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from warren.pipeline import generate, report

# pip's pyspark is a Spark distribution too: bin/spark-class, jars/
SPARK_HOME = str(Path(sysconfig.get_paths()["purelib"]) / "pyspark")


class _Lines:
    """A process's output, read by a thread; wait() for a line matching a pattern."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self.changed = threading.Condition()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()
        with self.changed:
            self.lines.append("")  # the end
            self.changed.notify_all()

    def wait(self, pattern: str, timeout: float) -> re.Match[str]:
        found: list[re.Match[str]] = []

        def seen() -> bool:
            found[:] = [m for line in self.lines if (m := re.search(pattern, line))]
            return bool(found) or "" in self.lines

        with self.changed:
            self.changed.wait_for(seen, timeout)
        assert found, f"no {pattern!r} in:\n{''.join(self.lines)}"
        return found[0]


def _start(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], _Lines]:
    proc = subprocess.Popen(
        [f"{SPARK_HOME}/bin/spark-class", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    return proc, _Lines(proc.stdout)


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    env = {**os.environ, "SPARK_HOME": SPARK_HOME, "SPARK_LOCAL_IP": "127.0.0.1"}
    work = tmp_path_factory.mktemp("worker")
    started = []
    try:
        proc, out = _start(
            [
                "org.apache.spark.deploy.master.Master",
                *("--host", "127.0.0.1", "--port", "0", "--webui-port", "0"),
            ],
            env,
        )
        started.append(proc)
        url = out.wait(r"Starting Spark master at (spark://127\.0\.0\.1:\d+)", 300).group(1)
        proc, out = _start(
            [
                "org.apache.spark.deploy.worker.Worker",
                *("--host", "127.0.0.1", "--port", "0", "--webui-port", "0"),
                *("--cores", "1", "--memory", "1g", "--work-dir", str(work), url),
            ],
            env,
        )
        started.append(proc)
        out.wait(r"Successfully registered with master", 300)
        yield url
    finally:
        for proc in reversed(started):
            proc.terminate()
            proc.wait(60)


def _report(trace: Path, out: Path, env: dict[str, str], *master: str) -> str:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "warren.pipeline",
            "--trace",
            str(trace),
            "--out",
            str(out),
            *master,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=out.parent,  # not the repository: its warren/ folder is not on any path
        timeout=900,
    )
    return f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"


def _bare_python(tmp_path: Path, site: bool) -> str:
    """A Python without Warren: this venv's interpreter with -S (no .pth files), and its
    site-packages on PYTHONPATH if ``site`` (so with PySpark and pyarrow)."""
    path = tmp_path / ("python-site" if site else "python-bare")
    # Spark's own PYTHONPATH (its pyspark.zip) kept with site-packages, dropped without
    site_packages = sysconfig.get_paths()["purelib"]
    extra = f"PYTHONPATH={site_packages}:$PYTHONPATH " if site else "PYTHONPATH= "
    path.write_text(f'#!/bin/sh\n{extra}exec {sys.executable} -S "$@"\n')
    path.chmod(0o755)
    return str(path)


def test_a_cluster_without_warren_gives_local_modes_report(master: str, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    events = generate.generate(str(trace), 200, seed=5, per_file=400)
    assert len(list(trace.glob("warren-trace-*"))) > 1
    # no Warren in the executors' Python; tasks fail at once instead of being retried
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": _bare_python(tmp_path, site=True),
        "PYSPARK_SUBMIT_ARGS": "--conf spark.task.maxFailures=1 pyspark-shell",
    }
    cluster = _report(trace, tmp_path / "cluster", env, "--master", master)
    assert cluster.startswith("exit 0"), cluster
    local = _report(trace, tmp_path / "local", {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
    assert local.startswith("exit 0"), local
    on_cluster = report.read_tables(str(tmp_path / "cluster"))
    here = report.read_tables(str(tmp_path / "local"))
    assert on_cluster["summary"][0]["events"] == events
    assert set(on_cluster) == set(here)
    for name in here:
        assert on_cluster[name] == here[name], name

    # an executor whose Python lacks PySpark: one line, exit 2
    env["PYSPARK_PYTHON"] = _bare_python(tmp_path, site=False)
    failed = _report(trace, tmp_path / "bare", env, "--master", master)
    assert failed.startswith("exit 2"), failed
    line = (
        "warren-report: an executor's Python has no module 'pyspark': a worker needs "
        "pyspark and pyarrow installed (the job ships Warren itself)"
    )
    assert failed.splitlines().count(line) == 1, failed
