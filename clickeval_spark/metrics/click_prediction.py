"""Click-prediction statistics (DESIGN §5): LL and PPL@t, conditional and unconditional.

One aggregation pass turns click_predictions rows into per-session sums per rank
(positions, Σ ln P(c | p_cond), Σ ln P(c | p_click), clipped counts); the metrics
are functions of those sums, so the bootstrap can reweight whole sessions.
"""

from __future__ import annotations

import numpy as np
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from clickeval_spark.metrics.bootstrap import to_fixed

KEYS = ("model", "dataset", "split")


def stat_columns(max_rank: int) -> list[str]:
    cols = ["n_serps", "clipped_cond", "clipped_uncond"]
    for t in range(1, max_rank + 1):
        cols += [f"n_{t}", f"ln_cond_{t}", f"ln_uncond_{t}"]
    return cols


def clipped(p: str, eps: float) -> Column:
    """Probability column `p` clipped to [eps, 1 - eps] (DESIGN §5)."""
    return F.least(F.greatest(F.col(p), F.lit(eps)), F.lit(1.0 - eps))


def log_lik(p: Column) -> Column:
    """ln P(observed click) under click probability p (natural log)."""
    return F.when(F.col("click") == 1, F.log(p)).otherwise(F.log(1.0 - p))


def session_stats(predictions: DataFrame, sessions: DataFrame, max_rank: int, eps: float) -> DataFrame:
    """model, dataset, split, session_id + stat_columns(max_rank), one row per session.

    `predictions`: the click_predictions contract (model, dataset, split, serp_id,
    rank, click, p_click_cond, p_click); `sessions`: dataset, serp_id, session_id.
    Log terms are stored as fixed-point longs (exact, order-free sums).
    """
    # two levels: positions -> SERPs (map-side partial aggregation folds a SERP's ranks,
    # which arrive together, before any shuffle), then SERPs -> sessions after the join
    # with the (10x smaller) SERP table. A SERP is counted at its rank 1: every SERP of
    # click_predictions has all its ranks (built-in models by construction, external
    # ones by external.checked_predictions).
    rows = predictions.where(F.col("rank").between(1, max_rank)).select(
        *KEYS, "serp_id", "rank",
        to_fixed(log_lik(clipped("p_click_cond", eps))).alias("ln_cond"),
        to_fixed(log_lik(clipped("p_click", eps))).alias("ln_uncond"),
        (F.col("p_click_cond") != clipped("p_click_cond", eps)).cast("long").alias("clipped_cond"),
        (F.col("p_click") != clipped("p_click", eps)).cast("long").alias("clipped_uncond"),
    )
    per_rank = []
    for t in range(1, max_rank + 1):
        at_t = F.col("rank") == t
        per_rank += [
            F.sum(at_t.cast("long")).alias(f"n_{t}"),
            F.sum(F.when(at_t, F.col("ln_cond")).otherwise(0)).alias(f"ln_cond_{t}"),
            F.sum(F.when(at_t, F.col("ln_uncond")).otherwise(0)).alias(f"ln_uncond_{t}"),
        ]
    per_serp = (
        rows.groupBy(*KEYS, "serp_id")
        .agg(F.sum("clipped_cond").alias("clipped_cond"), F.sum("clipped_uncond").alias("clipped_uncond"), *per_rank)
    )
    summed = [c for c in stat_columns(max_rank) if c != "n_serps"]
    return (
        per_serp.join(sessions, on=["dataset", "serp_id"], how="inner")
        .groupBy(*KEYS, "session_id")
        .agg(F.sum("n_1").alias("n_serps"), *[F.sum(c).alias(c) for c in summed])
        .select(*KEYS, "session_id", *stat_columns(max_rank))
    )


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


def log_likelihood_by_split(predictions: DataFrame, eps: float = 1e-6) -> dict[str, float]:
    """Mean per-position log-likelihood of p_click_cond (DESIGN §5 LL), per split: a small global aggregate."""
    ll = log_lik(clipped("p_click_cond", eps))
    return {r["split"]: r["ll"] for r in predictions.groupBy("split").agg(F.avg(ll).alias("ll")).collect()}
