"""The learned model's features from the training log, in Spark SQL: one row per shown position with its
clicks above (window functions over the SERP's ranks), the ranks' click rates, and the (query, doc)'s and
query's click statistics (`models.lcm.QD_STATS`).

Training rows take their statistics out of fold: the training sessions are split into `folds` folds by a
seeded hash of session_id, and a row's statistics are the totals of the other folds (totals minus its own
fold's), so a row's own click, and its session's, never enter its features. Predicted SERPs take the totals
of the whole training split (`pair_stats`). Only the per-rank rates (2 M numbers) reach the driver.
"""

from __future__ import annotations

from typing import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from clickeval_spark.fitted.attach import truncate_serps
from clickeval_spark.hashing import seeded_uniform
from clickeval_spark.models.lcm import QD_STATS

FOLD_SALT = "lcm-fold"  # keeps the folds independent of the split and the bootstrap, which hash the same ids
PAIR_SUMS = ("n_imp", "clicks", "exp_clicks", "clicks0", "exp_clicks0")
QUERY_SUMS = ("q_serps", "q_clicks", "q_exp_clicks")


def fold_column(seed: int, folds: int, session_col: str = "session_id") -> Column:
    """0..folds-1: a session's fold, from a seeded hash of its id (the SERPs of a session stay together)."""
    return F.least(F.floor(seeded_uniform(seed, F.lit(FOLD_SALT), session_col) * folds).cast("int"),
                   F.lit(folds - 1))


def positions(serps: DataFrame, max_rank: int, seed: int, folds: int) -> DataFrame:
    """One row per shown position of ``serps`` (lists cut to max_rank): serp_id, fold, query_id, doc_id,
    rank (1-based), click, n_above (clicks above), last_click (rank of the last click above, 0: none)."""
    base = truncate_serps(serps, max_rank, keep=("serp_id", "session_id")).select(
        "serp_id", fold_column(seed, folds).alias("fold"), "query_id",
        F.arrays_zip("doc_ids", "clicks").alias("_z"))
    exploded = base.select("serp_id", "fold", "query_id", F.posexplode("_z").alias("_pos", "_dc")).select(
        "serp_id", "fold", "query_id", F.col("_dc.doc_ids").alias("doc_id"),
        (F.col("_pos") + 1).alias("rank"), F.col("_dc.clicks").cast("int").alias("click"))
    above = Window.partitionBy("serp_id").orderBy("rank").rowsBetween(Window.unboundedPreceding, -1)
    return exploded.select(
        "serp_id", "fold", "query_id", "doc_id", "rank", "click",
        F.coalesce(F.sum("click").over(above), F.lit(0)).cast("int").alias("n_above"),
        F.coalesce(F.max(F.when(F.col("click") == 1, F.col("rank"))).over(above), F.lit(0)).cast("int")
        .alias("last_click"))


def rank_rates(pos: DataFrame, max_rank: int) -> tuple[list[float], list[float], int]:
    """Per rank 1..max_rank, the click rate, and the click rate with no click above (0.5 where a rank
    has no impression), and the number of positions: 2 M + 1 numbers, the only values collected."""
    rows = (pos.groupBy("rank")
            .agg(F.count(F.lit(1)).alias("n"), F.avg("click").alias("ctr"),
                 F.avg(F.when(F.col("n_above") == 0, F.col("click"))).alias("ctr0"))
            .collect())
    ctr, ctr0 = [0.5] * max_rank, [0.5] * max_rank
    for r in rows:
        ctr[r["rank"] - 1] = float(r["ctr"]) if r["ctr"] is not None else 0.5
        ctr0[r["rank"] - 1] = float(r["ctr0"]) if r["ctr0"] is not None else 0.5
    return ctr, ctr0, sum(int(r["n"]) for r in rows)


def _at_rank(values: Sequence[float]) -> Column:
    return F.element_at(F.array(*[F.lit(float(v)) for v in values]), F.col("rank"))


def with_expected(pos: DataFrame, ctr: Sequence[float], ctr0: Sequence[float]) -> DataFrame:
    """`positions` with each impression's contributions to the statistics: its expected click under its rank's
    rate, and the same two for impressions with no click above (clicks0, exp_clicks0; 0 otherwise)."""
    first = F.col("n_above") == 0
    return pos.select(
        "*",
        _at_rank(ctr).alias("exp_clicks"),
        F.when(first, F.col("click")).otherwise(F.lit(0)).cast("double").alias("clicks0"),
        F.when(first, _at_rank(ctr0)).otherwise(F.lit(0.0)).alias("exp_clicks0"))


FIXED = float(1 << 32)  # expected clicks are summed as integers in units of 2^-32: the same bits in any order


def _exact_sum(col: str) -> Column:
    """A sum of values in [0, 1] that does not depend on the order Spark adds them in (a float sum does, in its
    last bits, so two fits of one log, or a fit and its stored rows, would differ)."""
    return (F.sum(F.round(F.col(col) * F.lit(FIXED)).cast("long")) / F.lit(FIXED)).alias(col)


def _pair_sums() -> list[Column]:
    return [F.count(F.lit(1)).cast("double").alias("n_imp"), F.sum("click").cast("double").alias("clicks"),
            _exact_sum("exp_clicks"), F.sum("clicks0").alias("clicks0"), _exact_sum("exp_clicks0")]


def _query_sums() -> list[Column]:
    return [F.sum((F.col("rank") == 1).cast("double")).alias("q_serps"),
            F.sum("click").cast("double").alias("q_clicks"), _exact_sum("exp_clicks").alias("q_exp_clicks")]


def pair_stats(expected: DataFrame) -> DataFrame:
    """Per (query, doc) of the training log, its statistics over the whole split (what predicted SERPs see):
    query_id, doc_id, the QD_STATS columns, n_obs (= n_imp)."""
    pairs = expected.groupBy("query_id", "doc_id").agg(*_pair_sums())
    queries = expected.groupBy("query_id").agg(*_query_sums())
    return (pairs.join(queries, on="query_id", how="inner")
            .select("query_id", "doc_id", *QD_STATS, F.col("n_imp").alias("n_obs")))


def out_of_fold(expected: DataFrame, keep: Sequence[str] = ()) -> DataFrame:
    """The training rows with their statistics out of fold: each (query, doc)'s and query's totals minus
    those of the row's own fold. Output: ``keep`` columns, rank, click, n_above, last_click, fold and the
    QD_STATS columns."""
    pair_fold = expected.groupBy("query_id", "doc_id", "fold").agg(*_pair_sums())
    by_pair = Window.partitionBy("query_id", "doc_id")
    pair_oof = pair_fold.select(
        "query_id", "doc_id", "fold",
        *[(F.sum(c).over(by_pair) - F.col(c)).alias(c) for c in PAIR_SUMS])
    query_fold = expected.groupBy("query_id", "fold").agg(*_query_sums())
    by_query = Window.partitionBy("query_id")
    query_oof = query_fold.select(
        "query_id", "fold", *[(F.sum(c).over(by_query) - F.col(c)).alias(c) for c in QUERY_SUMS])
    cols = list(dict.fromkeys(("query_id", "doc_id", "fold", "rank", "click", "n_above", "last_click", *keep)))
    return (expected.select(*cols)
            .join(pair_oof, on=["query_id", "doc_id", "fold"], how="inner")
            .join(query_oof, on=["query_id", "fold"], how="inner")
            .select(*keep, "rank", "click", "n_above", "last_click", "fold", *QD_STATS))
