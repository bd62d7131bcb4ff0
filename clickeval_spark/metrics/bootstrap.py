"""Session-level Poisson bootstrap over additive statistics, all replicates in one pass.

Every metric here is a smooth function of sums over sessions (log-likelihood sums,
position counts, NDCG sums). So a replicate needs only Σ_s w_rs · stats_s with
w_rs ~ Poisson(1) drawn from a seeded hash of (session, replicate): the SERPs of a
session share a weight, and the draw is the same on any partitioning. Since the
sums are exact, each SERP's row can be weighted on its own: no aggregation per
session is needed (`replicate_partials`).

Exactness: statistics travel as fixed-point integers (`to_fixed`), so every sum,
in any order and over any number of partitions, is exact, and the metrics are
bit-identical across runs and shuffle layouts. Replicate 0 has all weights 1 and
is the point estimate.
"""

from __future__ import annotations

import math
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

# fixed point: 2^-32 resolution, ~2e18 headroom in a long for the per-row terms we store
SCALE = float(1 << 32)
_SPLIT_BITS = 26  # hi/lo halves keep float64 matrix products exact (all partial sums < 2^53)
_POISSON1_CDF = np.cumsum([math.exp(-1) / math.factorial(k) for k in range(30)])
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def to_fixed(value: Column) -> Column:
    """A double statistic as a fixed-point long; sums of these are exact and order-free."""
    return F.round(value * F.lit(SCALE)).cast("long")


def fixed_np(values: np.ndarray) -> np.ndarray:
    """`to_fixed` in numpy: Spark's round is half away from zero (np.round is half to even).
    Scaling by a power of two is exact, and adding 0.5 is exact below 2^52."""
    v = values * SCALE
    return (np.sign(v) * np.floor(np.abs(v) + 0.5)).astype(np.int64)


def session_hash(seed: int, session_col: str = "session_id") -> Column:
    return F.xxhash64(F.lit(int(seed)).cast("long"), F.lit("bootstrap"), F.col(session_col))


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def poisson_weights(hashes: np.ndarray, replicates: int) -> np.ndarray:
    """(n sessions, replicates + 1) integer weights; column 0 is all ones (the point estimate).

    Weight r of a session is Poisson(1) by inverse CDF of a uniform from
    splitmix64(hash + r * golden): a pure function of (seed, session, r). Drawn by a compiled
    loop (`poisson_draws`; numba is imported where this runs, in the workers); the same
    integers as `numpy_poisson_weights`.
    """
    # numba (heavy, JIT-compiles on import) is loaded in the workers that draw, not on the driver
    from clickeval_spark.metrics.poisson_draws import poisson_draws

    h = np.ascontiguousarray(hashes.astype(np.int64).view(np.uint64).reshape(-1))
    out = np.empty((len(h), replicates + 1), dtype=np.int64)
    poisson_draws(h, _POISSON1_CDF, out)
    return out


def numpy_poisson_weights(hashes: np.ndarray, replicates: int) -> np.ndarray:
    """`poisson_weights` in numpy: its test oracle, and what the single-process numpy reference draws."""
    h = hashes.astype(np.int64).view(np.uint64).reshape(-1, 1)
    r = np.arange(1, replicates + 1, dtype=np.uint64).reshape(1, -1)
    with np.errstate(over="ignore"):
        bits = _splitmix64(h + r * _GOLDEN)
    u = (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    w = np.searchsorted(_POISSON1_CDF, u, side="right")
    return np.hstack([np.ones((len(h), 1), dtype=np.int64), w.astype(np.int64)])


def weighted_sums(weights: np.ndarray, stats: np.ndarray) -> np.ndarray:
    """Exact int64 weights.T @ stats for integer matrices, through two float64 BLAS products.

    Each stat is split into a high and a low part small enough that every partial
    sum stays below 2^53, where float64 arithmetic on integers is exact.
    """
    stats = stats.astype(np.int64)
    lo = np.bitwise_and(stats, (1 << _SPLIT_BITS) - 1)
    hi = np.right_shift(stats, _SPLIT_BITS)
    wt = weights.T.astype(np.float64)
    lo_sum = np.rint(wt @ lo.astype(np.float64)).astype(np.int64)
    hi_sum = np.rint(wt @ hi.astype(np.float64)).astype(np.int64)
    return hi_sum * (1 << _SPLIT_BITS) + lo_sum


def replicate_partials(stats: DataFrame, keys: Sequence[str], stat_cols: Sequence[str], seed: int,
                       replicates: int, vector: str | None = None) -> DataFrame:
    """keys..., replicate, stat columns (long): per Arrow batch and key group, Σ_rows weight · stat for
    replicates 0..R; `replicate_total` adds them up.

    `stats` has keys..., session_id and the statistics: long columns `stat_cols`, or with
    ``vector`` one array<long> column holding them in that order. A session may have many rows
    (one per SERP): they share its weights, and as the sums are exact integers, weighting each
    row gives what weighting the session's summed row gives, so nothing is grouped per session.
    """
    keys, stat_cols = list(keys), list(stat_cols)
    schema = ", ".join([*(f"`{k}` string" for k in keys), "replicate int",
                        *(f"`{c}` long" for c in stat_cols)])
    replicate = pa.array(np.arange(replicates + 1, dtype=np.int32))
    width = len(stat_cols)

    def values_of(batch: pa.RecordBatch) -> np.ndarray:
        if vector is None:
            cols = [batch.column(c) for c in stat_cols]
        else:
            lists = batch.column(vector)
            if not (pc.list_value_length(lists).to_numpy(zero_copy_only=False) == width).all():
                raise ValueError(f"replicate_partials: a {vector} array without {width} elements")
            cols = [lists.flatten()]
        if any(c.null_count for c in cols):
            raise ValueError("replicate_partials: a null statistic")
        return np.column_stack([c.to_numpy() for c in cols]).reshape(batch.num_rows, width).astype(np.int64, copy=False)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            values, hashes = values_of(batch), batch.column("_h").to_numpy()
            # one code per distinct key tuple (a null is a value of its own)
            code = np.zeros(batch.num_rows, dtype=np.int64)
            for k in keys:
                e = pc.dictionary_encode(batch.column(k), null_encoding="encode")
                code = code * len(e.dictionary) + e.indices.to_numpy(zero_copy_only=False)
            _, first, group = np.unique(code, return_index=True, return_inverse=True)
            for g, row in enumerate(first):
                rows = np.flatnonzero(group == g)
                sums = weighted_sums(poisson_weights(hashes[rows], replicates), values[rows])
                at_row = pa.array(np.full(replicates + 1, row))   # the group's key values, from its first row
                yield pa.RecordBatch.from_arrays(
                    [batch.column(k).take(at_row).cast(pa.string()) for k in keys]
                    + [replicate] + [pa.array(sums[:, j]) for j in range(width)],
                    names=[*keys, "replicate", *stat_cols])

    return (stats.select(*keys, session_hash(seed).alias("_h"), *([vector] if vector else stat_cols))
            .mapInArrow(run, schema))


def replicate_total(partials: Sequence[DataFrame], keys: Sequence[str], stat_cols: Sequence[str]) -> DataFrame:
    """Per key group and replicate 0..R: the `replicate_partials` summed, as exact decimal(38,0) sums; a
    statistic that none of a group's partials has is 0. A global-size result: (R + 1) rows per group."""
    union = partials[0]
    for more in partials[1:]:
        union = union.unionByName(more, allowMissingColumns=True)
    return (union.groupBy(*keys, "replicate")
            .agg(*[F.coalesce(F.sum(F.col(c).cast("decimal(38,0)")), F.lit(0).cast("decimal(38,0)")).alias(c)
                   for c in stat_cols]))


def replicate_sums(stats: DataFrame, keys: Sequence[str], stat_cols: Sequence[str], seed: int, replicates: int,
                   vector: str | None = None) -> DataFrame:
    """Per key group and replicate 0..R: Σ_sessions weight · stat, as exact decimal(38,0) sums
    (`replicate_partials`, then `replicate_total`)."""
    return replicate_total([replicate_partials(stats, keys, stat_cols, seed, replicates, vector)], keys, stat_cols)


def percentile_interval(replicate_values: np.ndarray, confidence: float) -> tuple[float | None, float | None]:
    """The percentile bootstrap interval; replicates where the metric is undefined (NaN) are left out."""
    finite = replicate_values[np.isfinite(replicate_values)]
    if len(finite) == 0:
        return None, None
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(finite, [tail, 1.0 - tail])
    return float(low), float(high)
