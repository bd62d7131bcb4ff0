"""The evaluate stage's computation: per-SERP statistics → bootstrap sums → metric rows.

Spark does all per-row work: a vectorised pass over the prediction arrays for the click
statistics, one over each labelled SERP's documents for NDCG, and one that weighs every
row with its session's replicate weights; the driver receives (models × splits ×
(replicates + 1)) rows of sums and turns them into metrics with intervals. Nothing per
SERP reaches the driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
from pyspark.sql import DataFrame, SparkSession

from clickeval_spark.metrics import bootstrap, click_prediction, ndcg
from clickeval_spark.tables import METRICS

KEYS = ("model", "dataset", "split")
# the headline metrics that also get paired differences against a reference model
PAIRED = ("LL", "PPL", "PPL_cond", "NDCG")
# bookkeeping metric -> the statistic it reports (a count, no interval)
BOOKKEEPING = {"clipped_p_click_cond": "clipped_cond", "clipped_p_click": "clipped_uncond",
               "ndcg_excluded_idcg0": "excluded_idcg0", "ndcg_negative_grades": "negative_grades",
               "ndcg_unjudged_docs": "unjudged_docs", "ndcg_unscored_docs": "unscored_docs"}


@dataclass(frozen=True)
class MetricOptions:
    max_rank: int = 10
    eps: float = 1e-6
    replicates: int = 200
    seed: int = 20210414
    confidence: float = 0.95
    ndcg_cutoffs: tuple[int, ...] = (1, 3, 5, 10)
    ndcg_gain: str = "exponential"
    ndcg_ideal: str = "serp"

    @classmethod
    def from_config(cls, ecfg, max_rank: int) -> "MetricOptions":
        """The options of an `evaluate:` config section (config.EvaluateConfig) and fit.max_rank."""
        return cls(max_rank=max_rank, eps=ecfg.eps, replicates=ecfg.replicates, seed=ecfg.seed,
                   confidence=ecfg.confidence, ndcg_cutoffs=tuple(ecfg.ndcg_cutoffs),
                   ndcg_gain=ecfg.ndcg_gain, ndcg_ideal=ecfg.ndcg_ideal)


def statistic_replicates(predictions: DataFrame, serps: DataFrame, labels: DataFrame | None,
                         scores: DataFrame | None, ndcg_models: Sequence[str],
                         opts: MetricOptions) -> tuple[DataFrame, list[str]]:
    """Per (model, dataset, split) and replicate 0..R, every additive statistic summed with its sessions'
    bootstrap weights (`bootstrap.replicate_total`'s rows), and the statistics' names.

    The click statistics (a row per (model, SERP)) and NDCG (a row per (model, labelled SERP)) are
    weighted apart, each SERP with its session's weights, and meet only as replicate sums."""
    click_cols = click_prediction.stat_columns(opts.max_rank)
    sessions = serps.select("dataset", "serp_id", "session_id")
    clicks = click_prediction.serp_session_stats(predictions, sessions, opts.max_rank, opts.eps)
    parts = [bootstrap.replicate_partials(clicks, KEYS, click_cols, opts.seed, opts.replicates, vector="stats")]
    cols = list(click_cols)
    if labels is not None and scores is not None and ndcg_models:
        ndcg_cols = ndcg.stat_columns(opts.ndcg_cutoffs)
        graded = ndcg.graded_docs(serps, labels, opts.max_rank, opts.ndcg_gain)
        idcg = (ndcg.query_ideal_dcg(graded, labels, opts.ndcg_cutoffs, opts.ndcg_gain)
                if opts.ndcg_ideal == "query" else None)
        labelled = ndcg.serp_ndcg(graded, scores, ndcg_models, opts.ndcg_cutoffs, idcg)
        parts.append(bootstrap.replicate_partials(labelled, KEYS, ndcg_cols, opts.seed, opts.replicates))
        cols += ndcg_cols
    return bootstrap.replicate_total(parts, KEYS, cols), cols


def _replicate_arrays(rows: Iterable, stat_cols: Sequence[str], replicates: int) -> dict[tuple, dict[str, np.ndarray]]:
    """{(model, dataset, split): {stat: float array over replicates 0..R}} from collected sums."""
    out: dict[tuple, dict[str, np.ndarray]] = {}
    for row in rows:
        key = tuple(row[k] for k in KEYS)
        group = out.setdefault(key, {c: np.full(replicates + 1, np.nan) for c in stat_cols})
        for c in stat_cols:
            group[c][row["replicate"]] = float(int(row[c]))
    return out


def _metric_row(key: tuple, metric: str, cutoff: int | None, reps: np.ndarray, n: int | None,
                confidence: float, reference: str | None = None) -> dict:
    low, high = bootstrap.percentile_interval(reps[1:], confidence)
    value = float(reps[0])
    return {"model": key[0], "dataset": key[1], "split": key[2], "metric": metric, "cutoff": cutoff,
            "value": value if np.isfinite(value) else None, "n": n, "ci_low": low, "ci_high": high,
            "reference_model": reference}


def metric_rows(replicate_sums: DataFrame, stat_cols: Sequence[str], opts: MetricOptions,
                reference_model: str | None) -> list[dict]:
    """Metric rows (dicts in the metrics contract, without run_id) from the bootstrap sums."""
    groups = _replicate_arrays(replicate_sums.collect(), stat_cols, opts.replicates)
    scale = bootstrap.SCALE
    per_group: dict[tuple, dict[tuple[str, int | None], np.ndarray]] = {}
    rows = []
    for key, sums in sorted(groups.items()):
        metrics = click_prediction.metric_replicates(sums, opts.max_rank, scale)
        n_lab = int(sums.get("n_labelled", np.zeros(1))[0])
        if n_lab > 0:
            metrics.update(ndcg.metric_replicates(sums, opts.ndcg_cutoffs, scale))
        per_group[key] = metrics
        n_serps = int(sums["n_serps"][0])
        for (metric, cutoff), reps in metrics.items():
            n = n_lab if metric == "NDCG" else (int(sums[f"n_{cutoff}"][0]) if cutoff else n_serps)
            rows.append(_metric_row(key, metric, cutoff, reps, n, opts.confidence))
        for metric, col in BOOKKEEPING.items():
            if col in sums and (metric.startswith("clipped") or n_lab or int(sums[col][0])):
                rows.append({"model": key[0], "dataset": key[1], "split": key[2], "metric": metric,
                             "cutoff": None, "value": float(sums[col][0]), "n": None, "ci_low": None,
                             "ci_high": None, "reference_model": None})
    if reference_model:
        rows += paired_difference_rows(per_group, groups, reference_model, opts.confidence)
    return rows


def paired_difference_rows(per_group: dict, groups: dict, reference: str, confidence: float) -> list[dict]:
    """metric_diff = model − reference on the same SERPs, replicate by replicate (shared session weights)."""
    rows = []
    for (model, dataset, split), metrics in per_group.items():
        ref_key = (reference, dataset, split)
        if model == reference or ref_key not in per_group:
            continue
        if groups[ref_key]["n_serps"][0] != groups[(model, dataset, split)]["n_serps"][0]:
            continue  # not the same SERPs: a paired difference would be meaningless
        for (metric, cutoff), reps in metrics.items():
            ref = per_group[ref_key].get((metric, cutoff))
            if metric in PAIRED and ref is not None and (cutoff is None or metric == "NDCG"):
                n = int(groups[ref_key]["n_labelled" if metric == "NDCG" else "n_serps"][0])
                rows.append(_metric_row((model, dataset, split), f"{metric}_diff", cutoff, reps - ref, n,
                                        confidence, reference))
    return rows


def compute_metrics(predictions: DataFrame, serps: DataFrame, labels: DataFrame | None,
                    scores: DataFrame | None, ndcg_models: Sequence[str], opts: MetricOptions,
                    reference_model: str | None = None) -> list[dict]:
    sums, cols = statistic_replicates(predictions, serps, labels, scores, ndcg_models, opts)
    return metric_rows(sums, cols, opts, reference_model)


def metrics_frame(spark: SparkSession, rows: list[dict], run_id: str) -> DataFrame:
    return spark.createDataFrame([{"run_id": run_id, **r} for r in rows], METRICS)
