"""warren.broker.testkit.run_broker (sync and async) and the pytest plugin's fixtures.

The plugin is exercised the way a user meets it: pytest runs in a separate
process on a project of its own, finding the fixtures through the
``pytest11`` entry point; the last test installs the built wheel into a
fresh virtualenv first.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import subprocess
import sys
import threading
import urllib.request
import venv
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pika
import pika.exceptions
import pytest

from warren.broker.testkit import QueueDepth, RunningBroker, run_broker, run_broker_async
from warren.config import Listener, Settings

ROOT = Path(__file__).resolve().parent.parent

pytest_plugins = ["pytester"]


def broker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "warren-broker"]


@pytest.fixture
def running() -> Iterator[RunningBroker]:
    with run_broker() as broker:
        yield broker


# --------------------------------------------------------------------------
# run_broker in a thread


def test_run_broker_serves_pika_and_reports_queue_depth(running: RunningBroker) -> None:
    assert running.host == "127.0.0.1"
    assert running.url == f"amqp://guest:guest@127.0.0.1:{running.port}/"
    assert running.management_url is None  # off unless asked for
    conn = pika.BlockingConnection(pika.URLParameters(running.url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("work", durable=True)
        for i in range(3):
            ch.basic_publish("", "work", b"job %d" % i)
        assert running.queue_depth("work") == 3
        method, _, body = ch.basic_get("work")
        assert body == b"job 0"
        assert running.queue_counts("work") == QueueDepth(ready=2, unacked=1)
        assert running.queue_counts("work").total == 3
        assert method is not None
        ch.basic_ack(method.delivery_tag)
        conn.process_data_events(0)
        assert running.queues() == {"work": QueueDepth(2, 0)}
    finally:
        conn.close()
    with pytest.raises(KeyError, match="no queue 'missing' in vhost '/'"):
        running.queue_depth("missing")


def test_run_broker_defaults_keep_test_runs_apart() -> None:
    before = broker_threads()
    with run_broker() as one, run_broker() as two:
        assert one.port != two.port
        assert len(broker_threads()) == len(before) + 2
        for broker in (one, two):
            settings = broker.settings
            assert settings.listeners == (Listener("default", "127.0.0.1", 0),)
            assert settings.management_port is None
            assert settings.prometheus_port is None
            assert settings.data_dir is None  # nothing on disk
    assert broker_threads() == before


def test_run_broker_takes_settings_and_keywords(tmp_path: Path) -> None:
    base = Settings(default_user="app", default_pass="p@ss/word", heartbeat=7)
    with run_broker(base, frame_max=8192, data_dir=str(tmp_path)) as broker:
        assert (broker.settings.heartbeat, broker.settings.frame_max) == (7, 8192)
        assert broker.settings.data_dir == str(tmp_path)
        assert broker.url == f"amqp://app:p%40ss%2Fword@127.0.0.1:{broker.port}/"
        params = pika.URLParameters(broker.url)
        assert params.credentials.password == "p@ss/word"
        conn = pika.BlockingConnection(params)
        assert conn.is_open
        conn.close()
    assert tmp_path.is_dir()  # a data_dir given is the caller's: kept


@pytest.mark.parametrize("taken_by", ["listeners", "management_port"])
def test_run_broker_start_failure_is_raised_and_leaves_nothing_behind(taken_by: str) -> None:
    before = broker_threads()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        if taken_by == "listeners":
            runner = run_broker(listeners=(Listener("default", "127.0.0.1", port),))
        else:
            runner = run_broker(management_port=port)
        with pytest.raises(OSError), runner:
            pass
    assert broker_threads() == before


def test_call_runs_on_the_broker_loop(running: RunningBroker) -> None:
    def where() -> str:
        asyncio.get_running_loop()  # raises unless on a running loop
        return threading.current_thread().name

    assert running.call(where) == "warren-broker"
    assert running.call(lambda a, b: a + b, 2, 3) == 5


def test_restart_keeps_the_port_and_closes_connections(running: RunningBroker) -> None:
    port, url = running.port, running.url
    conn = pika.BlockingConnection(pika.URLParameters(url))
    conn.channel().queue_declare("before", durable=True)
    running.restart()
    assert running.port == port
    with pytest.raises(pika.exceptions.ConnectionClosed) as closed:
        conn.channel()
    assert closed.value.reply_code == 320
    again = pika.BlockingConnection(pika.URLParameters(url))
    assert again.is_open
    again.close()
    assert running.queues() == {}  # no data_dir: nothing survives


def test_restart_with_a_data_dir_keeps_durable_messages(tmp_path: Path) -> None:
    with run_broker(data_dir=str(tmp_path)) as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("durable", durable=True)
        ch.queue_declare("transient", exclusive=True)  # transient: gone after a restart
        persistent = pika.BasicProperties(delivery_mode=2)
        ch.basic_publish("", "durable", b"kept", persistent)
        ch.basic_publish("", "durable", b"lost")  # not persistent
        broker.restart()
        assert broker.queues() == {"durable": QueueDepth(1, 0)}
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        _, _, body = conn.channel().basic_get("durable", auto_ack=True)
        assert body == b"kept"
        conn.close()


def test_vhosts_isolate_queues(running: RunningBroker) -> None:
    other = running.add_vhost("tenant/a")
    assert other.vhost == "tenant/a"
    assert other.url == f"amqp://guest:guest@127.0.0.1:{running.port}/tenant%2Fa"
    conn = pika.BlockingConnection(pika.URLParameters(other.url))
    ch = conn.channel()
    ch.queue_declare("q", durable=True)
    ch.basic_publish("", "q", b"x")
    conn.process_data_events(0.05)
    assert other.queue_depth("q") == 1
    assert "q" not in running.queues()
    assert running.delete_vhost("tenant/a") is True
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        conn.process_data_events(2)  # deleting a vhost closes its connections
    assert closed.value.reply_code == 320
    assert other.queues() == {}


def test_management_and_prometheus_on_free_ports() -> None:
    with run_broker(management_port=0, prometheus_port=0) as broker:
        assert broker.settings.management_ip == "127.0.0.1"
        url = broker.management_url
        assert url is not None
        port = int(url.rsplit(":", 1)[1])
        assert url == f"http://guest:guest@127.0.0.1:{port}" and port != 15672
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/overview",
            headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 200
            assert "rabbitmq_version" in json.load(response)
        assert broker.prometheus_url is not None
        with urllib.request.urlopen(broker.prometheus_url, timeout=5) as response:
            assert response.status == 200
        broker.restart()  # the same ports again
        assert broker.management_url == url


# --------------------------------------------------------------------------
# run_broker on the current loop


async def test_run_broker_async_runs_on_this_loop() -> None:
    before = broker_threads()
    async with run_broker() as broker:
        assert broker_threads() == before
        assert broker.loop is asyncio.get_running_loop()
        connection = await aio_pika.connect(broker.url)
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue("jobs", durable=True)
            await channel.default_exchange.publish(aio_pika.Message(b"1"), routing_key="jobs")
            await channel.default_exchange.publish(aio_pika.Message(b"2"), routing_key="jobs")
            for _ in range(100):  # publishes are not confirmed: let the broker read them
                if broker.queue_depth("jobs") == 2:
                    break
                await asyncio.sleep(0.01)
            assert broker.queue_depth("jobs") == 2
            message = await queue.get()
            assert broker.queue_counts("jobs") == QueueDepth(1, 1)
            await message.ack()
        port = broker.port
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


async def test_run_broker_async_restart_and_vhost() -> None:
    async with run_broker_async(default_vhost="app") as broker:
        assert broker.vhost == "app"
        assert broker.url.endswith("/app")
        tenant = broker.add_vhost("t1")
        connection = await aio_pika.connect(tenant.url)
        await connection.close()
        port = broker.port
        await broker.restart_async()
        assert broker.port == port
        with pytest.raises(RuntimeError, match="restart_async"):
            broker.restart()
        connection = await aio_pika.connect(broker.url)
        await connection.close()


# --------------------------------------------------------------------------
# the plugin, run by pytest in a process of its own

# The README's example, verbatim: aio-pika against the fixture.
README_EXAMPLE = """
import aio_pika
import pytest


@pytest.mark.warren(clock="manual")
async def test_unpaid_order_expires_after_an_hour(warren_broker):
    async with await aio_pika.connect(warren_broker.url) as connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue("orders", durable=True, arguments={
            "x-message-ttl": 3_600_000, "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "expired-orders",
        })
        await channel.declare_queue("expired-orders", durable=True)
        await channel.default_exchange.publish(aio_pika.Message(b'{"id": 1}'), "orders")

        warren_broker.clock.advance(3600)  # the hour passes in about a millisecond
        assert warren_broker.outcome_names("orders") == ["dead-lettered"]
"""

PLUGIN_TESTS = """
import asyncio
import pathlib

import aio_pika
import pika
import pytest


def test_sync_client(warren_broker):
    conn = pika.BlockingConnection(pika.URLParameters(warren_broker.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("q", durable=True)
    ch.basic_publish("", "q", b"hello")
    assert warren_broker.queue_depth("q") == 1
    conn.close()


@pytest.mark.warren(max_message_size=1024, heartbeat=5)
def test_marker_changes_settings(warren_broker):
    assert warren_broker.settings.max_message_size == 1024
    assert warren_broker.settings.heartbeat == 5
    assert warren_broker.management_url is None


def test_transient_queue_refused_as_on_rabbitmq_4_3(warren_broker):
    ch = pika.BlockingConnection(pika.URLParameters(warren_broker.url)).channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as caught:
        ch.queue_declare("transient")
    assert caught.value.reply_code == 541


@pytest.mark.warren(deprecated_features_permit={"transient_nonexcl_queues": True})
def test_marker_permits_a_deprecated_feature(warren_broker):
    conn = pika.BlockingConnection(pika.URLParameters(warren_broker.url))
    conn.channel().queue_declare("transient")
    assert "transient" in warren_broker.queues()
    conn.close()


@pytest.mark.warren(record=False)
def test_marker_turns_recording_off(warren_broker):
    with pytest.raises(RuntimeError, match="does not record"):
        warren_broker.published()


@pytest.mark.parametrize("n", [1, 2])
async def test_session_vhosts_are_fresh(warren_broker_session, n):
    assert warren_broker_session.vhost != "/"
    assert warren_broker_session.queues() == {}
    connection = await aio_pika.connect(warren_broker_session.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue("shared-name", durable=True)
        for _ in range(n):
            await channel.default_exchange.publish(aio_pika.Message(b"x"), "shared-name")
    assert warren_broker_session.queue_depth("shared-name") == n


def test_one_broker_for_the_session(warren_broker_session, request):
    ports = request.config.stash.setdefault(PORTS, set())
    ports.add(warren_broker_session.port)
    assert len(ports) == 1


def test_one_broker_for_the_session_again(warren_broker_session, request):
    test_one_broker_for_the_session(warren_broker_session, request)


PORTS = pytest.StashKey()


@pytest.mark.warren(clock="manual")
def test_manual_clock_with_pika(warren_broker):
    conn = pika.BlockingConnection(pika.URLParameters(warren_broker.url))
    ch = conn.channel()
    ch.queue_declare("q", durable=True, arguments={"x-message-ttl": 60_000})
    ch.confirm_delivery()
    ch.basic_publish("", "q", b"m")
    warren_broker.clock.advance(60)
    assert [o.outcome for o in warren_broker.outcomes("q")] == ["expired"]
    conn.close()


def test_session_vhost_records_and_resets(warren_broker_session):
    conn = pika.BlockingConnection(pika.URLParameters(warren_broker_session.url))
    ch = conn.channel()
    ch.queue_declare("q", durable=True)
    ch.confirm_delivery()
    ch.basic_publish("", "q", b"m")
    assert [p.body for p in warren_broker_session.published()] == [b"m"]
    warren_broker_session.reset()
    assert warren_broker_session.queues() == {}
    assert warren_broker_session.published() == []
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
    )
    return pytester


def test_readme_example_is_the_one_tested() -> None:
    assert README_EXAMPLE.strip() in (ROOT / "README.md").read_text()


def test_plugin_fixtures_in_another_project(project: pytest.Pytester) -> None:
    project.makepyfile(test_readme=README_EXAMPLE, test_plugin=PLUGIN_TESTS)
    result = project.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=12)


def test_plugin_reads_its_ini_options(project: pytest.Pytester) -> None:
    project.makefile(
        ".conf",
        **{
            "etc/warren": (
                "default_user = app\n"
                "default_pass = s3cret\n"
                "consumer_timeout = 5000\n"
                "# the fixtures choose their own ports whatever the file says\n"
                "listeners.tcp.default = 5672\n"
                "management.tcp.port = 15672\n"
            )
        },
    )
    project.makeini(
        "[pytest]\n"
        "asyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
        "warren_config = etc/warren.conf\n"
        "warren_data_dir = var/warren\n"
        "warren_management = true\n"
    )
    project.makepyfile(
        """
        import pathlib

        import pika

        def test_options(warren_broker, warren_broker_session):
            s = warren_broker.settings
            assert (s.default_user, s.consumer_timeout) == ("app", 5000)
            assert warren_broker.port != 5672
            assert warren_broker.url.startswith("amqp://app:s3cret@127.0.0.1:")
            assert warren_broker_session.url.startswith("amqp://app:s3cret@127.0.0.1:")
            # management on a free port, on loopback
            assert (s.management_port, s.management_ip) == (0, "127.0.0.1")
            assert s.prometheus_port is None
            assert pathlib.Path(s.data_dir) == pathlib.Path("var/warren/test_options").resolve()
            assert pathlib.Path(s.data_dir).is_dir()

        def test_durable_across_restart(warren_broker):
            conn = pika.BlockingConnection(pika.URLParameters(warren_broker.url))
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare("jobs", durable=True)
            ch.basic_publish("", "jobs", b"1", pika.BasicProperties(delivery_mode=2))
            warren_broker.restart()
            assert warren_broker.queue_depth("jobs") == 1
        """
    )
    project.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_plugin_usage_errors(project: pytest.Pytester) -> None:
    project.makepyfile(
        """
        import pytest

        @pytest.mark.warren(heartbeat="often")
        def test_bad_value(warren_broker):
            pass

        @pytest.mark.warren(heartbeat=5)
        def test_marker_on_shared_broker(warren_broker_session):
            pass
        """
    )
    result = project.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(
        ["*warren: <overrides>: heartbeat = 'often': expected int*", "*warren_broker only*"]
    )


def test_plugin_does_not_import_the_broker_until_used(project: pytest.Pytester) -> None:
    project.makepyfile(
        """
        import sys

        def test_no_broker_imported(pytestconfig):
            assert pytestconfig.pluginmanager.has_plugin("warren")
            assert "warren.broker.server.shell" not in sys.modules
        """
    )
    project.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_installed_wheel_gives_the_fixture_to_another_project(tmp_path: Path) -> None:
    """What `pip install warren` gives a project: the fixtures, with no conftest or set-up."""
    wheels = tmp_path / "wheels"
    # pure: what is tested here is the entry point (tests/install_check.py builds compiled)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)],
        check=True,
        capture_output=True,
        env={**os.environ, "WARREN_NO_EXTENSIONS": "1"},
    )
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    (wheel,) = wheels.glob("warren-*.whl")
    # a PYTHONPATH to a checkout (with its warren.egg-info) makes pip think it is installed
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        env=env,
    )
    # the dependencies (pytest, aio-pika, ...) come from this virtualenv, after the wheel's
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    ours = subprocess.run(
        [sys.executable, "-c", "import aio_pika, os; print(os.path.dirname(aio_pika.__path__[0]))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(site, "test-deps.pth").write_text(ours + "\n")

    other = tmp_path / "other-project"
    other.mkdir()
    (other / "pyproject.toml").write_text('[tool.pytest.ini_options]\nasyncio_mode = "auto"\n')
    (other / "test_readme.py").write_text(README_EXAMPLE)
    # the test kit as a new user meets it: clock, published/outcomes, reset, in both fixtures
    (other / "test_plugin.py").write_text(PLUGIN_TESTS)
    # the project's own modules named like Warren's folders stay the project's
    for name in ("config", "broker", "protocol", "pipeline"):
        (other / f"{name}.py").write_text(f"OWNER = 'other-project:{name}'\n")
    (other / "test_where.py").write_text(
        "import broker, config, pipeline, protocol\n"
        "import warren, warren.broker.server.shell\n\n"
        "def test_warren_comes_from_the_wheel():\n"
        f"    assert warren.__file__.startswith({str(env_dir)!r})\n"
        f"    assert warren.broker.server.shell.__file__.startswith({str(env_dir)!r})\n\n"
        "def test_the_project_keeps_its_module_names(warren_broker):\n"
        "    for module in (broker, config, pipeline, protocol):\n"
        "        assert module.OWNER == 'other-project:' + module.__name__\n"
    )
    result = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=other,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "14 passed" in result.stdout
    # nothing but the one package (and its metadata) lands at the top of site-packages
    mine = {p.name for p in Path(site).iterdir()} - {"test-deps.pth", "_virtualenv.pth"}
    assert {n for n in mine if not n.startswith(("warren", "__pycache__"))} == set(), mine


def test_warren_reports_gives_the_report_of_a_failing_test(project: pytest.Pytester) -> None:
    """--warren-reports: a trace per test, and for the failing one only a report, made by
    warren-report (Spark) after the run and named in the terminal summary."""
    project.makepyfile(
        test_two="""
        import pika

        def _publish(broker, n):
            conn = pika.BlockingConnection(pika.URLParameters(broker.url))
            ch = conn.channel()
            ch.queue_declare("jobs", durable=True)
            for i in range(n):
                ch.basic_publish("", "jobs", b"x")
            conn.close()

        def test_passes(warren_broker):
            _publish(warren_broker, 1)

        def test_fails(warren_broker):
            _publish(warren_broker, 3)
            assert warren_broker.queue_depth("jobs") == 0
        """
    )
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "--warren-reports", "reports")
    result.assert_outcomes(passed=1, failed=1)
    base = project.path / "reports"
    failed = base / "test_two.py_test_fails"
    result.stdout.fnmatch_lines(
        [
            "*warren reports of failed tests*",
            f"test_two.py::test_fails: {failed}/report/report.html",
        ]
    )
    assert "test_passes:" not in result.stdout.str()
    assert list((base / "test_two.py_test_passes" / "trace").glob("warren-trace-*"))
    assert not (base / "test_two.py_test_passes" / "report").exists()
    from warren.pipeline import report

    tables = report.read_tables(str(failed / "report"))
    assert tables["summary"][0]["published"] == 3
    (jobs,) = report.queue_rows(tables)
    assert (jobs["queue"], jobs["published"], jobs["ready"]) == ("jobs", 3, 3)
