"""The pipeline's stages on a real Spark standalone cluster, from deploy/package.sh's artefacts only.

One spark-submit of `pipeline` (its own driver and application: every stage of
clickeval_spark.stages.STAGES) against a master and two one-core workers on loopback. Each further
submit costs a driver JVM, an Ivy resolution and two executors fetching the PEX: 7 submits, one per
stage, took about 14 of CI's 33 minutes, and the two that came after them (ingest, then `pipeline
--from fit` resuming its run id) 73 and 121 s. A stage resuming a run in a new application is
tests/reliability/test_crash_recovery.py's rerun. Code and dependencies come
from the PEX (--files, the Python of driver and executors), pyspark from Spark's own zips, Delta's
jars from --packages; the driver runs in a scratch directory on the PEX, not on this checkout or its
venv; stages hand over only through the Delta tables of a warehouse in the driver's working
directory (the config's relative `warehouse`, where its `reports` go too). The checks read those
tables with the test session's local Spark, and the workers' work dirs for the executors.
"""

from __future__ import annotations

import json
import sys
import zipfile

import pytest
from pyspark.sql import functions as F

from clickeval_spark.stages import STAGES
from clickeval_spark.config import load_config
from clickeval_spark.tables import read_table
from tests.cluster.standalone import REPO, tail

pytestmark = pytest.mark.cluster

RUN_ID = "standalone-1"
# the Delta table each stage writes its run's rows to (DESIGN.md §2); a stage not named here is
# checked through its `runs` rows alone
STAGE_TABLES = {"fit": "model_params", "predict": "click_predictions", "evaluate": "metrics",
                "generate": "synthetic_serps", "surrogate": "distributional_metrics"}


def _python_files(names) -> set[str]:
    return {n for n in names if n.endswith(".py") and n.startswith(("clickeval_spark/", "jobs/"))}


def test_artefacts_hold_the_checkout(artefacts):
    """The wheel (inside the PEX too) and the --py-files zip carry every module of the checkout, and the
    build's record (clickeval_spark/_build.py, as BUILD_INFO.json); the PEX holds no pyspark or py4j."""
    checkout = _python_files(str(p.relative_to(REPO)) for d in ("clickeval_spark", "jobs")
                             for p in (REPO / d).rglob("*.py")) - {"clickeval_spark/_build.py"}
    built = checkout | {"clickeval_spark/_build.py"}
    [wheel] = artefacts.glob("clickeval_spark-*.whl")
    with zipfile.ZipFile(wheel) as whl, zipfile.ZipFile(artefacts / "clickeval_spark.zip") as pyfiles:
        assert _python_files(whl.namelist()) == built
        assert _python_files(pyfiles.namelist()) == built
        record = pyfiles.read("clickeval_spark/_build.py").decode()
    info = json.loads((artefacts / "BUILD_INFO.json").read_text())
    assert info["python"] == "%d.%d" % sys.version_info[:2] and f"BUILD = {info!r}" in record
    with zipfile.ZipFile(artefacts / "clickeval.pex") as pex:
        pex_info = json.loads(pex.read("PEX-INFO"))
        deps = {name.split("/")[1].split("-")[0] for name in pex.namelist() if name.startswith(".deps/")}
    assert {"clickeval_spark", "delta_spark", "numpy", "pyarrow"} <= deps and not deps & {"pyspark", "py4j"}, deps
    assert pex_info["interpreter_constraints"] == [f"CPython=={info['python']}.*"]
    assert pex_info["inherit_path"] == "fallback"
    assert {f"{stage}.py" for stage in STAGES} <= {p.name for p in (artefacts / "jobs").iterdir()}


def test_pipeline_stages_on_standalone_cluster(artefacts, standalone_cluster, tmp_path, request):
    conf = artefacts / "conf" / "standalone-test.yaml"
    cfg = load_config(conf)
    driver_cwd = tmp_path / "driver-cwd"
    driver_cwd.mkdir()
    # the config's relative locations, as the driver resolves them: against its working directory,
    # not the unpacked archive its code runs from
    assert (cfg.spark.warehouse, cfg.report.path) == ("warehouse", "reports")
    warehouse = str(driver_cwd / "warehouse")
    reports = driver_cwd / "reports"
    job_args = ["--conf", str(conf), "--run-id", RUN_ID]

    # the cluster is shared with the other standalone tests: only the application submitted here counts
    earlier = {app for d in standalone_cluster.worker_dirs for app in d.glob("app-*")}
    done = standalone_cluster.submit(artefacts, "pipeline", job_args, cwd=driver_cwd)
    print(f"[cluster] spark-submit pipeline: exit {done.returncode}, {done.seconds:.0f}s")
    assert done.returncode == 0, f"pipeline failed (log {done.log}):\n{tail(done.log)}"

    # the work was done by executors on both workers: one application, with each worker's executor
    # on its own copy of the PEX, and tasks run on every worker
    apps_by_worker = [{app.name: app for app in sorted(d.glob("app-*")) if app not in earlier}
                      for d in standalone_cluster.worker_dirs]
    assert all(len(apps) == 1 for apps in apps_by_worker), apps_by_worker
    assert len({frozenset(apps) for apps in apps_by_worker}) == 1, "every application had executors on both workers"
    ran_tasks = {}
    for w, apps in enumerate(apps_by_worker):
        for app_id, app in apps.items():
            executors = [e for e in app.iterdir() if e.is_dir()]  # more than one if an executor was replaced
            assert executors and all((e / "clickeval.pex").is_file() for e in executors), app
            ran_tasks[w, app_id] = any("Running task" in (e / "stderr").read_text(errors="replace")
                                       for e in executors)
    assert all(any(ran_tasks[w, a] for a in apps_by_worker[0]) for w in range(len(apps_by_worker))), ran_tasks
    assert all(any(ran_tasks[w, a] for w in range(len(apps_by_worker))) for a in apps_by_worker[0]), ran_tasks

    spark = request.getfixturevalue("spark")  # local session with Delta, started only now

    runs = read_table(spark, warehouse, "runs").where(F.col("run_id") == RUN_ID)
    statuses = {r["job"]: r["status"] for r in runs.select("job", "status").collect()}
    for stage in STAGES:
        mine = {job: s for job, s in statuses.items() if job == stage or job.startswith(f"{stage}:")}
        assert mine and set(mine.values()) == {"succeeded"}, (stage, statuses)

    dataset = cfg.ingest.dataset
    serps = read_table(spark, warehouse, "serps").where(F.col("dataset") == dataset)
    assert serps.count() == cfg.ingest.synthetic.n_serps
    [ingest_counts] = [r["counts"] for r in runs.where(F.col("job") == "ingest").collect()]
    assert ingest_counts["serps_accepted"] == cfg.ingest.synthetic.n_serps
    assert ingest_counts["serps_quarantined"] == 0

    params = read_table(spark, warehouse, "model_params").where(F.col("run_id") == RUN_ID)
    per_model = {r["model"]: r["n"] for r in params.groupBy("model").agg(F.count(F.lit(1)).alias("n")).collect()}
    assert set(per_model) == set(cfg.fit.models) and min(per_model.values()) > 0, per_model

    serps_per_split = {r["split"]: r["n"] for r in serps.groupBy("split").agg(F.count(F.lit(1)).alias("n")).collect()}
    preds = read_table(spark, warehouse, "click_predictions").where(F.col("run_id") == RUN_ID)
    pred_rows = {(r["model"], r["split"]): r["n"]
                 for r in preds.groupBy("model", "split").agg(F.count(F.lit(1)).alias("n")).collect()}
    for model in cfg.fit.models:   # one row per SERP
        splits = {s for m, s in pred_rows if m == model}
        assert set(cfg.predict.splits) <= splits, (model, splits)
        assert {s: pred_rows[model, s] for s in splits} == {s: serps_per_split[s] for s in splits}
    assert preds.where(F.size("p_click") != cfg.ingest.synthetic.list_size).limit(1).count() == 0

    scores = read_table(spark, warehouse, "relevance_scores").where(F.col("run_id") == RUN_ID)
    # the simulated log's true model is scored beside the fitted ones
    assert {r["model"] for r in scores.select("model").distinct().collect()} == set(cfg.fit.models) | {"truth"}

    for stage in STAGES:
        if stage in STAGE_TABLES:
            assert read_table(spark, warehouse, STAGE_TABLES[stage]).where(F.col("run_id") == RUN_ID).limit(1).count(), stage
    if "report" in STAGES:
        assert (reports / f"{RUN_ID}.html").stat().st_size > 0
