"""The main job: every stage of clickeval_spark.cli.PIPELINE_STAGES in order, in one Spark session, one run id."""

import sys

from clickeval_spark import stages
from clickeval_spark.cli import PIPELINE_STAGES
from clickeval_spark.runtime import run_job


def pipeline_stage(spark, cfg, warehouse, run_id) -> None:
    for name in PIPELINE_STAGES:
        getattr(stages, f"{name}_stage")(spark, cfg, warehouse, run_id)
    print(f"pipeline done: run_id={run_id}, tables under {warehouse}")


def main(argv=None) -> int:
    return run_job("pipeline", argv, pipeline_stage)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
