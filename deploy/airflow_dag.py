"""Airflow DAG: the clickeval-spark stages as one SparkSubmitOperator each, run daily.

The run id comes from the logical date, so a retried or re-run day replaces its own
rows (Delta replaceWhere on run_id) and never duplicates them. Build the artefacts
with deploy/package.sh and copy dist/ to ARTEFACTS (object storage or the workers' disk).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow import DAG
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

ARTEFACTS = "s3a://my-search-logs/clickeval/dist"
CONF = f"{ARTEFACTS}/conf/cluster.yaml"
DELTA = "io.delta:delta-spark_2.13:4.0.1"
RUN_ID = "daily-{{ ds_nodash }}"

with DAG(
    dag_id="clickeval_spark",
    start_date=datetime(2026, 1, 1),
    schedule="@daily",
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=10)},
    tags=["search", "click-models"],
) as dag:
    tasks = [
        SparkSubmitOperator(
            task_id=stage,
            conn_id="spark_default",
            application=f"{ARTEFACTS}/jobs/{stage}.py",
            py_files=f"{ARTEFACTS}/clickeval_spark.zip",
            files=CONF,
            packages=DELTA,
            application_args=["--conf", "cluster.yaml", "--run-id", RUN_ID],
            name=f"clickeval-{stage}-{{{{ ds_nodash }}}}",
        )
        for stage in ("ingest", "fit", "predict")
    ]
    for upstream, downstream in zip(tasks, tasks[1:]):
        upstream >> downstream
