"""Reverse / Forward PPL (DESIGN §5): how well a generator's click sequences cover the real ones.

Reverse PPL: a surrogate click model fitted on the generator's synthetic sequences,
scored (total PPL) on the real test SERPs. Forward PPL: the surrogate fitted on the
real test SERPs, scored on the synthetic sequences. The surrogate's model and EM
iterations are the same for every generator of a run.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from clickeval_spark.metrics.bootstrap import SCALE
from clickeval_spark.metrics.click_prediction import serp_stats
from clickeval_spark.models.base import ClickModel
from clickeval_spark.models.priors import ModelPrior
from clickeval_spark.models.fitted import FittedModel
from clickeval_spark.models.spark_em import fit


@dataclass(frozen=True)
class Perplexity:
    total: float  # mean of PPL@t over the ranks present
    at_rank: tuple[float, ...]  # PPL@1..M (NaN where no SERP reaches the rank)
    n_serps: int


def perplexity(serps: DataFrame, fitted: FittedModel, eps: float = 1e-6) -> Perplexity:
    """Classic click-model perplexity of `fitted` on `serps` (unconditional p_click), per rank and total.

    Sums are fixed-point (exact, order-free); one row of per-rank sums reaches the driver.
    """
    M = fitted.max_rank
    stats = serp_stats(fitted.predict(serps).withColumn("model", F.lit(fitted.model.name)), M, eps)
    sums = stats.agg(*[F.sum(f"{c}_{t}").alias(f"{c}_{t}") for t in range(1, M + 1)
                       for c in ("n", "ln_uncond")]).first()
    at_rank = tuple(math.exp(-sums[f"ln_uncond_{t}"] / SCALE / sums[f"n_{t}"]) if sums[f"n_{t}"] else math.nan
                    for t in range(1, M + 1))
    present = [v for v in at_rank if not math.isnan(v)]
    n_serps = int(sums["n_1"] or 0)
    return Perplexity(sum(present) / len(present) if present else math.nan, at_rank, n_serps)


def fit_surrogate(serps: DataFrame, surrogate: ClickModel, iterations: int, max_rank: int,
                  logger: logging.Logger | None = None, prior: ModelPrior | None = None) -> FittedModel:
    """The surrogate: a fixed number of passes and one prior for every generator (no held-out
    SERPs here, so `k: auto` means priors.DEFAULT_K): the same capacity whatever it is fitted on."""
    return fit(serps, surrogate, iterations=iterations, max_rank=max_rank, logger=logger, prior=prior)


def coverage(real: DataFrame, synthetic: DataFrame, on_real: FittedModel, surrogate: ClickModel,
             iterations: int, max_rank: int, eps: float, logger: logging.Logger | None = None,
             prior: ModelPrior | None = None) -> tuple[Perplexity, Perplexity]:
    """(Reverse, Forward) perplexity of one generator's synthetic sequences against the real SERPs."""
    on_synthetic = fit_surrogate(synthetic, surrogate, iterations, max_rank, logger, prior)
    return perplexity(real, on_synthetic, eps), perplexity(synthetic, on_real, eps)


def coverage_row(run_id: str, dataset: str, generator: str, surrogate: str, surrogate_iterations: int,
                 order: str, mode: str, reverse: Perplexity, forward: Perplexity, n_real: int) -> dict:
    """One distributional_metrics row: a generator's Reverse / Forward PPL (NaN stored as null)."""
    def finite(v: float) -> float | None:
        return None if math.isnan(v) else v

    return {"run_id": run_id, "dataset": dataset, "generator_model": generator, "surrogate_model": surrogate,
            "variant": f"{order}/{mode}", "list_order": order, "click_mode": mode,
            "reverse_ppl": finite(reverse.total), "forward_ppl": finite(forward.total),
            "reverse_ppl_at": [finite(v) for v in reverse.at_rank], "forward_ppl_at": [finite(v) for v in forward.at_rank],
            "n_synthetic": forward.n_serps, "n_real": n_real, "surrogate_iterations": surrogate_iterations}
