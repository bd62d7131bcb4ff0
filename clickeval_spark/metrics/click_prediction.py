"""Click-prediction statistics (DESIGN §5): LL and PPL@t, conditional and unconditional.

One pass over click_predictions (one row per SERP, arrays by rank) reads each rank's
element and sums per session (positions, Σ ln P(c | p_cond), Σ ln P(c | p_click),
clipped counts); the metrics
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


def _at(column: str, t: int) -> Column:
    return F.element_at(column, t)


def serp_stats(predictions: DataFrame, max_rank: int, eps: float) -> DataFrame:
    """KEYS, serp_id + stat_columns(max_rank) but n_serps, one row per SERP, straight from the arrays
    (no explode): the rank-t columns read element t. Log terms are fixed-point longs."""
    n = F.size("p_click_cond")
    zero = F.lit(0).cast("long")
    per_rank = []
    for t in range(1, max_rank + 1):
        here = n >= t
        per_rank += [
            here.cast("long").alias(f"n_{t}"),
            F.when(here, to_fixed(log_lik(clipped(_at("p_click_cond", t), eps), _at("clicks", t)))).otherwise(zero)
            .alias(f"ln_cond_{t}"),
            F.when(here, to_fixed(log_lik(clipped(_at("p_click", t), eps), _at("clicks", t)))).otherwise(zero)
            .alias(f"ln_uncond_{t}"),
        ]

    def n_clipped(column: str) -> Column:
        return F.size(F.filter(F.slice(column, 1, max_rank), lambda p: p != clipped(p, eps))).cast("long")

    return predictions.select(*KEYS, "serp_id", n_clipped("p_click_cond").alias("clipped_cond"),
                              n_clipped("p_click").alias("clipped_uncond"), *per_rank)


def session_stats(predictions: DataFrame, sessions: DataFrame, max_rank: int, eps: float) -> DataFrame:
    """model, dataset, split, session_id + stat_columns(max_rank), one row per session.

    `predictions`: the click_predictions contract (model, dataset, split, serp_id, clicks,
    p_click_cond, p_click: one row per SERP); `sessions`: dataset, serp_id, session_id.
    Log terms are stored as fixed-point longs (exact, order-free sums). A SERP is counted
    at its rank 1.
    """
    summed = [c for c in stat_columns(max_rank) if c != "n_serps"]
    return (
        serp_stats(predictions, max_rank, eps).join(sessions, on=["dataset", "serp_id"], how="inner")
        .groupBy(*KEYS, "session_id")
        .agg(F.sum("n_1").alias("n_serps"), *[F.sum(c).alias(c) for c in summed])
        .select(*KEYS, "session_id", *stat_columns(max_rank))
    )


def _ll_per_position(eps: float) -> Column:
    """Aggregate: mean per-position log-likelihood of p_click_cond (DESIGN §5 LL) over the group's SERPs."""
    terms = F.zip_with("p_click_cond", "clicks", lambda p, c: log_lik(clipped(p, eps), c))
    serp_ll = F.aggregate(terms, F.lit(0.0), lambda acc, x: acc + x)
    return (F.sum(serp_ll) / F.sum(F.size("p_click_cond"))).alias("ll")


def log_likelihood_by_split(predictions: DataFrame, eps: float = 1e-6) -> dict[str, float]:
    """Mean per-position log-likelihood of p_click_cond (DESIGN §5 LL), per split: a small global aggregate."""
    return {r["split"]: r["ll"] for r in predictions.groupBy("split").agg(_ll_per_position(eps)).collect()}


def log_likelihood_by_model(predictions: DataFrame, eps: float = 1e-6) -> dict[str, tuple[dict[str, float], int]]:
    """Per model: (`log_likelihood_by_split`'s numbers, its SERP count), in one aggregate over every model."""
    out: dict[str, tuple[dict[str, float], int]] = {}
    for r in (predictions.groupBy("model", "split").agg(_ll_per_position(eps), F.count("*").alias("n"))
              .collect()):
        by_split, n = out.get(r["model"], ({}, 0))
        out[r["model"]] = ({**by_split, r["split"]: r["ll"]}, n + r["n"])
    return out


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

