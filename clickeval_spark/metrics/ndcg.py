"""Relevance estimation: NDCG@k of the models' relevance scores against human labels (DESIGN §5).

Per labelled SERP its documents are ordered by the model's score (ties: original
rank first; in numpy, one row per SERP, `serp_ndcg`), DCG@k = Σ_{i<=k} gain_i / log2(i + 1), and
IDCG@k is the same over the ideal order: the SERP's own grades (default) or all
judged documents of the query. SERPs with IDCG = 0 are excluded and counted;
negative grades count as 0 and are counted; unjudged documents on a labelled
SERP have gain 0 and are counted.

Which lists are labelled: see `graded_docs`.
"""

from __future__ import annotations

import math
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from clickeval_spark.metrics.bootstrap import fixed_np, to_fixed

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
    # a doc graded twice keeps its best grade; each SERP's (query's) grades as one doc -> grade map
    tied = (tied_rows.groupBy("dataset", "serp_id", "doc_id").agg(F.max("relevance").alias("grade"))
            .groupBy("dataset", "serp_id").agg(F.map_from_entries(F.collect_list(F.struct("doc_id", "grade")))
                                               .alias("_tied")))
    pooled = (labels.where(F.col("serp_id").isNull() & F.col("session_id").isNull())
              .groupBy("dataset", "query_id", "doc_id").agg(F.max("relevance").alias("grade"))
              .groupBy("dataset", "query_id").agg(F.map_from_entries(F.collect_list(F.struct("doc_id", "grade")))
                                                  .alias("_pooled")))
    # only SERPs a label can reach are kept: a SERP with a tied label, or of a query with pooled
    # labels (in TianGong-ST ~1% of the log). Their first max_rank docs are graded by map lookups and
    # a list is labelled when one has a grade, before anything is exploded (no join or window per doc)
    grades = F.transform("doc_ids", lambda d: F.coalesce(F.try_element_at("_tied", d), F.try_element_at("_pooled", d)))
    candidates = (
        serps.select("dataset", "split", "session_id", "serp_id", "query_id",
                     F.slice("doc_ids", 1, max_rank).alias("doc_ids"))
        .join(tied, on=["dataset", "serp_id"], how="left")
        .join(pooled, on=["dataset", "query_id"], how="left")
        .where(F.col("_tied").isNotNull() | F.col("_pooled").isNotNull())
        .select("dataset", "split", "session_id", "serp_id", "query_id", "doc_ids", grades.alias("grades"))
        .where(F.exists("grades", lambda g: g.isNotNull()))
    )
    on_log = candidates.select(
        "dataset", "split", "session_id", "serp_id", "query_id",
        F.posexplode(F.arrays_zip("doc_ids", "grades")).alias("pos", "doc"),
    ).select("dataset", "split", "session_id", "serp_id", "query_id", F.col("doc.doc_ids").alias("doc_id"),
             (F.col("pos") + 1).alias("rank"), F.col("doc.grades").alias("grade"))
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


def query_ideal_dcg(graded: DataFrame, labels: DataFrame, cutoffs: Sequence[int], gain: str) -> DataFrame:
    """dataset, serp_id, idcg_k for every labelled SERP, the ideal order being every judged doc of its
    query, returned on this SERP or not (``ndcg_ideal: query``); a doc graded twice keeps its best grade."""
    pool = (labels.groupBy("dataset", "query_id", "doc_id").agg(F.max("relevance").alias("grade"))
            .withColumn("gain", _gain(F.col("grade"), gain)))
    per_query = _ideal_dcg(pool, ["dataset", "query_id"], cutoffs)
    return (graded.select("dataset", "serp_id", "query_id").distinct()
            .join(per_query, on=["dataset", "query_id"], how="inner")
            .select("dataset", "serp_id", *[f"idcg_{k}" for k in cutoffs]))


def _score_col(i: int) -> str:
    return f"_score_{i}"


def serp_ndcg(graded: DataFrame, scores: DataFrame, models: Sequence[str], cutoffs: Sequence[int],
              idcg: DataFrame | None = None) -> DataFrame:
    """model, dataset, split, session_id, serp_id + stat_columns(cutoffs): one row per (model, labelled
    SERP), NDCG in fixed point.

    `scores`: model, query_id, doc_id, score; `models`: the models to rank with. A document without
    a score ranks last and is counted. `idcg`: dataset, serp_id, idcg_k (`query_ideal_dcg`); None:
    each SERP's own grades give its ideal order.

    The scores are pivoted to a column per model and joined to the graded documents once for all
    models; each SERP's documents are then collected into one row and ranked in numpy, every model
    in one vectorised pass per batch (`_ndcg_fn`): window functions over (model, SERP) rows would
    need two sorts and two more shuffles of models x graded documents.
    """
    models = list(models)
    wide = (scores.where(F.col("model").isin(*models)).groupBy("query_id", "doc_id")
            .agg(*[F.max(F.when(F.col("model") == m, F.col("score"))).alias(_score_col(i))
                   for i, m in enumerate(models)]))
    doc = F.struct("rank", "grade", "gain", *[_score_col(i) for i in range(len(models))])
    lists = (graded.join(wide, on=["query_id", "doc_id"], how="left")
             .groupBy("dataset", "split", "session_id", "serp_id").agg(F.collect_list(doc).alias("docs")))
    idcg_cols = []
    if idcg is not None:
        idcg_cols = [f"idcg_{k}" for k in cutoffs]
        lists = lists.join(idcg, on=["dataset", "serp_id"], how="left")
    schema = ", ".join(["model string", "dataset string", "split string", "session_id string", "serp_id string",
                        *(f"{c} long" for c in stat_columns(cutoffs))])
    return (
        lists.select("dataset", "split", "session_id", "serp_id", "docs", *idcg_cols)
        .mapInArrow(_ndcg_fn(models, cutoffs, bool(idcg_cols)), schema)
        .select(*KEYS, "session_id", "serp_id", *stat_columns(cutoffs))
    )


def _ndcg_fn(models: Sequence[str], cutoffs: Sequence[int], joined_idcg: bool):
    top = max(cutoffs)

    def discounted(gain: np.ndarray, pos: np.ndarray) -> np.ndarray:
        # as `_discounted` computes it in SQL: gain / log2(pos + 1), log2 as Spark's ln(x) / ln(2)
        return fixed_np(gain / (np.log(pos + 1.0) / math.log(2.0)))

    def dcg(rows: np.ndarray, pos: np.ndarray, terms: np.ndarray, n: int) -> dict[int, np.ndarray]:
        # sums of fixed-point terms (< 2^53 in total): exact in float64
        return {k: np.bincount(rows, weights=np.where(pos <= k, terms, 0), minlength=n).astype(np.int64)
                for k in cutoffs}

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            n = batch.num_rows
            if n == 0:
                continue
            docs = batch.column("docs")
            lens = pc.list_value_length(docs).to_numpy().astype(np.int64)
            start = np.concatenate([[0], np.cumsum(lens)[:-1]])
            rows = np.repeat(np.arange(n), lens)
            flat = docs.flatten()
            rank = flat.field("rank").to_numpy(zero_copy_only=False)
            grade = flat.field("grade")
            unjudged = grade.is_null().to_numpy(zero_copy_only=False)
            negative = (pc.fill_null(grade, 0).to_numpy(zero_copy_only=False) < 0) & ~unjudged
            gain = flat.field("gain").to_numpy(zero_copy_only=False)
            counts = {"negative_grades": np.bincount(rows, weights=negative, minlength=n).astype(np.int64),
                      "unjudged_docs": np.bincount(rows, weights=unjudged, minlength=n).astype(np.int64)}
            if joined_idcg:
                idcg = {k: pc.fill_null(batch.column(f"idcg_{k}"), 0).to_numpy().astype(np.int64) for k in cutoffs}
            else:
                ideal = np.lexsort((-gain, rows))
                pos = np.arange(len(rows)) - start[rows[ideal]] + 1
                idcg = dcg(rows[ideal], pos, discounted(gain[ideal], pos), n)
            # IDCG = 0 iff no judged document has a positive gain (the ideal order puts the best one first)
            idcg_zero = idcg[top] <= 0
            for i, model in enumerate(models):
                score = flat.field(_score_col(i))
                unscored = score.is_null().to_numpy(zero_copy_only=False)
                value = pc.fill_null(score, 0.0).to_numpy(zero_copy_only=False)
                # ORDER BY score DESC NULLS LAST, rank: NaN sorts above every number, as in Spark
                desc = np.where(np.isnan(value), -np.inf, -value)
                order = np.lexsort((rank, desc, unscored, rows))
                pos = np.arange(len(rows)) - start[rows[order]] + 1
                sums = dcg(rows[order], pos, discounted(gain[order], pos), n)
                out = {"model": pa.repeat(model, n), **{c: batch.column(c) for c in
                                                        ("dataset", "split", "session_id", "serp_id")},
                       "n_labelled": pa.array((~idcg_zero).astype(np.int64))}
                with np.errstate(divide="ignore", invalid="ignore"):
                    for k in cutoffs:
                        ratio = sums[k].astype(np.float64) / idcg[k].astype(np.float64)
                        out[f"ndcg_{k}"] = pa.array(np.where(idcg_zero, 0, fixed_np(np.where(idcg_zero, 0.0, ratio))))
                out["excluded_idcg0"] = pa.array(idcg_zero.astype(np.int64))
                out.update({c: pa.array(v) for c, v in counts.items()})
                out["unscored_docs"] = pa.array(np.bincount(rows, weights=unscored, minlength=n).astype(np.int64))
                yield pa.RecordBatch.from_pydict(out)

    return run


def metric_replicates(sums: dict[str, np.ndarray], cutoffs: Sequence[int], scale: float) -> dict[tuple[str, int], np.ndarray]:
    n = sums["n_labelled"]
    with np.errstate(divide="ignore", invalid="ignore"):
        return {("NDCG", k): np.where(n > 0, sums[f"ndcg_{k}"] / scale / n, np.nan) for k in cutoffs}
