"""The main job: ingest -> fit -> predict in one Spark session, all under one run id."""

import sys

from clickeval_spark.runtime import run_job
from clickeval_spark.stages import fit_stage, ingest_stage, predict_stage


def pipeline_stage(spark, cfg, warehouse, run_id) -> None:
    for stage in (ingest_stage, fit_stage, predict_stage):
        stage(spark, cfg, warehouse, run_id)
    print(f"pipeline done: run_id={run_id}, tables under {warehouse}")


def main(argv=None) -> int:
    return run_job("pipeline", argv, pipeline_stage)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
