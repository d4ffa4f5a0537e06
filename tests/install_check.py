"""Warren installed as a user installs it, each into a fresh venv: `make test-install`.

Not part of `make test` (the file name keeps pytest from collecting it there): every case
compiles the message path or installs Warren's dependencies from the index, minutes in all.
docs/building.md has what it measured.

- ``pip install <checkout>``: compiled, ``warren-server --version`` names the modules;
- ``WARREN_NO_EXTENSIONS=1``: pure Python, and it serves clients;
- a C compiler that fails: the install still succeeds, pure, with one line saying so;
- ``pip wheel``, then the wheel installed where no compiler can run: compiled.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import venv
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pika
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The working tree without its build products: pip builds in the tree it is given."""
    copy = tmp_path / "checkout"
    junk = shutil.ignore_patterns(".git", ".venv", "build", "dist", "data", "*.egg-info")
    shutil.copytree(ROOT, copy, symlinks=True, ignore=junk)
    return copy


def fresh_venv(where: Path) -> Path:
    venv.EnvBuilder(with_pip=True).create(where)
    return where / "bin"


def pip(bin_dir: Path, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(bin_dir / "pip"), "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def version(bin_dir: Path) -> str:
    out = subprocess.run(
        [str(bin_dir / "warren-server"), "--version"], capture_output=True, text=True, cwd="/"
    )
    return out.stdout


@contextmanager
def serving(bin_dir: Path, tmp: Path) -> Iterator[int]:
    """warren-server from that venv (run from /, so the checkout is not on its path)."""
    config = tmp / "rabbitmq.conf"
    config.write_text("")
    server = subprocess.Popen(
        [str(bin_dir / "warren-server"), "--port", "0", "--bind", "127.0.0.1",
         "--management-port", "none", "--prometheus-port", "none", "--data-dir", str(tmp / "d")],
        cwd="/", env={**os.environ, "RABBITMQ_CONFIG_FILE": str(config), "PYTHONPATH": ""},
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stderr is not None
        port = 0
        while not port:
            line = server.stderr.readline()
            assert line, "the server exited"
            found = re.search(r"\bready\b.*address=\S*:(\d+)", line)
            if found:
                port = int(found[1])
        yield port
    finally:
        server.terminate()
        server.wait(timeout=10)


def round_trip(port: int) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.queue_declare("install-check", durable=True)
    ch.confirm_delivery()
    ch.basic_publish("", "install-check", b"hello")
    _, _, body = ch.basic_get("install-check", auto_ack=True)
    assert body == b"hello"
    conn.close()


def test_pip_install_of_the_checkout_is_compiled(tmp_path: Path, checkout: Path) -> None:
    bin_dir = fresh_venv(tmp_path / "venv")
    pip(bin_dir, "install", str(checkout))
    out = version(bin_dir)
    assert "compiled with mypyc: " in out and "broker.engine.channel" in out, out
    with serving(bin_dir, tmp_path) as port:
        round_trip(port)


def test_warren_no_extensions_installs_pure_python_that_serves(
    tmp_path: Path, checkout: Path
) -> None:
    bin_dir = fresh_venv(tmp_path / "venv")
    pip(bin_dir, "install", str(checkout), env={"WARREN_NO_EXTENSIONS": "1"})
    assert "(pure Python)" in version(bin_dir)
    with serving(bin_dir, tmp_path) as port:
        round_trip(port)


def test_a_failing_compiler_falls_back_to_pure_python_and_says_so(
    tmp_path: Path, checkout: Path
) -> None:
    bin_dir = fresh_venv(tmp_path / "venv")
    out = pip(bin_dir, "install", "-v", str(checkout), env={"CC": "false", "LDSHARED": "false"})
    assert "warren: building pure Python" in out
    assert "(pure Python)" in version(bin_dir)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    builder = fresh_venv(tmp_path_factory.mktemp("builder"))
    source = tmp_path_factory.mktemp("source") / "warren"
    junk = shutil.ignore_patterns(".git", ".venv", "build", "dist", "data", "*.egg-info")
    shutil.copytree(ROOT, source, symlinks=True, ignore=junk)
    pip(builder, "wheel", "--no-deps", "-w", str(dist), str(source))
    (found,) = dist.glob("warren-*.whl")
    assert sys.implementation.cache_tag.replace("cpython-", "cp") in found.name  # a platform wheel
    return found


def test_the_wheel_runs_compiled_where_no_compiler_can_run(wheel: Path, tmp_path: Path) -> None:
    bin_dir = fresh_venv(tmp_path / "venv")
    pip(bin_dir, "install", str(wheel), env={"CC": "false", "LDSHARED": "false"})
    out = version(bin_dir)
    assert "compiled with mypyc: " in out, out
    with serving(bin_dir, tmp_path) as port:
        round_trip(port)
