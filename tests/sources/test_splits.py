from pyspark.sql import functions as F

from clickeval_spark.config import SplitConfig
from clickeval_spark.splits import assign_splits


def _sessions(spark, n, partitions):
    return (spark.range(n).select(F.concat(F.lit("s"), F.col("id").cast("string")).alias("session_id"),
                                  F.lit(None).cast("string").alias("split"))
            .repartition(partitions))


def test_split_is_identical_for_1_and_8_partitions(spark):
    cfg = SplitConfig(seed=3)
    one = assign_splits(_sessions(spark, 20000, 1), cfg).orderBy("session_id").collect()
    eight = assign_splits(_sessions(spark, 20000, 8), cfg).orderBy("session_id").collect()
    assert one == eight


def test_split_follows_the_ratios_and_seed(spark):
    cfg = SplitConfig(seed=3, ratios={"train": 8.0, "valid": 1.0, "test": 1.0})
    counts = dict(assign_splits(_sessions(spark, 20000, 4), cfg).groupBy("split").count().collect())
    assert abs(counts["train"] / 20000 - 0.8) < 0.015 and abs(counts["test"] / 20000 - 0.1) < 0.01
    other = dict(assign_splits(_sessions(spark, 20000, 4), SplitConfig(seed=4, ratios=cfg.ratios))
                 .groupBy("split").count().collect())
    assert other != counts  # a different seed draws a different split


def test_given_split_is_kept(spark):
    df = spark.createDataFrame([("a", "test"), ("b", None)], "session_id string, split string")
    rows = dict(assign_splits(df, SplitConfig()).collect())
    assert rows["a"] == "test" and rows["b"] in {"train", "valid", "test"}
