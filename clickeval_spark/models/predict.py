"""Click probabilities and relevance scores from a fitted click model.

Both run the kernel in Python (``mapInArrow`` / ``mapInPandas``) on parameters attached to the SERP
arrays exactly as in EM (`attach.attach_qd`: per-query maps for queries with
few docs, a (query, doc) join for head queries); pairs unseen in training get
``fitted.prior``. Only the global
parameters travel in the task closure.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from clickeval_spark.models.attach import attach_qd, batch_arrays, list_array, qd_array_col, truncate_serps
from clickeval_spark.models.fitted import FittedModel

# one row per SERP; element i of each array is rank i + 1 (DESIGN §2 click_predictions)
PREDICTION_SCHEMA = ("dataset string, split string, serp_id string, clicks array<int>, "
                     "p_click_cond array<double>, p_click array<double>")
RELEVANCE_SCHEMA = "query_id string, doc_id string, score double"


def _predict_fn(fitted: FittedModel):
    model, g, M = fitted.model, fitted.glob, fitted.max_rank
    params = list(model.qd_params)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            clicks, mask, lens, qd = batch_arrays(batch, M, params)
            p_cond = np.asarray(model.cond_probs(qd, g, clicks, mask), dtype=np.float64)
            p_click = np.asarray(model.click_probs(qd, g, mask), dtype=np.float64)
            yield pa.RecordBatch.from_arrays(
                [batch.column("dataset"), batch.column("split"), batch.column("serp_id"),
                 list_array(clicks.astype(np.int32), mask, lens), list_array(p_cond, mask, lens),
                 list_array(p_click, mask, lens)],
                names=["dataset", "split", "serp_id", "clicks", "p_click_cond", "p_click"])

    return run


def predict_clicks(serps: DataFrame, fitted: FittedModel) -> DataFrame:
    """One row per SERP: dataset, split, serp_id, clicks array<int>, p_click_cond array<double>,
    p_click array<double>; element i is rank i + 1 (`click_prediction.by_rank` gives one row per rank).

    p_click_cond = P(C_r = 1 | the SERP's observed clicks above r); p_click =
    P(C_r = 1) with earlier clicks marginalised. Ranks beyond the fitted
    max_rank are not predicted; SERPs without a query or results are skipped.
    """
    params = list(fitted.model.qd_params)
    base = truncate_serps(serps, fitted.max_rank, keep=("dataset", "split", "serp_id"))
    joined = attach_qd(base, fitted.qd, params, fitted.prior)
    cols = ["dataset", "split", "serp_id", "query_id", "doc_ids", "clicks",
            *[qd_array_col(p) for p in params]]
    return (
        joined.select(*cols)
        .mapInArrow(_predict_fn(fitted), PREDICTION_SCHEMA)
        .select("dataset", "split", "serp_id", "clicks", "p_click_cond", "p_click")
    )


def _relevance_fn(fitted: FittedModel):
    model = fitted.model
    params = list(model.qd_params)

    def run(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for pdf in batches:
            if len(pdf) == 0:
                continue
            qd = {p: pdf[p].to_numpy(dtype=np.float64).reshape(-1, 1) for p in params}
            score = np.asarray(model.relevance(qd), dtype=np.float64).reshape(-1)
            yield pd.DataFrame({"query_id": pdf["query_id"].to_numpy(),
                                "doc_id": pdf["doc_id"].to_numpy(), "score": score})

    return run


def relevance_scores(fitted: FittedModel, pairs: DataFrame | None = None) -> DataFrame:
    """query_id, doc_id, score for every (query, doc) pair of the training log and of ``pairs``:
    the kernel's ``relevance`` (attractiveness; alpha * sigma for DBN / SDBN).

    Pairs unseen in training are scored from the model's prior (the pooled
    training estimate, ``fitted.prior``), so every document of an evaluated SERP
    has a score. Models without per-(query, doc) parameters (GCTR, RCTR) cannot
    rank documents: ValueError (the kernel's own message).
    """
    params = list(fitted.model.qd_params)
    if not params:
        fitted.model.relevance({})  # the kernel raises with its reason
        raise ValueError(f"{fitted.model.name} has no per-(query, doc) parameter to score")
    known = fitted.qd.select("query_id", "doc_id", *[F.col(p).cast("double").alias(p) for p in params])
    if pairs is not None:
        unseen = pairs.select("query_id", "doc_id").distinct().join(known, on=["query_id", "doc_id"], how="left_anti")
        known = known.unionByName(
            unseen.select("query_id", "doc_id", *[F.lit(float(fitted.prior[p])).alias(p) for p in params]))
    return (
        known.mapInPandas(_relevance_fn(fitted), RELEVANCE_SCHEMA)
        .select("query_id", "doc_id", "score")
    )
