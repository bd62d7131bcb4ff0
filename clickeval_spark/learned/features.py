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
    rank (1-based), click, n_above (clicks above), last_click (rank of the last click above, 0: none).

    The clicks above come from the SERP's own click array (higher-order functions before the explode), so the
    positions need no shuffle (a window over serp_id would move every position once)."""
    base = truncate_serps(serps, max_rank, keep=("serp_id", "session_id")).select(
        "serp_id", fold_column(seed, folds).alias("fold"), "query_id", "doc_ids",
        F.transform("clicks", lambda c: c.cast("int")).alias("_c"))
    ranked = base.select("*", F.transform("_c", lambda c, i: F.when(c == 1, i + 1)).alias("_cr"))
    # element i (0-based): the clicks at ranks 1..i, i.e. above rank i + 1 (a missing click counts 0, as a sum
    # over a window skips it); the rank of the last of them, 0 for none
    above = ranked.select(
        "serp_id", "fold", "query_id", "doc_ids", "_c",
        F.transform("_c", lambda _, i: F.aggregate(F.slice("_c", 1, i), F.lit(0),
                                                   lambda acc, x: acc + F.coalesce(x, F.lit(0)))).alias("_na"),
        F.transform("_cr", lambda _, i: F.coalesce(F.array_max(F.slice("_cr", 1, i)), F.lit(0))).alias("_lc"))
    return above.select("serp_id", "fold", "query_id",
                        F.posexplode(F.arrays_zip("doc_ids", "_c", "_na", "_lc")).alias("_pos", "_z")).select(
        "serp_id", "fold", "query_id", F.col("_z.doc_ids").alias("doc_id"), (F.col("_pos") + 1).alias("rank"),
        F.col("_z._c").alias("click"), F.col("_z._na").cast("int").alias("n_above"),
        F.col("_z._lc").cast("int").alias("last_click"))


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
FIXED_COLS = ("exp_clicks", "exp_clicks0", "q_exp_clicks")


def _sum(col: str, alias: str | None = None) -> Column:
    """An exact sum as a long: of a count, or of a value in [0, 1] in units of 2^-32 (FIXED_COLS; a float sum
    depends on the order Spark adds in, in its last bits, so two fits of one log, or a fit and its stored rows,
    would differ). `_value` turns it into the statistic."""
    x = F.round(F.col(col) * F.lit(FIXED)) if (alias or col) in FIXED_COLS else F.col(col)
    return F.sum(x.cast("long")).alias(alias or col)


def _value(sum_: Column, name: str) -> Column:
    """The statistic ``name`` from its exact long sum (`_sum`)."""
    return (sum_ / F.lit(FIXED) if name in FIXED_COLS else sum_.cast("double")).alias(name)


def _pair_sums() -> list[Column]:
    return [F.count(F.lit(1)).alias("n_imp"), _sum("click", "clicks"), _sum("exp_clicks"), _sum("clicks0"),
            _sum("exp_clicks0")]


def _query_sums() -> list[Column]:
    return [F.sum((F.col("rank") == 1).cast("long")).alias("q_serps"), _sum("click", "q_clicks"),
            _sum("exp_clicks", "q_exp_clicks")]


def fold_sums(expected: DataFrame) -> DataFrame:
    """Per (query, doc, fold) of the training positions (`with_expected`): each statistic's exact sum over the
    fold's rows (``<stat>_own``) and over every fold (``<stat>_all``), the query's statistics beside the pair's.
    As many rows as (pair, fold)s: what both `out_of_fold` and `pair_stats` are read from."""
    pair_fold = expected.groupBy("query_id", "doc_id", "fold").agg(*_pair_sums())
    by_pair = Window.partitionBy("query_id", "doc_id")
    pair = pair_fold.select("query_id", "doc_id", "fold",
                            *[F.col(c).alias(f"{c}_own") for c in PAIR_SUMS],
                            *[F.sum(c).over(by_pair).alias(f"{c}_all") for c in PAIR_SUMS])
    query_fold = expected.groupBy("query_id", "fold").agg(*_query_sums())
    by_query = Window.partitionBy("query_id")
    query = query_fold.select("query_id", "fold", *[F.col(c).alias(f"{c}_own") for c in QUERY_SUMS],
                              *[F.sum(c).over(by_query).alias(f"{c}_all") for c in QUERY_SUMS])
    return pair.join(query, on=["query_id", "fold"], how="inner")


def pair_stats(expected: DataFrame, sums: DataFrame | None = None) -> DataFrame:
    """Per (query, doc) of the training log, its statistics over the whole split (what predicted SERPs see):
    query_id, doc_id, the QD_STATS columns, n_obs (= n_imp). ``sums``: `fold_sums` of ``expected``, when the
    caller has it already."""
    sums = fold_sums(expected) if sums is None else sums
    # the totals repeat on every fold row of the pair: any one of them
    return (sums.groupBy("query_id", "doc_id").agg(*[F.max(f"{c}_all").alias(c) for c in QD_STATS])
            .select("query_id", "doc_id", *[_value(F.col(c), c) for c in QD_STATS],
                    _value(F.col("n_imp"), "n_obs")))


def out_of_fold(expected: DataFrame, keep: Sequence[str] = (), sums: DataFrame | None = None) -> DataFrame:
    """The training rows with their statistics out of fold: each (query, doc)'s and query's totals minus
    those of the row's own fold (exact, in the sums' integer units). Output: ``keep`` columns, rank, click,
    n_above, last_click, fold and the QD_STATS columns. ``sums``: as in `pair_stats`."""
    sums = fold_sums(expected) if sums is None else sums
    cols = list(dict.fromkeys(("query_id", "doc_id", "fold", "rank", "click", "n_above", "last_click", *keep)))
    return (expected.select(*cols)
            .join(sums, on=["query_id", "doc_id", "fold"], how="inner")
            .select(*keep, "rank", "click", "n_above", "last_click", "fold",
                    *[_value(F.col(f"{c}_all") - F.col(f"{c}_own"), c) for c in QD_STATS]))
