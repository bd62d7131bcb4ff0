"""StageContext: what every stage works with — the session, the config, the warehouse, the run id —
and the few reads and writes they all make, so a stage names tables and slices, never paths."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date
from typing import Iterator, Sequence

from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from clickeval_spark import tables
from clickeval_spark.catalog import check_locations, register_in_catalog, register_temp_views
from clickeval_spark.config import SPLITS, AppConfig, config_as_dict
from clickeval_spark.runs import RunRecord, recorded_run, write_run_rows


@dataclass(frozen=True)
class StageContext:
    spark: SparkSession
    cfg: AppConfig
    warehouse: str
    run_id: str
    # the runs rows of the enclosing `batched_runs` blocks, innermost last
    _pending_runs: list[list[dict]] = field(default_factory=list, init=False, repr=False, compare=False)

    @property
    def dataset(self) -> str:
        return self.cfg.ingest.dataset

    @contextmanager
    def record(self, job: str) -> Iterator[RunRecord]:
        """Time the body and write its `runs` row (job e.g. "fit:pbm"), also when it fails; inside
        `batched_runs` the row is written when that block ends."""
        sink = self._pending_runs[-1].append if self._pending_runs else None
        with recorded_run(self.spark, self.warehouse, self.run_id, job, self.dataset,
                          config_as_dict(self.cfg), sink) as run:
            yield run

    @contextmanager
    def batched_runs(self) -> Iterator[None]:
        """The body's `record` rows written together in one MERGE when it ends, also when it fails:
        a stage pays one runs commit, not one per model."""
        self._pending_runs.append([])
        try:
            yield
        finally:
            rows = {row["job"]: row for row in self._pending_runs.pop()}   # a job recorded twice: its last row
            write_run_rows(self.spark, self.warehouse, list(rows.values()))

    def check_catalog(self) -> None:
        """With tables.catalog set: the names already in the catalog are this warehouse's tables (before a write)."""
        if self.cfg.tables.catalog is not None:
            check_locations(self.spark, self.warehouse, self.cfg.tables.catalog.database)

    def register_in_catalog(self) -> list[str]:
        """With tables.catalog set: every table under the warehouse registered in the session's catalog
        (clickeval_spark.catalog); without it nothing. The names registered."""
        if self.cfg.tables.catalog is None:
            return []
        return register_in_catalog(self.spark, self.warehouse, self.cfg.tables.catalog.database)

    def register_temp_views(self) -> list[str]:
        """Every table under the warehouse as a temp view of its name (and the by-rank view): the names."""
        return register_temp_views(self.spark, self.warehouse)

    def read(self, table: str) -> DataFrame:
        return tables.read_table(self.spark, self.warehouse, table)

    def exists(self, table: str) -> bool:
        return tables.exists(self.spark, self.warehouse, table)

    def collected(self, table: str, condition: Column, columns: list[str] | None = None) -> list[dict]:
        """The rows of `table` where `condition` holds (column predicates, never SQL text with values
        spliced in), as dicts; none when no run has written the table. For the small global tables only."""
        if not self.exists(table):
            return []
        df = self.read(table).where(condition)
        return [r.asDict() for r in (df.select(*columns) if columns else df).collect()]

    def last_commit(self, table: str) -> Row:
        """The table's latest Delta commit: version, timestamp, userMetadata."""
        return tables.last_commit(self.spark, self.warehouse, table)

    def this_run(self, table: str, **keys: str) -> DataFrame:
        """This run's rows of `table`, narrowed by column = value `keys`."""
        condition = F.col("run_id") == self.run_id
        for column, value in keys.items():
            condition &= F.col(column) == value
        return self.read(table).where(condition)

    def write(self, df: DataFrame, table: str, keys: dict[str, str],
              log_dates: Sequence[date | None] | None = None) -> None:
        """Replace the slice `keys` of `table` with `df` (Delta replaceWhere, tagged with the run id)."""
        tables.replace_slice(df, self.warehouse, table, keys, self.run_id, log_dates)

    def rows_written(self, table: str, keys: dict[str, str]) -> int:
        """Rows of this run's last write of slice `keys`, from the Delta log (no scan)."""
        return tables.rows_written(self.spark, self.warehouse, table, keys, self.run_id)

    def serps(self, splits: tuple[str, ...] = SPLITS) -> DataFrame:
        """The dataset's SERPs of `splits` in the configured log_date window: what every stage after
        ingest reads."""
        return self.read("serps").where(
            (F.col("dataset") == self.dataset) & F.col("split").isin(*splits) & tables.in_window(self.cfg.window))

    def dataset_days(self, table: str, log_dates: Sequence[date | None]) -> DataFrame:
        """The dataset's rows of `table` (serps, relevance_labels) on `log_dates` (None: the undated rows):
        e.g. the slices an ingest just wrote."""
        return self.read(table).where(
            (F.col("dataset") == self.dataset) & F.expr(tables.log_date_predicate(log_dates)))

    def labels(self) -> DataFrame | None:
        """The dataset's relevance labels (None: none ingested); with a window, the dated ones of its
        days and every undated one."""
        if not self.exists("relevance_labels"):
            return None
        return self.read("relevance_labels").where(
            (F.col("dataset") == self.dataset) & tables.in_window(self.cfg.window, undated=True))

    def outside_window(self, rows: DataFrame) -> DataFrame:
        """External rows (predictions, sequences) without those of the dataset's SERPs outside the window:
        they are not evaluated in this run. A serp_id the dataset does not have at all still fails the
        checks."""
        if self.cfg.window is None or "serp_id" not in rows.columns:
            return rows
        outside = self.read("serps").where(
            (F.col("dataset") == self.dataset) & ~tables.in_window(self.cfg.window)).select(F.col("serp_id").alias("_out"))
        return rows.join(outside, on=F.col("serp_id").cast("string") == F.col("_out"), how="left_anti")
