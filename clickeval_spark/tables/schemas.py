"""Every table's schema, declared once: its columns, types and nullability (a StructField with
nullable=False is a NOT NULL column of the Delta table), its partition columns and the stage that first
writes it. Column names are the contract (DESIGN §2); columns are added, never renamed.
"""

from __future__ import annotations

from pyspark.sql import types as T

SERPS = T.StructType([
    T.StructField("dataset", T.StringType(), False),
    T.StructField("split", T.StringType(), False),
    T.StructField("session_id", T.StringType(), False),
    T.StructField("serp_id", T.StringType(), False),
    T.StructField("serp_pos", T.IntegerType(), False),
    T.StructField("query_id", T.StringType(), False),
    T.StructField("doc_ids", T.ArrayType(T.StringType(), True), False),
    T.StructField("vtypes", T.ArrayType(T.StringType(), True), True),
    T.StructField("clicks", T.ArrayType(T.IntegerType(), True), False),
    T.StructField("log_date", T.DateType(), True),
    T.StructField("ingest_run_id", T.StringType(), False),
])

RELEVANCE_LABELS = T.StructType([
    T.StructField("dataset", T.StringType(), False),
    T.StructField("query_id", T.StringType(), False),
    T.StructField("doc_id", T.StringType(), False),
    T.StructField("relevance", T.IntegerType(), False),
    # the labelled SERP the grade belongs to, and the doc's rank on it (null for pooled labels)
    T.StructField("serp_id", T.StringType(), True),
    T.StructField("rank", T.IntegerType(), True),
    T.StructField("session_id", T.StringType(), True),
    T.StructField("ingest_run_id", T.StringType(), False),
    # the day of the labelled SERP of the same ingest, else ingest.log_date; null: undated (pooled)
    T.StructField("log_date", T.DateType(), True),
])

QUARANTINE = T.StructType([
    T.StructField("run_id", T.StringType(), False),
    T.StructField("dataset", T.StringType(), False),
    # which table the record was headed for: serps or relevance_labels
    T.StructField("target", T.StringType(), False),
    T.StructField("source", T.StringType(), False),
    # 1-based line number for text inputs; null where the source has no lines (XML, Parquet)
    T.StructField("line", T.LongType(), True),
    # a readable locator for sources without lines: "session 3 interaction 2", "row serp_id=..."
    T.StructField("record", T.StringType(), True),
    T.StructField("raw", T.StringType(), True),
    T.StructField("rule", T.StringType(), False),
    T.StructField("reason", T.StringType(), False),
])

MODEL_PARAMS = T.StructType([
    T.StructField("run_id", T.StringType(), False),
    T.StructField("model", T.StringType(), False),
    T.StructField("param", T.StringType(), False),
    T.StructField("query_id", T.StringType(), True),
    T.StructField("doc_id", T.StringType(), True),
    T.StructField("rank", T.IntegerType(), True),
    T.StructField("prev_click_rank", T.IntegerType(), True),
    T.StructField("value", T.DoubleType(), False),
    T.StructField("n_obs", T.DoubleType(), True),
])

RUNS = T.StructType([
    T.StructField("run_id", T.StringType(), False),
    T.StructField("job", T.StringType(), False),
    T.StructField("dataset", T.StringType(), True),
    T.StructField("status", T.StringType(), False),
    T.StructField("started_at", T.TimestampType(), False),
    T.StructField("finished_at", T.TimestampType(), False),
    T.StructField("seconds", T.DoubleType(), False),
    T.StructField("counts", T.MapType(T.StringType(), T.LongType()), True),
    T.StructField("details", T.StringType(), True),
    T.StructField("config", T.StringType(), True),
])

# one row per (run, model, SERP); element i of each array is rank i + 1. The view
# click_predictions_by_rank (clickeval_spark/catalog.py) has one row per rank for SQL.
CLICK_PREDICTIONS = T.StructType([
    T.StructField("run_id", T.StringType(), False),
    T.StructField("model", T.StringType(), False),
    T.StructField("dataset", T.StringType(), False),
    T.StructField("split", T.StringType(), False),
    T.StructField("serp_id", T.StringType(), False),
    T.StructField("clicks", T.ArrayType(T.IntegerType()), False),
    T.StructField("p_click_cond", T.ArrayType(T.DoubleType()), False),
    T.StructField("p_click", T.ArrayType(T.DoubleType()), False),
])

RELEVANCE_SCORES = T.StructType([
    T.StructField("run_id", T.StringType(), False),
    T.StructField("model", T.StringType(), False),
    T.StructField("query_id", T.StringType(), False),
    T.StructField("doc_id", T.StringType(), False),
    T.StructField("score", T.DoubleType(), False),
])

METRICS = T.StructType([
    T.StructField("run_id", T.StringType(), False),
    T.StructField("model", T.StringType(), False),
    T.StructField("dataset", T.StringType(), False),
    T.StructField("split", T.StringType(), False),
    # LL, PPL, PPL_cond, NDCG; <metric>_diff (model minus reference_model); bookkeeping counts
    T.StructField("metric", T.StringType(), False),
    # t for PPL@t, k for NDCG@k; null for LL and total PPL
    T.StructField("cutoff", T.IntegerType(), True),
    T.StructField("value", T.DoubleType(), True),
    # SERPs behind the value (SERPs with rank t for PPL@t, labelled SERPs for NDCG)
    T.StructField("n", T.LongType(), True),
    T.StructField("ci_low", T.DoubleType(), True),
    T.StructField("ci_high", T.DoubleType(), True),
    T.StructField("reference_model", T.StringType(), True),
])

# the serps columns a generated SERP carries (everything but the ingest bookkeeping)
GENERATED_SERP_FIELDS = [f for f in SERPS.fields if f.name != "ingest_run_id"]

SYNTHETIC_SERPS = T.StructType([
    T.StructField("run_id", T.StringType(), False),
    T.StructField("generator_model", T.StringType(), False),
    T.StructField("sample_idx", T.IntegerType(), False),
    T.StructField("click_mode", T.StringType(), False),
    T.StructField("list_order", T.StringType(), False),
    *GENERATED_SERP_FIELDS,
])

DISTRIBUTIONAL_METRICS = T.StructType([
    T.StructField("run_id", T.StringType(), False),
    T.StructField("dataset", T.StringType(), False),
    # a generator model, or "real_log": the surrogate fitted on the real SERPs themselves (click_mode observed,
    # in sample) or out of sample on two session halves (fit_a_score_b, fit_b_score_a, cross_fitted)
    T.StructField("generator_model", T.StringType(), False),
    T.StructField("surrogate_model", T.StringType(), False),
    T.StructField("variant", T.StringType(), False),  # <list_order>/<click_mode>
    T.StructField("list_order", T.StringType(), False),
    T.StructField("click_mode", T.StringType(), False),
    T.StructField("reverse_ppl", T.DoubleType(), True),
    T.StructField("forward_ppl", T.DoubleType(), True),
    T.StructField("reverse_ppl_at", T.ArrayType(T.DoubleType()), True),
    T.StructField("forward_ppl_at", T.ArrayType(T.DoubleType()), True),
    T.StructField("n_synthetic", T.LongType(), False),
    T.StructField("n_real", T.LongType(), False),
    T.StructField("surrogate_iterations", T.IntegerType(), False),
])

SCHEMAS: dict[str, T.StructType] = {
    "serps": SERPS,
    "relevance_labels": RELEVANCE_LABELS,
    "quarantine": QUARANTINE,
    "model_params": MODEL_PARAMS,
    "runs": RUNS,
    "click_predictions": CLICK_PREDICTIONS,
    "relevance_scores": RELEVANCE_SCORES,
    "metrics": METRICS,
    "synthetic_serps": SYNTHETIC_SERPS,
    "distributional_metrics": DISTRIBUTIONAL_METRICS,
}

# the columns a table is partitioned on: the unit a rerun replaces (serps: one day of a dataset)
PARTITION_COLUMNS: dict[str, tuple[str, ...]] = {
    "serps": ("dataset", "log_date"),
    "relevance_labels": ("dataset",),
    "quarantine": ("run_id",),
    "model_params": ("run_id",),
    "runs": ("run_id",),
    "click_predictions": ("run_id",),
    "relevance_scores": ("run_id",),
    "metrics": ("run_id",),
    "synthetic_serps": ("run_id",),
    "distributional_metrics": ("run_id",),
}

# the stage whose run first writes each table, for the error a read before that run gets
WRITTEN_BY = {"serps": "ingest", "relevance_labels": "ingest", "quarantine": "ingest", "runs": "ingest",
              "model_params": "fit", "click_predictions": "predict", "relevance_scores": "predict",
              "metrics": "evaluate", "synthetic_serps": "generate", "distributional_metrics": "surrogate"}
