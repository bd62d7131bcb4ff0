from __future__ import annotations

from pathlib import Path

from pyspark.sql import functions as F

from clickeval_spark import ingestion
from clickeval_spark.config import IngestConfig


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def run(spark, cfg: IngestConfig, run_id: str = "t1"):
    """Parse + validate (no Delta write): the IngestOutput of a config."""
    return ingestion.run_ingest(spark, cfg, ingestion.parse_serps(spark, cfg), ingestion.parse_labels(spark, cfg), run_id)


def rules(out) -> list[tuple]:
    """(line or record, rule) of every quarantined record, sorted."""
    rows = out.quarantine.select(F.coalesce(F.col("line").cast("string"), "record").alias("at"), "rule").collect()
    return sorted((r["at"], r["rule"]) for r in rows)
