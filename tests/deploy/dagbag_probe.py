"""Runs inside .venv-airflow (not under pytest): loads a DAG folder with Airflow's DagBag and prints
one JSON document about it on stdout, for tests/deploy/test_airflow_dag.py to assert on.

    python dagbag_probe.py DAG_FOLDER DAG_ID LOGICAL_DATE(YYYY-MM-DD)

Needs no metadata DB: DagBag only parses files; the templates are rendered with a hand-made
context (logical date, params, `macros`, `var` backed by Airflow's own VariableAccessor, which outside a
task reads Variables from AIRFLOW_VAR_* environment variables and otherwise takes the default
written in the template); the spark-submit command line is built by the provider's hook from the
rendered task (connections from AIRFLOW_CONN_* environment variables; nothing is submitted); the
DAG is serialized and read back the way the DAG processor does.
"""

from __future__ import annotations

import copy
import json
import sys
from datetime import datetime, timezone

from airflow.dag_processing.dagbag import DagBag
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

# SparkSubmitOperator keeps these in private attributes; report them under their argument names.
ATTRS = {
    "application": "application",
    "application_args": "application_args",
    "py_files": "py_files",
    "archives": "_archives",
    "files": "files",
    "packages": "packages",
    "conf": "conf",
    "conn_id": "_conn_id",
    "deploy_mode": "_deploy_mode",
    "name": "name",
}


def task_attrs(task) -> dict:
    return {key: getattr(task, attr, None) for key, attr in ATTRS.items()}


def render(task, dag, logical_date: datetime) -> dict:
    from airflow.sdk.execution_time.context import MacrosAccessor, VariableAccessor

    context = {
        "dag": dag,
        "task": task,
        "params": dict(dag.params),
        "logical_date": logical_date,
        "ds": logical_date.strftime("%Y-%m-%d"),
        "ds_nodash": logical_date.strftime("%Y%m%d"),
        "ts": logical_date.isoformat(),
        "ts_nodash": logical_date.strftime("%Y%m%dT%H%M%S"),
        "run_id": f"scheduled__{logical_date.isoformat()}",
        "var": {"value": VariableAccessor(deserialize_json=False), "json": VariableAccessor(deserialize_json=True)},
        "macros": MacrosAccessor(),  # as the task runner's context: ds_add, datetime, ...
    }
    rendered = copy.copy(task)  # render_template_fields mutates in place
    rendered.render_template_fields(context)
    return rendered


def spark_submit_command(rendered) -> list[str]:
    """The spark-submit argv the operator's hook would run (the connection comes from an
    AIRFLOW_CONN_* environment variable; nothing is executed)."""
    hook = rendered._get_hook()
    return hook._build_spark_submit_command(rendered.application)


def serialized_round_trip(dag) -> dict:
    from airflow.serialization.serialized_objects import DagSerialization

    data = DagSerialization.to_dict(dag)
    json.dumps(data)  # what the DAG processor stores must be JSON
    back = DagSerialization.from_dict(data)
    return {
        "task_ids": [t.task_id for t in back.task_group.topological_sort()],
        "template_fields": {t.task_id: list(t.template_fields) for t in back.tasks},
    }


def main(dag_folder: str, dag_id: str, logical_date: str) -> dict:
    when = datetime.strptime(logical_date, "%Y-%m-%d").replace(tzinfo=timezone.utc)
    bag = DagBag(dag_folder=dag_folder)
    out: dict = {"import_errors": dict(bag.import_errors), "dag_ids": sorted(bag.dags)}
    dag = bag.dags.get(dag_id)
    if dag is None:
        return out
    order = [t.task_id for t in dag.task_group.topological_sort()]
    out["dag"] = {
        "schedule": str(dag.schedule) if hasattr(dag, "schedule") else None,
        "catchup": dag.catchup,
        "max_active_runs": dag.max_active_runs,
        "task_order": order,
        "edges": sorted([up, down] for t in dag.tasks for up, down in ((t.task_id, d) for d in t.downstream_task_ids)),
    }
    out["tasks"] = {}
    for task_id in order:
        task = dag.get_task(task_id)
        out["tasks"][task_id] = {
            "operator": type(task).__name__,
            "is_spark_submit": isinstance(task, SparkSubmitOperator),
            "retries": task.retries,
            "template_fields": list(task.template_fields),
            "attrs": task_attrs(task),
        }
        rendered = render(task, dag, when)
        out["tasks"][task_id]["rendered"] = task_attrs(rendered)
        out["tasks"][task_id]["spark_submit"] = spark_submit_command(rendered)
    out["serialized"] = serialized_round_trip(dag)
    return out


if __name__ == "__main__":
    print("CLICKEVAL-PROBE-JSON " + json.dumps(main(*sys.argv[1:]), default=str))
