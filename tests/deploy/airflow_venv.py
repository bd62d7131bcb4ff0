"""The Airflow 3 venv of the deploy tests (.venv-airflow, built on first use by
deploy/airflow/setup_test_venv.sh from pinned versions: Airflow's dependencies clash with the main
venv's) and a clean environment to run its commands in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DAG_FOLDER = ROOT / "deploy" / "airflow"
DAG_FILE = DAG_FOLDER / "clickeval_dag.py"
DAG_ID = "clickeval_spark"
SETUP = DAG_FOLDER / "setup_test_venv.sh"
VENV = Path(os.environ.get("AIRFLOW_TEST_VENV", ROOT / ".venv-airflow"))


def airflow_python() -> Path:
    """.venv-airflow's interpreter; the set-up script is a no-op while the venv matches the pins."""
    env = dict(os.environ, PYTHON=os.environ.get("PYTHON") or getattr(sys, "_base_executable", sys.executable))
    env.pop("VIRTUAL_ENV", None)
    setup = subprocess.run(["bash", str(SETUP)], env=env, capture_output=True, text=True, timeout=1800)
    assert setup.returncode == 0, f"{SETUP} failed:\n{setup.stdout}\n{setup.stderr}"
    return VENV / "bin" / "python"


def clean_env(airflow_home: Path) -> dict[str, str]:
    """This process's environment without anything that would leak into Airflow (the main venv,
    Spark settings, an outer Airflow's config), plus a throw-away AIRFLOW_HOME and its SQLite DB."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIRFLOW", "PYSPARK", "SPARK_", "PYTHON", "VIRTUAL_ENV"))
    }
    env.update(
        AIRFLOW_HOME=str(airflow_home),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__DAGS_FOLDER=str(DAG_FOLDER),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{airflow_home / 'airflow.db'}",
    )
    return env
