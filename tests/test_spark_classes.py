"""Spark's class archive: what is archived, and that a missing or foreign one is harmless."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from txstream.connectors import spark, spark_driver
from txstream.connectors.spark_classes import class_names

LOG = "\n".join(
    "[0.1s][info][class,load] " + line
    for line in [
        "java.lang.Object source: shared objects file",
        "java.sql.Date source: jrt:/java.sql",
        "org.apache.spark.SparkConf source: file:/v/pyspark/jars/spark-core_2.12-3.5.7.jar",
        "org.apache.spark.SparkConf$$Lambda$12/0x0000000800c0b000 source: org.apache.spark.Conf",
        "org.apache.spark.GeneratedClass source: __JVM_DefineClass__",
        "org.apache.spark.Foo$$Lambda$1/0x1 source: file:/v/x.jar",
    ]
)


def test_class_names_keeps_what_the_jvms_own_loaders_load():
    assert class_names(LOG) == {
        "java/lang/Object",
        "java/sql/Date",
        "org/apache/spark/SparkConf",
    }


def test_no_archive_no_flag(monkeypatch, tmp_path):
    monkeypatch.setattr(spark_driver, "CLASS_ARCHIVE", tmp_path / "missing.jsa")
    assert spark_driver._archive_flags() == []
    (tmp_path / "missing.jsa").write_bytes(b"")
    assert spark_driver._archive_flags() == [f"-XX:SharedArchiveFile={tmp_path / 'missing.jsa'}"]


@pytest.mark.skipif(shutil.which("java") is None, reason="no java")
@pytest.mark.parametrize("content", [b"", b"not an archive" * 100])
def test_a_broken_archive_is_ignored(tmp_path, content):
    """A JVM given an archive it cannot map starts as without one, and says nothing."""
    archive = tmp_path / "broken.jsa"
    archive.write_bytes(content)
    run = subprocess.run(
        ["java", f"-XX:SharedArchiveFile={archive}", "-cp", str(tmp_path), "-version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0
    assert "archive" not in (run.stdout + run.stderr).lower()


def test_the_class_path_is_the_one_raydp_gives_its_app_master():
    """The class archive is made for it, and Java workers get it from the job's options."""
    from raydp.spark.ray_cluster_master import RayDPSparkMaster

    master = RayDPSparkMaster.__ray_metadata__.modified_class
    bare = master.__new__(master)
    bare._configs = {}
    class_path = os.pathsep.join(bare._prepare_jvm_classpath())
    assert spark_driver.spark_class_path() == class_path
    options = spark.ray_job_config(["-Dx=1"]).jvm_options
    assert options[options.index("-cp") + 1] == class_path
    assert options[-1] == "-Dx=1"


def test_the_driver_gets_the_configs_raydp_gives_it():
    """Without RayDP's app master actor, the driver's configs are RayDP's all the same."""
    from raydp.spark.ray_cluster import SparkCluster

    base = {
        "spark.log4j.config.file.name": "/x/log4j2.properties",
        "spark.driver.extraJavaOptions": "-Da=1",
        "spark.local.dir": "/y",
    }
    cluster = SparkCluster.__new__(SparkCluster)
    cluster._num_executors, cluster._executor_cores = 1, 2
    cluster._executor_memory, cluster._configs = "1g", dict(base)
    cluster._prepare_spark_configs()
    assert spark._driver_configs(base, 2, "1g") == cluster._configs
