"""How the pack lays out its blocks (em.blocks, em.layout): the block count from a count before the filter,
checked against the SERPs packed; blocks spread over the tasks by their size."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql import types as T

from clickeval_spark.em.blocks import MIN_BLOCKS, BlockGroup, largest_first, pack_log, pack_serps, packed_blocks
from clickeval_spark.em.codec import decode_data, pack_block
from clickeval_spark.em.driver import fit
from clickeval_spark.em.layout import balanced
from clickeval_spark.models import get_model
from clickeval_spark.spark_internals import spark_hash_long

SERPS = T.StructType([
    T.StructField("query_id", T.StringType()),
    T.StructField("doc_ids", T.ArrayType(T.StringType())),
    T.StructField("clicks", T.ArrayType(T.IntegerType())),
])


def test_blocks_go_to_partitions_largest_first_each_to_the_least_loaded(spark):
    """LPT by hand: 100 -> p0; 60 -> p1; 50 -> p1 (60 < 100); 40 -> p0 (100 < 110); 10 -> p1 (110 < 140)."""
    sizes = {0: (100, 0, 0), 1: (60, 0, 0), 2: (50, 0, 0), 3: (40, 0, 0), 4: (10, 0, 0)}
    blocks = spark.createDataFrame([(b,) for b in sizes], "block int").repartition(3)
    out = balanced(blocks, 2, sizes)
    assert out.rdd.getNumPartitions() == 2
    where = {r["block"]: r["p"] for r in out.select("block", F.spark_partition_id().alias("p")).collect()}
    assert sorted(where) == [0, 1, 2, 3, 4]
    assert {where[0], where[3]} == {where[0]} and {where[1], where[2], where[4]} == {where[1]} != {where[0]}
    # and with as many partitions as blocks: one block each
    out = balanced(blocks, 5, sizes)
    assert sorted(r["n"] for r in out.groupBy(F.spark_partition_id()).agg(F.count("*").alias("n")).collect()) == [1] * 5


def test_the_pack_takes_the_largest_blocks_first(spark):
    """Blocks by their query_id rows, most first (a tie by number), as the pack itself counts them; block
    order[t] is packed by task t, which Spark starts t-th."""
    rows = ([("q0", ["d0", "d1"], [1, 0])] * 30
            + [(f"q{i}", ["d2"], [0]) for i in range(1, 12) for _ in range(i % 5 + 1)])
    serps = spark.createDataFrame(rows, SERPS)
    groups = [BlockGroup(0, 5, len(rows), 0)]
    order = largest_first(serps.select("query_id"), groups)
    packed, sizes = packed_blocks(serps.withColumn("held_out", F.lit(False)).withColumn("group", F.lit(0)), 2, groups,
                            None, False, order)
    try:
        counts = {b: sizes.get(b, (0,) * 5)[1] for b in range(5)}
        assert sorted(order) == list(range(5)) and max(counts.values()) >= 30
        assert order == sorted(counts, key=lambda b: (-counts[b], b))
        where = {r["block"]: r["p"] for r in packed.select("block", F.spark_partition_id().alias("p")).collect()}
        assert where == {b: t for t, b in enumerate(order) if counts[b]}
    finally:
        packed.unpersist()
    assert largest_first(None, groups) is None


def _rows(packed):
    return sorted((r["block"], bytes(r["data"]), bytes(r["keys"])) for r in packed.blocks.collect())


def test_a_filter_that_empties_blocks_packs_again_into_the_exact_count(spark):
    """60 SERPs with results and 40 without: the count before the filter (100, at 10 per block) asks for 10 blocks,
    the SERPs packed fill 6, so the log is packed again into 6: the blocks of a pack counted exactly."""
    rows = ([(f"q{i % 13}", [f"d{i % 7}", f"d{(i + 3) % 7}"], [i % 2, 0]) for i in range(60)]
            + [(f"q{i}", [], []) for i in range(40)])
    serps = spark.createDataFrame(rows, SERPS)
    packed = pack_serps(serps, max_rank=2, block_serps=10)
    try:
        assert [(g.first_block, g.n_blocks, g.n_serps, g.n_held_out) for g in packed.groups] == [(0, 6, 60, 0)]
        assert sum(v[1] for v in packed.sizes.values()) == 60
        prep = serps.where(F.size("doc_ids") > 0)   # pack_log's own group count, for comparison
        exact = pack_log(prep, 2, block_serps=10, fold=False)
        try:
            assert exact.groups == packed.groups
            assert _rows(exact) == _rows(packed)
            assert exact.sizes == packed.sizes
        finally:
            exact.unpersist()
    finally:
        packed.unpersist()


def test_held_out_serps_are_counted_per_block(spark):
    train = spark.createDataFrame([(f"q{i % 5}", ["a", "b"], [1, 0]) for i in range(30)], SERPS)
    valid = spark.createDataFrame([(f"q{i % 3}", ["b", "c"], [0, 1]) for i in range(8)], SERPS)
    packed = pack_serps(train, max_rank=2, held_out=valid)
    try:
        [group] = packed.groups
        assert (group.n_serps, group.n_held_out, group.n_blocks) == (30, 8, 4)
        # each held-out SERP shows b, which its query's training SERPs show, and c, which none does
        assert (group.held_out_positions, group.held_out_seen, group.seen_share) == (16, 8, 0.5)
        assert (sum(v[1] for v in packed.sizes.values()), sum(v[2] for v in packed.sizes.values())) == (30, 8)
        lengths = {r["block"]: r["n"] for r in packed.blocks.select("block", F.length("data").alias("n")).collect()}
        assert {b: v[0] for b, v in packed.sizes.items()} == lengths
    finally:
        packed.unpersist()


def test_a_block_is_the_same_bytes_in_any_order_of_its_rows():
    """`pack_block` reads rows in the order they came (held-out ones mixed in): any order gives the same block."""
    rng = np.random.default_rng(5)
    n = 400
    lens = rng.integers(0, 6, n)
    docs = [[f"d{rng.integers(0, 9)}" for _ in range(k)] for k in lens]
    rows = pa.table({"query_id": [f"q{rng.integers(0, 12)}" for _ in range(n)], "doc_ids": docs,
                     "clicks": [[int(c) for c in rng.integers(0, 2, k)] for k in lens],
                     "held_out": rng.random(n) < 0.3, "weight": rng.integers(1, 4, n)})
    held = rows.column("held_out").to_numpy()
    expected = pack_block(rows.take(pa.array(np.argsort(held, kind="stable"))), 5)   # training rows first
    for seed in range(3):
        assert pack_block(rows.take(pa.array(np.random.default_rng(seed).permutation(n))), 5) == expected
    data, keys, counts = expected
    clicks, pair, weight, n_pairs, n_train = decode_data(data)
    assert (int(weight[:n_train].sum()), int(weight[n_train:].sum())) == (
        int(rows.column("weight").to_numpy()[~held].sum()), int(rows.column("weight").to_numpy()[held].sum()))
    # the SERPs, the held-out positions and those of a pair some training row shows, counted row by row in Python
    r = rows.to_pylist()
    shown = {(x["query_id"], d) for x in r if not x["held_out"] for d in x["doc_ids"]}
    assert counts == (sum(x["weight"] for x in r if not x["held_out"]), sum(x["weight"] for x in r if x["held_out"]),
                      sum(x["weight"] * len(x["doc_ids"]) for x in r if x["held_out"]),
                      sum(x["weight"] for x in r if x["held_out"] for d in x["doc_ids"] if (x["query_id"], d) in shown))


def test_the_partition_keys_hash_as_spark_hashes_a_long(spark):
    """`spark_hash_long` against Spark's own `hash` on longs of every size and sign: the pack's partition keys
    rely on it (a wrong hash sends blocks to other partitions, which the LPT test above also catches)."""
    values = [0, 1, -1, 7, 42, 2**31 - 1, 2**31, -2**31, 2**32 + 5, 2**63 - 1, -2**63, 123456789012345]
    values += list(range(100, 1100, 7))
    df = spark.createDataFrame([(v,) for v in values], "v long")
    spark_hashes = {r["v"]: r["h"] for r in df.select("v", F.hash("v").alias("h")).collect()}
    assert {v: spark_hash_long(v) for v in values} == spark_hashes


def test_a_fit_on_smaller_blocks_is_the_same_fit(spark, make_log):
    """The block count is the pack's choice, not the estimator's: every query's SERPs are in one block either
    way, so 10 blocks fit what 4 do, to float rounding."""
    model, M = get_model("pbm"), 5
    log = make_log(model, n_serps=300, M=M, seed=62)
    df = log.df(spark)
    default, small = pack_serps(df, max_rank=M), pack_serps(df, max_rank=M, block_serps=30)
    try:
        assert [g.n_blocks for g in default.groups] == [MIN_BLOCKS] and [g.n_blocks for g in small.groups] == [10]
        options = dict(iterations=6, tol=None, max_rank=M, engine="stages")
        a, b = fit(default, model, **options), fit(small, model, **options)
    finally:
        default.unpersist()
        small.unpersist()
    assert a.glob.keys() == b.glob.keys()
    for name in a.glob:
        np.testing.assert_allclose(b.glob[name], a.glob[name], rtol=1e-12)
    qa, qb = ({(r["query_id"], r["doc_id"]): r["alpha"] for r in f.qd.collect()} for f in (a, b))
    assert qa.keys() == qb.keys() and len(qa) > 50
    np.testing.assert_allclose([qb[k] for k in qa], list(qa.values()), rtol=1e-12)
