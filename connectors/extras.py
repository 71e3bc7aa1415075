"""Whether Spark is installed: pyspark and RayDP come with the ``spark`` extra
(``pip install 'txstream[spark]'``), and the core runs without them (Arrow and Parquet read
by pyarrow). Asking for Spark without it fails in one line that names the extra, before
anything starts; nothing here imports Spark."""

from __future__ import annotations

import importlib.util

from txstream.errors import UsageError

SPARK_EXTRA = "pip install 'txstream[spark]'"
"""What installs Spark for txstream: pyspark 3.5 with RayDP (Spark on Ray)."""


def spark_missing(*, on_ray: bool = True) -> list[str]:
    """The packages of the ``spark`` extra that cannot be imported here: pyspark and py4j,
    and RayDP too if txstream is to start Spark on Ray itself (``on_ray``); a user's own
    Spark session needs no RayDP."""
    names = ["pyspark", "py4j", *(["raydp"] if on_ray else [])]
    return [name for name in names if not _importable(name)]


def require_spark(what: str, *, on_ray: bool = True, instead: str | None = None) -> None:
    """`UsageError` in one line if ``what`` (e.g. ``"--source spark"``) cannot have the
    Spark it needs (see `spark_missing`), naming the extra and what to do ``instead``."""
    missing = spark_missing(on_ray=on_ray)
    if missing:
        raise UsageError(
            f"{what} needs Spark, which is not installed here ({', '.join(missing)} "
            f"missing): {SPARK_EXTRA}" + (f", or {instead}" if instead else "")
        )


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a module without spec
        return False
