"""Warren's pytest plugin (entry point ``pytest11``): an AMQP broker per test, no set-up.

Fixtures:

* ``warren_broker``: a broker of its own for each test, on 127.0.0.1 and a
  free port; ``.url``, ``.port``, ``.management_url``, ``.queue_depth(name)``,
  ``.queue_counts(name)``, ``.queues()``, ``.restart()``, ``.call(fn, ...)``,
  and the test kit (docs/test-kit.md): ``.clock``, ``.published()``,
  ``.outcomes(queue)``, ``.reset()``, ``.wait_for(predicate)``.
  ``@pytest.mark.warren(**settings)`` changes its settings for one test
  (``deprecated_features_permit={"global_qos": True}`` for RabbitMQ 3.x's behaviour;
  ``clock="manual"``: broker time moves only with ``.clock.advance(seconds)``;
  ``record=False``: nothing is recorded, for tests that push many messages).
* ``warren_broker_session``: one broker for the whole session, and a fresh
  vhost for each test (deleted afterwards); the same attributes, with
  ``.url`` and the queue helpers pointing at that vhost.

Options (``pytest.ini`` / ``[tool.pytest.ini_options]``, paths relative to
that file):

* ``warren_config``: a rabbitmq.conf to start from (the fixtures still
  choose the ports and data_dir, and the ``RABBITMQ_*`` environment is
  not read, so that a developer's shell cannot change the tests);
* ``warren_data_dir``: keep durable queues and messages on disk there, in
  a fresh subdirectory per test, so that they survive ``.restart()``
  (default: nothing is written to disk);
* ``warren_management``: also serve the management API on a free port.

Command-line option ``--warren-reports DIR`` (opt-in): each ``warren_broker``
writes its lifecycle trace to ``DIR/<test>/trace``; at the end of the run one
``warren-report --serve`` session (Spark) makes ``DIR/<test>/report`` for each
test that failed, and the terminal summary prints each report's path
(docs/test-kit.md "A report per failing test").

Nothing here imports the broker until a fixture is used, so the plugin
costs nothing in test runs that do not use it.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from warren.broker.testkit import RunningBroker
    from warren.config import Settings


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "warren_config",
        "rabbitmq.conf for the warren_broker fixtures (relative to the ini file)",
        type="paths",
        default=[],
    )
    parser.addini(
        "warren_data_dir",
        "directory for the warren fixtures' durable data, a subdirectory per test "
        "(default: nothing is written to disk)",
        type="paths",
        default=[],
    )
    parser.addini(
        "warren_management",
        "serve Warren's management API on a free port (warren_broker.management_url)",
        type="bool",
        default=False,
    )
    parser.getgroup("warren").addoption(
        "--warren-reports",
        metavar="DIR",
        help="trace each warren_broker to DIR/<test>/trace and print the path of a "
        "warren-report for each failing test (needs warren[pipeline])",
    )


TRACE_DIR = pytest.StashKey[Path]()  # an item's trace directory (--warren-reports)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    trace = item.stash.get(TRACE_DIR, None)
    if trace is not None and report.when == "call":
        # on the report, not the config: pytest-xdist sends reports to the controller
        report.user_properties.append(("warren_trace", str(trace)))
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    traces = [str(v) for k, v in report.user_properties if k == "warren_trace"]
    if traces and report.failed and report.when == "call":
        _failed.append((report.nodeid, Path(traces[0])))


_failed: list[tuple[str, Path]] = []  # (nodeid, its trace) of failed tests, this run


def _reports(failed: list[tuple[str, Path]]) -> list[str]:
    """Reports of the failed tests' traces through one ``warren-report --serve``: a line
    per test, the report's path or why there is none."""
    import importlib.util

    lines = []
    # the pipeline extra (the subprocess would say the same, after a Python start)
    missing = [m for m in ("pyspark", "pyarrow", "matplotlib") if not importlib.util.find_spec(m)]
    if missing:
        for nodeid, trace in failed:
            lines.append(f"{nodeid}: trace {trace} (no report: needs {', '.join(missing)})")
        return lines
    requests = "".join(
        f"--trace {shlex.quote(str(trace))} --out {shlex.quote(str(trace.parent / 'report'))}\n"
        for _, trace in failed
    )
    answer = subprocess.run(
        [sys.executable, "-m", "warren.pipeline", "--serve"],
        input=requests,
        capture_output=True,
        text=True,
        check=False,
    )
    ends = [a for a in answer.stdout.splitlines() if a == "done" or a.startswith("error:")]
    for i, (nodeid, trace) in enumerate(failed):
        end = ends[i] if i < len(ends) else f"error: warren-report exited {answer.returncode}"
        if end == "done":
            lines.append(f"{nodeid}: {trace.parent / 'report' / 'report.html'}")
        else:
            lines.append(f"{nodeid}: trace {trace} (no report: {end[7:]})")
    return lines


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    failed, _failed[:] = list(_failed), []
    if failed:
        terminalreporter.section("warren reports of failed tests")
        for line in _reports(failed):
            terminalreporter.write_line(line)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "warren(**settings): config.Settings fields for this test's warren_broker, "
        "e.g. @pytest.mark.warren(consumer_timeout=500, clock='manual')",
    )


def _one_path(config: pytest.Config, name: str) -> Path | None:
    paths: list[Path] = config.getini(name)
    if len(paths) > 1:
        raise pytest.UsageError(f"{name}: expected one path, got {len(paths)}")
    return paths[0] if paths else None


def _safe(name: str) -> str:
    """A test name as a directory or vhost name: no slashes, brackets or spaces."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:60].strip("_.") or "test"


def _data_dir(config: pytest.Config, name: str) -> str | None:
    base = _one_path(config, "warren_data_dir")
    if base is None:
        return None
    path = base / name
    shutil.rmtree(path, ignore_errors=True)  # each run of a test starts empty
    path.mkdir(parents=True)
    return str(path)


def _changes(config: pytest.Config, **changes: Any) -> dict[str, Any]:
    """Settings changes for run_broker, checked as config/ checks overrides."""
    from warren.config import ConfigError, load_settings

    if config.getini("warren_management"):
        changes.setdefault("management_port", 0)
    permits = changes.get("deprecated_features_permit")
    if isinstance(permits, dict):  # @pytest.mark.warren(deprecated_features_permit={...})
        changes["deprecated_features_permit"] = tuple(permits.items())
    if changes.get("clock", "real") not in ("real", "manual"):
        raise pytest.UsageError(
            f"warren: clock: expected 'real' or 'manual', got {changes['clock']!r}"
        )
    try:
        load_settings(environ={}, overrides=changes)
    except ConfigError as exc:
        raise pytest.UsageError(f"warren: {exc}") from None
    return changes


@pytest.fixture(scope="session")
def warren_settings(pytestconfig: pytest.Config) -> Settings:
    """The settings the warren fixtures start from: ``warren_config`` or RabbitMQ's defaults."""
    from warren.config import ConfigError, load_settings

    path = _one_path(pytestconfig, "warren_config")
    try:
        # environ={}: a developer's RABBITMQ_* variables must not change the tests
        return load_settings(path, environ={}) if path else load_settings(environ={})
    except ConfigError as exc:
        raise pytest.UsageError(f"warren_config: {exc}") from None


@pytest.fixture
def warren_broker(
    request: pytest.FixtureRequest, warren_settings: Settings
) -> Iterator[RunningBroker]:
    """A broker of this test's own, started for it and stopped after it."""
    from warren.broker.testkit import run_broker

    marked: dict[str, Any] = {}
    # the closest marker wins: apply module/class markers first
    for marker in reversed(list(request.node.iter_markers("warren"))):
        if marker.args:
            raise pytest.UsageError("@pytest.mark.warren takes keyword arguments only")
        marked.update(marker.kwargs)
    data_dir = _data_dir(request.config, _safe(request.node.name))
    record = marked.pop("record", True)  # not a setting: the test kit's record (run_broker)
    reports = request.config.getoption("warren_reports")
    if reports is not None:
        trace = Path(reports).absolute() / _safe(request.node.nodeid) / "trace"
        shutil.rmtree(trace.parent, ignore_errors=True)  # each run of a test starts empty
        trace.mkdir(parents=True)
        request.node.stash[TRACE_DIR] = trace
        marked = {"trace_enabled": True, "trace_dir": str(trace), **marked}
    changes = _changes(request.config, **{"data_dir": data_dir, **marked})
    with run_broker(warren_settings, record=record, **changes) as broker:
        yield broker


@pytest.fixture(scope="session")
def _warren_session_broker(
    pytestconfig: pytest.Config, warren_settings: Settings
) -> Iterator[RunningBroker]:
    from warren.broker.testkit import run_broker

    data_dir = _data_dir(pytestconfig, "session")
    with run_broker(warren_settings, **_changes(pytestconfig, data_dir=data_dir)) as broker:
        yield broker


@pytest.fixture
def warren_broker_session(
    request: pytest.FixtureRequest, _warren_session_broker: RunningBroker
) -> Iterator[RunningBroker]:
    """The session's broker, seen through a vhost made for this test and deleted after it."""
    if request.node.get_closest_marker("warren") is not None:
        raise pytest.UsageError(
            "@pytest.mark.warren changes settings of warren_broker only; the session broker "
            "is shared (set warren_config instead)"
        )
    name = f"{_safe(request.node.name)[:40]}-{uuid.uuid4().hex[:8]}"
    view = _warren_session_broker.add_vhost(name)
    try:
        yield view
    finally:
        _warren_session_broker.delete_vhost(name)
