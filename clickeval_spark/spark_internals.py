"""The one place for py4j and Spark's private attributes (`_jvm`, `_jsc`, `_jsparkSession`, `_jdf`, ...).

PySpark has no public API for what these functions do: the Hadoop FileSystem behind a path, the SQL
parser and session state, the RDD behind a checkpoint, the cluster's slot count, Spark's own hash. Each
is one small named function here, so the rest of the package reads as Spark's public API, and a Spark
upgrade that moves one of these attributes is fixed in this file alone.
"""

from __future__ import annotations

import os
import subprocess

from py4j.java_gateway import JavaObject   # a JVM object as py4j hands it over (re-exported)
from py4j.protocol import Py4JJavaError    # an exception thrown in the JVM (re-exported)
from pyspark import SparkContext, StorageLevel
from pyspark.sql import DataFrame, SparkSession

__all__ = ["JavaObject", "Py4JJavaError", "checkpoint_rdd", "glob", "hadoop_fs", "jvm", "launch_jvm_logging_to",
           "list_files", "max_concurrent_tasks", "path_exists", "persist_rdd", "qualified_path",
           "session_catalog_location", "session_state", "spark_hash_long", "storage_level", "write_text_file"]


def jvm(spark: SparkSession):
    """The py4j view of the driver JVM's packages (``jvm(spark).org.apache...``)."""
    return spark.sparkContext._jvm


def session_state(spark: SparkSession):
    """The JVM SparkSession's SessionState: its SQL parser, catalog, function registries and conf."""
    return spark._jsparkSession.sessionState()


def session_catalog_location(spark: SparkSession, database: str, table: str) -> str:
    """Where the session catalog (`spark_catalog`: Hive's metastore, Glue through a Hive client, the in-memory
    catalog) says a table lives: one metastore call. The public ways (DESCRIBE, Delta's detail) load the
    table, which for Delta means replaying its log: seconds per table in a fresh JVM."""
    ids = jvm(spark).org.apache.spark.sql.catalyst
    option = jvm(spark).scala.Option
    metadata = session_state(spark).catalog().getTableMetadata(ids.TableIdentifier(table, option.apply(database)))
    return metadata.location().toString()


# -- Hadoop FileSystem ---------------------------------------------------------------------------------------

def hadoop_fs(spark: SparkSession, path: str):
    """(the Hadoop FileSystem of ``path``, ``path`` as a Hadoop Path), under the session's Hadoop conf: any
    scheme Spark reads (a local path, file:, hdfs:, s3a:, abfss:, ...)."""
    hpath = jvm(spark).org.apache.hadoop.fs.Path(path)
    return hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), hpath


def path_exists(spark: SparkSession, path: str) -> bool:
    fs, hpath = hadoop_fs(spark, path)
    return bool(fs.exists(hpath))


def glob(spark: SparkSession, path: str) -> list:
    """The Hadoop FileStatus of each file or folder a path or glob matches ([] when none)."""
    fs, hpath = hadoop_fs(spark, path)
    return list(fs.globStatus(hpath) or [])


def list_files(spark: SparkSession, path: str) -> list[str]:
    """The files a path, glob or folder names, as URIs, sorted: a matched file itself, and of a matched folder
    the files directly inside it whose names do not start with '_' or '.' (what Spark skips too)."""
    fs, hpath = hadoop_fs(spark, path)
    files = []
    for status in fs.globStatus(hpath) or []:
        if status.isFile():
            files.append(status.getPath().toUri().toString())
            continue
        for child in fs.listStatus(status.getPath()):
            name = child.getPath().getName()
            if child.isFile() and not name.startswith(("_", ".")):
                files.append(child.getPath().toUri().toString())
    return sorted(files)


def qualified_path(spark: SparkSession, location: str) -> str:
    """The location as its file system names it, scheme and authority added, no trailing slash: /wh, file:/wh
    and hdfs://nn:8020/wh under fs.defaultFS compare equal where they are the same folder."""
    fs, hpath = hadoop_fs(spark, location)
    return fs.makeQualified(hpath).toString().rstrip("/")


def write_text_file(spark: SparkSession, uri: str, text: str) -> None:
    """Write (or replace) a small UTF-8 text file at any Hadoop file system URI."""
    fs, hpath = hadoop_fs(spark, uri)
    out = fs.create(hpath, True)
    try:
        out.write(bytearray(text.encode("utf-8")))
    finally:
        out.close()


# -- storage levels, checkpoints, slots ----------------------------------------------------------------------

def storage_level(spark: SparkSession, name: str) -> StorageLevel:
    """The StorageLevel a name such as ``disk_only`` stands for, parsed by the JVM as Dataset.cache() does."""
    j = jvm(spark).org.apache.spark.storage.StorageLevel.fromString(name.strip().upper())
    return StorageLevel(j.useDisk(), j.useMemory(), j.useOffHeap(), j.deserialized(), j.replication())


def checkpoint_rdd(df: DataFrame):
    """The JVM RDD behind a checkpoint's DataFrame (its analyzed plan is a LogicalRDD), or None."""
    plan = df._jdf.queryExecution().analyzed()
    return plan.rdd() if plan.nodeName() == "LogicalRDD" else None


def persist_rdd(spark: SparkSession, rdd, level: StorageLevel) -> None:
    """Persist a JVM RDD (`checkpoint_rdd`) at ``level``."""
    rdd.persist(spark.sparkContext._getJavaStorageLevel(level))


def max_concurrent_tasks(spark: SparkSession) -> int:
    """Tasks the cluster runs at once now under the default resource profile: the number the barrier
    scheduler checks a barrier stage against."""
    sc = spark.sparkContext._jsc.sc()
    return int(sc.maxNumConcurrentTasks(sc.resourceProfileManager().defaultResourceProfile()))


def spark_hash_long(value: int) -> int:
    """Spark's `hash` of a long (Murmur3_x86_32.hashLong, seed 42), as the signed int Spark returns: what its
    hash partitioning takes pmod n of. Checked against `F.hash` in tests/em/test_pack_layout.py."""
    def mix_k1(k: int) -> int:
        k = (k * 0xCC9E2D51) & 0xFFFFFFFF
        k = ((k << 15) | (k >> 17)) & 0xFFFFFFFF
        return (k * 0x1B873593) & 0xFFFFFFFF

    def mix_h1(h: int, k: int) -> int:
        h ^= k
        h = ((h << 13) | (h >> 19)) & 0xFFFFFFFF
        return (h * 5 + 0xE6546B64) & 0xFFFFFFFF

    v = value & 0xFFFFFFFFFFFFFFFF
    h = mix_h1(mix_h1(42, mix_k1(v & 0xFFFFFFFF)), mix_k1(v >> 32))
    h ^= 8   # the length in bytes
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h - (1 << 32) if h >= 1 << 31 else h


# -- the driver JVM -----------------------------------------------------------------------------------------

def launch_jvm_logging_to(log_file: str, builder: SparkSession.Builder) -> None:
    """Start the driver JVM with the builder's options and its stdout/stderr appended to `log_file`
    (pyspark's `launch_gateway(popen_kwargs=...)`, the hook it keeps for capturing them). A process that
    already has a JVM (a second session, a spark-submit driver) keeps the one it has."""
    from pyspark import SparkConf
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return
    conf = SparkConf(loadDefaults=False)
    for key, value in builder._options.items():   # what getOrCreate passes to spark-submit
        conf.set(key, value)
    os.makedirs(os.path.dirname(os.path.abspath(log_file)), exist_ok=True)
    with open(log_file, "ab") as out:   # the JVM keeps its own copy of the descriptor
        gateway = launch_gateway(conf, popen_kwargs={"stdout": out, "stderr": subprocess.STDOUT})
    SparkContext._ensure_initialized(gateway=gateway)
