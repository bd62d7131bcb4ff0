"""Synthetic click sequences from a fitted click model.

For every SERP and sample index 0..k-1, clicks are drawn rank by rank with
`base.sample_clicks` (C_r = [u_r < P(C_r = 1 | sampled clicks above)]). The
uniforms are computed in Spark SQL from a seeded hash of (seed, serp_id,
sample_idx, rank):

    u = (xxhash64(seed, serp_id, sample_idx, rank) & (2^53 - 1)) / 2^53   in [0, 1)

so a row's clicks depend only on its own content and the parameters, never on
how the data is partitioned or batched: the same seed and input give the same
rows on any number of partitions.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from clickeval_spark.models.base import sample_clicks
from clickeval_spark.hashing import seeded_uniform
from clickeval_spark.models.attach import attach_qd, batch_arrays, pad, truncate_serps
from clickeval_spark.models.fitted import FittedModel

_LIST_COLS = ("doc_ids", "vtypes", "clicks")


def _uniforms(seed: int):
    """The draw of rank r: U[0, 1) from (seed, serp_id, sample_idx, r)."""
    def fn(r: Column) -> Column:
        return seeded_uniform(seed, F.col("serp_id"), F.col("sample_idx"), r)

    return fn


def _sample_fn(fitted: FittedModel, out_cols: list[str], deterministic: bool):
    model, g, M = fitted.model, fitted.glob, fitted.max_rank
    params = list(model.qd_params)

    def run(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for pdf in batches:
            if len(pdf) == 0:
                continue
            _, mask, lens, qd = batch_arrays(pdf, M, params)
            u, _, _ = pad(pdf["_u"], M, np.float64, 1.0)
            clicks = sample_clicks(model, qd, g, mask, u, deterministic=deterministic)
            flat = clicks[mask].astype(np.int32)
            out = pdf[out_cols].copy()
            out["clicks"] = np.split(flat, np.cumsum(lens)[:-1])
            yield out

    return run


def sample_serps(serps: DataFrame, fitted: FittedModel, *, k: int, seed: int,
                 deterministic: bool = False) -> DataFrame:
    """k generated click sequences per SERP.

    Output: the serps columns in their order, with ``clicks`` replaced by the
    sampled sequence, plus ``sample_idx`` int (0..k-1). Lists are cut to the
    fitted ``max_rank`` (doc_ids, vtypes and clicks alike): the model has no
    parameters beyond it. SERPs without a query or results are skipped.
    ``deterministic``: click where P(C_r = 1 | sampled clicks above) > 0.5; the
    k samples are then identical.
    """
    if k < 1:
        raise ValueError("k must be >= 1")
    M = fitted.max_rank
    params = list(fitted.model.qd_params)
    cols = list(serps.columns)
    base = truncate_serps(serps, M, keep=cols, cut=_LIST_COLS).select(*cols)
    # parameters are attached once per SERP, before the k copies are made
    joined = attach_qd(base, fitted.qd, params, fitted.prior)
    joined = joined.select(*joined.columns,
                           F.explode(F.sequence(F.lit(0), F.lit(int(k) - 1))).alias("sample_idx"))
    joined = joined.select(
        *joined.columns,
        F.transform(F.sequence(F.lit(1), F.size(F.col("doc_ids"))), _uniforms(seed)).alias("_u"),
    )
    # the observed clicks only give batch_arrays the list lengths; the kernel never sees them
    out_cols = cols + ["sample_idx"]
    schema = T.StructType(
        [T.StructField(f.name, T.ArrayType(T.IntegerType()) if f.name == "clicks" else f.dataType, True)
         for f in serps.schema.fields]
        + [T.StructField("sample_idx", T.IntegerType(), False)]
    )
    return (
        joined.mapInPandas(_sample_fn(fitted, out_cols, deterministic), schema)
        .select(*out_cols)
    )
