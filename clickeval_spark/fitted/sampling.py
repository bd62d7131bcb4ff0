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

from typing import TYPE_CHECKING, Iterator, Mapping

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from clickeval_spark.hashing import seeded_uniform
from clickeval_spark.fitted.attach import (attach_models, batch_arrays, list_array, padded, shared_max_rank,
                                           truncate_serps, wide_cols, wide_models)
from clickeval_spark.models.base import sample_clicks

if TYPE_CHECKING:  # FittedModel's methods call this module: the class is only a type here
    from clickeval_spark.fitted import FittedModel

_LIST_COLS = ("doc_ids", "vtypes", "clicks")


def _uniforms(seed: int):
    """The draw of rank r: U[0, 1) from (seed, serp_id, sample_idx, r)."""
    def fn(r: Column) -> Column:
        return seeded_uniform(seed, F.col("serp_id"), F.col("sample_idx"), r)

    return fn


def _sample_fn(fitted: Mapping[str, FittedModel], out_cols: list[str], deterministic: bool):
    M = shared_max_rank(fitted)
    models = wide_models(fitted)
    cols = wide_cols(fitted)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            n = batch.num_rows
            if n == 0:
                continue
            _, mask, lens, attached = batch_arrays(batch, M, cols)
            u = padded(batch.column("_u"), mask, np.float64, 1.0)
            for name, model, g, own in models:
                qd = {p: attached[c] for p, c in own.items()}
                clicks = list_array(sample_clicks(model, qd, g, mask, u, deterministic=deterministic)
                                    .astype(np.int32), mask, lens)
                # every other column passes through as the Arrow array it came in
                yield pa.RecordBatch.from_arrays(
                    [pa.repeat(name, n), *[clicks if c == "clicks" else batch.column(c) for c in out_cols]],
                    names=["model", *out_cols])

    return run


def sample_models(serps: DataFrame, fitted: Mapping[str, FittedModel], *, k: int, seed: int,
                  deterministic: bool = False, qd: DataFrame | None = None) -> DataFrame:
    """k generated click sequences per SERP and model, the models' parameters attached once
    (`predict.wide_qd`; ``qd``: that table, when the caller has a cheaper way to build it).

    Output: ``model`` (the key of ``fitted``), the serps columns in their order, with
    ``clicks`` replaced by the sampled sequence, plus ``sample_idx`` int (0..k-1). Lists
    are cut to the fitted ``max_rank`` (doc_ids, vtypes and clicks alike): the model has no
    parameters beyond it. SERPs without a query or results are skipped. The uniforms
    depend on (seed, serp_id, sample_idx, rank) only, so the models share them.
    ``deterministic``: click where P(C_r = 1 | sampled clicks above) > 0.5; the
    k samples are then identical.
    """
    if k < 1:
        raise ValueError("k must be >= 1")
    cols = list(serps.columns)
    base = truncate_serps(serps, shared_max_rank(fitted), keep=cols, cut=_LIST_COLS).select(*cols)
    # parameters are attached once per SERP, before the k copies are made
    joined = attach_models(base, fitted, qd)
    joined = joined.select(*joined.columns,
                           F.explode(F.sequence(F.lit(0), F.lit(int(k) - 1))).alias("sample_idx"))
    joined = joined.select(
        *joined.columns,
        F.transform(F.sequence(F.lit(1), F.size(F.col("doc_ids"))), _uniforms(seed)).alias("_u"),
    )
    # the observed clicks only give batch_arrays the list lengths; the kernel never sees them
    out_cols = cols + ["sample_idx"]
    schema = T.StructType(
        [T.StructField("model", T.StringType(), False)]
        + [T.StructField(f.name, T.ArrayType(T.IntegerType()) if f.name == "clicks" else f.dataType, True)
           for f in serps.schema.fields]
        + [T.StructField("sample_idx", T.IntegerType(), False)]
    )
    return (
        joined.mapInArrow(_sample_fn(fitted, out_cols, deterministic), schema)
        .select("model", *out_cols)
    )


def sample_serps(serps: DataFrame, fitted: FittedModel, *, k: int, seed: int,
                 deterministic: bool = False) -> DataFrame:
    """`sample_models` for one model, without the model column."""
    return sample_models(serps, {fitted.model.name: fitted}, k=k, seed=seed, deterministic=deterministic).drop("model")
