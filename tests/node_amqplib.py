"""amqplib (Node.js, from npm) for tests that need the real client.

The package is installed once per machine with npm into a cache directory (the system's
temporary directory unless ``WARREN_NODE_CACHE`` names another) and reused; the scripts
that drive it are in ``tests/node/``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

AMQPLIB_VERSION = "2.3.1"
SCRIPTS = Path(__file__).resolve().parent / "node"
INSTALL_TIMEOUT = 300.0  # seconds; npm's registry is the only thing this waits for


def amqplib_modules() -> Path:
    """The ``node_modules`` directory holding amqplib, installed on first use."""
    cache = Path(os.environ.get("WARREN_NODE_CACHE") or tempfile.gettempdir())
    target = cache / f"warren-amqplib-{AMQPLIB_VERSION}"
    modules = target / "node_modules"
    if (modules / "amqplib" / "package.json").exists():
        return modules
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"warren-amqplib-{AMQPLIB_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be installing it
        if not (modules / "amqplib" / "package.json").exists():
            staging = Path(tempfile.mkdtemp(prefix="warren-amqplib-", dir=cache))
            try:
                subprocess.run(
                    ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error",
                     "--prefix", str(staging), f"amqplib@{AMQPLIB_VERSION}"],
                    check=True, capture_output=True, timeout=INSTALL_TIMEOUT,
                )  # fmt: skip
                with contextlib.suppress(FileNotFoundError):
                    shutil.rmtree(target)
                staging.rename(target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    return modules


def run_script(name: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``tests/node/<name>`` with amqplib on its module path; the timeout is a failure."""
    env = dict(os.environ, NODE_PATH=str(amqplib_modules()))
    return subprocess.run(
        ["node", str(SCRIPTS / name), *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
