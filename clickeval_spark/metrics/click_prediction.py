"""Click-prediction statistics (DESIGN §5): LL and PPL@t, conditional and unconditional.

One pass over click_predictions (one row per SERP, arrays by rank) reads each rank's
element and sums per session (positions, Σ ln P(c | p_cond), Σ ln P(c | p_click),
clipped counts); the metrics
are functions of those sums, so the bootstrap can reweight whole sessions.
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from clickeval_spark import tables
from clickeval_spark.metrics.bootstrap import fixed_np
from clickeval_spark.fitted.attach import list_value_lengths, padded

KEYS = ("model", "dataset", "split")


def stat_columns(max_rank: int) -> list[str]:
    cols = ["n_serps", "clipped_cond", "clipped_uncond"]
    for t in range(1, max_rank + 1):
        cols += [f"n_{t}", f"ln_cond_{t}", f"ln_uncond_{t}"]
    return cols


PREDICTED = ("clicks", "p_click_cond", "p_click")


def clipped(p: str | Column, eps: float) -> Column:
    """Probability `p` clipped to [eps, 1 - eps] (DESIGN §5)."""
    p = F.col(p) if isinstance(p, str) else p
    return F.least(F.greatest(p, F.lit(eps)), F.lit(1.0 - eps))


def log_lik(p: Column, click: Column | None = None) -> Column:
    """ln P(observed click) under click probability p (natural log); the click defaults to column `click`."""
    click = F.col("click") if click is None else click
    return F.when(click == 1, F.log(p)).otherwise(F.log(1.0 - p))


def by_rank(predictions: DataFrame) -> DataFrame:
    """click_predictions (one row per SERP, arrays) as one row per (SERP, rank): the other columns,
    rank (1-based), click, p_click_cond, p_click. The `click_predictions_by_rank` view."""
    other = [c for c in predictions.columns if c not in PREDICTED]
    return (
        predictions.select(*other, *PREDICTED, F.posexplode("p_click_cond").alias("_pos", "_p_cond"))
        .select(*other, (F.col("_pos") + 1).cast("int").alias("rank"), F.col("clicks")[F.col("_pos")].alias("click"),
                F.col("_p_cond").alias("p_click_cond"), F.col("p_click")[F.col("_pos")].alias("p_click"))
    )


def per_serp(by_rank_rows: DataFrame) -> DataFrame:
    """The inverse of `by_rank`: rows of (SERP, rank, click, p_click_cond, p_click) folded into one row per
    SERP with arrays in rank order; every column but those (and doc_id, query_id) is a key."""
    keys = [c for c in by_rank_rows.columns if c not in ("rank", "click", "p_click_cond", "p_click", "doc_id", "query_id")]
    ranked = F.sort_array(F.collect_list(F.struct("rank", "click", "p_click_cond", "p_click")))
    return (
        by_rank_rows.groupBy(*keys).agg(ranked.alias("_r"))
        .select(*keys, F.col("_r.click").alias("clicks"), F.col("_r.p_click_cond").alias("p_click_cond"),
                F.col("_r.p_click").alias("p_click"))
    )


def log_terms(click: np.ndarray, p: np.ndarray, mask: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """The DESIGN §5 terms of (B, M) clicks (bool) and probabilities, as the SQL `log_lik(clipped(p, eps))`
    and `bootstrap.to_fixed` give them: (clipped count per row, fixed-point ln P(observed click) per
    position, 0 off ``mask``)."""
    # as Spark's least(greatest(p, eps), 1 - eps): NaN sorts above every number, so it clips to 1 - eps
    q = np.where(np.isnan(p), 1.0 - eps, np.clip(p, eps, 1.0 - eps))
    clipped_n = ((p != q) & mask).sum(axis=1).astype(np.int64)
    return clipped_n, np.where(mask, fixed_np(np.where(click, np.log(q), np.log(1.0 - q))), 0)


def _serp_stats_fn(max_rank: int, eps: float, keys: list[str]):
    M = max_rank

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            n = batch.num_rows
            if n == 0:
                continue
            # ranks beyond max_rank are not scored
            lists = {c: pc.list_slice(batch.column(c), 0, M) for c in PREDICTED}
            lens = list_value_lengths(lists["p_click_cond"])
            for c in ("clicks", "p_click"):
                if not np.array_equal(list_value_lengths(lists[c]), lens):
                    raise ValueError(f"click_predictions rows whose {c} and p_click_cond have different lengths")
            mask = np.arange(M)[None, :] < lens[:, None]
            click = padded(lists["clicks"], mask, np.int64, 0) == 1
            # the columns of stat_columns(M): n_serps, clipped_cond, clipped_uncond, then (n_t, ln_cond_t,
            # ln_uncond_t) for each rank t
            out = np.empty((n, 3 + 3 * M), dtype=np.int64)
            out[:, 0] = mask[:, 0]
            out[:, 3::3] = mask
            for i, col in enumerate(("p_click_cond", "p_click")):
                out[:, 1 + i], out[:, 4 + i::3] = log_terms(click, padded(lists[col], mask, np.float64, 0.5), mask, eps)
            width = out.shape[1]
            vectors = pa.ListArray.from_arrays(pa.array(np.arange(0, (n + 1) * width, width, dtype=np.int32)),
                                               pa.array(out.reshape(-1)))
            yield pa.RecordBatch.from_arrays([batch.column(k) for k in keys] + [vectors], names=[*keys, "stats"])

    return run


def serp_stats(predictions: DataFrame, max_rank: int, eps: float) -> DataFrame:
    """KEYS, serp_id, stats: one row per SERP, its statistics as one array<long> in the order of
    `stat_columns(max_rank)` (n_serps = 1 when the SERP has a rank 1), straight from the arrays (no
    explode), in one vectorised pass per Arrow batch (``mapInArrow``: far cheaper than 30 Spark SQL
    expressions per row, benchmarks/RESULTS.md): the rank-t columns read element t. Log terms are fixed-point
    longs, rounded as `bootstrap.to_fixed` rounds.

    One array, not 33 columns: the rows are only moved on (joined to their sessions) and read
    again in Python (`bootstrap.replicate_partials`), and Spark moves one array column at a fraction
    of the cost of 33 long columns."""
    keys = [*KEYS, "serp_id"]
    schema = T.StructType([predictions.schema[k] for k in keys]
                          + [T.StructField("stats", T.ArrayType(T.LongType(), False), False)])
    return (
        predictions.select(*keys, *PREDICTED)
        .mapInArrow(_serp_stats_fn(max_rank, eps, keys), schema)
        .select(*keys, "stats")
    )


def serp_session_stats(predictions: DataFrame, sessions: DataFrame, max_rank: int, eps: float) -> DataFrame:
    """model, dataset, split, session_id, stats (`serp_stats`' array): one row per SERP, with its session.

    The sessions (one narrow row per SERP) are the hashed side of the join, so the statistics are
    not sorted, as a sort-merge join would sort them (benchmarks/RESULTS.md)."""
    return (
        serp_stats(predictions, max_rank, eps)
        .join(sessions.hint("shuffle_hash"), on=["dataset", "serp_id"], how="inner")
        .select(*KEYS, "session_id", "stats")
    )


def _serp_ll(eps: float) -> Column:
    """A SERP's summed log-likelihood of p_click_cond (DESIGN §5 LL terms), from its arrays."""
    terms = F.zip_with("p_click_cond", "clicks", lambda p, c: log_lik(clipped(p, eps), c))
    return F.aggregate(terms, F.lit(0.0), lambda acc, x: acc + x)


def _ll_per_position(eps: float) -> Column:
    """Aggregate: mean per-position log-likelihood of p_click_cond (DESIGN §5 LL) over the group's SERPs."""
    return (F.sum(_serp_ll(eps)) / F.sum(F.size("p_click_cond"))).alias("ll")


def log_likelihood_by_split(predictions: DataFrame, eps: float = 1e-6) -> dict[str, float]:
    """Mean per-position log-likelihood of p_click_cond (DESIGN §5 LL), per split: a small global aggregate."""
    return {r["split"]: r["ll"] for r in predictions.groupBy("split").agg(_ll_per_position(eps)).collect()}


def observe_log_likelihood(predictions: DataFrame, models: Sequence[str], splits: Sequence[str],
                           eps: float = 1e-6) -> tuple[DataFrame, Callable[[], dict[str, tuple[dict[str, float], int]]]]:
    """``predictions`` (one row per SERP) as they are, observed: once an action (the stage's write) has run
    them, the returned function gives per model (`log_likelihood_by_split`'s numbers, its SERP count).

    The sums are taken by the write's own tasks (Spark's ``Observation``: no second job, no
    re-read of what was just written). ``models`` x ``splits`` are the groups summed; a group
    without rows is left out, as a groupBy would.
    """
    groups = list(itertools.product(models, splits))
    metrics = []
    for i, (model, split) in enumerate(groups):
        hit = (F.col("model") == model) & (F.col("split") == split)
        metrics += [F.sum(F.when(hit, F.col("_serp_ll"))).alias(f"ll_{i}"),
                    F.sum(F.when(hit, F.size("p_click_cond"))).alias(f"positions_{i}"),
                    F.count(F.when(hit, 1)).alias(f"serps_{i}")]
    observed, observation = tables.observed(predictions.withColumn("_serp_ll", _serp_ll(eps)),
                                            "log_likelihood_by_model", *metrics)
    observed = observed.drop("_serp_ll")

    def result() -> dict[str, tuple[dict[str, float], int]]:
        sums, out = observation.get, {}
        for i, (model, split) in enumerate(groups):
            if sums[f"serps_{i}"]:
                by_split, n = out.get(model, ({}, 0))
                out[model] = ({**by_split, split: sums[f"ll_{i}"] / sums[f"positions_{i}"]}, n + sums[f"serps_{i}"])
        return out

    return observed, result


def metric_replicates(sums: dict[str, np.ndarray], max_rank: int, scale: float) -> dict[tuple[str, int | None], np.ndarray]:
    """{(metric, cutoff): value per replicate} from replicate sums (arrays over replicates).

    LL = Σ ln P(c | p_cond) / positions; PPL@t = exp(-Σ_t ln P / n_t) (= 2^(-mean log2));
    total PPL = mean of PPL@t over the ranks observed in the data.
    """
    n_t = np.stack([sums[f"n_{t}"] for t in range(1, max_rank + 1)], axis=1)
    cond = np.stack([sums[f"ln_cond_{t}"] for t in range(1, max_rank + 1)], axis=1) / scale
    uncond = np.stack([sums[f"ln_uncond_{t}"] for t in range(1, max_rank + 1)], axis=1) / scale
    observed = n_t[0] > 0  # ranks present in the data (replicate 0 = the data itself)
    with np.errstate(divide="ignore", invalid="ignore"):
        positions = n_t.sum(axis=1)
        out: dict[tuple[str, int | None], np.ndarray] = {
            ("LL", None): np.where(positions > 0, cond.sum(axis=1) / positions, np.nan)}
        for name, ln in (("PPL", uncond), ("PPL_cond", cond)):
            ppl_t = np.where(n_t > 0, np.exp(-ln / n_t), np.nan)
            for t in range(1, max_rank + 1):
                if observed[t - 1]:
                    out[(name, t)] = ppl_t[:, t - 1]
            out[(name, None)] = ppl_t[:, observed].mean(axis=1)
    return out

