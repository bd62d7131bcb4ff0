"""Reverse / Forward PPL (DESIGN §5): how well a generator's click sequences cover the real ones.

Reverse PPL: a surrogate click model fitted on the generator's synthetic sequences,
scored (total PPL) on the real test SERPs. Forward PPL: the surrogate fitted on the
real test SERPs, scored on the synthetic sequences. The surrogate's model and EM
iterations are the same for every generator of a run. The stage (stages/surrogate.py)
fits every surrogate in one packed log and takes Reverse PPL from the fits' own final
pass; `perplexities` gives the same number in one kernel pass over any SERPs (Forward PPL).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from clickeval_spark.metrics.bootstrap import SCALE
from clickeval_spark.metrics.click_prediction import log_terms
from clickeval_spark.fitted.attach import (attach_models, batch_arrays, qd_array_col, truncate_serps, wide_cols,
                                           wide_models)
from clickeval_spark.fitted import FittedModel


@dataclass(frozen=True)
class Perplexity:
    total: float  # mean of PPL@t over the ranks present
    at_rank: tuple[float, ...]  # PPL@1..M (NaN where no SERP reaches the rank)
    n_serps: int

    @classmethod
    def from_sums(cls, n: Sequence[float], ln: Sequence[float]) -> "Perplexity":
        """From per-rank position counts and summed ln P(observed click) under p_click.

        A rank no SERP reaches is NaN and left out of the total; a reached rank whose sum is NaN (a model
        that returned NaN probabilities) makes the total NaN too, rather than silently dropping out."""
        at_rank = tuple(math.exp(-float(l_) / float(n_)) if n_ else math.nan for n_, l_ in zip(n, ln))
        present = [v for v, n_ in zip(at_rank, n) if n_]
        return cls(sum(present) / len(present) if present else math.nan, at_rank, int(n[0]) if len(n) else 0)


def _perplexity_sums_fn(fitted: FittedModel, eps: float):
    [(_, model, g, own)] = wide_models({fitted.model.name: fitted})
    M = fitted.max_rank

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            clicks, mask, _, attached = batch_arrays(batch, M, list(own.values()))
            p = np.asarray(model.click_probs({q: attached[c] for q, c in own.items()}, g, mask), dtype=np.float64)
            _, terms = log_terms(clicks == 1, p, mask, eps)
            # this batch's sums per label: a few rows leave Python, not one per SERP
            labels, index = np.unique(batch.column("label").to_numpy(zero_copy_only=False), return_inverse=True)
            n, ln = np.zeros((len(labels), M), np.int64), np.zeros((len(labels), M), np.int64)
            np.add.at(n, index, mask.astype(np.int64))
            np.add.at(ln, index, terms)
            yield pa.RecordBatch.from_pydict({"label": pa.array(labels.tolist(), pa.string()),
                                              **{f"n_{t + 1}": n[:, t] for t in range(M)},
                                              **{f"ln_{t + 1}": ln[:, t] for t in range(M)}})

    return run


def perplexities(serps: DataFrame, fitted: FittedModel, eps: float = 1e-6,
                 label: Column | None = None) -> dict[str, Perplexity]:
    """Classic click-model perplexity of `fitted` (unconditional p_click) on `serps`, per rank and total, for
    each value of the string column `label` (default: one group, "all"): one Spark job for them all.

    One kernel pass: the model's p_click for each SERP and its fixed-point log terms (exact,
    order-free sums; the terms of `click_prediction.serp_stats`), summed per label within each
    Arrow batch; one row of per-rank sums per label reaches the driver.
    """
    M = fitted.max_rank
    one = {fitted.model.name: fitted}
    cols = wide_cols(one)
    base = truncate_serps(serps.withColumn("label", F.lit("all") if label is None else label), M, keep=("label",))
    attached = attach_models(base, one)
    schema = ("label string, " + ", ".join(f"n_{t} long" for t in range(1, M + 1)) + ", "
              + ", ".join(f"ln_{t} long" for t in range(1, M + 1)))
    rows = (
        attached.select("label", "doc_ids", "clicks", *[qd_array_col(c) for c in cols])
        .mapInArrow(_perplexity_sums_fn(fitted, eps), schema)
        .groupBy("label").agg(*[F.sum(c).alias(c) for t in range(1, M + 1) for c in (f"n_{t}", f"ln_{t}")])
        .collect()
    )
    return {r["label"]: Perplexity.from_sums([r[f"n_{t}"] for t in range(1, M + 1)],
                                             [r[f"ln_{t}"] / SCALE for t in range(1, M + 1)]) for r in rows}


def perplexity(serps: DataFrame, fitted: FittedModel, eps: float = 1e-6) -> Perplexity:
    """`perplexities` of all of `serps` as one group."""
    return perplexities(serps, fitted, eps).get("all", Perplexity(math.nan, (math.nan,) * fitted.max_rank, 0))


# The real log's reference rows: generator_model "real_log", list_order "original", and a click_mode that says
# how the surrogate was fitted and scored (its variant: original/<click_mode>):
#   observed       fitted on every real SERP and scored on them: in sample, as before (and the surrogate that
#                  scores every generator's sequences: Forward PPL)
#   fit_a_score_b  fitted on half a of the real SERPs, scored on half b (reverse_ppl); forward_ppl the surrogate
#                  fitted on half b, scored on half a: half a in a generator's place, half b the real log
#                  (n_synthetic = half a's SERPs, n_real = half b's)
#   fit_b_score_a  the same with the halves swapped
#   cross_fitted   the two out-of-sample scorings pooled: every real SERP scored once, by the surrogate fitted on
#                  the other half (reverse_ppl = forward_ppl = that number): the coverage chart's reference
REAL_LOG = "real_log"
IN_SAMPLE, A_ON_B, B_ON_A, CROSS_FITTED = "observed", "fit_a_score_b", "fit_b_score_a", "cross_fitted"


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
