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
    """A run's row is keyed by (run_id, job): a retry replaces it, other jobs of the run stay."""
    from delta.tables import DeltaTable

    df = spark.createDataFrame([row], schema=tables.RUNS)
    path = tables.table_path(warehouse, "runs")
    if not DeltaTable.isDeltaTable(spark, path):
        tables.conform(df, "runs").write.format("delta").partitionBy("run_id").save(path)
        return
    (
        DeltaTable.forPath(spark, path).alias("t")
        .merge(df.alias("s"), "t.run_id = s.run_id AND t.job = s.job")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
