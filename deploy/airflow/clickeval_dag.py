"""Airflow DAG `clickeval_spark`: the clickeval-spark stages, one SparkSubmitOperator each, in
stage order, run daily.

- Run id: ``daily-<logical date as YYYYMMDD>``, so a retried or re-run day replaces its own rows
  (Delta replaceWhere on run_id) and never duplicates them.
- Days: ``ingest`` reads the day's input as ``ingest.log_date = {{ ds }}`` (records without a time
  of their own get that day) and replaces only those (dataset, log_date) slices of ``serps``; every
  later stage reads the window of the last ``clickeval_window_days`` days ending at ``{{ ds }}``
  (``window.start``, ``window.end``, both inclusive), so a daily run over a growing log stays bounded.
- Each task submits ``<artefacts>/jobs/<stage>.py`` with ``--py-files <artefacts>/clickeval_spark.zip``,
  the packed venv ``--archives <artefacts>/clickeval_venv.tar.gz#environment`` (its Python runs
  driver and executors: ``spark.pyspark.python=./environment/bin/python``, hence cluster deploy
  mode, on YARN or Kubernetes alike), ``--files <artefacts>/conf/<conf>`` and Delta via
  ``--packages``; the job reads ``--conf <conf>`` from its working directory.
- Settings are Airflow Variables, read when a task renders its templates (never at import time,
  which would query the metadata DB on every parse); unset ones take the defaults below:

  | Variable                  | default                                |
  |---------------------------|----------------------------------------|
  | clickeval_artefacts       | s3a://my-search-logs/clickeval/dist    |
  | clickeval_conf            | cluster.yaml                           |
  | clickeval_packages        | io.delta:delta-spark_2.13:4.0.1        |
  | clickeval_spark_conn_id   | spark_default                          |
  | clickeval_window_days     | 7                                      |

Build the artefacts with deploy/package.sh and copy dist/ to the artefacts location. Airflow needs
apache-airflow-providers-apache-spark, plus apache-airflow-providers-cncf-kubernetes when the Spark
connection's master is k8s://, and spark-submit on the workers' PATH. Written for Airflow 3
(tested with the pins in requirements-test.txt: Airflow 3.3.2, Spark provider 6.3.4). This file
must not import clickeval_spark (Airflow's workers do not have it): the stage list is written
out here, and tests/deploy checks it against clickeval_spark.stages.STAGES.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG  # Airflow 3
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

# Run order; each stage reads the tables the ones before it wrote.
STAGES = ("ingest", "fit", "predict", "evaluate", "generate", "surrogate", "report")

DEFAULTS = {
    "clickeval_artefacts": "s3a://my-search-logs/clickeval/dist",
    "clickeval_conf": "cluster.yaml",
    "clickeval_packages": "io.delta:delta-spark_2.13:4.0.1",
    "clickeval_spark_conn_id": "spark_default",
    "clickeval_window_days": "7",
}


def _var(name: str) -> str:
    """A Jinja expression for Airflow Variable `name`, falling back to its default."""
    return "{{ var.value.get('%s', '%s') }}" % (name, DEFAULTS[name])


ARTEFACTS = _var("clickeval_artefacts")
CONF_NAME = _var("clickeval_conf")
RUN_ID = "daily-{{ ds_nodash }}"
# ingest: the logical date's slice; the other stages: the window_days days ending at the logical date
INGEST_ARGS = ["--set", "ingest.log_date={{ ds }}"]
WINDOW_START = ("{{ macros.ds_add(ds, 1 - (var.value.get('clickeval_window_days', '%s') | int)) }}"
                % DEFAULTS["clickeval_window_days"])
WINDOW_ARGS = ["--set", f"window.start={WINDOW_START}", "--set", "window.end={{ ds }}"]


class ClickevalSparkSubmitOperator(SparkSubmitOperator):
    """SparkSubmitOperator whose archives and connection id are templated as well, so that they
    too can come from Variables (the hook is built from them in execute(), after rendering)."""

    template_fields = (*SparkSubmitOperator.template_fields, "_archives", "_conn_id")


with DAG(
    dag_id="clickeval_spark",
    description="clickeval-spark: ingest -> fit -> predict -> evaluate -> generate -> surrogate -> report",
    doc_md=__doc__,
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    schedule="@daily",
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=10)},
    tags=["search", "click-models"],
) as dag:
    tasks = [
        ClickevalSparkSubmitOperator(
            task_id=stage,
            conn_id=_var("clickeval_spark_conn_id"),
            deploy_mode="cluster",
            name=f"clickeval-{stage}-{{{{ ds_nodash }}}}",
            application=f"{ARTEFACTS}/jobs/{stage}.py",
            application_args=["--conf", CONF_NAME, "--run-id", RUN_ID,
                              *(INGEST_ARGS if stage == "ingest" else WINDOW_ARGS)],
            py_files=f"{ARTEFACTS}/clickeval_spark.zip",
            archives=f"{ARTEFACTS}/clickeval_venv.tar.gz#environment",
            files=f"{ARTEFACTS}/conf/{CONF_NAME}",
            packages=_var("clickeval_packages"),
            conf={"spark.pyspark.python": "./environment/bin/python"},
            # A retry resubmits the stage, which is safe: a stage rerun with the same run id
            # replaces that run's rows. (Durable reattach would need YARN's RM REST API set up.)
            durable=False,
        )
        for stage in STAGES
    ]
    for upstream, downstream in zip(tasks, tasks[1:]):
        upstream >> downstream
