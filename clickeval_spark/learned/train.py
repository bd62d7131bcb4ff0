"""Training the learned click model on the executors: Spark MLlib's LogisticRegression on the out-of-fold
feature rows (`features.out_of_fold` through `models.lcm.feature_matrix`), its weights then the kernel's
global parameters.

Why a logistic regression: its weights are a few dozen numbers that broadcast into the Arrow passes that
predict, marginalise (an exact forward DP over the features' click state) and sample, exactly like the classic
kernels' globals; a tree ensemble or an MLP would need its own inference path. benchmarks/RESULTS.md has the
held-out LL and fit time of the alternatives measured here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from clickeval_spark.fitted import FittedModel
from clickeval_spark.learned.features import fold_sums, out_of_fold, pair_stats, positions, rank_rates, with_expected
from clickeval_spark.models import get_model
from clickeval_spark.models.lcm import FEATURES, QD_STATS, feature_matrix

FEATURE_SCHEMA = "label double, features array<double>"


@dataclass(frozen=True)
class LearnerOptions:
    """The learner's settings; the same folds and seed give the same features on any partitioning."""
    folds: int = 5
    seed: int = 20210417
    reg_param: float = 1e-4
    # 30 L-BFGS iterations: on `make run`'s log 0.0001 of valid LL per position below 100 iterations, in a
    # third of the time (benchmarks/RESULTS.md, "The learned click model")
    max_iter: int = 30
    tol: float = 1e-6


def design_width(M: int) -> int:
    """Columns of a training vector: a one-hot of (rank, any click above), 2 M, then the FEATURES."""
    return 2 * M + len(FEATURES)


def design_rows(rank: np.ndarray, n_above: np.ndarray, last_click: np.ndarray, qd: dict, M: int) -> np.ndarray:
    """The (n, design_width(M)) matrix of n positions: the kernel's logit is this row dotted with
    concat(w_rank.ravel(), w), so the MLlib coefficients are the kernel's weights as they are."""
    n = len(rank)
    out = np.zeros((n, design_width(M)))
    out[np.arange(n), 2 * (rank - 1) + (n_above > 0)] = 1.0
    out[:, 2 * M:] = feature_matrix(qd, rank, n_above, last_click, M)
    return out


def _design_fn(M: int):
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            col = {name: batch.column(name).to_numpy(zero_copy_only=False) for name in batch.schema.names}
            rank = col["rank"].astype(np.int64)
            x = design_rows(rank, col["n_above"].astype(np.int64), col["last_click"].astype(np.int64),
                            {p: col[p].astype(np.float64) for p in QD_STATS}, M)
            width = x.shape[1]
            offsets = pa.array(np.arange(0, (len(rank) + 1) * width, width, dtype=np.int32))
            yield pa.RecordBatch.from_arrays(
                [pa.array(col["click"].astype(np.float64)), pa.ListArray.from_arrays(offsets, pa.array(x.ravel()))],
                names=["label", "features"])

    return run


def design_frame(oof: DataFrame, M: int) -> DataFrame:
    """label, features (an MLlib vector) of every out-of-fold training row; the feature transform is the
    kernel's own (`feature_matrix`), run in a vectorised Arrow pass."""
    from pyspark.ml.functions import array_to_vector   # pyspark.ml imports pandas: a second only lcm's fit needs

    return (oof.select("rank", "click", "n_above", "last_click", *QD_STATS)
            .mapInArrow(_design_fn(M), FEATURE_SCHEMA)
            .select("label", array_to_vector("features").alias("features")))


def held_out_ll(fitted: FittedModel, serps: DataFrame, eps: float = 1e-6) -> float | None:
    """LL per position (DESIGN §5, p = p_click_cond) of ``serps`` under ``fitted``; None without a position."""
    preds = fitted.predict(serps).select(F.explode(F.arrays_zip("clicks", "p_click_cond")).alias("z"))
    p = F.least(F.greatest(F.col("z.p_click_cond"), F.lit(eps)), F.lit(1 - eps))
    term = F.when(F.col("z.clicks") == 1, F.log(p)).otherwise(F.log(1 - p))
    row = preds.agg(F.avg(term).alias("ll")).first()
    return None if row is None or row["ll"] is None else float(row["ll"])


def train_lcm(train: DataFrame, max_rank: int, options: LearnerOptions = LearnerOptions(),
              valid: DataFrame | None = None) -> tuple[FittedModel, dict]:
    """The learned click model fitted on the ``train`` SERPs, and what the fit stage records of it (learner,
    rows, weights' names, out-of-fold train log loss, valid LL per position, seconds).

    The fitted qd table holds every training pair's statistics over the whole split (what predict, sample and
    relevance attach); the weights are the kernel's globals. Nothing per row or pair reaches the driver."""
    from pyspark.ml.classification import LogisticRegression   # as in design_frame

    t0 = time.perf_counter()
    M = int(max_rank)
    pos = positions(train, M, options.seed, options.folds).persist()
    try:
        ctr, ctr0, n_rows = rank_rates(pos, M)
        expected = with_expected(pos, ctr, ctr0)
        # the per-(pair, fold) sums, materialised once from the cached positions: the training rows' out-of-fold
        # statistics and the per-pair table are both read from them (as many rows as (pair, fold)s)
        sums = fold_sums(expected).localCheckpoint(eager=True)
        design = design_frame(out_of_fold(expected, sums=sums), M)
        # every L-BFGS iteration is a Spark job over the design's partitions: the join leaves
        # spark.sql.shuffle.partitions of them, more tasks than cores on a small log (make run's 30 iterations
        # 8.5 -> 4.5 s at 2 partitions instead of 8, benchmarks/RESULTS.md)
        cores = train.sparkSession.sparkContext.defaultParallelism
        if design.rdd.getNumPartitions() > cores:
            design = design.coalesce(cores)
        lr = LogisticRegression(featuresCol="features", labelCol="label", family="binomial", fitIntercept=False,
                                regParam=options.reg_param, elasticNetParam=0.0, maxIter=options.max_iter,
                                tol=options.tol, standardization=True)
        model = lr.fit(design)
        summary = model.summary
        objective = float(summary.objectiveHistory[-1])
        # the per-pair table, materialised: model_params takes a select of it per statistic and the valid LL
        # attaches it, which would each recompute it
        stats = pair_stats(expected, sums).localCheckpoint(eager=True)
    finally:
        pos.unpersist()
    coef = model.coefficients.toArray()
    glob = {"w_rank": coef[:2 * M].reshape(M, 2), "w": coef[2 * M:]}
    seconds = time.perf_counter() - t0
    fitted = FittedModel(model=get_model("lcm"), max_rank=M, qd=stats, glob=glob,
                         prior={p: 0.0 for p in QD_STATS}, history=[(0, -objective, seconds)])
    if valid is not None:
        fitted.valid_ll = held_out_ll(fitted, valid)
    details = {"learner": "pyspark.ml.classification.LogisticRegression",
               "options": {"folds": options.folds, "seed": options.seed, "reg_param": options.reg_param,
                           "max_iter": options.max_iter, "tol": options.tol},
               "rows": n_rows, "iterations": int(summary.totalIterations),
               "features": [f"rank{r}_{j}" for r in range(1, M + 1) for j in ("none_above", "clicked_above")]
               + list(FEATURES),
               "train_objective": objective, "rank_ctr": ctr, "rank_ctr_no_click_above": ctr0,
               "valid_ll": fitted.valid_ll, "seconds": seconds}
    return fitted, details
