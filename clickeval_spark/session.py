"""SparkSession factory. Only jobs and test fixtures call it; library code never builds sessions."""

from __future__ import annotations

import os
import re
import sys
from typing import Mapping

from pyspark import StorageLevel
from pyspark.sql import SparkSession

from clickeval_spark.spark_internals import launch_jvm_logging_to, storage_level

DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}

# The embedded JVM (driver and executors in one) shares a small machine's cores with its own background
# threads: the throughput collector leaves the tasks more of them than G1's concurrent work, and JIT
# thresholds x3 keep a fresh JVM from compiling thousands of methods that run a few times (their effect on
# `make run`: benchmarks/RESULTS.md). A config with its own `spark.driver.extraJavaOptions` keeps its own.
EMBEDDED_JVM_OPTIONS = "-XX:+UseParallelGC -XX:CompileThresholdScaling=3"

#: The young generation's cap (MiB) in the embedded JVM: the throughput collector grows it to a third of the
#: heap, and memory a process touches for the first time is what a VM makes slow, so a smaller young
#: generation, touched again and again, is faster (benchmarks/RESULTS.md). Never more than a third of the heap.
EMBEDDED_YOUNG_MIB = 1024
_MEMORY = re.compile(r"(\d+)([kmgt]?)b?")


def embedded_jvm_options(driver_memory: str | None) -> str:
    """`EMBEDDED_JVM_OPTIONS` with the young generation capped for ``driver_memory`` (Spark's 1g when None)."""
    match = _MEMORY.fullmatch((driver_memory or "1g").strip().lower())
    if not match:
        raise ValueError(f"spark.driver.memory: {driver_memory!r} is not a size such as 4g or 512m")
    mib = int(match.group(1)) * {"k": 1 / 1024, "": 1, "m": 1, "g": 1024, "t": 1024 ** 2}[match.group(2)]
    return f"{EMBEDDED_JVM_OPTIONS} -XX:MaxNewSize={max(1, min(EMBEDDED_YOUNG_MIB, int(mib) // 3))}m"

# Spark's own default for a cluster; local mode ignores spark.task.maxFailures and gives a task one attempt
DEFAULT_TASK_MAX_FAILURES = 4
_LOCAL_MASTER = re.compile(r"local(?:\[(\*|\d+)\])?")


def with_task_retries(master: str | None, conf: Mapping[str, str]) -> str | None:
    """A local master with task retries: ``local[N]`` becomes ``local[N,F]``, F being the conf's
    `spark.task.maxFailures` (Spark's cluster default, 4, when unset), so one lost Python worker costs a
    retried task, not the job. A master that names its own failures (``local[N,F]``), or is not local, stays."""
    match = _LOCAL_MASTER.fullmatch(master or "")
    if not match:
        return master
    failures = int(conf.get("spark.task.maxFailures", DEFAULT_TASK_MAX_FAILURES))
    if failures < 1:
        raise ValueError(f"spark.task.maxFailures must be >= 1, got {failures}")
    return f"local[{match.group(1) or 1},{failures}]"


#: Spark's own setting for `DataFrame.cache()`'s storage level; the pipeline's caches and local checkpoints
#: (`cache_level`) follow it too
CACHE_LEVEL_CONF = "spark.sql.defaultCacheStorageLevel"


def cache_level(spark: SparkSession, default: StorageLevel | None = StorageLevel.MEMORY_AND_DISK
                ) -> StorageLevel | None:
    """The storage level of what the pipeline keeps between jobs (the ingest's parsed input, EM's packed
    blocks and local checkpoints): Spark's ``spark.sql.defaultCacheStorageLevel`` when set, else ``default``
    (None: Spark's own default of the call).

    DISK_ONLY bounds an executor's heap by its running tasks: with MEMORY_AND_DISK a cached block that went
    to disk is read back into the heap whole, more than a small executor holds on a large log
    (benchmarks/cluster_memory.py, benchmarks/RESULTS.md)."""
    name = spark.conf.get(CACHE_LEVEL_CONF, None)
    if name is None:
        return default
    return storage_level(spark, name)   # Spark checked the name when it was set


def build_session(
    app_name: str,
    *,
    master: str | None,
    warehouse: str,
    embedded: bool,
    conf: Mapping[str, str] | None = None,
    checkpoint_dir: str | None = None,
    log_file: str | None = None,
) -> SparkSession:
    """Build (or reuse) the job's session.

    embedded=True is the one-machine mode: the Delta jars are resolved from Maven
    Central by Ivy (`configure_spark_with_delta_pip`), and Python workers use this
    interpreter (the venv), not whatever `python3` is first on PATH, started by
    `clickeval_spark.python_daemon` (less start-up per Python task on Python 3.10/3.11), and the
    JVM runs with `embedded_jvm_options` unless the conf names its own driver options.
    embedded=False is spark-submit on a cluster: master and jars come from the
    submit command (`--master`, `--packages`), so nothing here overrides them.
    A local master gets task retries (`with_task_retries`).
    checkpoint_dir: the SparkContext's checkpoint directory (reliable checkpoints of
    EM's blocks, `clickeval_spark.em.layout.checkpointed`); None: local checkpoints.
    log_file: embedded only; the JVM this call starts writes its stdout and stderr there (Spark's
    log4j console, Ivy's resolution report, the JVM's own warnings, the Python workers' stderr),
    so the terminal shows the project's lines alone. None: they go to this process's stderr.
    """
    builder = SparkSession.builder.appName(app_name)
    master = with_task_retries(master, conf or {})
    if master:
        builder = builder.master(master)
    settings = {
        **DELTA_CONF,
        "spark.sql.warehouse.dir": warehouse,
        "spark.sql.session.timeZone": "UTC",
        # checkpoint files of RDDs the driver no longer references are deleted (EM writes one per interval)
        **({"spark.cleaner.referenceTracking.cleanCheckpoints": "true"} if checkpoint_dir else {}),
        # EM's blocks are rows of MBs, persisted and checkpointed through Java serialization streams, which
        # hold on to every row written or read until they reset (Spark's default: every 100 rows): a task
        # reading a local checkpoint while writing a reliable one would hold both whole (benchmarks/RESULTS.md)
        "spark.serializer.objectStreamReset": "1",
        # the columnar cache's per-column compression (run-length, dictionary) costs the ingest's cache CPU
        # for little: what the pipeline caches is mostly arrays and binary blocks, which it leaves
        # uncompressed anyway (benchmarks/RESULTS.md)
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        # ids unique per SERP or session: Parquet's dictionary fills up and falls back on every file, work spent
        # for nothing (benchmarks/RESULTS.md)
        "spark.hadoop.parquet.enable.dictionary#serp_id": "false",
        "spark.hadoop.parquet.enable.dictionary#session_id": "false",
        # PySpark 4 records the Python call site of every Column function for its error messages' DataFrame
        # context: four JVM round trips per call, a noticeable share of the driver's time to build a plan
        # (benchmarks/RESULTS.md). Errors still name the failed expression and the query.
        "spark.python.sql.dataFrameDebugging.enabled": "false",
        **dict(conf or {}),
    }
    if embedded:
        # the workers run this interpreter, so they can import the daemon module from this package
        settings.setdefault("spark.python.daemon.module", "clickeval_spark.python_daemon")
        settings.setdefault("spark.driver.extraJavaOptions", embedded_jvm_options(settings.get("spark.driver.memory")))
    for key, value in settings.items():
        builder = builder.config(key, value)
    if embedded:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        from delta import configure_spark_with_delta_pip

        builder = configure_spark_with_delta_pip(builder)
        if log_file:
            launch_jvm_logging_to(log_file, builder)
    spark = builder.getOrCreate()
    if checkpoint_dir:
        spark.sparkContext.setCheckpointDir(checkpoint_dir)
    spark.sparkContext.setLogLevel("WARN")
    return spark

