"""Reading and writing the Delta tables under one warehouse root: <warehouse>/<name>.

A table is created once, empty, from its schema (`create_table`: NOT NULL columns, partitioning), before
its first write. A write replaces exactly the slice it owns (a dataset's serps, a run's rows) with Delta
`replaceWhere`, or merges a run's rows by key (`merge_rows`), so a retried job never duplicates rows and
never touches other runs; every commit goes through `with_conflict_retries`.
"""

from __future__ import annotations

import uuid
from datetime import date
from typing import Sequence

from delta.tables import DeltaTable
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, Observation, Row, SparkSession
from pyspark.sql import functions as F

from clickeval_spark.config import validate_run_id
from clickeval_spark.errors import ClickevalError
from clickeval_spark.spark_internals import path_exists
from clickeval_spark.tables.predicates import slice_predicate, user_metadata
from clickeval_spark.tables.retries import TableCreationRace, with_conflict_retries
from clickeval_spark.tables.schemas import PARTITION_COLUMNS, SCHEMAS, WRITTEN_BY


def table_path(warehouse: str, name: str) -> str:
    return f"{warehouse.rstrip('/')}/{name}"


def exists(spark: SparkSession, warehouse: str, name: str) -> bool:
    return DeltaTable.isDeltaTable(spark, table_path(warehouse, name))


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


# what Delta raises to the loser of a creation race (`create_table`)
_RACE_CONDITIONS = {"DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION", "DELTA_TABLE_NOT_FOUND"}


def create_table(spark: SparkSession, warehouse: str, name: str) -> None:
    """Table `name`, empty, unless one is at its path already: the schema's columns, NOT NULL where its
    StructField says nullable=False (a Delta invariant, checked by every write), partitioned as
    PARTITION_COLUMNS says. No table property or feature: the table stays at a plain table's protocol
    (reader 1, writer 2), which delta-rs and DuckDB read. Idempotent, so the loser of a creation race
    simply retries (`with_conflict_retries`)."""
    path = table_path(warehouse, name)
    if DeltaTable.isDeltaTable(spark, path):
        return
    try:
        (DeltaTable.createIfNotExists(spark).location(path).addColumns(SCHEMAS[name])
         .partitionedBy(*PARTITION_COLUMNS[name]).execute())
    except AnalysisException as exc:
        # Another writer's create has begun (its _delta_log is there, its commit maybe not): Delta finds the
        # location not empty, or the builder's read-back of the table (DeltaTable.forPath) finds no commit
        # (DELTA_TABLE_NOT_FOUND). Both are retried; files of anything else at the path stay Delta's error.
        if any(f"[{c}]" in str(exc) for c in _RACE_CONDITIONS) and path_exists(spark, f"{path}/_delta_log"):
            raise TableCreationRace(f"{name}: another writer is creating the table at {path}") from exc
        raise


def replace_slice(df: DataFrame, warehouse: str, name: str, keys: dict[str, str], run_id: str,
                  log_dates: Sequence[date | None] | None = None) -> None:
    """Write `df` as the whole slice `col1 = v1 AND ...` of table `name` (e.g. one run's rows of one model);
    with `log_dates`, only those days of it (None: the undated rows), e.g. the days one ingest read.

    Delta replaceWhere makes the write idempotent: a retry replaces the same slice
    and leaves every other slice as it was; Delta also refuses a row outside the slice.
    `userMetadata` tags the commit with the run that made it, so `DESCRIBE HISTORY`
    tells which run wrote what. Key values go into the predicate, so they must match
    the safe id pattern (checked before anything is created or written).
    """
    predicate = slice_predicate(keys, log_dates)
    tag = user_metadata(name, predicate, run_id)
    spark, path = df.sparkSession, table_path(warehouse, name)

    def write() -> None:
        # an existing table keeps its layout: serps made before days were partitions stays partitioned by
        # dataset alone, and its day slices are replaced through the log_date data column instead
        if DeltaTable.isDeltaTable(spark, path):
            _add_missing_columns(spark, path, name)
        else:
            create_table(spark, warehouse, name)
        (conform(df, name).write.format("delta").mode("overwrite")
         .option("replaceWhere", predicate).option("userMetadata", tag).save(path))

    with_conflict_retries(write, f"{name} [{predicate}]")


def merge_rows(df: DataFrame, warehouse: str, name: str, run_id: str, on: Sequence[str], what: str) -> None:
    """Upsert `df`, rows of run `run_id` only, into table `name` (created first if missing), matching rows
    on run_id and the `on` columns: a retry replaces the rows it wrote, other rows of the run stay.

    The MERGE condition names the run_id partition as a literal, so Delta reads (and checks for
    conflicts) only this run's partition: concurrent runs merging their own rows do not conflict.
    Creating the table, and a MERGE racing another job of the same run, can still conflict: both are
    retried (`what` names the rows in the warning)."""
    spark, path = df.sparkSession, table_path(warehouse, name)
    condition = " AND ".join([f"t.run_id = '{validate_run_id(run_id)}'", "t.run_id = s.run_id",
                              *[f"t.{c} = s.{c}" for c in on]])

    def merge() -> None:
        (DeltaTable.forPath(spark, path).alias("t").merge(df.alias("s"), condition)
         .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())

    ensure_table(spark, warehouse, name)
    with_conflict_retries(merge, f"{name} [{what}]")


def ensure_table(spark: SparkSession, warehouse: str, name: str) -> None:
    """`create_table` with its creation race retried (`with_conflict_retries`): the table is there after it."""
    with_conflict_retries(lambda: create_table(spark, warehouse, name), f"{name} [create]")


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


def rows_written(spark: SparkSession, warehouse: str, name: str, keys: dict[str, str], run_id: str) -> int:
    """Rows of the latest replace_slice(keys) commit, from the Delta log (no scan of the data; other
    runs' commits in between are skipped by their userMetadata)."""
    tag = user_metadata(name, slice_predicate(keys), run_id)
    last = (DeltaTable.forPath(spark, table_path(warehouse, name)).history(50)
            .where(F.col("userMetadata") == tag).select("operationMetrics").first())
    return int(last["operationMetrics"].get("numOutputRows", 0)) if last else 0


def last_commit(spark: SparkSession, warehouse: str, name: str) -> Row:
    """The table's latest commit: version, timestamp, userMetadata (the run and slice that made it)."""
    return (DeltaTable.forPath(spark, table_path(warehouse, name)).history(1)
            .select("version", "timestamp", "userMetadata").first())


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
