"""Airflow DAG `clickeval_spark`: the clickeval-spark stages, one SparkSubmitOperator each, in
stage order, run daily.

- Run id: ``daily-<logical date as YYYYMMDD>``, so a retried or re-run day replaces its own rows
  (Delta replaceWhere on run_id) and never duplicates them.
- Days: ``ingest`` runs with ``ingest.log_date = {{ ds }}``: an input location naming the day
  (``ingest.paths.all: …/dt={log_date}/``, conf/cluster.yaml) reads that day's files only, a missing
  day fails the task in one line naming the location (Airflow retries, then alerts), records
  without a time of their own get that day, and only those (dataset, log_date) slices of ``serps``
  are replaced; every
  later stage reads the window of the last ``clickeval_window_days`` days ending at ``{{ ds }}``
  (``window.start``, ``window.end``, both inclusive), so a daily run over a growing log stays bounded.
- Each task submits ``<artefacts>/jobs/<stage>.py`` with ``--files <artefacts>/clickeval.pex,
  <artefacts>/conf/<conf>``; Delta comes from ``--packages``. The PEX (deploy/package.sh) holds the
  code and its dependencies and is the Python of driver and executors: it finds a Python
  3.11 on each node's PATH (PEX_PYTHON_PATH if it lives elsewhere), so nodes need not share the build
  host's interpreter path. Executors run ``./clickeval.pex`` from their working directory.
- Deploy mode and the driver's Python depend on the cluster manager:

  | cluster manager | clickeval_deploy_mode | clickeval_driver_python | the job's config |
  |---|---|---|---|
  | YARN, Kubernetes | cluster (default) | ./clickeval.pex (default: the driver's container gets --files) | ``<conf>`` in the driver's working directory |
  | Spark standalone | client (standalone runs Python drivers in client mode only) | the PEX's path on the Airflow worker, e.g. /opt/clickeval/dist/clickeval.pex | ``<artefacts>/conf/<conf>``: the artefacts must be a local path there |

  Kubernetes also needs apache-airflow-providers-cncf-kubernetes (a ``k8s://`` master) and an image
  whose Python is 3.11; YARN needs HADOOP_CONF_DIR on the Airflow worker.
- A stage that fails (a missing day's input, a lost driver) is retried (``retries`` 2, after
  Airflow's ``[core] default_task_retry_delay``), then alerts; a retry replaces the run's rows.
- Settings are Airflow Variables, read when a task renders its templates (never at import time,
  which would query the metadata DB on every parse); unset ones take the defaults below:

  | Variable                  | default                                |
  |---------------------------|----------------------------------------|
  | clickeval_artefacts       | s3a://my-search-logs/clickeval/dist    |
  | clickeval_conf            | cluster.yaml                           |
  | clickeval_packages        | io.delta:delta-spark_2.13:4.0.1        |
  | clickeval_spark_conn_id   | spark_default                          |
  | clickeval_window_days     | 7                                      |
  | clickeval_deploy_mode     | cluster                                |
  | clickeval_driver_python   | ./clickeval.pex                        |

Build the artefacts with deploy/package.sh and copy dist/ to the artefacts location. Airflow needs
apache-airflow-providers-apache-spark, plus apache-airflow-providers-cncf-kubernetes when the Spark
connection's master is k8s://, and spark-submit on the workers' PATH. Written for Airflow 3
(tested with the pins in requirements-test.txt: Airflow 3.3.2, Spark provider 6.3.4). This file
must not import clickeval_spark (Airflow's workers do not have it): the stage list is written
out here, and tests/deploy checks it against clickeval_spark.stages.STAGES.
"""

from __future__ import annotations

from datetime import datetime, timezone

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
    "clickeval_deploy_mode": "cluster",
    "clickeval_driver_python": "./clickeval.pex",
}


def _var(name: str) -> str:
    """A Jinja expression for Airflow Variable `name`, falling back to its default."""
    return "{{ var.value.get('%s', '%s') }}" % (name, DEFAULTS[name])


ARTEFACTS = _var("clickeval_artefacts")
CONF_NAME = _var("clickeval_conf")
DEPLOY_MODE = _var("clickeval_deploy_mode")
# cluster mode: the driver's working directory holds --files; client mode: it is the Airflow worker's
JOB_CONF = ("{%% if var.value.get('clickeval_deploy_mode', '%s') == 'cluster' %%}%s{%% else %%}%s/conf/%s{%% endif %%}"
            % (DEFAULTS["clickeval_deploy_mode"], CONF_NAME, ARTEFACTS, CONF_NAME))
RUN_ID = "daily-{{ ds_nodash }}"
# ingest: the logical date's slice; the other stages: the window_days days ending at the logical date
INGEST_ARGS = ["--set", "ingest.log_date={{ ds }}"]
WINDOW_START = ("{{ macros.ds_add(ds, 1 - (var.value.get('clickeval_window_days', '%s') | int)) }}"
                % DEFAULTS["clickeval_window_days"])
WINDOW_ARGS = ["--set", f"window.start={WINDOW_START}", "--set", "window.end={{ ds }}"]


class ClickevalSparkSubmitOperator(SparkSubmitOperator):
    """SparkSubmitOperator whose connection id and deploy mode are templated as well, so that they
    too can come from Variables (the hook is built from them in execute(), after rendering)."""

    template_fields = (*SparkSubmitOperator.template_fields, "_conn_id", "_deploy_mode")


with DAG(
    dag_id="clickeval_spark",
    description="clickeval-spark: ingest -> fit -> predict -> evaluate -> generate -> surrogate -> report",
    doc_md=__doc__,
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    schedule="@daily",
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2},
    tags=["search", "click-models"],
) as dag:
    tasks = [
        ClickevalSparkSubmitOperator(
            task_id=stage,
            conn_id=_var("clickeval_spark_conn_id"),
            deploy_mode=DEPLOY_MODE,
            name=f"clickeval-{stage}-{{{{ ds_nodash }}}}",
            application=f"{ARTEFACTS}/jobs/{stage}.py",
            application_args=["--conf", JOB_CONF, "--run-id", RUN_ID,
                              *(INGEST_ARGS if stage == "ingest" else WINDOW_ARGS)],
            files=f"{ARTEFACTS}/clickeval.pex,{ARTEFACTS}/conf/{CONF_NAME}",
            packages=_var("clickeval_packages"),
            conf={"spark.pyspark.python": "./clickeval.pex",
                  "spark.pyspark.driver.python": _var("clickeval_driver_python")},
            # A retry resubmits the stage, which is safe: a stage rerun with the same run id
            # replaces that run's rows. (Durable reattach would need YARN's RM REST API set up.)
            durable=False,
        )
        for stage in STAGES
    ]
    for upstream, downstream in zip(tasks, tasks[1:]):
        upstream >> downstream
