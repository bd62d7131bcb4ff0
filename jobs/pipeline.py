"""The main job (`clickeval run`): every stage of PIPELINE_STAGES in order, in one Spark session, one run id.

Ends by printing the metrics table and the report's path.
"""

import sys

from pyspark.sql import functions as F

from clickeval_spark import stages, tables
from clickeval_spark.cli import PIPELINE_STAGES
from clickeval_spark.metrics.summary import metrics_table
from clickeval_spark.runtime import run_job


def pipeline_stage(spark, cfg, warehouse, run_id) -> None:
    results = {name: getattr(stages, f"{name}_stage")(spark, cfg, warehouse, run_id) for name in PIPELINE_STAGES}
    print(f"\npipeline done: run_id={run_id}, tables under {warehouse}")
    if "evaluate" in results:
        rows = (tables.read_table(spark, warehouse, "metrics")
                .where((F.col("run_id") == run_id) & (F.col("dataset") == cfg.ingest.dataset)).collect())
        print(metrics_table([r.asDict() for r in rows], cfg.evaluated_models))
    if "report" in results:
        print(f"report: {results['report']}")


def main(argv=None) -> int:
    return run_job("pipeline", argv, pipeline_stage)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
