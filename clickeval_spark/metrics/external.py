"""Predictions of models trained elsewhere, checked against the contract before they are evaluated.

A user writes the click_predictions (per SERP: serp_id, p_click_cond, p_click arrays[,
clicks]; or per rank: serp_id, rank, p_click_cond, p_click[, click]) and relevance_scores (query_id, doc_id, score) contracts as Delta or Parquet. The
checks below make sure the model is scored on exactly the SERPs every built-in model
is scored on; a violation fails the job with the rule and the first offending rows.
"""

from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.utils import AnalysisException

from clickeval_spark.config import CLICK_MODES, LIST_ORDERS, ExternalModelConfig
from clickeval_spark.errors import ClickevalError
from clickeval_spark.metrics.click_prediction import per_serp

PREDICTION_COLUMNS = ("serp_id", "rank", "p_click_cond", "p_click")
SCORE_COLUMNS = ("query_id", "doc_id", "score")
SHOWN = 5


def read_external(spark: SparkSession, path: str, fmt: str) -> DataFrame:
    if fmt == "auto":
        fmt = "delta" if DeltaTable.isDeltaTable(spark, path) else "parquet"
    try:
        return spark.read.format(fmt).load(path)
    except AnalysisException as exc:
        raise ClickevalError(f"{path}: cannot be read as {fmt} ({str(exc).splitlines()[0]})") from None


def _fail_if_any(offending: DataFrame, name: str, path: str, rule: str, what: str) -> None:
    first = offending.limit(SHOWN).collect()
    if first:
        total = offending.count()
        shown = "\n".join(f"    {row.asDict()}" for row in first)
        raise ClickevalError(
            f"external model '{name}': {path}: {total} row(s) break rule {rule} ({what}); first rows:\n{shown}")


def _require_columns(df: DataFrame, columns: tuple[str, ...], name: str, path: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ClickevalError(f"external model '{name}': {path}: missing column(s) {missing}; "
                             f"the contract needs {list(columns)}, found {df.columns}")


def _probability_ok(col: str | F.Column) -> F.Column:
    col = F.col(col) if isinstance(col, str) else col
    return col.isNotNull() & ~F.isnan(col) & col.between(0.0, 1.0)


def checked_predictions(raw: DataFrame, serps: DataFrame, max_rank: int, splits: tuple[str, ...],
                        ext: ExternalModelConfig) -> DataFrame:
    """The external predictions of the evaluated splits in the click_predictions contract: model, dataset,
    split, serp_id, clicks (the log's), p_click_cond, p_click, one row per SERP.

    Either shape of DESIGN §2 is accepted: one row per SERP with arrays (p_click_cond,
    p_click[, clicks]), or one row per (SERP, rank) (rank, p_click_cond, p_click[, click]).
    Both are held to the same rules: every evaluated SERP of `splits` has exactly one
    prediction for each of its ranks up to max_rank; a SERP or rank the log does not have
    fails; predictions for other splits of the log are allowed and not evaluated; a click,
    when given, must be the log's click.
    """
    log = serps.select("dataset", "split", "serp_id", F.slice("clicks", 1, max_rank).alias("clicks"))
    if "rank" in raw.columns:
        return _checked_by_rank(raw, log, splits, ext)
    name, path = ext.name, ext.predictions
    _require_columns(raw, ("serp_id", "p_click_cond", "p_click"), name, path)
    preds = raw.select(
        F.col("serp_id").cast("string").alias("serp_id"),
        F.col("p_click_cond").try_cast("array<double>").alias("p_click_cond"),
        F.col("p_click").try_cast("array<double>").alias("p_click"),
        (F.col("clicks").try_cast("array<int>") if "clicks" in raw.columns
         else F.lit(None).cast("array<int>")).alias("ext_clicks"),
    )
    _fail_if_any(preds.groupBy("serp_id").count().where("count > 1"), name, path, "duplicate_prediction",
                 "each serp_id of an evaluated SERP must appear exactly once")
    _fail_if_any(preds.join(log, on="serp_id", how="left_anti"), name, path, "unknown_position",
                 "no SERP of the log has this serp_id")
    evaluated = log.where(F.col("split").isin(*splits))
    _fail_if_any(evaluated.join(preds, on="serp_id", how="left_anti").select("split", "serp_id"), name, path,
                 "missing_prediction", "an evaluated SERP has no prediction")
    joined = evaluated.join(preds, on="serp_id", how="inner")
    n = F.size("clicks")
    _fail_if_any(joined.where(F.coalesce((F.size("p_click_cond") != n) | (F.size("p_click") != n), F.lit(True)))
                 .select("serp_id", "clicks", "p_click_cond", "p_click"), name, path, "length_mismatch",
                 f"p_click_cond and p_click need one value per rank of the SERP (its first {max_rank})")
    bad = F.exists("p_click_cond", lambda p: ~_probability_ok(p)) | F.exists("p_click", lambda p: ~_probability_ok(p))
    _fail_if_any(preds.where(bad), name, path, "probability_out_of_range",
                 "p_click_cond and p_click must be numbers in [0, 1], not null or NaN")
    _fail_if_any(joined.where(F.col("ext_clicks").isNotNull() & (F.col("ext_clicks") != F.col("clicks")))
                 .select("serp_id", "clicks", "ext_clicks"), name, path, "click_differs_from_log",
                 "the clicks column, when given, must equal the log's clicks")
    return joined.select(F.lit(name).alias("model"), "dataset", "split", "serp_id", "clicks", "p_click_cond",
                         "p_click")


def _checked_by_rank(raw: DataFrame, log: DataFrame, splits: tuple[str, ...], ext: ExternalModelConfig) -> DataFrame:
    """`checked_predictions` for one row per (serp_id, rank)."""
    name, path = ext.name, ext.predictions
    _require_columns(raw, PREDICTION_COLUMNS, name, path)
    positions = log.select("dataset", "split", "serp_id", F.posexplode("clicks").alias("pos", "click")).select(
        "dataset", "split", "serp_id", (F.col("pos") + 1).cast("int").alias("rank"), "click")
    preds = raw.select(
        F.col("serp_id").cast("string").alias("serp_id"),
        F.col("rank").try_cast("int").alias("rank"),
        F.col("p_click_cond").try_cast("double").alias("p_click_cond"),
        F.col("p_click").try_cast("double").alias("p_click"),
        (F.col("click").try_cast("int") if "click" in raw.columns else F.lit(None).cast("int")).alias("ext_click"),
    )
    keys = ["serp_id", "rank"]
    _fail_if_any(preds.groupBy(*keys).count().where("count > 1"), name, path, "duplicate_prediction",
                 "each (serp_id, rank) of an evaluated SERP must appear exactly once")
    _fail_if_any(preds.join(positions, on=keys, how="left_anti"), name, path, "unknown_position",
                 "no evaluated SERP of the log has this (serp_id, rank)")
    evaluated = positions.where(F.col("split").isin(*splits))
    _fail_if_any(evaluated.join(preds, on=keys, how="left_anti").select("split", *keys), name, path,
                 "missing_prediction", "an evaluated (serp_id, rank) has no prediction")
    _fail_if_any(preds.where(~(_probability_ok("p_click_cond") & _probability_ok("p_click"))), name, path,
                 "probability_out_of_range", "p_click_cond and p_click must be numbers in [0, 1], not null or NaN")
    joined = evaluated.join(preds, on=keys, how="inner")
    _fail_if_any(joined.where(F.col("ext_click").isNotNull() & (F.col("ext_click") != F.col("click")))
                 .select(*keys, "click", "ext_click"), name, path, "click_differs_from_log",
                 "the click column, when given, must equal the log's click")
    rows = joined.select(F.lit(name).alias("model"), "dataset", "split", "serp_id", "rank", "click",
                         "p_click_cond", "p_click")
    return per_serp(rows).select("model", "dataset", "split", "serp_id", "clicks", "p_click_cond", "p_click")


def checked_scores(raw: DataFrame, needed: DataFrame, ext: ExternalModelConfig) -> DataFrame:
    """The external relevance scores (model, query_id, doc_id, score), every `needed` pair scored once."""
    name, path = ext.name, ext.relevance_scores
    _require_columns(raw, SCORE_COLUMNS, name, path)
    scores = raw.select(F.col("query_id").cast("string").alias("query_id"),
                        F.col("doc_id").cast("string").alias("doc_id"),
                        F.col("score").try_cast("double").alias("score"))
    keys = ["query_id", "doc_id"]
    _fail_if_any(scores.groupBy(*keys).count().where("count > 1"), name, path, "duplicate_score",
                 "each (query_id, doc_id) must have one score")
    _fail_if_any(scores.where(F.col("score").isNull() | F.isnan("score")), name, path, "score_not_a_number",
                 "scores must be numbers, not null or NaN")
    _fail_if_any(needed.select(*keys).distinct().join(scores, on=keys, how="left_anti"), name, path,
                 "missing_score", "every document of a labelled SERP needs a score")
    return scores.select(F.lit(name).alias("model"), *keys, "score")


SEQUENCE_COLUMNS = ("serp_id", "sample_idx", "click_mode", "list_order", "doc_ids", "clicks")


def checked_sequences(raw: DataFrame, serps: DataFrame, name: str, path: str) -> DataFrame:
    """External click sequences in the synthetic_serps layout (without run_id), checked against the log.

    Each row names a SERP of `serps` (the generation split), a sample index, a click
    mode and a list order; its doc_ids are a permutation of the SERP's documents
    (the same list for `original`), its clicks are 0/1 with one per document.
    """
    _require_columns(raw, SEQUENCE_COLUMNS, name, path)
    seqs = raw.select(F.col("serp_id").cast("string"), F.col("sample_idx").try_cast("int").alias("sample_idx"),
                      F.col("click_mode").cast("string"), F.col("list_order").cast("string"),
                      F.col("doc_ids").cast("array<string>"), F.col("clicks").cast("array<int>"))
    keys = ["serp_id", "sample_idx", "click_mode", "list_order"]
    _fail_if_any(seqs.groupBy(*keys).count().where("count > 1"), name, path, "duplicate_sequence",
                 "each (serp_id, sample_idx, click_mode, list_order) must appear once")
    _fail_if_any(seqs.where(~F.col("click_mode").isin(*CLICK_MODES) | ~F.col("list_order").isin(*LIST_ORDERS)
                            | F.col("sample_idx").isNull() | (F.col("sample_idx") < 0)),
                 name, path, "bad_variant", f"click_mode in {list(CLICK_MODES)}, list_order in {list(LIST_ORDERS)}, "
                 "sample_idx >= 0")
    log = serps.select("serp_id", F.col("doc_ids").alias("log_doc_ids"))
    joined = seqs.join(log, on="serp_id", how="left")
    _fail_if_any(joined.where(F.col("log_doc_ids").isNull()).select(*keys), name, path, "unknown_serp",
                 "serp_id is not a SERP of the generation split")
    same_docs = F.array_sort("doc_ids") == F.array_sort(F.slice("log_doc_ids", 1, F.size("doc_ids")))
    original_ok = (F.col("list_order") != "original") | (F.col("doc_ids") == F.slice("log_doc_ids", 1, F.size("doc_ids")))
    _fail_if_any(joined.where(F.col("log_doc_ids").isNotNull() & ~(same_docs & original_ok)).select(*keys, "doc_ids"),
                 name, path, "documents_differ", "doc_ids must be the SERP's documents (in logged order for original)")
    _fail_if_any(seqs.where(F.col("clicks").isNull() | (F.size("clicks") != F.size("doc_ids"))
                            | F.exists("clicks", lambda c: c.isNull() | ~c.isin(0, 1))).select(*keys, "clicks"),
                 name, path, "clicks_not_binary", "clicks must be 0/1, one per document")
    return seqs

