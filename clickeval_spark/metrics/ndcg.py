"""Relevance estimation: NDCG@k of the models' relevance scores against human labels (DESIGN §5).

Per labelled SERP its documents are ordered by the model's score (ties: original
rank first) with a window function, DCG@k = Σ_{i<=k} gain_i / log2(i + 1), and
IDCG@k is the same over the ideal order: the SERP's own grades (default) or all
judged documents of the query. SERPs with IDCG = 0 are excluded and counted;
negative grades count as 0 and are counted; unjudged documents on a labelled
SERP have gain 0 and are counted.

Which lists are labelled: see `graded_docs`.
"""

from __future__ import annotations

from typing import Literal, Sequence

import numpy as np
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from clickeval_spark.metrics.bootstrap import to_fixed

KEYS = ("model", "dataset", "split")


def stat_columns(cutoffs: Sequence[int]) -> list[str]:
    return ["n_labelled", *[f"ndcg_{k}" for k in cutoffs],
            "excluded_idcg0", "negative_grades", "unjudged_docs", "unscored_docs"]


def _gain(grade: Column, gain: str) -> Column:
    g = F.greatest(grade, F.lit(0)).cast("double")
    return F.pow(F.lit(2.0), g) - 1.0 if gain == "exponential" else g


def _discounted(position: Column, gain_col: str, k: int) -> Column:
    """Fixed-point gain / log2(position + 1) when position <= k, else 0."""
    return F.when(position <= k, to_fixed(F.col(gain_col) / F.log2(position + 1.0))).otherwise(F.lit(0).cast("long"))


def graded_docs(serps: DataFrame, labels: DataFrame, max_rank: int, gain: str) -> DataFrame:
    """dataset, split, session_id, serp_id, query_id, doc_id, rank, grade (null: unjudged), gain —
    the documents of every labelled list, from three kinds of labels:

    - tied to a SERP of the log: that SERP's documents, graded where labelled;
    - tied to a list of the label file itself (its serp_id is not in the log, e.g. the
      GraphCM/TREC label file): the labelled documents in their labelled order, in the
      split of their session;
    - pooled (no serp_id, no session): every SERP of the query.
    """
    tied_rows = labels.where(F.col("serp_id").isNotNull())
    tied = tied_rows.groupBy("dataset", "serp_id", "doc_id").agg(F.max("relevance").alias("tied_grade"))
    pooled = (labels.where(F.col("serp_id").isNull() & F.col("session_id").isNull())
              .groupBy("dataset", "query_id", "doc_id").agg(F.max("relevance").alias("pooled_grade")))
    # only SERPs a label can reach are exploded: a SERP with a tied label, or of a query with
    # pooled labels (in TianGong-ST ~1% of the log; exploding every SERP first cost 10x the rows)
    tied_serps = tied.select("dataset", "serp_id", F.lit(True).alias("_tied")).distinct()
    pooled_queries = pooled.select("dataset", "query_id", F.lit(True).alias("_pooled")).distinct()
    candidates = (
        serps.join(tied_serps, on=["dataset", "serp_id"], how="left")
        .join(pooled_queries, on=["dataset", "query_id"], how="left")
        .where(F.col("_tied") | F.col("_pooled"))
    )
    shown = candidates.select(
        "dataset", "split", "session_id", "serp_id", "query_id",
        F.posexplode("doc_ids").alias("pos", "doc_id"),
    ).where(F.col("pos") < max_rank).select(
        "dataset", "split", "session_id", "serp_id", "query_id", "doc_id", (F.col("pos") + 1).alias("rank"))
    per_serp = Window.partitionBy("dataset", "serp_id")
    on_log = (
        shown.join(tied, on=["dataset", "serp_id", "doc_id"], how="left")
        .join(pooled, on=["dataset", "query_id", "doc_id"], how="left")
        .withColumn("grade", F.coalesce("tied_grade", "pooled_grade"))
        .withColumn("labelled", F.max(F.col("grade").isNotNull().cast("int")).over(per_serp))
        .where(F.col("labelled") == 1)
    )
    session_split = serps.select("dataset", "session_id", "split").distinct()
    own_lists = (
        tied_rows.join(serps.select("dataset", "serp_id"), on=["dataset", "serp_id"], how="left_anti")
        .where(F.col("rank") <= max_rank)
        .join(session_split, on=["dataset", "session_id"], how="inner")
        .withColumn("grade", F.col("relevance"))
    )
    cols = ["dataset", "split", "session_id", "serp_id", "query_id", "doc_id", "rank", "grade"]
    return (
        on_log.select(*cols).unionByName(own_lists.select(*cols))
        .withColumn("gain", _gain(F.coalesce("grade", F.lit(0)), gain))
    )


def _ideal_dcg(docs: DataFrame, group: Sequence[str], cutoffs: Sequence[int]) -> DataFrame:
    """group..., idcg_k: DCG of each group's gains sorted descending."""
    pos = F.row_number().over(Window.partitionBy(*group).orderBy(F.col("gain").desc(), F.col("doc_id")))
    return (
        docs.withColumn("ipos", pos)
        .groupBy(*group)
        .agg(*[F.sum(_discounted(F.col("ipos"), "gain", k)).alias(f"idcg_{k}") for k in cutoffs])
    )


def ideal_dcg(graded: DataFrame, labels: DataFrame, cutoffs: Sequence[int], gain: str,
              ideal: Literal["serp", "query"]) -> DataFrame:
    """dataset, serp_id, idcg_k for every labelled SERP."""
    if ideal == "serp":
        return _ideal_dcg(graded, ["dataset", "serp_id"], cutoffs)
    # every judged doc of the query, returned on this SERP or not; a doc graded twice keeps its best grade
    pool = (labels.groupBy("dataset", "query_id", "doc_id").agg(F.max("relevance").alias("grade"))
            .withColumn("gain", _gain(F.col("grade"), gain)))
    per_query = _ideal_dcg(pool, ["dataset", "query_id"], cutoffs)
    return (graded.select("dataset", "serp_id", "query_id").distinct()
            .join(per_query, on=["dataset", "query_id"], how="inner")
            .select("dataset", "serp_id", *[f"idcg_{k}" for k in cutoffs]))


def serp_ndcg(graded: DataFrame, idcg: DataFrame, scores: DataFrame, models: DataFrame,
              cutoffs: Sequence[int]) -> DataFrame:
    """model, dataset, split, session_id, serp_id, ndcg_k (fixed point), idcg_zero + per-SERP counts.

    `scores`: model, query_id, doc_id, score; `models`: one column `model` naming the
    models to rank with. A document without a score ranks last and is counted.
    """
    by_model = Window.partitionBy("model", "dataset", "serp_id").orderBy(
        F.col("score").desc_nulls_last(), F.col("rank").asc())
    ranked = (
        graded.crossJoin(F.broadcast(models))
        .join(scores, on=["model", "query_id", "doc_id"], how="left")
        .withColumn("mpos", F.row_number().over(by_model))
    )
    per_serp = (
        ranked.groupBy(*KEYS, "session_id", "serp_id")
        .agg(*[F.sum(_discounted(F.col("mpos"), "gain", k)).alias(f"dcg_{k}") for k in cutoffs],
             F.sum((F.col("grade") < 0).cast("long")).alias("negative_grades"),
             F.sum(F.col("grade").isNull().cast("long")).alias("unjudged_docs"),
             F.sum(F.col("score").isNull().cast("long")).alias("unscored_docs"))
        .join(idcg, on=["dataset", "serp_id"], how="left")
    )
    # IDCG = 0 iff no judged document has a positive gain (the ideal order puts the best one first)
    idcg_zero = F.coalesce(F.col(f"idcg_{max(cutoffs)}"), F.lit(0)) <= 0
    return per_serp.select(
        *KEYS, "session_id", "serp_id",
        idcg_zero.alias("idcg_zero"),
        *[F.when(idcg_zero, F.lit(0).cast("long"))
          .otherwise(to_fixed(F.col(f"dcg_{k}").cast("double") / F.col(f"idcg_{k}").cast("double")))
          .alias(f"ndcg_{k}") for k in cutoffs],
        "negative_grades", "unjudged_docs", "unscored_docs",
    )


def session_stats(serp_rows: DataFrame, cutoffs: Sequence[int]) -> DataFrame:
    """model, dataset, split, session_id + stat_columns(cutoffs)."""
    kept = ~F.col("idcg_zero")
    return (
        serp_rows.groupBy(*KEYS, "session_id")
        .agg(F.sum(kept.cast("long")).alias("n_labelled"),
             *[F.sum(F.col(f"ndcg_{k}")).alias(f"ndcg_{k}") for k in cutoffs],
             F.sum(F.col("idcg_zero").cast("long")).alias("excluded_idcg0"),
             F.sum("negative_grades").alias("negative_grades"),
             F.sum("unjudged_docs").alias("unjudged_docs"),
             F.sum("unscored_docs").alias("unscored_docs"))
        .select(*KEYS, "session_id", *stat_columns(cutoffs))
    )


def metric_replicates(sums: dict[str, np.ndarray], cutoffs: Sequence[int], scale: float) -> dict[tuple[str, int], np.ndarray]:
    n = sums["n_labelled"]
    with np.errstate(divide="ignore", invalid="ignore"):
        return {("NDCG", k): np.where(n > 0, sums[f"ndcg_{k}"] / scale / n, np.nan) for k in cutoffs}
