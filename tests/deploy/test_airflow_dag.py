"""The Airflow DAG (deploy/airflow/clickeval_dag.py), loaded by Airflow's own DagBag.

Airflow and the Apache Spark provider live in their own venv (.venv-airflow, built on first use by
deploy/airflow/setup_test_venv.sh from pinned versions; their dependencies clash with the main
venv's). tests/deploy/dagbag_probe.py runs there in a subprocess with a throw-away AIRFLOW_HOME and
no metadata DB, and reports the DAG as JSON: import errors, task order, each task's operator
arguments as written and as rendered for one logical date, and the spark-submit command line the
provider's hook builds from them.
"""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import pytest

from tests.deploy import airflow_venv
from tests.deploy.airflow_venv import DAG_FILE, DAG_FOLDER, DAG_ID, ROOT

# an Airflow venv and subprocesses: `make test-fast` leaves it out
pytestmark = pytest.mark.slow

PROBE = Path(__file__).with_name("dagbag_probe.py")

STAGES = ("ingest", "fit", "predict", "evaluate", "generate", "surrogate", "report")
LOGICAL_DATE = "2026-11-28"
RUN_ID = "daily-20261128"

DEFAULT_ARTEFACTS = "s3a://my-search-logs/clickeval/dist"
WINDOW_START = "{{ macros.ds_add(ds, 1 - (var.value.get('clickeval_window_days', '7') | int)) }}"
DELTA = "io.delta:delta-spark_2.13:4.0.1"
MARKER = "CLICKEVAL-PROBE-JSON "


def _day_args(stage: str, log_date: str, window_start: str) -> list[str]:
    """ingest reads the logical date's slice; every later stage the window ending on it."""
    if stage == "ingest":
        return ["--set", f"ingest.log_date={log_date}"]
    return ["--set", f"window.start={window_start}", "--set", f"window.end={log_date}"]


@pytest.fixture(scope="module")
def airflow_python() -> Path:
    return airflow_venv.airflow_python()


def _probe(airflow_python: Path, tmp_path: Path, **extra_env: str) -> dict:
    env = airflow_venv.clean_env(tmp_path)
    env.update(extra_env)
    proc = subprocess.run(
        [str(airflow_python), str(PROBE), str(DAG_FOLDER), DAG_ID, LOGICAL_DATE],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, f"probe failed:\n{proc.stdout}\n{proc.stderr}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARKER)]
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0][len(MARKER):])


@pytest.fixture(scope="module")
def dag_defaults(airflow_python, tmp_path_factory) -> dict:
    """The DAG with no Variables set (the defaults) and `spark_default` pointing at YARN."""
    return _probe(
        airflow_python, tmp_path_factory.mktemp("airflow_home"),
        AIRFLOW_CONN_SPARK_DEFAULT=json.dumps({"conn_type": "spark", "host": "yarn"}),
    )


@pytest.fixture(scope="module")
def dag_overridden(airflow_python, tmp_path_factory) -> dict:
    """The DAG with every Variable set (AIRFLOW_VAR_* is an Airflow Variable), the connection
    pointing at another YARN queue. (Not a k8s:// master: the hook then needs the cncf.kubernetes
    provider, which this venv does not install.)"""
    return _probe(
        airflow_python, tmp_path_factory.mktemp("airflow_home"),
        AIRFLOW_VAR_CLICKEVAL_ARTEFACTS="hdfs:///apps/clickeval/v2",
        AIRFLOW_VAR_CLICKEVAL_CONF="prod.yaml",
        AIRFLOW_VAR_CLICKEVAL_PACKAGES="io.delta:delta-spark_2.13:4.0.2",
        AIRFLOW_VAR_CLICKEVAL_SPARK_CONN_ID="spark_search",
        AIRFLOW_VAR_CLICKEVAL_WINDOW_DAYS="3",
        AIRFLOW_VAR_CLICKEVAL_DEPLOY_MODE="client",
        AIRFLOW_VAR_CLICKEVAL_DRIVER_PYTHON="/opt/clickeval/dist/clickeval.pex",
        AIRFLOW_CONN_SPARK_SEARCH=json.dumps({"conn_type": "spark", "host": "yarn", "extra": {"queue": "search"}}),
    )


def test_dag_imports_cleanly(dag_defaults):
    assert dag_defaults["import_errors"] == {}
    assert dag_defaults["dag_ids"] == [DAG_ID]
    dag = dag_defaults["dag"]
    assert dag["schedule"] == "@daily"
    assert dag["catchup"] is False
    assert dag["max_active_runs"] == 1


def test_one_spark_submit_task_per_stage_in_stage_order(dag_defaults):
    dag = dag_defaults["dag"]
    assert tuple(dag["task_order"]) == STAGES
    # a plain chain: each stage waits for the one before it and for nothing else
    assert sorted(dag["edges"]) == sorted([a, b] for a, b in zip(STAGES, STAGES[1:]))
    for stage in STAGES:
        task = dag_defaults["tasks"][stage]
        assert task["is_spark_submit"], task["operator"]
        assert task["retries"] == 2
    # what the DAG processor stores and the scheduler reads back keeps the order and the templating
    assert tuple(dag_defaults["serialized"]["task_ids"]) == STAGES
    for fields in dag_defaults["serialized"]["template_fields"].values():
        assert {"application", "application_args", "py_files", "files", "packages", "conf",
                "_conn_id", "_deploy_mode"} <= set(fields)


def test_dag_stages_are_the_package_stages_in_order():
    """The DAG writes its stage list out (Airflow's workers do not have the package); it is
    clickeval_spark.stages.STAGES, in order, and each stage has the job file the DAG submits."""
    from clickeval_spark import stages

    assert STAGES == tuple(stages.STAGES)
    for stage in STAGES:
        assert (ROOT / "jobs" / f"{stage}.py").is_file(), stage


def test_operator_arguments_as_written(dag_defaults):
    """The templates themselves: the run id from the logical date, settings from Variables."""
    artefacts = f"{{{{ var.value.get('clickeval_artefacts', '{DEFAULT_ARTEFACTS}') }}}}"
    conf_name = "{{ var.value.get('clickeval_conf', 'cluster.yaml') }}"
    job_conf = ("{% if var.value.get('clickeval_deploy_mode', 'cluster') == 'cluster' %}"
                f"{conf_name}{{% else %}}{artefacts}/conf/{conf_name}{{% endif %}}")
    for stage in STAGES:
        attrs = dag_defaults["tasks"][stage]["attrs"]
        assert attrs == {
            "application": f"{artefacts}/jobs/{stage}.py",
            "application_args": ["--conf", job_conf, "--run-id", "daily-{{ ds_nodash }}",
                                 *_day_args(stage, "{{ ds }}", WINDOW_START)],
            "py_files": None,
            "archives": None,
            "files": f"{artefacts}/clickeval.pex,{artefacts}/conf/{conf_name}",
            "packages": f"{{{{ var.value.get('clickeval_packages', '{DELTA}') }}}}",
            "conf": {"spark.pyspark.python": "./clickeval.pex",
                     "spark.pyspark.driver.python": "{{ var.value.get('clickeval_driver_python', './clickeval.pex') }}"},
            "conn_id": "{{ var.value.get('clickeval_spark_conn_id', 'spark_default') }}",
            "deploy_mode": "{{ var.value.get('clickeval_deploy_mode', 'cluster') }}",
            "name": f"clickeval-{stage}-{{{{ ds_nodash }}}}",
        }


def test_rendered_arguments_with_default_variables(dag_defaults):
    for stage in STAGES:
        rendered = dag_defaults["tasks"][stage]["rendered"]
        assert rendered == {
            "application": f"{DEFAULT_ARTEFACTS}/jobs/{stage}.py",
            "application_args": ["--conf", "cluster.yaml", "--run-id", RUN_ID,
                                 *_day_args(stage, LOGICAL_DATE, "2026-11-22")],
            "py_files": None,
            "archives": None,
            "files": f"{DEFAULT_ARTEFACTS}/clickeval.pex,{DEFAULT_ARTEFACTS}/conf/cluster.yaml",
            "packages": DELTA,
            "conf": {"spark.pyspark.python": "./clickeval.pex", "spark.pyspark.driver.python": "./clickeval.pex"},
            "conn_id": "spark_default",
            "deploy_mode": "cluster",
            "name": f"clickeval-{stage}-20261128",
        }


def test_spark_submit_command_with_default_variables(dag_defaults):
    for stage in STAGES:
        assert dag_defaults["tasks"][stage]["spark_submit"] == [
            "spark-submit", "--master", "yarn",
            "--conf", "spark.pyspark.python=./clickeval.pex",
            "--conf", "spark.pyspark.driver.python=./clickeval.pex",
            "--files", f"{DEFAULT_ARTEFACTS}/clickeval.pex,{DEFAULT_ARTEFACTS}/conf/cluster.yaml",
            "--packages", DELTA,
            "--name", f"clickeval-{stage}-20261128",
            "--deploy-mode", "cluster",
            f"{DEFAULT_ARTEFACTS}/jobs/{stage}.py",
            "--conf", "cluster.yaml", "--run-id", RUN_ID, *_day_args(stage, LOGICAL_DATE, "2026-11-22"),
        ]


def test_variables_override_every_setting(dag_overridden):
    assert dag_overridden["import_errors"] == {}
    art = "hdfs:///apps/clickeval/v2"
    for stage in STAGES:
        task = dag_overridden["tasks"][stage]
        assert task["rendered"]["conn_id"] == "spark_search"
        assert task["spark_submit"] == [
            "spark-submit", "--master", "yarn",
            "--conf", "spark.pyspark.python=./clickeval.pex",
            "--conf", "spark.pyspark.driver.python=/opt/clickeval/dist/clickeval.pex",
            "--files", f"{art}/clickeval.pex,{art}/conf/prod.yaml",
            "--packages", "io.delta:delta-spark_2.13:4.0.2",
            "--name", f"clickeval-{stage}-20261128",
            "--queue", "search",
            "--deploy-mode", "client",
            f"{art}/jobs/{stage}.py",
            # client mode: the driver reads the config from the artefacts, not from its --files
            "--conf", f"{art}/conf/prod.yaml", "--run-id", RUN_ID,
            # clickeval_window_days = 3: the window is the logical date and the two days before it
            *_day_args(stage, LOGICAL_DATE, "2026-11-26"),
        ]


def test_dag_file_does_no_work_at_import():
    """Only stdlib and Airflow imports (workers have no clickeval_spark), and no Variable or
    connection lookups at module level (each would query the metadata DB on every parse)."""
    tree = ast.parse(DAG_FILE.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported <= {"__future__", "datetime", "airflow"}, imported
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not names & {"Variable", "BaseHook", "Connection", "get_connection"}, names
