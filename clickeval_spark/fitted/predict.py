"""Click probabilities and relevance scores from fitted click models.

Several models are predicted together: their per-(query, doc) parameters sit side by side
in one wide table (`wide_qd`: a column per (model, parameter), `wide_col`), attached to the
SERP arrays once, exactly as in EM (`attach.attach_qd`: per-query maps for queries with few
docs, a (query, doc) join for head queries), and one pass of Python (``mapInArrow``) runs
every model's kernel on each batch. The models share their pairs (they were fitted on the
same SERPs), so one attach serves them all. Pairs a model has no value for (unseen in
training) get its ``fitted.prior``. Only the global parameters travel in the task closure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from clickeval_spark.fitted.attach import (attach_models, batch_arrays, list_array, qd_array_col, shared_max_rank,
                                           truncate_serps, wide_cols, wide_models, wide_qd)

if TYPE_CHECKING:  # FittedModel's methods call this module: the class is only a type here
    from clickeval_spark.fitted import FittedModel

# one row per SERP; element i of each array is rank i + 1 (DESIGN §2 click_predictions)
PREDICTION_SCHEMA = ("model string, dataset string, split string, serp_id string, clicks array<int>, "
                     "p_click_cond array<double>, p_click array<double>")
RELEVANCE_SCHEMA = "model string, query_id string, doc_id string, score double"


def _predict_fn(fitted: Mapping[str, FittedModel]):
    M = shared_max_rank(fitted)
    models = wide_models(fitted)
    cols = wide_cols(fitted)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            n = batch.num_rows
            if n == 0:
                continue
            clicks, mask, lens, attached = batch_arrays(batch, M, cols)
            observed = list_array(clicks.astype(np.int32), mask, lens)
            for name, model, g, own in models:
                qd = {p: attached[c] for p, c in own.items()}
                p_cond = np.asarray(model.cond_probs(qd, g, clicks, mask), dtype=np.float64)
                p_click = np.asarray(model.click_probs(qd, g, mask), dtype=np.float64)
                yield pa.RecordBatch.from_arrays(
                    [pa.repeat(name, n), batch.column("dataset"), batch.column("split"), batch.column("serp_id"),
                     observed, list_array(p_cond, mask, lens), list_array(p_click, mask, lens)],
                    names=["model", "dataset", "split", "serp_id", "clicks", "p_click_cond", "p_click"])

    return run


def predict_models(serps: DataFrame, fitted: Mapping[str, FittedModel], qd: DataFrame | None = None) -> DataFrame:
    """One row per (model, SERP): model (the key of ``fitted``), dataset, split, serp_id, clicks
    array<int>, p_click_cond array<double>, p_click array<double>; element i is rank i + 1
    (`click_prediction.by_rank` gives one row per rank).

    p_click_cond = P(C_r = 1 | the SERP's observed clicks above r); p_click =
    P(C_r = 1) with earlier clicks marginalised. Ranks beyond the fitted
    max_rank (shared by the models) are not predicted; SERPs without a query or
    results are skipped. ``qd``: the models' `wide_qd` table, when the caller has a
    cheaper way to build it.
    """
    cols = wide_cols(fitted)
    base = truncate_serps(serps, shared_max_rank(fitted), keep=("dataset", "split", "serp_id"))
    return (
        attach_models(base, fitted, qd)
        .select("dataset", "split", "serp_id", "query_id", "doc_ids", "clicks", *[qd_array_col(c) for c in cols])
        .mapInArrow(_predict_fn(fitted), PREDICTION_SCHEMA)
        .select("model", "dataset", "split", "serp_id", "clicks", "p_click_cond", "p_click")
    )


def predict_clicks(serps: DataFrame, fitted: FittedModel) -> DataFrame:
    """`predict_models` for one model, without the model column."""
    return predict_models(serps, {fitted.model.name: fitted}).drop("model")


def _relevance_fn(fitted: Mapping[str, FittedModel]):
    models = [(name, model, {p: (c, float(fitted[name].prior[p])) for p, c in own.items()},
               (g,) if model.relevance_uses_globals else ())
              for name, model, g, own in wide_models(fitted)]

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            n = batch.num_rows
            if n == 0:
                continue
            for name, model, own, extra in models:
                # a pair the model has no value for (unseen in its training) takes its prior
                qd = {p: pc.fill_null(batch.column(c), prior).to_numpy(zero_copy_only=False).reshape(-1, 1)
                      for p, (c, prior) in own.items()}
                score = np.asarray(model.relevance(qd, *extra), dtype=np.float64).reshape(-1)
                yield pa.RecordBatch.from_arrays(
                    [pa.repeat(name, n), batch.column("query_id"), batch.column("doc_id"), pa.array(score)],
                    names=["model", "query_id", "doc_id", "score"])

    return run


def relevance_models(fitted: Mapping[str, FittedModel], pairs: DataFrame | None = None,
                     qd: DataFrame | None = None) -> DataFrame:
    """model, query_id, doc_id, score for every (query, doc) pair of the training log and of
    ``pairs``, per model: the kernel's ``relevance`` (attractiveness; alpha * sigma for DBN / SDBN).

    Pairs unseen in training are scored from the model's prior (the pooled
    training estimate, ``fitted.prior``), so every document of an evaluated SERP
    has a score. Models without per-(query, doc) parameters (GCTR, RCTR) cannot
    rank documents: ValueError (the kernel's own message). ``qd``: as in `predict_models`.
    """
    for name, f in fitted.items():
        if not f.model.qd_params:
            f.model.relevance({})  # the kernel raises with its reason
            raise ValueError(f"{name} has no per-(query, doc) parameter to score")
    cols = wide_cols(fitted)
    known = (wide_qd(fitted) if qd is None else qd).select(
        "query_id", "doc_id", *[F.col(c).cast("double").alias(c) for c in cols])
    if pairs is not None:
        # every pair once, the known ones with their values: one aggregation (partial on the map side),
        # not a distinct of the pairs and an anti join to the known ones
        blank = pairs.select("query_id", "doc_id", *[F.lit(None).cast("double").alias(c) for c in cols])
        known = (known.unionByName(blank).groupBy("query_id", "doc_id")
                 .agg(*[F.max(c).alias(c) for c in cols]))
    return (
        known.mapInArrow(_relevance_fn(fitted), RELEVANCE_SCHEMA)
        .select("model", "query_id", "doc_id", "score")
    )


def relevance_scores(fitted: FittedModel, pairs: DataFrame | None = None) -> DataFrame:
    """`relevance_models` for one model, without the model column: query_id, doc_id, score."""
    return relevance_models({fitted.model.name: fitted}, pairs).drop("model")
