"""txstream's classes in Spark's JVMs: compiled once per installation (``./setup`` runs this,
and a Spark source does if the jar is missing).

`txstream.connectors.spark` converts a Parquet input with `ArrowColumns` (``java/``): the
scans' columnar batches copied into Arrow vectors column by column, instead of Spark's
row-by-row ``toArrowBatchRdd``; `RayChunks` hands every source's batches to its Python
consumer through Ray. The classes are compiled here into a jar in this installation's
prefix, with ``javac`` if there is one, else with Janino (in pyspark's jars: a Java runtime
has no compiler), and reach Spark's JVMs at run time (``ADD JAR``), so their class path,
and with it the class archive (`txstream.connectors.spark_classes`), stays the same. The
jar is also the Java agent that warms Spark's executor up as it starts (`Warmup`): it
converts `WARMUP_SAMPLE`, written here too.

    python -m txstream.connectors.spark_converter
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from txstream.cluster.ray_runtime import INSTALLATION_FILES
from txstream.cluster.scratch import written_whole

CONVERTER_CLASS = "txstream.spark.ArrowColumns"
CHUNKS_CLASS = "txstream.spark.RayChunks"
AGENT_CLASS = "txstream.spark.Warmup"
SOURCES = sorted((Path(__file__).parent / "java").glob("*.java"))


def _sources_digest() -> str:
    digest = hashlib.sha256()
    for source in SOURCES:
        digest.update(source.read_bytes())
    return digest.hexdigest()[:12]


CONVERTER_JAR = INSTALLATION_FILES / f"txstream-spark-{_sources_digest()}.jar"
"""The compiled converter, in this installation's prefix (the virtualenv), named after its
sources: where they changed since ``./setup``, the first Spark source compiles them again."""
_COMPILE_TIMEOUT_S = 300
_MANIFEST = f"Manifest-Version: 1.0\r\nPremain-Class: {AGENT_CLASS}\r\n\r\n"
"""The jar's manifest: it is a Java agent too."""

WARMUP_SAMPLE = INSTALLATION_FILES / "spark-warmup.parquet"
"""What Spark's executor converts as it starts (`Warmup`): 131,072 rows of the column types
events have, 64-bit integers most (unique and repeated), then 32-bit ones, floats with
nulls, strings and booleans, dictionary-encoded or plain, in 32 of Spark's batches."""
_WARMUP_ROWS = 1 << 17


def _spark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def _ray_jar() -> Path:
    """Ray's Java API, which Spark's executors (Ray actors under RayDP) run with."""
    import ray

    return Path(ray.__file__).parent / "jars" / "ray_dist.jar"


def _compile_command(out: Path) -> list[str]:
    """javac when this machine has a working one, else Janino's command line on ``java``."""
    jars = _spark_jars()
    class_path = os.pathsep.join([*map(str, sorted(jars.glob("*.jar"))), str(_ray_jar())])
    javac = shutil.which("javac")
    if javac and subprocess.run([javac, "-version"], capture_output=True).returncode == 0:
        return [javac, "-nowarn", "-encoding", "UTF-8", "-cp", class_path, "-d", str(out)]
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("no java on PATH")
    janino = os.pathsep.join(  # whichever version this pyspark ships
        str(jar) for name in ("janino", "commons-compiler") for jar in jars.glob(f"{name}-*.jar")
    )
    demo = "org.codehaus.commons.compiler.samples.CompilerDemo"  # Janino's javac
    return [
        java,
        "-cp",
        janino,
        demo,
        "-encoding",
        "UTF-8",
        "-classpath",
        class_path,
        "-d",
        str(out),
    ]


def build(target: Path = CONVERTER_JAR) -> Path:
    """Compile `SOURCES` into the jar ``target`` (replacing it)."""
    with tempfile.TemporaryDirectory(prefix="txs-converter-") as tmp:
        out = Path(tmp) / "classes"
        out.mkdir()
        command = [*_compile_command(out), *(str(source) for source in SOURCES)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=_COMPILE_TIMEOUT_S)
        classes = sorted(out.rglob("*.class"))
        if done.returncode or not classes:
            raise RuntimeError(f"{Path(command[0]).name} failed: {done.stderr.strip()[-500:]}")
        target.parent.mkdir(parents=True, exist_ok=True)
        with written_whole(target) as partial:
            with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as jar:
                jar.writestr("META-INF/MANIFEST.MF", _MANIFEST)
                for found in classes:
                    jar.write(found, found.relative_to(out).as_posix())
    return target


def write_warmup_sample(target: Path = WARMUP_SAMPLE) -> Path:
    """Write the executor's warm-up sample (`WARMUP_SAMPLE`) to ``target``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = np.arange(_WARMUP_ROWS)
    table = pa.table(
        {
            "id": rows,
            "key": rows * 7919 % 4096,
            "amount": rows * 31 % 1000,
            "total": rows * 2_654_435_761 % 2**40,
            "count": (rows % 100).astype(np.int32),
            "value": pa.array(rows / 8, mask=rows % 97 == 0),
            "kind": pa.array(["deposit", "transfer", "withdrawal"]).take(rows % 3),
            "flag": rows % 5 == 0,
        }
    )
    with written_whole(target) as partial:
        pq.write_table(table, partial, use_dictionary=["key", "amount", "count", "kind"])
    return target


def main() -> int:
    """Compile the classes and write the warm-up sample; 1 if the classes could not be
    compiled (the first Spark source tries again)."""
    begin = time.perf_counter()
    try:
        path = build()
    except Exception as exc:  # ./setup goes on: only Spark sources need the jar
        print(f"txstream's Spark classes not compiled: {exc}", file=sys.stderr)
        return 1
    write_warmup_sample()
    print(f"txstream's Spark classes: {path} ({time.perf_counter() - begin:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
