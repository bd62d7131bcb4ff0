"""Canonical Delta tables: explicit schemas, locations, and re-runnable writes.

Every table lives at <warehouse>/<name>. A write replaces exactly the slice it
owns (a dataset's serps, a run's rows) with Delta `replaceWhere`, so a retried
job never duplicates rows and never touches other runs.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from datetime import date, datetime
from typing import Callable, Sequence, TypeVar

# importing delta.exceptions.captured also makes PySpark raise these classes for Delta's Java commit conflicts
from delta.exceptions.captured import (ConcurrentAppendException, ConcurrentDeleteDeleteException,
                                       ConcurrentDeleteReadException, ConcurrentTransactionException,
                                       ConcurrentWriteException, DeltaConcurrentModificationException,
                                       MetadataChangedException, ProtocolChangedException)
from delta.tables import DeltaTable
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from clickeval_spark.config import WindowConfig, validate_run_id
from clickeval_spark.errors import ClickevalError

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
# click_predictions_by_rank (register_tables) has one row per rank for SQL.
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
PARTITION_COLUMNS: dict[str, str | tuple[str, ...]] = {
    "serps": ("dataset", "log_date"),
    "relevance_labels": "dataset",
    "quarantine": "run_id",
    "model_params": "run_id",
    "runs": "run_id",
    "click_predictions": "run_id",
    "relevance_scores": "run_id",
    "metrics": "run_id",
    "synthetic_serps": "run_id",
    "distributional_metrics": "run_id",
}


# Concurrent runs (DESIGN §2: two runs with different run_ids write the same tables at once).
# Every run-keyed table is partitioned by run_id and every write names its run_id in the
# replaceWhere / MERGE predicate, so Delta's conflict check (WriteSerializable) sees two runs
# touching disjoint partitions and lets both commit; that already removes the common conflicts.
# Partitioning cannot separate every writer, though:
#   - the first write to a table that does not exist yet: two writers both try to commit version 0
#     (ProtocolChangedException / MetadataChangedException for the loser);
#   - two runs replacing the same slice: the same dataset's serps / relevance_labels (partitioned by
#     dataset, not run_id) or its synthetic truth `truth-<dataset>` in model_params;
#   - Delta's own metadata commits racing a write.
# So every table write also goes through with_conflict_retries: a bounded number of attempts with
# jittered exponential backoff, retrying only Delta's concurrent-modification errors (anything else
# fails at once), one warning per retry, the original error re-raised after the last attempt. A retry
# is safe because each write replaces a whole slice: re-run against the newer snapshot it leaves the
# same rows, never duplicates. Writes conflicting with themselves forever (the same slice written by
# two processes in a loop) still fail after the last attempt rather than spin.
CONCURRENT_MODIFICATION_ERRORS: tuple[type[BaseException], ...] = (
    DeltaConcurrentModificationException, ConcurrentWriteException, MetadataChangedException,
    ProtocolChangedException, ConcurrentAppendException, ConcurrentDeleteReadException,
    ConcurrentDeleteDeleteException, ConcurrentTransactionException,
)
WRITE_ATTEMPTS = 6
RETRY_BASE_SECONDS = 0.5
_log = logging.getLogger("clickeval.tables")
_T = TypeVar("_T")


def is_concurrent_modification(exc: BaseException) -> bool:
    """A Delta commit conflict (another writer committed first); not a bad write."""
    return isinstance(exc, CONCURRENT_MODIFICATION_ERRORS)


def with_conflict_retries(write: Callable[[], _T], what: str, *, attempts: int | None = None,
                          base_seconds: float | None = None, sleep: Callable[[float], None] = time.sleep) -> _T:
    """Run `write` (one complete, idempotent Delta commit); on a concurrent-modification conflict wait
    base * 2^(k-1) * U(1, 2) seconds and run it again, at most `attempts` times in all."""
    attempts = WRITE_ATTEMPTS if attempts is None else attempts
    base_seconds = RETRY_BASE_SECONDS if base_seconds is None else base_seconds
    for attempt in range(1, attempts + 1):
        try:
            return write()
        except Exception as exc:
            if not is_concurrent_modification(exc):
                raise
            if attempt == attempts:
                exc.add_note(f"clickeval: {what}: still conflicting after {attempts} attempts")
                raise
            delay = base_seconds * 2 ** (attempt - 1) * (1 + random.random())
            _log.warning("%s: concurrent Delta commit (%s); retry %d of %d in %.2f s",
                         what, type(exc).__name__, attempt, attempts - 1, delay)
            sleep(delay)
    raise AssertionError("unreachable")  # the loop returns or raises


def table_path(warehouse: str, name: str) -> str:
    return f"{warehouse.rstrip('/')}/{name}"


def conform(df: DataFrame, name: str) -> DataFrame:
    """Select the table's columns in order, cast to its types: the write's schema contract."""
    schema = SCHEMAS[name]
    return df.select([F.col(f.name).cast(f.dataType).alias(f.name) for f in schema.fields])


def observed(df: DataFrame, what: str, *metrics: Column) -> tuple[DataFrame, Observation]:
    """``df`` with global aggregates ``metrics`` taken by the action that runs it (Spark's Observation):
    sums of what a write wrote, by the write's own tasks, without reading the table back.
    ``Observation.get`` gives them once that action has run."""
    seen = Observation(f"{what}-{uuid.uuid4().hex}")   # unique: sessions run stages concurrently
    return df.observe(seen, *metrics), seen


def replace_slice(df: DataFrame, warehouse: str, name: str, keys: dict[str, str], run_id: str,
                  log_dates: Sequence[date | None] | None = None) -> None:
    """Write `df` as the whole slice `col1 = v1 AND ...` of table `name` (e.g. one run's rows of one model);
    with `log_dates`, only those days of it (None: the undated rows), e.g. the days one ingest read.

    Delta replaceWhere makes the write idempotent: a retry replaces the same slice
    and leaves every other slice as it was; Delta also refuses a row outside the slice.
    `userMetadata` tags the commit with the run that made it, so `DESCRIBE HISTORY`
    tells which run wrote what. Key values go into the predicate, so they must match
    the safe id pattern.
    """
    predicate = _slice_predicate(keys, log_dates)
    path = table_path(warehouse, name)

    def write() -> None:
        writer = (conform(df, name).write.format("delta").mode("overwrite")
                  .option("replaceWhere", predicate)
                  .option("userMetadata", _user_metadata(name, predicate, run_id)))
        # an existing table keeps its layout: serps made before days were partitions stays partitioned by
        # dataset alone, and its day slices are replaced through the log_date data column instead
        if DeltaTable.isDeltaTable(df.sparkSession, path):
            _add_missing_columns(df.sparkSession, path, name)
        else:
            writer = writer.partitionBy(PARTITION_COLUMNS[name])
        writer.save(path)

    with_conflict_retries(write, f"{name} [{predicate}]")


def _add_missing_columns(spark: SparkSession, path: str, name: str) -> None:
    """A table written by an older version gains the (nullable) columns added to its schema since, before a
    predicate names them (relevance_labels.log_date). Adding a column needs no table feature.

    A column whose type changed cannot be migrated in place (click_predictions before it held one row
    per SERP): that is a user error naming the table and what to do, before anything is written."""
    stored = {f.name: f.dataType for f in spark.read.format("delta").load(path).schema}
    changed = [f"{f.name} {stored[f.name].simpleString()} (now {f.dataType.simpleString()})"
               for f in SCHEMAS[name].fields
               if f.name in stored and stored[f.name].simpleString() != f.dataType.simpleString()]
    if changed:
        raise ClickevalError(f"{path}: table {name} was written by an older version with another layout: "
                             f"{', '.join(changed)}; move it aside (or delete it: the stage that writes it "
                             "recreates it) and rerun")
    present = set(stored)
    if any(f.name not in present for f in SCHEMAS[name].fields):
        # appending no rows with mergeSchema commits the schema change alone (no SQL text built from the path)
        (spark.createDataFrame([], SCHEMAS[name]).write.format("delta").mode("append")
         .option("mergeSchema", "true").save(path))


def _slice_predicate(keys: dict[str, str], log_dates: Sequence[date | None] | None = None) -> str:
    # a tuple of values: several slices replaced in one commit (every model of a stage)
    parts = [f"{col} IN ({', '.join(map(_quoted, value))})" if isinstance(value, tuple)
             else f"{col} = {_quoted(value)}" for col, value in keys.items()]
    if log_dates is not None:
        parts.append(log_date_predicate(log_dates))
    return " AND ".join(parts)


def _quoted(value: str) -> str:
    return f"'{validate_run_id(value)}'"


def log_date_predicate(log_dates: Sequence[date | None]) -> str:
    """SQL for `log_date` in the given days; None stands for the undated (null) slice."""
    days = sorted({d for d in log_dates if d is not None})
    bad = [d for d in days if not isinstance(d, date) or isinstance(d, datetime)]
    if bad or not log_dates:
        raise ValueError(f"log_dates must be a non-empty list of datetime.date or None, got {list(log_dates)!r}")
    terms = [f"log_date IN ({', '.join(f'DATE{d.isoformat()!r}' for d in days)})"] if days else []
    if None in log_dates:
        terms.append("log_date IS NULL")
    return f"({' OR '.join(terms)})"


def _user_metadata(name: str, predicate: str, run_id: str) -> str:
    return f"clickeval run_id={validate_run_id(run_id)} table={name} slice={predicate}"


def rows_written(spark: SparkSession, warehouse: str, name: str, keys: dict[str, str], run_id: str) -> int:
    """Rows of the latest replace_slice(keys) commit, from the Delta log (no scan of the data; other
    runs' commits in between are skipped by their userMetadata)."""
    tag = _user_metadata(name, _slice_predicate(keys), run_id)
    last = (DeltaTable.forPath(spark, table_path(warehouse, name)).history(50)
            .where(F.col("userMetadata") == tag).select("operationMetrics").first())
    return int(last["operationMetrics"].get("numOutputRows", 0)) if last else 0


# the stage whose run first writes each table, for the error a read before that run gets
WRITTEN_BY = {"serps": "ingest", "relevance_labels": "ingest", "quarantine": "ingest", "runs": "ingest",
              "model_params": "fit", "click_predictions": "predict", "relevance_scores": "predict",
              "metrics": "evaluate", "synthetic_serps": "generate", "distributional_metrics": "surrogate"}


def read_table(spark: SparkSession, warehouse: str, name: str) -> DataFrame:
    """The table as a DataFrame; a table no run has written yet is a user error (a stage run before the
    one that writes its input), reported in one line rather than Delta's stack trace."""
    path = table_path(warehouse, name)
    try:
        return spark.read.format("delta").load(path)
    except AnalysisException:
        if DeltaTable.isDeltaTable(spark, path):
            raise
        raise ClickevalError(f"table {name} does not exist yet under {warehouse}: "
                             f"run `clickeval {WRITTEN_BY.get(name, 'ingest')}` first") from None


def in_window(window: WindowConfig | None, *, undated: bool = False) -> Column:
    """Rows whose log_date lies in the window (both ends inclusive); every row when it is unset.

    Undated rows (null log_date) are outside any set window, unless `undated` keeps them
    (pooled relevance labels belong to no day).
    """
    if window is None:
        return F.lit(True)
    dated = F.col("log_date").between(F.lit(window.start), F.lit(window.end))
    return (F.col("log_date").isNull() | dated) if undated else F.coalesce(dated, F.lit(False))


def register_tables(spark: SparkSession, warehouse: str) -> list[str]:
    """Expose every existing table as a temp view, so `spark.sql("SELECT ... FROM serps")` works; with
    click_predictions also `click_predictions_by_rank`, one row per (SERP, rank)."""
    from clickeval_spark.metrics.click_prediction import by_rank  # the contract's two shapes live there

    registered = []
    for name in SCHEMAS:
        if DeltaTable.isDeltaTable(spark, table_path(warehouse, name)):
            table = read_table(spark, warehouse, name)
            table.createOrReplaceTempView(name)
            registered.append(name)
            if name == "click_predictions":
                by_rank(table).createOrReplaceTempView(BY_RANK_VIEW)
                registered.append(BY_RANK_VIEW)
    return registered


BY_RANK_VIEW = "click_predictions_by_rank"
