"""The daily DAG (deploy/airflow/clickeval_dag.py) executed by Airflow itself against the Spark
standalone cluster of tests/cluster, for three consecutive logical dates.

`airflow dags test` (Airflow 3, .venv-airflow) runs each date's DAG run with its real scheduling
loop: every task is the DAG's SparkSubmitOperator, whose hook spark-submits the stage in client
mode (the Variables a standalone cluster needs) to the master of `standalone_cluster`, from
deploy/package.sh's artefacts only (the PEX as driver's and executors' Python, the zip, the jobs,
the conf). Each day's input is its own `dt=<day>` folder, named by `{log_date}` in the config; the
tables are registered in a Hive metastore (embedded Derby) as the catalog. Day 2 is run a second
time whole (`dags test` clears its task instances) and must leave every table as it was; on day 3
the fit's spark-submit is SIGKILLed mid-run and Airflow's retry must complete the day without
duplicate or partial rows. Every application has an executor on each of the cluster's two workers.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from clickeval_spark.stages import STAGES
from clickeval_spark.tables import read_table
from tests.cluster.standalone import SPARK_HOME, StandaloneCluster, jvm_settings, processes, spark_env
from tests.deploy import airflow_venv
from tests.reliability.baseline import assert_same_tables, table_rows
from tests.spark_settings import INTERPRETED, PROCESS_CONF

pytestmark = pytest.mark.cluster

DAYS = ("2026-11-28", "2026-11-29", "2026-11-30")
SERPS_PER_DAY = dict(zip(DAYS, (48, 64, 56)))
LATER_DAY = "2026-12-01"   # its folder is there from the start: no run may read it
DATASET = "daily-logs"
DATABASE = "clickeval"
CONF_NAME = "airflow-daily-test.yaml"
# the tables a run writes rows keyed by its run_id
RUN_TABLES = ("model_params", "click_predictions", "relevance_scores", "metrics", "synthetic_serps",
              "distributional_metrics")
PROBE = Path(airflow_venv.ROOT / "tests" / "deploy" / "dagrun_probe.py")
ARCHIVE_REFUSED = "Unable to use shared archive"   # a JVM's warning when its class path does not fit the archive

CONF = """\
env: airflow-daily-test
spark:
  mode: cluster
  master: null
  warehouse: {warehouse}
  conf:
    spark.sql.shuffle.partitions: "2"
    spark.databricks.delta.snapshotPartitions: "2"
    spark.python.daemon.module: clickeval_spark.python_daemon
    # the catalog: a Hive metastore in an embedded Derby database (one driver at a time uses it)
    spark.sql.catalogImplementation: hive
    spark.hadoop.javax.jdo.option.ConnectionURL: "jdbc:derby:;databaseName={metastore};create=true"
    spark.sql.warehouse.dir: {hive_warehouse}
tables:
  catalog:
    database: {database}
ingest:
  dataset: {dataset}
  format: per_query_text
  text_variant: graphcm
  paths:
    all: {logs}/dt={{log_date}}/
  max_rank: 10
fit:
  models: [rctr, pbm]
  iterations: 5
  tol: null
  max_rank: 10
  prior: {{kind: beta, k: 1.0}}
predict:
  splits: [test]
evaluate:
  splits: [test]
  replicates: 10
  reference_model: pbm
generate:
  samples: 1
  list_orders: [original]
  split: test
surrogate:
  model: pbm
  iterations: 2
report:
  path: {reports}
  trend: true
"""


def _write_day(logs: Path, day: str, n: int, seed: int) -> None:
    """`n` SERPs of per-query text (sid, qid, docs, vtypes, clicks) in <logs>/dt=<day>/, sessions of
    two SERPs, clicks from a position-biased model."""
    rng = random.Random(seed)
    folder = logs / f"dt={day}"
    folder.mkdir(parents=True)
    lines = []
    for i in range(n):
        sid = f"{day.replace('-', '')}{i // 2:04d}"
        qid = rng.randrange(6)
        docs = [qid * 100 + d for d in rng.sample(range(15), 10)]
        clicks = [int(rng.random() < 0.5 / (r + 1)) for r in range(10)]
        lines.append(f"{sid}\t{qid}\t{docs}\t{[1] * 10}\t{clicks}\n")
    (folder / "part-00000.txt").write_text("".join(lines))


class DailyRuns:
    """Airflow's home, its environment, and the commands the test runs there."""

    def __init__(self, root: Path, artefacts: Path, cluster: StandaloneCluster):
        self.root = root
        self.python = airflow_venv.airflow_python()
        home = root / "airflow-home"
        home.mkdir()
        conf_dir = root / "spark-conf"
        conf_dir.mkdir()
        # what every spark-submit on this Airflow worker needs for a cluster on loopback, as an operator
        # would set it: SPARK_CONF_DIR's spark-defaults.conf
        defaults = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                    "spark.driver.memory": "1g", "spark.executor.memory": "768m", "spark.ui.enabled": "false",
                    "spark.locality.wait": "0s", **jvm_settings(cluster.class_data), **INTERPRETED}
        (conf_dir / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in defaults.items()))
        host, port = cluster.master_url.rsplit(":", 1)
        spark = spark_env(SPARK_CONF_DIR=str(conf_dir))
        self.env = {
            **airflow_venv.clean_env(home),
            **{k: v for k, v in spark.items() if k.startswith("SPARK")},
            "PATH": f"{SPARK_HOME / 'bin'}:{os.environ['PATH']}",
            # a failed task is retried after 2 s here (Airflow's default: 5 minutes)
            "AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY": "2",
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": host, "port": int(port)}),
            "AIRFLOW_VAR_CLICKEVAL_ARTEFACTS": str(artefacts),
            "AIRFLOW_VAR_CLICKEVAL_CONF": CONF_NAME,
            "AIRFLOW_VAR_CLICKEVAL_DEPLOY_MODE": "client",
            "AIRFLOW_VAR_CLICKEVAL_DRIVER_PYTHON": str(artefacts / "clickeval.pex"),
            "AIRFLOW_VAR_CLICKEVAL_WINDOW_DAYS": "3",
        }
        self.airflow("db", "migrate")

    def airflow(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(self.python), "-m", "airflow", *args], env=self.env, cwd=self.root,
                              capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, f"airflow {' '.join(args)}: exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        return proc

    def start_day(self, day: str) -> subprocess.Popen:
        log = (self.root / f"dags-test-{day}-{time.monotonic_ns()}.log").open("wb")
        return subprocess.Popen([str(self.python), "-m", "airflow", "dags", "test", airflow_venv.DAG_ID, day],
                                env=self.env, cwd=self.root, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)

    def run_day(self, day: str, timeout: float = 1200) -> float:
        t0 = time.monotonic()
        proc = self.start_day(day)
        assert proc.wait(timeout) == 0, f"airflow dags test {day}: exit {proc.returncode}"
        return time.monotonic() - t0

    def dag_runs(self) -> dict:
        proc = subprocess.run([str(self.python), str(PROBE), airflow_venv.DAG_ID], env=self.env, cwd=self.root,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        [line] = [x for x in proc.stdout.splitlines() if x.startswith("CLICKEVAL-DAGRUNS-JSON ")]
        return json.loads(line.split(" ", 1)[1])


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for p in processes():
        children.setdefault(p.ppid, []).append(p.pid)
    out, todo = [], [pid]
    while todo:
        out.append(todo.pop())
        todo.extend(children.get(out[-1], []))
    return out


def _kill_mid_fit(run_id: str, timeout: float = 600) -> str:
    """Waits for the fit's spark-submit of `run_id` to have its Python driver running for a few
    seconds, then SIGKILLs it and every process under it (Airflow's task runner sees it die)."""
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        procs = processes()
        submits = [p for p in procs if "SparkSubmit" in p.cmdline and "jobs/fit.py" in p.cmdline
                   and run_id in p.cmdline and p.state != "Z"]
        # the Python driver: the PEX re-executes itself as `<python3.11> <its unzipped copy> jobs/fit.py ...`
        drivers = [p for p in procs if submits and p.ppid == submits[0].pid and "jobs/fit.py" in p.cmdline
                   and p.state != "Z"]
        if drivers:
            seen = seen or time.monotonic()
            if time.monotonic() - seen > 8:
                victims = _descendants(submits[0].pid)
                for pid in victims:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                return f"SIGKILL to fit's spark-submit {submits[0].pid} and {len(victims) - 1} processes under it"
        time.sleep(0.5)
    raise TimeoutError(f"no fit spark-submit of {run_id} within {timeout:.0f}s")


def _executors_on_both_workers(worker_dirs: list[Path], at_least: int) -> None:
    """Every application the DAG submitted had an executor on each worker, tasks ran on every worker, and an
    executor that ran a task had its own copy of the PEX (the killed attempt may have died before its
    executors started). No executor JVM refused the class-data archive it was given."""
    apps = [{app.name: app for app in d.glob("app-*")} for d in worker_dirs]
    both = set.intersection(*(set(a) for a in apps))
    ran = [0] * len(apps)
    for w, by_name in enumerate(apps):
        for name in both:
            executors = [e for e in by_name[name].iterdir() if e.is_dir()]   # more than one if one was replaced
            logs = {e: (e / "stderr").read_text(errors="replace") for e in executors}
            busy = [e for e in executors if "Running task" in logs[e]]
            assert executors and all((e / "clickeval.pex").is_file() for e in busy), by_name[name]
            assert not [e for e in executors if ARCHIVE_REFUSED in logs[e]], by_name[name]
            ran[w] += bool(busy)
    print(f"[airflow] applications with an executor on both workers: {len(both)}; with tasks run, per worker: {ran}")
    assert len(both) >= at_least and all(ran), (len(both), ran)


def _snapshot(spark, warehouse: str, run_id: str, day: str) -> dict:
    """A day's rows of every table its run writes, and its slice of serps (floats to 12 significant digits:
    sums over partitions may reassociate)."""
    snap = {name: table_rows(spark, warehouse, name, where=f"run_id = '{run_id}'", digits=12) for name in RUN_TABLES}
    snap["serps"] = table_rows(spark, warehouse, "serps", where=f"log_date = '{day}'", digits=12)
    return snap


def _catalog_tables(metastore: Path, hive_warehouse: Path, root: Path) -> dict:
    """The catalog's tables, read by another Spark application from the same metastore."""
    code = f"""
import json
from clickeval_spark.session import build_session
spark = build_session("catalog-check", master="local[1]", warehouse="{hive_warehouse}", embedded=True, conf={{
    "spark.sql.catalogImplementation": "hive", "spark.ui.enabled": "false",
    "spark.hadoop.javax.jdo.option.ConnectionURL": "jdbc:derby:;databaseName={metastore};create=false",
    "spark.sql.warehouse.dir": "{hive_warehouse}", **{PROCESS_CONF!r}}})
names = sorted(r["tableName"] for r in spark.sql("SHOW TABLES IN {DATABASE}").collect())
days = {{str(r[0]): r[1] for r in spark.sql(
    "SELECT log_date, count(*) FROM {DATABASE}.serps GROUP BY log_date").collect()}}
print("CATALOG-JSON " + json.dumps({{"tables": names, "serps_by_day": days}}))
spark.stop()
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    [line] = [x for x in proc.stdout.splitlines() if x.startswith("CATALOG-JSON ")]
    return json.loads(line.split(" ", 1)[1])


def test_three_days_a_rerun_and_a_killed_fit(artefacts, standalone_cluster, tmp_path_factory, request):
    root = tmp_path_factory.mktemp("airflow-daily")
    logs, warehouse, reports = root / "logs", root / "warehouse", root / "reports"
    metastore, hive_warehouse = root / "metastore_db", root / "hive-warehouse"
    for i, day in enumerate(DAYS):
        _write_day(logs, day, SERPS_PER_DAY[day], seed=i)
    _write_day(logs, LATER_DAY, 40, seed=9)
    (artefacts / "conf" / CONF_NAME).write_text(CONF.format(
        warehouse=warehouse, metastore=metastore, hive_warehouse=hive_warehouse, database=DATABASE,
        dataset=DATASET, logs=logs, reports=reports))
    runs = DailyRuns(root, artefacts, standalone_cluster)
    run_ids = {day: f"daily-{day.replace('-', '')}" for day in DAYS}

    seconds = {day: runs.run_day(day) for day in DAYS[:2]}
    spark = request.getfixturevalue("spark")
    before = _snapshot(spark, str(warehouse), run_ids[DAYS[1]], DAYS[1])
    seconds[f"{DAYS[1]} again"] = runs.run_day(DAYS[1])   # dags test clears the day's task instances
    after = _snapshot(spark, str(warehouse), run_ids[DAYS[1]], DAYS[1])
    # the re-run of day 2 left every table's rows as they were
    print(f"\n[airflow] {DAYS[1]} rows before and after its re-run ({seconds[f'{DAYS[1]} again']:.0f}s): "
          + ", ".join(f"{k} {before[k].total()}/{after[k].total()}" for k in before))
    assert all(before.values())
    assert_same_tables(before, after, f"{DAYS[1]} re-run")

    t0 = time.monotonic()
    day3 = runs.start_day(DAYS[2])
    killed = _kill_mid_fit(run_ids[DAYS[2]])
    assert day3.wait(1200) == 0
    seconds[DAYS[2]] = time.monotonic() - t0

    dag_runs = runs.dag_runs()
    print(f"[airflow] {killed}")
    # every driver mapped the class-data archive (spark-submit's output is in the dags test logs)
    assert not [log.name for log in root.glob("dags-test-*.log") if ARCHIVE_REFUSED in log.read_text(errors="replace")]
    _executors_on_both_workers(standalone_cluster.worker_dirs, (len(DAYS) + 1) * len(STAGES))
    for day in DAYS:
        tasks = dag_runs[day]["tasks"]
        print(f"[airflow] {day} ({seconds[day]:.0f}s): dag run {dag_runs[day]['state']}; "
              + ", ".join(f"{t} {tasks[t]['state']} (try {tasks[t]['try_number']})" for t in STAGES))

    # every task of every day succeeded; on day 3 the fit took a second try, nothing else did
    for day in DAYS:
        assert dag_runs[day]["state"] == "success", dag_runs[day]
        assert {t: s["state"] for t, s in dag_runs[day]["tasks"].items()} == {t: "success" for t in STAGES}
    assert dag_runs[DAYS[2]]["tasks"]["fit"]["try_number"] == 2
    assert all(s["try_number"] == 1 for t, s in dag_runs[DAYS[2]]["tasks"].items() if t != "fit")

    # each day's slice of serps holds that day's SERPs, read from that day's folder only
    serps = read_table(spark, str(warehouse), "serps")
    by_day = {str(r["log_date"]): r["n"] for r in serps.groupBy("log_date").agg(F.count(F.lit(1)).alias("n")).collect()}
    print(f"[airflow] serps per log_date: {by_day}")
    assert by_day == {day: SERPS_PER_DAY[day] for day in DAYS}
    ingests = (read_table(spark, str(warehouse), "runs").where(F.col("job") == "ingest")
               .select("run_id", "details").collect())
    assert sorted(row["run_id"] for row in ingests) == sorted(run_ids.values())
    for row in ingests:
        day = next(d for d, r in run_ids.items() if r == row["run_id"])
        files = json.loads(row["details"])["input_files"]
        assert files and all(f"/dt={day}/" in f for f in files), (day, files)

    counts = {day: {name: read_table(spark, str(warehouse), name).where(F.col("run_id") == run_ids[day]).count()
                    for name in RUN_TABLES} for day in DAYS}
    for day in DAYS:
        print(f"[airflow] {day} rows: " + ", ".join(f"{name} {n}" for name, n in counts[day].items()))

    # day 3's rows: no duplicate (the killed attempt wrote none that stayed) and none missing
    run3 = run_ids[DAYS[2]]
    params = read_table(spark, str(warehouse), "model_params").where(F.col("run_id") == run3)
    keys = ["model", "param", "query_id", "doc_id", "rank", "prev_click_rank"]
    assert params.count() == params.select(*keys).distinct().count() > 0
    assert {r["model"] for r in params.select("model").distinct().collect()} == {"rctr", "pbm"}
    for name in RUN_TABLES:
        table = read_table(spark, str(warehouse), name).where(F.col("run_id") == run3)
        assert table.count() == table.distinct().count() > 0, name
    preds = read_table(spark, str(warehouse), "click_predictions").where(F.col("run_id") == run3)
    assert preds.select("serp_id", "model").distinct().count() == preds.count()

    # the catalog lists the tables, and reads the same rows by name
    catalog = _catalog_tables(metastore, hive_warehouse, root)
    print(f"[airflow] catalog {DATABASE}: {catalog}")
    assert {"serps", "model_params", "metrics", "distributional_metrics", "runs"} <= set(catalog["tables"])
    assert catalog["serps_by_day"] == by_day

    # the trend page shows the three runs in order
    page = (reports / f"{DATASET}-trend.html").read_text()
    positions = [page.find(run_ids[day]) for day in DAYS]
    print(f"[airflow] trend page: run ids at offsets {positions}")
    assert all(p >= 0 for p in positions) and positions == sorted(positions)
