"""Session-level train/valid/test split from a seeded hash of session_id.

The split of a row depends only on (seed, session_id): the same rows land in the
same split whatever the partitioning, and all SERPs of a session stay together.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from clickeval_spark.config import SPLITS, SplitConfig
from clickeval_spark.hashing import seeded_uniform

def split_column(cfg: SplitConfig, session_col: str = "session_id") -> Column:
    total = float(sum(cfg.ratios.values()))
    u = seeded_uniform(cfg.seed, session_col)
    expr = None
    upper = 0.0
    for name in SPLITS:
        share = cfg.ratios.get(name, 0.0) / total
        if share <= 0:
            continue
        upper += share
        expr = (F.when(u < F.lit(upper), F.lit(name)) if expr is None
                else expr.when(u < F.lit(upper), F.lit(name)))
    last = [n for n in SPLITS if cfg.ratios.get(n, 0.0) > 0][-1]
    return expr.otherwise(F.lit(last))  # float rounding at the top edge


def assign_splits(df: DataFrame, cfg: SplitConfig) -> DataFrame:
    """Fill `split` where the input did not arrive split; a given split is kept as it is."""
    return df.withColumn("split", F.coalesce(F.col("split"), split_column(cfg)))
