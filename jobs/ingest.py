"""Ingest job: read the configured source, validate, split, write serps / relevance_labels / quarantine."""

from __future__ import annotations

import sys
from typing import Sequence

from pyspark.sql import SparkSession

from clickeval_spark import ingest
from clickeval_spark.config import AppConfig, config_as_dict
from clickeval_spark.runs import recorded_run
from clickeval_spark.runtime import run_job
from clickeval_spark.sources import synthetic


def ingest_stage(spark: SparkSession, cfg: AppConfig, warehouse: str, run_id: str) -> dict[str, int]:
    icfg = cfg.ingest
    with recorded_run(spark, warehouse, run_id, "ingest", icfg.dataset, config_as_dict(cfg)) as run:
        if icfg.format == "synthetic":
            parsed_serps, labels = synthetic.generate(spark, icfg, warehouse, run_id)
        else:
            parsed_serps, labels = ingest.parse_serps(spark, icfg), ingest.parse_labels(spark, icfg)
        out = ingest.run_ingest(spark, icfg, parsed_serps, labels, run_id)
        run.counts.update(ingest.write_ingest(spark, out, warehouse, icfg.dataset, run_id))
    print(f"ingest {icfg.dataset} run_id={run_id}: " + ", ".join(f"{k}={v}" for k, v in sorted(run.counts.items())))
    return run.counts


def main(argv: Sequence[str] | None = None) -> int:
    return run_job("ingest", argv, ingest_stage)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
