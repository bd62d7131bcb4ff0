"""What the pipeline keeps between jobs follows Spark's spark.sql.defaultCacheStorageLevel (issue 36: executors
of 1g ran out of heap reading MEMORY_AND_DISK blocks back from disk; DISK_ONLY keeps them out of the heap)."""

from __future__ import annotations

import pytest
from pyspark import StorageLevel
from pyspark.sql import types as T

from clickeval_spark.config import IngestConfig
from clickeval_spark.em import blocks
from clickeval_spark.ingestion import run_ingest
from clickeval_spark.session import CACHE_LEVEL_CONF, cache_level
from clickeval_spark.sources.parsed import to_parsed


@pytest.fixture
def disk_only(spark):
    spark.conf.set(CACHE_LEVEL_CONF, "disk_only")
    try:
        yield
    finally:
        spark.conf.unset(CACHE_LEVEL_CONF)


def _rdd_level(df) -> StorageLevel:
    """The storage level of the RDD behind a local checkpoint (as `blocks.release` reaches it)."""
    j = df._jdf.queryExecution().analyzed().rdd().getStorageLevel()
    return StorageLevel(j.useDisk(), j.useMemory(), j.useOffHeap(), j.deserialized(), j.replication())


def test_unset_keeps_each_call_s_default(spark):
    assert spark.conf.get(CACHE_LEVEL_CONF, None) is None
    assert cache_level(spark) == StorageLevel.MEMORY_AND_DISK
    assert cache_level(spark, None) is None
    out = blocks.checkpointed(spark.range(7))
    try:
        assert _rdd_level(out) == StorageLevel(True, True, False, True, 1)   # Spark's own local checkpoint level
    finally:
        blocks.release(out)


def test_disk_only_reaches_local_checkpoints_and_the_ingest(spark, disk_only):
    assert cache_level(spark) == StorageLevel.DISK_ONLY == cache_level(spark, None)
    out = blocks.checkpointed(spark.range(7))
    try:
        assert _rdd_level(out) == StorageLevel.DISK_ONLY and out.count() == 7
    finally:
        blocks.release(out)
    schema = T.StructType([T.StructField(c, T.StringType()) for c in ("session_id", "serp_id", "query_id")]
                          + [T.StructField("doc_ids", T.ArrayType(T.StringType())),
                             T.StructField("clicks", T.ArrayType(T.IntegerType()))])
    sc = spark.sparkContext._jsc.sc()
    before = {r.id() for r in sc.getRDDStorageInfo()}   # other tests' caches share the session
    rows = spark.createDataFrame([("s1", "s1:0", "q1", ["d1", "d2"], [0, 1]),
                                  ("s2", "s2:0", "q2", ["d3"], [1])], schema)
    out = run_ingest(spark, IngestConfig(format="parquet", paths={"all": "/unused"}), to_parsed(
        rows.selectExpr("'test' as source", "monotonically_increasing_id() + 1 as line", "serp_id as raw",
                        "'d' as dataset", "*")), None, "r1")
    try:
        assert out.counts == {"serps_read": 2}
        cached = [r.storageLevel().description() for r in sc.getRDDStorageInfo() if r.id() not in before]
        assert cached and all(level.startswith("Disk Serialized") for level in cached), cached
        out.release()   # what a later stage of the same session must not find still cached
        assert [r.id() for r in sc.getRDDStorageInfo() if r.id() not in before] == []
    finally:   # this ingest's caches only (the session's other caches belong to other tests' fixtures)
        for rdd_id, rdd in spark.sparkContext._jsc.getPersistentRDDs().items():
            if rdd_id not in before:
                rdd.unpersist(False)


@pytest.fixture
def checkpoint_dir(spark, tmp_path):
    """A reliable checkpoint directory on the shared SparkContext for one test (then none again)."""
    sc = spark.sparkContext
    sc.setCheckpointDir(str(tmp_path / "checkpoints"))
    try:
        yield
    finally:   # no public API unsets it; the field is private[spark], public in the bytecode
        getattr(sc._jsc.sc(), "checkpointDir_$eq")(sc._jvm.scala.Option.empty())


def test_reliable_checkpoint_keeps_rdd_blocks_not_a_columnar_cache(spark, disk_only, checkpoint_dir):
    """keep_cached serves a reliable checkpoint from RDD blocks at the cache level, never from Dataset.cache()'s
    columnar batches (built in the heap: a partition of MB-sized block rows ran 1g executors out of it)."""
    sc = spark.sparkContext._jsc.sc()
    before = {r.id() for r in sc.getRDDStorageInfo()}
    out = blocks.checkpointed(spark.range(0, 100, 1, 4).selectExpr("id", "repeat('x', 1000) as pad"),
                              keep_cached=True)
    try:
        assert not out.is_cached
        assert _rdd_level(out) == StorageLevel.DISK_ONLY
        assert out.agg({"id": "sum"}).first()[0] == 4950   # the first read fills the RDD blocks
        kept = [r for r in sc.getRDDStorageInfo() if r.id() not in before]
        # only the checkpoint's RDD is kept (the local checkpoint it was written from is released), all of it
        assert [(r.numCachedPartitions(), r.storageLevel().description()) for r in kept] == [
            (4, "Disk Serialized 1x Replicated")]
        assert spark.sparkContext.getCheckpointDir() is not None
    finally:
        blocks.release(out)
    assert not [r for r in sc.getRDDStorageInfo() if r.id() not in before]


def test_reliable_checkpoint_without_keep_cached_reads_the_files(spark, checkpoint_dir):
    out = blocks.checkpointed(spark.range(10))
    assert _rdd_level(out) == StorageLevel.NONE and out.count() == 10


def _jobs(spark, group: str, fn):
    sc = spark.sparkContext
    sc.setJobGroup(group, group)
    try:
        out = fn()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    return out, len(sc.statusTracker().getJobIdsForGroup(group))


def test_a_kept_local_checkpoint_is_written_from_its_blocks(spark, checkpoint_dir):
    """The resident engine's finished blocks are a local checkpoint already: checkpointed writes them as they are,
    in the jobs of a plain reliable checkpoint, without a second local copy of every block's state."""
    src = spark.range(0, 10, 1, 2).localCheckpoint(eager=True)
    try:
        out, jobs = _jobs(spark, "kept-local", lambda: blocks.checkpointed(src))
        _, plain = _jobs(spark, "plain", lambda: src.checkpoint(eager=True))
        assert jobs == plain and out.count() == 10
        _, fresh = _jobs(spark, "fresh", lambda: blocks.checkpointed(spark.range(0, 10, 1, 2)))
        assert fresh == plain + 1   # not kept: computed once into a local checkpoint first
    finally:
        blocks.release(src)
