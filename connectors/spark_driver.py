"""Spark's JVMs on Ray: the flags every one gets, the driver's configs, and the driver's
launch (pyspark's gateway) and end.

Light on purpose (the standard library, and pyspark once a driver is launched): `txstream
run` launches Spark's driver from here before it imports the engine (`launch_early`). A
Spark run's start-up is CPU-bound on two cores but for its first ~0.7 s, when one Python
thread imports numba, Ray and Arrow and plans the run while the other core idles; the
driver's JVM boots there instead of beside Ray's and the app master's (docs/performance.md).
`txstream.connectors.spark.spark_session` then takes that driver (`take_early`) and creates
its Spark session on it.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from txstream.cluster.ray_runtime import INSTALLATION_FILES
from txstream.cluster.scratch import private_dir, remove_tree
from txstream.connectors import spark_private
from txstream.errors import UsageError

_OPENED_PACKAGES = """
    java.lang java.lang.invoke java.lang.reflect java.io java.net java.nio java.math java.text
    java.time java.util java.util.concurrent java.util.concurrent.atomic java.util.regex
    java.security jdk.internal.misc jdk.internal.ref sun.nio.ch sun.nio.cs sun.security.action
    sun.util.calendar
""".split()

JVM_OPTIONS: tuple[str, ...] = tuple(
    f"--add-opens=java.base/{package}=ALL-UNNAMED" for package in _OPENED_PACKAGES
)
"""Flags every JVM of Spark-on-Ray needs on Java 17, else `InaccessibleObjectException`."""
NO_PERF_DATA = "-XX:-UsePerfData"
"""No /tmp/hsperfdata_<user>/<pid> file (left behind by a JVM that is killed, and by a class
archive's dump)."""
_QUICK_JIT = "-XX:TieredStopAtLevel=1"
"""JIT with C1 only: a run's JVMs live for one run, and C2's compiler threads would take
the cores from everything else while they start, with no gain in the conversion's speed
that a single run could collect."""

_NO_LOG4J_JMX = "-Dlog4j2.disable.jmx=true"
"""log4j2 does not register its MBeans, for which it creates the platform's MBean server
as it configures itself, in each JVM: a cost on the way to the first converted chunk
that nothing in txstream uses."""

CLASS_ARCHIVE = INSTALLATION_FILES / "spark-classes.jsa"
"""The class data sharing archive of Spark's JVMs, in this installation's prefix (the
virtualenv): ``./setup`` makes it (`txstream.connectors.spark_classes`)."""


def _archive_flags() -> list[str]:
    """Map the class archive if this installation has one. A JVM checks it against its
    class path, jars and Java build, and ignores one that does not match, silently."""
    return [f"-XX:SharedArchiveFile={CLASS_ARCHIVE}"] if CLASS_ARCHIVE.is_file() else []


def jvm_flags() -> list[str]:
    """The flags of every JVM of Spark on Ray: those Java 17 needs, no perf data, C1 only,
    no log4j2 MBeans, and the class archive."""
    return [*JVM_OPTIONS, NO_PERF_DATA, _QUICK_JIT, _NO_LOG4J_JMX, *_archive_flags()]


def java_available() -> str | None:
    """Say why Spark cannot start here, or None when Java 17+ is usable.

    RayDP's app master runs `java` from PATH and spark-submit prefers `$JAVA_HOME/bin/java`,
    so both must be Java 17 or newer.
    """
    javas = {"on PATH": shutil.which("java")}
    if os.environ.get("JAVA_HOME"):
        javas["in $JAVA_HOME"] = os.path.join(os.environ["JAVA_HOME"], "bin", "java")
    for where, java in javas.items():
        major = _java_major(java) if java else None
        if major is None or major < 17:
            found = "no working java" if major is None else f"Java {major}"
            return (
                f"Spark input needs Java 17 or newer, found {found} {where}; install it "
                "(Debian/Ubuntu: apt-get install openjdk-17-jre-headless)"
            )
    return None


def _java_major(java: str) -> int | None:
    """The major version of a `java` (8 for "1.8.0_392"): from its installation's
    `release` file, else from `java -version` (a JVM start, ~0.5 s); None if it fails."""
    release = Path(os.path.realpath(java)).parent.parent / "release"
    try:
        found = re.search(r'^JAVA_VERSION="(\d+)(?:\.(\d+))?', release.read_text(), re.M)
    except OSError:
        found = None
    if found is None:
        try:
            run = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
        found = re.search(r'version "(\d+)(?:\.(\d+))?', run.stderr)
    if not found:
        return None
    return int(found[2] or 0) if found[1] == "1" else int(found[1])


def spark_class_path() -> str:
    """The class path of Spark's JVMs on Ray, as RayDP gives its app master (RayDP's jars,
    Spark's, Ray's; the class archive is made for it): found without importing RayDP,
    pyspark or Ray, so that it is known before Ray starts."""
    import glob
    from importlib.util import find_spec

    def jars(package: str, home: str | None = None) -> str:
        if home is None:
            spec = find_spec(package)
            if spec is None or not spec.submodule_search_locations:
                raise UsageError(f"Spark input needs the Python package {package}")
            home = list(spec.submodule_search_locations)[0]
        return os.path.abspath(os.path.join(home, "jars/*"))

    spark = jars("pyspark", os.environ.get("SPARK_HOME") or None)
    return ":".join([*glob.glob(jars("raydp")), spark, *glob.glob(jars("ray"))])


LOG4J_LEVELS = {"debug": "DEBUG", "info": "INFO", "warning": "WARN", "error": "ERROR"}
"""log4j's name of each log level of a run."""
_LOG4J_CONFIG = """\
status = error
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.follow = true
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss.SSS} %p %c{1}: %m%n%ex
rootLogger.level = LEVEL
rootLogger.appenderRef.console.ref = console
"""
"""A log4j2 configuration for the Spark driver: RayDP otherwise names a file that does not
exist, and log4j2 says so on stdout. The console follows stderr: RayDP's agent points
stderr at a file of its own while log4j2 first configures itself, then closes it (pyspark
then sets the level to WARN: the run's level is set once Spark runs, with `setLogLevel`)."""


def spark_configs(folder: Path, log_level: str, java_options: Sequence[str]) -> dict[str, str]:
    """The Spark configs of `spark_session`: every JVM's flags (`jvm_flags`, then
    ``java_options``), temporary files in
    ``folder``, the driver's log4j2 settings at ``log_level``, this interpreter for Python
    workers, no UI. RayDP's agent in the driver writes its log into ``folder`` too (by
    default, into the logs of whichever Ray session is the latest in /tmp/ray, not
    necessarily this one)."""
    log4j = folder / "log4j2.properties"
    log4j.write_text(_LOG4J_CONFIG.replace("LEVEL", LOG4J_LEVELS[log_level]))
    flags = " ".join([*jvm_flags(), f"-Djava.io.tmpdir={folder}", *java_options])
    python = os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    _launcher_without_perf_data()
    return {
        "spark.ray.raydp_app_master.extraJavaOptions": flags,
        "spark.executor.extraJavaOptions": flags,
        "spark.driver.extraJavaOptions": f"{flags} -Dray.logging.dir={folder}",
        "spark.local.dir": str(folder),
        "spark.log4j.config.file.name": str(log4j),
        "spark.pyspark.python": python,
        "spark.executorEnv.PYSPARK_PYTHON": python,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
    }


def _launcher_without_perf_data() -> None:
    """spark-submit first runs a JVM of its own, Spark's launcher, whose flags come from
    $SPARK_LAUNCHER_OPTS alone: without `-XX:-UsePerfData` there, it makes
    /tmp/hsperfdata_<user>, which outlives the run."""
    options = os.environ.get("SPARK_LAUNCHER_OPTS", "")
    if NO_PERF_DATA not in options.split():
        os.environ["SPARK_LAUNCHER_OPTS"] = f"{options} {NO_PERF_DATA}".strip()


def driver_configs(configs: dict[str, str]) -> dict[str, str]:
    """``configs`` with those RayDP gives Spark's driver JVM as it launches
    (`SparkCluster._prepare_spark_configs` of RayDP 1.6, whose module would import RayDP,
    and with it Ray Data: 0.3 s): RayDP's agent, its log4j settings and the class path of
    Spark's JVMs."""
    import glob

    class_path = spark_class_path()
    raydp_jars = os.path.dirname(class_path.split(":", 1)[0])
    agent = glob.glob(os.path.join(raydp_jars, "raydp-agent*.jar"))[0]
    configs = dict(configs)
    configs["spark.javaagent"] = agent
    configs["spark.ray.log4j.factory.class"] = "log4j2"
    configs.setdefault(
        "spark.log4j.config.file.name",
        os.environ.get("SPARK_LOG4J_CONFIG_FILE_NAME", "log4j2-default.properties"),
    )
    configs.setdefault(
        "spark.ray.log4j.config.file.name",
        os.environ.get("RAY_LOG4J_CONFIG_FILE_NAME", "log4j2.xml"),
    )
    if configs.get("spark.driver.extraClassPath"):
        class_path = f"{configs['spark.driver.extraClassPath']}:{class_path}"
    configs["spark.driver.extraClassPath"] = class_path
    agent_options = (
        f"-javaagent:{agent} -Dspark.ray.log4j.factory.class=log4j2 "
        f"-Dlog4j2.configurationFile={configs['spark.log4j.config.file.name']}"
    )
    driver_options = configs.get("spark.driver.extraJavaOptions", "")
    configs["spark.driver.extraJavaOptions"] = (
        f"{driver_options} {agent_options}" if driver_options else agent_options
    )
    return configs


class _EarlyDriver:
    """Spark's driver JVM launched on a thread before Ray starts (`launch_early`), its
    output held until a Spark session takes it (`take`), then passed on to what stderr is
    at that moment: a run's log, once the run has pointed stderr at it."""

    def __init__(self, log_level: str):
        import pyspark.java_gateway  # noqa: F401  (here: the thread then launches at once)

        self.folder = private_dir("spark")
        configs = driver_configs(spark_configs(self.folder, log_level, ()))
        self.failure: Exception | None = None
        self._output, write = os.pipe()
        self._held: list[bytes] = []
        self._target: int | None = None  # a copy of stderr, once taken
        self._ended = False  # the driver's output has ended
        self._lock = threading.Lock()
        self._launch = threading.Thread(target=self._launched, args=(configs, write), daemon=True)
        self._launch.start()
        threading.Thread(target=self._pass_output, daemon=True).start()

    def _launched(self, configs: dict[str, str], write: int) -> None:
        try:
            from pyspark import SparkConf

            conf = SparkConf(loadDefaults=False).setAll(list(configs.items()))
            spark_private.launch_driver_writing_to(conf, write)
        except Exception as exc:
            self.failure = exc
        finally:
            os.close(write)  # the JVM has its own: the output ends when it does

    def _pass_output(self) -> None:
        while data := os.read(self._output, 1 << 16):
            with self._lock:
                if self._target is None:
                    self._held.append(data)
                else:
                    _write_all(self._target, data)
        with self._lock:
            os.close(self._output)
            if self._target is not None:
                os.close(self._target)
            self._ended = True

    def take(self) -> Path | None:
        """Once launched: the folder of the driver's temporary files (the taker removes
        it), its output passed on to stderr from now on; None if the launch failed (its
        folder removed)."""
        self._launch.join()
        if self.failure is not None:
            log = logging.getLogger(__name__)
            log.debug("early launch of Spark's driver failed: %r", self.failure)
            remove_tree(self.folder)
            return None
        with self._lock:
            target = os.dup(2)
            for data in self._held:
                _write_all(target, data)
            self._held.clear()
            if self._ended:  # the driver's output has ended already
                os.close(target)
            else:
                self._target = target
        return self.folder

    def abandon(self) -> None:
        """Nobody took it: end the driver once launched, remove its folder."""
        self._launch.join()
        spark_private.end_driver()
        remove_tree(self.folder)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


_early: _EarlyDriver | None = None
"""The driver launched early in this process, until a Spark session takes it."""


def launch_early(log_level: str) -> None:
    """Launch Spark's driver JVM now, for a Spark session of this process to take
    (`take_early`; `abandon_early` if none will), unless Java is not usable, or this
    process already runs Ray or a Spark driver (whose session would be used instead)."""
    global _early
    if _early is not None or java_available() is not None:
        return
    if not spark_private.tested(spark_private.EARLY_DRIVER):
        return
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return
    if spark_private.driver_launched():
        return
    _early = _EarlyDriver(log_level)


def take_early() -> Path | None:
    """The folder of the driver launched early (`launch_early`), which the caller now owns
    (its Spark session runs on that driver); None if no driver was launched early or its
    launch failed."""
    global _early
    early, _early = _early, None
    return early.take() if early is not None else None


def abandon_early() -> None:
    """End the driver launched early if no Spark session took it (a run refused before
    Spark started), and remove its folder."""
    global _early
    early, _early = _early, None
    if early is not None:
        early.abandon()


def end_spark_driver() -> None:
    """End Spark's driver JVM (pyspark's gateway) if this process launched it, and wait
    until it has; one launched early that no session took too, with its folder. Left to
    itself a driver ends only after this process has (it watches its stdin), then runs
    Spark's shutdown hooks for ~0.5 s (deleting Spark's local dirs, which txstream's
    scratch folder removal has already done), holding this process's stdout and stderr
    meanwhile: a pipeline waited for it, and its last log lines came after the command's
    end. For a process that ends now (`txstream run`): a Spark of a later run in the same
    process would have to launch its driver again."""
    abandon_early()
    spark_private.end_driver()
