"""Runs inside .venv-airflow (not under pytest): prints, as one JSON line, the task instances of the
DAG runs of one DAG from Airflow's metadata DB (AIRFLOW_HOME's), for tests/cluster/test_airflow_daily.py.

    python dagrun_probe.py DAG_ID

{"<logical date YYYY-MM-DD>": {"state": ..., "tasks": {"<task_id>": {"state": ..., "try_number": n}}}}
"""

from __future__ import annotations

import json
import sys

from airflow.models.dagrun import DagRun
from airflow.utils.session import create_session


def main(dag_id: str) -> dict:
    out = {}
    with create_session() as session:
        for run in session.query(DagRun).filter(DagRun.dag_id == dag_id).all():
            tasks = {ti.task_id: {"state": str(ti.state), "try_number": ti.try_number}
                     for ti in run.get_task_instances(session=session)}
            out[run.logical_date.strftime("%Y-%m-%d")] = {"state": str(run.state), "tasks": tasks}
    return out


if __name__ == "__main__":
    print("CLICKEVAL-DAGRUNS-JSON " + json.dumps(main(sys.argv[1])))
