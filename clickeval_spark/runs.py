"""The `runs` table: one row per job run with its config, counts, timing and status."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterator

from pyspark.sql import SparkSession

from clickeval_spark import tables
from clickeval_spark.config import validate_run_id


@dataclass
class RunRecord:
    run_id: str
    job: str
    dataset: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    details: dict = field(default_factory=dict)
    status: str = "running"


@contextmanager
def recorded_run(spark: SparkSession, warehouse: str, run_id: str, job: str,
                 dataset: str | None, config: dict) -> Iterator[RunRecord]:
    """Time the body and write its `runs` row, also when it fails (status=failed, error in details)."""
    record = RunRecord(run_id=run_id, job=job, dataset=dataset)
    if job != "ingest":
        # the log_date window the job read (null: the whole dataset); the report shows it
        record.details["window"] = config.get("window")
    started = datetime.now(timezone.utc).replace(tzinfo=None)
    t0 = time.perf_counter()
    try:
        yield record
        record.status = "succeeded"
    except Exception as exc:
        record.status = "failed"
        record.details["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        row = {
            "run_id": run_id,
            "job": job,
            "dataset": dataset,
            "status": record.status,
            "started_at": started,
            "finished_at": datetime.now(timezone.utc).replace(tzinfo=None),
            "seconds": time.perf_counter() - t0,
            "counts": {k: int(v) for k, v in record.counts.items()},
            "details": json.dumps(record.details, default=str, sort_keys=True),
            "config": json.dumps(config, default=str, sort_keys=True),
        }
        _write_run_row(spark, warehouse, row)


def _write_run_row(spark: SparkSession, warehouse: str, row: dict) -> None:
    """A run's row is keyed by (run_id, job): a retry replaces it, other jobs of the run stay.

    The MERGE condition names the run_id partition as a literal, so Delta reads (and checks for
    conflicts) only this run's partition: concurrent runs merging their own rows do not conflict.
    Creating the table, and a MERGE racing another job of the same run, can still conflict: both go
    through tables.with_conflict_retries (see there).
    """
    from delta.tables import DeltaTable

    df = spark.createDataFrame([row], schema=tables.RUNS)
    path = tables.table_path(warehouse, "runs")
    run_id = validate_run_id(row["run_id"])

    def create_if_missing() -> None:
        # an empty append creates the table once; appending nothing to an existing table is harmless,
        # so the loser of a creation race simply retries (no "path already exists" error)
        if not DeltaTable.isDeltaTable(spark, path):
            tables.conform(df.limit(0), "runs").write.format("delta").mode("append").partitionBy("run_id").save(path)

    def merge() -> None:
        (
            DeltaTable.forPath(spark, path).alias("t")
            .merge(df.alias("s"), f"t.run_id = '{run_id}' AND t.run_id = s.run_id AND t.job = s.job")
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )

    tables.with_conflict_retries(create_if_missing, "runs [create]")
    tables.with_conflict_retries(merge, f"runs [run_id = '{run_id}' AND job = '{row['job']}']")
