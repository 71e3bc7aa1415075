"""The class archive of Spark's JVMs: made once per installation (``./setup`` runs this module).

A Spark application on Ray runs four fresh JVMs (RayDP's app master and its Ray actor, the
Spark driver, the executor), and much of their start is loading classes: ~12,000 distinct
ones from the JDK and Spark's, RayDP's and Ray's jars, ~24,000 loads in all for a 1M-event
read. All four
have the same class path (RayDP's jars, then Spark's, then Ray's; the driver adds Spark's
conf folder after them), so one class data sharing archive serves them all: its classes are
mapped already parsed instead of being read from the jars, which shortens Spark's start,
the planning of the input and the first converted partition alike.

It is made in two steps: a small Spark read whose JVMs log every class they load
(``-Xlog:class+load``), then ``java -Xshare:dump`` over those classes, with the class path
those JVMs had. `txstream.connectors.spark_driver` gives every Spark JVM
``-XX:SharedArchiveFile`` when the archive exists (`CLASS_ARCHIVE
<txstream.connectors.spark_driver.CLASS_ARCHIVE>`). The JVM checks it against its own
class path, jars and Java build: an archive that does not match (a jar or Java updated, a
class path that differs) is ignored without a word, and classes load as without it.

    python -m txstream.connectors.spark_classes [--check]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from txstream.cluster.scratch import written_whole
from txstream.connectors.spark import SparkSource, ray_for_spark, spark_session
from txstream.connectors.spark_driver import CLASS_ARCHIVE as ARCHIVE
from txstream.connectors.spark_driver import NO_PERF_DATA, spark_class_path
from txstream.topologies.generators import WorkloadSpec, generate, write_workload

CLASS_PATH = ARCHIVE.with_suffix(".classpath")
"""The class path the archive was made for (to check it later)."""
LOG = ARCHIVE.with_suffix(".log")
"""What Ray, Spark and the JVMs printed while the archive was made."""

_EVENTS = 300_000
"""Events of the training read: enough for three partitions and the JIT's first tier."""
_LOADED = re.compile(r"\[class,load\] (\S+) source: (?:jrt:/|shared objects file|file:.*\.jar)")
"""A class the JVM's own loaders loaded (boot, platform, application): what CDS archives."""
_DUMP_TIMEOUT_S = 600


def usable() -> bool:
    """Whether the archive exists and the `java` on PATH maps it for its class path."""
    if not ARCHIVE.is_file() or not CLASS_PATH.is_file():
        return False
    java = shutil.which("java")
    if java is None:
        return False
    check = [
        *(java, "-Xshare:on", NO_PERF_DATA, f"-XX:SharedArchiveFile={ARCHIVE}"),
        *("-cp", CLASS_PATH.read_text()),
    ]
    try:
        return subprocess.run([*check, "-version"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def build() -> Path:
    """Make the archive (replacing any): a small Spark read that logs its classes, then the
    dump. Starts its own Ray and Spark; ~1 minute on 2 cores."""
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("no java on PATH")
    with tempfile.TemporaryDirectory(prefix="txs-classes-") as tmp:
        folder = Path(tmp)
        classes, class_path = _train(folder)
        listing = folder / "classes.txt"
        listing.write_text("".join(f"{name}\n" for name in sorted(classes)))
        ARCHIVE.parent.mkdir(parents=True, exist_ok=True)
        with written_whole(ARCHIVE) as partial:
            dump = [
                java,
                "-Xshare:dump",
                NO_PERF_DATA,  # the dump ends without removing /tmp/hsperfdata_<user>/<pid>
                f"-XX:SharedClassListFile={listing}",
                f"-XX:SharedArchiveFile={partial}",
                "-Xlog:cds=error",
                "-cp",
                class_path,
            ]
            done = subprocess.run(dump, capture_output=True, text=True, timeout=_DUMP_TIMEOUT_S)
            if done.returncode or not partial.is_file():
                raise RuntimeError(f"java -Xshare:dump failed: {done.stderr.strip()[-500:]}")
        CLASS_PATH.write_text(class_path)
    return ARCHIVE


def _train(folder: Path) -> tuple[set[str], str]:
    """Classes that Spark's JVMs load for a small read (names with slashes) and the class
    path they ran with."""
    events, init = generate("sl", WorkloadSpec(events=_EVENTS))
    write_workload(folder / "input", events, init)
    logs = folder / "logs"
    logs.mkdir()
    log_flag = f"-Xlog:class+load=info:file={logs}/%p.log"
    with ray_for_spark(java_options=[log_flag]), spark_session(java_options=[log_flag]):
        class_path = spark_class_path()
        with SparkSource(folder / "input" / "events.parquet", partition_rows=1 << 17) as source:
            for _batch in source.iter_batches(1 << 16):
                pass
    time.sleep(1)  # the JVMs' logs are complete once they have stopped
    classes = set().union(
        *(class_names(log.read_text(errors="replace")) for log in logs.glob("*.log"))
    )
    if not classes:
        raise RuntimeError("Spark's JVMs logged no classes")
    return classes, class_path


def class_names(log: str) -> set[str]:
    """The classes of a ``-Xlog:class+load`` log that an archive can hold (those the JVM's
    own loaders loaded from its image, its archive or a jar; not those generated at run
    time), as a class list names them (``java/lang/Object``)."""
    names = set()
    for found in _LOADED.finditer(log):
        if "$$Lambda" not in found[1]:
            names.add(found[1].replace(".", "/"))
    return names


@contextmanager
def _output_to(log: Path) -> Iterator[None]:
    """File descriptors 1 and 2 (this process's and its children's output) into ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with log.open("w") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def main() -> int:
    """Make the archive (``--check``: unless usable); 1 if it could not be made."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="make it only if missing or no longer usable"
    )
    args = parser.parse_args()
    if args.check and usable():
        print(f"Spark's class archive is usable: {ARCHIVE}")
        return 0
    os.environ.pop("RAY_ADDRESS", None)  # the archive is this machine's: a local Ray
    begin = time.perf_counter()
    try:
        with _output_to(LOG):
            path = build()
    except Exception as exc:  # optional: Spark works without it, only starts slower
        print(f"no class archive for Spark's JVMs: {exc} (see {LOG})", file=sys.stderr)
        return 1
    size = path.stat().st_size / 2**20
    print(f"Spark's class archive: {path} ({size:.0f} MiB, {time.perf_counter() - begin:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
