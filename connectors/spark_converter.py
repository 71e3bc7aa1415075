"""txstream's classes in Spark's JVMs: compiled once per installation (``./setup`` runs this,
and a Spark source does if the jar is missing).

`txstream.connectors.spark` converts a Parquet input with `ArrowColumns` (``java/``): the
scans' columnar batches copied into Arrow vectors column by column, instead of Spark's
row-by-row ``toArrowBatchRdd``; `RayChunks` hands every source's batches to its Python
consumer through Ray. The classes are compiled here into a jar in this installation's
prefix, with ``javac`` if there is one, else with Janino (in pyspark's jars: a Java runtime
has no compiler), and reach Spark's JVMs at run time (``ADD JAR``), so their class path,
and with it the class archive (`txstream.connectors.spark_classes`), stays the same.

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
_MANIFEST = "Manifest-Version: 1.0\r\n\r\n"


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


def main() -> int:
    """Compile the classes; 1 if they could not be compiled (the first Spark source tries
    again)."""
    begin = time.perf_counter()
    try:
        path = build()
    except Exception as exc:  # ./setup goes on: only Spark sources need the jar
        print(f"txstream's Spark classes not compiled: {exc}", file=sys.stderr)
        return 1
    print(f"txstream's Spark classes: {path} ({time.perf_counter() - begin:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
