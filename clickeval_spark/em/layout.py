"""Where the packed log's block rows live: which partition (and so which task) holds each block, and how
they are kept between jobs (checkpoints, RDD blocks at `cache_level`).

A block's partition is steered, not left to a hash of its number: `to_partitions` shuffles on a long key
that Spark's hash partitioning (`spark_internals.spark_hash_long`) sends to the partition asked for, so a
pass's tasks get blocks of about equal work (`balanced`), or a copy of every block (`replicated`).
"""

from __future__ import annotations

from typing import Mapping

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from clickeval_spark.session import cache_level
from clickeval_spark.spark_internals import checkpoint_rdd, max_concurrent_tasks, persist_rdd, spark_hash_long


def cluster_slots(df: DataFrame) -> int:
    """Tasks the cluster runs at once now (0 with dynamic allocation: barrier mode refuses it)."""
    sc = df.sparkSession.sparkContext
    if sc.getConf().get("spark.dynamicAllocation.enabled", "false").lower() == "true":
        return 0
    return max_concurrent_tasks(df.sparkSession)


def checkpointed(df: DataFrame, *, keep_cached: bool = False) -> DataFrame:
    """``df`` computed once, its lineage cut where a lost executor's partitions are rebuilt from.

    With a checkpoint directory on the SparkContext (``spark.checkpoint_dir``, reliable storage on a
    cluster) the rows are written there: a lost executor's partitions are read back. Without one they
    are local checkpoints, kept by the executors that computed them and lost with them (the embedded
    default). ``keep_cached``: also serve the reliable copy from the executors' storage (read repeatedly).
    ``df``'s own cache, if any, is released. Everything kept is kept at `cache_level`, as RDD blocks.

    Why RDD blocks, not ``Dataset.cache()``: the columnar cache builds a batch of up to 10,000 rows in the
    heap before storing it at any level, and block rows are MBs each: a partition's blocks in one batch do
    not fit a small executor's heap (benchmarks/cluster_memory.py). RDD blocks are stored row by row (streamed
    to disk under DISK_ONLY).
    """
    level = cache_level(df.sparkSession, None)
    if df.sparkSession.sparkContext.getCheckpointDir() is None:
        out = df.localCheckpoint(eager=True, storageLevel=level)
        df.unpersist()
        return out
    # the checkpoint counts its input, then writes it in a second job: from kept blocks, df is computed once
    rdd = checkpoint_rdd(df)
    kept = df.is_cached or (rdd is not None and rdd.getStorageLevel().isValid())   # (a local checkpoint's)
    local = df if kept else df.localCheckpoint(eager=True, storageLevel=level)
    out = local.checkpoint(eager=True)
    if local is not df:
        release(local)
    df.unpersist()
    if keep_cached:   # filled by the first read; a lost block is read back from the checkpoint's files
        persist_rdd(df.sparkSession, checkpoint_rdd(out), level or StorageLevel.MEMORY_AND_DISK)
    return out


def release(df: DataFrame) -> None:
    """Free what ``df`` holds in the executors: its cache, and the RDD behind a checkpoint
    (`checkpointed`). ``unpersist`` alone leaves that RDD persisted until the session ends: an EM fit
    would keep one copy of every block's state per checkpoint interval, until the executors ran out of heap."""
    df.unpersist()
    rdd = checkpoint_rdd(df)
    if rdd is not None:
        rdd.unpersist(False)


def task_partitions(df: DataFrame, n_blocks: int) -> int:
    """Partitions for ``n_blocks`` blocks: no more than the cluster runs tasks at once (without dynamic
    allocation), so a resident EM stage, one task per slot, starts on them as they are, not on a shuffle of
    every block."""
    return max(1, min(n_blocks, cluster_slots(df) or n_blocks))


def balanced(blocks: DataFrame, n: int, sizes: Mapping[int, tuple[int, ...]]) -> DataFrame:
    """``blocks`` in ``n`` partitions of about equal work, so no task of a pass waits on another: blocks by
    the bytes of their data (a pass's work is linear in its rows), largest first, each to the partition with
    the fewest bytes so far. Blocks are far from equal: a query's SERPs all go to its block, and a log's head
    queries are large (a 10M log's blocks: 108k to 1.75M SERPs).

    ``sizes``: block -> (bytes, ...) of at least ``blocks``' blocks.
    """
    if not sizes:   # an empty log
        return blocks.coalesce(n)
    load, where = [0] * n, {}
    for block in sorted(sizes, key=lambda b: (-sizes[b][0], b)):
        t = min(range(n), key=lambda i: (load[i], i))
        load[t] += sizes[block][0]
        where[block] = t
    pairs = [F.lit(v) for b in sorted(where) for v in (b, where[b])]
    return to_partitions(blocks, n, F.element_at(F.create_map(*pairs), F.col("block")))


def replicated(blocks: DataFrame, n: int) -> DataFrame:
    """``blocks`` copied into each of ``n`` partitions: every partition holds every block (a selection sample's
    few blocks, for tasks that share out candidates instead of blocks)."""
    copies = blocks.crossJoin(blocks.sparkSession.range(n).select(F.col("id").cast("int").alias("_copy")))
    return to_partitions(copies, n, F.col("_copy")).drop("_copy")


def to_partitions(df: DataFrame, n: int, partition: Column) -> DataFrame:
    """``df`` in ``n`` partitions, each row in the one ``partition`` (an int column, 0..n-1) names: a shuffle
    keyed on a long that Spark's hash partitioning sends there (`partition_keys`)."""
    keys = F.array(*[F.lit(k) for k in partition_keys(n)])
    return df.repartition(n, F.element_at(keys, partition + 1).cast("long"))


def partition_keys(n: int) -> list[int]:
    """For each partition t < n a key that ``repartition(n, key)`` sends to t when the key is a long (an int
    hashes otherwise): Spark's hash partitioning is pmod(hash(key), n), `spark_hash_long`, tried on 0, 1, 2, ..."""
    found: dict[int, int] = {}
    key = 0
    while len(found) < n:
        found.setdefault(spark_hash_long(key) % n, key)   # Python's % of a positive n is Spark's pmod
        key += 1
    return [found[t] for t in range(n)]
