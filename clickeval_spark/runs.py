"""The `runs` table: one row per job run with its config, counts, timing and status."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Iterator

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
                 dataset: str | None, config: dict,
                 sink: Callable[[dict], None] | None = None) -> Iterator[RunRecord]:
    """Time the body and write its `runs` row, also when it fails (status=failed, error in details).

    With `sink` the finished row goes there instead (a stage collects its rows and writes them
    in one MERGE when it ends: `write_run_rows`)."""
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
        if sink is None:
            write_run_rows(spark, warehouse, [row])
        else:
            sink(row)


def write_run_rows(spark: SparkSession, warehouse: str, rows: list[dict]) -> None:
    """Rows of one run, keyed by (run_id, job), in one MERGE: a retry replaces them, other jobs of
    the run stay (`tables.merge_rows`: the run_id partition named as a literal, so concurrent runs
    merging their own rows do not conflict)."""
    if not rows:
        return
    [run_id] = {validate_run_id(row["run_id"]) for row in rows}
    jobs = ", ".join(row["job"] for row in rows)
    tables.merge_rows(spark.createDataFrame(rows, schema=tables.RUNS), warehouse, "runs", run_id, on=("job",),
                      what=f"run_id = '{run_id}' AND job IN ({jobs})")
