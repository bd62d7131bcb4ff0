"""Synthetic click sequences for the distributional measures (DESIGN §5, Reverse / Forward PPL).

A generator model produces K click sequences per test SERP, on the list as logged
(`original`) or on a poorly ranked version of it: `shuffled_all` (the whole list
permuted) or `shuffled_halves` (top five and bottom five permuted separately).
Permutations and clicks come from seeded hashes, so the rows are the same on any
number of partitions; every generator sees the same permuted lists.
"""

from __future__ import annotations

from functools import reduce
from typing import Mapping

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from clickeval_spark.config import CLICK_MODES, LIST_ORDERS
from clickeval_spark.fitted import FittedModel
from clickeval_spark.fitted.sampling import sample_models
from clickeval_spark.tables import GENERATED_SERP_FIELDS

HALF = 5  # shuffled_halves: ranks 1-5 and 6-10 are permuted separately
SERP_COLUMNS = tuple(f.name for f in GENERATED_SERP_FIELDS)


def _permutation_key(seed: int, list_order: str, i: Column) -> Column:
    """Sort key of position i (0-based): a seeded hash, kept within its half for shuffled_halves."""
    h = F.xxhash64(F.lit(int(seed)).cast("long"), F.lit(list_order), F.col("serp_id"), i)
    return F.struct((i >= HALF).cast("int").alias("half") if list_order == "shuffled_halves" else F.lit(0).alias("half"),
                    h.alias("h"), i.alias("i"))


def reorder(serps: DataFrame, list_order: str, seed: int) -> DataFrame:
    """The SERPs with doc_ids / vtypes / clicks permuted as `list_order` says (original: unchanged)."""
    if list_order not in LIST_ORDERS:
        raise ValueError(f"list_order {list_order!r}; allowed: {list(LIST_ORDERS)}")
    if list_order == "original":
        return serps
    idx = F.sequence(F.lit(0), F.size("doc_ids") - 1)
    order = F.transform(F.array_sort(F.transform(idx, lambda i: _permutation_key(seed, list_order, i))),
                        lambda k: k["i"])

    def permute(col: str) -> Column:
        return F.transform(order, lambda i: F.element_at(F.col(col), i + 1))

    return serps.withColumns({
        "doc_ids": permute("doc_ids"),
        "clicks": permute("clicks"),
        "vtypes": F.when(F.col("vtypes").isNull(), F.lit(None)).otherwise(permute("vtypes")),
    })


def generate(serps: DataFrame, generators: Mapping[str, FittedModel], *, samples: int, click_mode: str,
             list_orders: tuple[str, ...], seed: int, qd: DataFrame | None = None) -> DataFrame:
    """synthetic_serps rows (without run_id) of every generator (named by its key) in one click mode,
    for every list order.

    The list orders are stacked before sampling and the generators sampled together
    (`sampling.sample_models`), so the parameters are attached once. Uniforms are keyed by
    (seed, serp_id, sample_idx, rank): list orders and generators of a SERP share them
    (common random numbers), which leaves each variant an exact sample. Deterministic mode
    clicks where P(click | generated clicks above) > 0.5, so its K samples would be
    identical: one sample (sample_idx 0) is written. ``qd``: the generators' wide qd table
    (`attach.wide_qd`), when the caller has a cheaper way to build it.
    """
    if click_mode not in CLICK_MODES:
        raise ValueError(f"click_mode {click_mode!r}; allowed: {list(CLICK_MODES)}")
    deterministic = click_mode == "deterministic"
    base = serps.select(*SERP_COLUMNS)
    lists = reduce(DataFrame.unionByName,
                   [reorder(base, order, seed).withColumn("list_order", F.lit(order)) for order in list_orders])
    sampled = sample_models(lists, generators, k=1 if deterministic else samples, seed=seed,
                            deterministic=deterministic, qd=qd)
    return sampled.select(
        F.col("model").alias("generator_model"), "sample_idx", F.lit(click_mode).alias("click_mode"),
        "list_order", *SERP_COLUMNS)
