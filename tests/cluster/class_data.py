"""A class-data archive (AppCDS) of Spark's jars for the test cluster's short-lived JVMs.

    python -m tests.cluster.class_data ARCHIVE

Each spark-submit of the cluster tests starts three JVMs (the driver and an executor per worker) that
live about a minute, and loading and linking Spark's classes is a large share of their CPU. A dynamic
archive, written once at the exit of a JVM that ran a small job like theirs (a local Delta write and
read, a shuffle, an Arrow UDF, a Hive metastore in Derby), maps those classes ready-made instead. A
local session with a Delta write and a Hive table took 27.8 / 27.0 JVM CPU-seconds without it and
21.1 / 22.2 with it (benchmarks/RESULTS.md).

The JVM uses an archive only when its class path begins with the one it was written with, and refuses
any non-empty directory on that stretch: Spark puts SPARK_CONF_DIR (spark-defaults.conf, hive-site.xml)
ahead of its jars. So the drivers' and executors' `extraClassPath`, which Spark puts first, is the jars
directory itself: the conf directory comes after the archived part. A JVM that cannot use the archive
runs as before, without it.
"""

from __future__ import annotations

import fcntl
import hashlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from clickeval_spark.session import DELTA_CONF
from tests.cluster.standalone import JARS, REPO, spark_env
from tests.spark_settings import SHORT_LIVED_JVM


def shared_archive(folder: Path) -> Path | None:
    """The archive for this venv's Spark and these JVM options in ``folder``, written by the first test
    process that asks (the others wait on a lock); None, with a line saying why, if it cannot be written."""
    key = hashlib.sha256(f"{JARS}|{SHORT_LIVED_JVM}|{sys.version}".encode()).hexdigest()[:12]
    archive = folder / f"spark-classes-{key}.jsa"
    with open(folder / "class-data.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if archive.is_file():
            return archive
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(dir=folder) as work:
            partial = Path(work) / archive.name
            proc = subprocess.run([sys.executable, "-m", "tests.cluster.class_data", str(partial)], cwd=work,
                                  env=spark_env(PYTHONPATH=str(REPO), PYSPARK_PYTHON=sys.executable),
                                  capture_output=True, text=True, timeout=600)
            if proc.returncode != 0 or not partial.is_file():
                errors = [line for line in proc.stderr.splitlines() if " INFO " not in line]
                print(f"\n[cluster] no class-data archive (exit {proc.returncode}): the JVMs load every class",
                      *errors[-5:], sep="\n")
                return None
            partial.rename(archive)
        print(f"\n[cluster] class-data archive of Spark's jars: {archive.stat().st_size / 2**20:.0f} MiB "
              f"in {time.monotonic() - t0:.0f}s")
        return archive


def main(archive: str) -> None:
    """A small job of the kind the cluster tests run, in a JVM that writes ``archive`` as it exits."""
    from delta import configure_spark_with_delta_pip
    from pyspark.sql import SparkSession, functions as F

    work = Path.cwd()
    builder = (SparkSession.builder.master("local[2]").appName("class-data")
               .config(map={**DELTA_CONF, "spark.ui.enabled": "false", "spark.driver.extraClassPath": JARS,
                            "spark.driver.extraJavaOptions": f"{SHORT_LIVED_JVM} -XX:ArchiveClassesAtExit={archive}",
                            "spark.sql.warehouse.dir": str(work / "hive-warehouse"),
                            "spark.sql.catalogImplementation": "hive",
                            "spark.hadoop.javax.jdo.option.ConnectionURL":
                                f"jdbc:derby:;databaseName={work / 'metastore_db'};create=true"}))
    spark = configure_spark_with_delta_pip(builder).getOrCreate()
    table = str(work / "t")
    spark.range(1000).withColumn("g", F.col("id") % 7).write.format("delta").save(table)
    counts = spark.read.format("delta").load(table).groupBy("g").count()
    assert counts.mapInArrow(lambda batches: batches, counts.schema).count() == 7
    spark.sql("CREATE DATABASE IF NOT EXISTS class_data")
    spark.sql(f"CREATE TABLE class_data.t USING delta LOCATION '{table}'")
    assert spark.table("class_data.t").count() == 1000
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
