"""Seeded uniforms from hashes: the one source of randomness in every Spark-side draw.

A draw is a pure function of (seed, its key columns), so splits, simulated logs and
sampled click sequences are the same on any number of partitions and in any order.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

_MANTISSA = (1 << 53) - 1  # a double holds 53 random bits exactly


def seeded_uniform(seed: int, *keys: Column | str) -> Column:
    """U[0, 1) from xxhash64(seed, keys...); string keys are column names."""
    cols = [F.col(k) if isinstance(k, str) else k for k in keys]
    return (F.xxhash64(F.lit(int(seed)).cast("long"), *cols)
            .bitwiseAND(F.lit(_MANTISSA)).cast("double") / float(1 << 53))
