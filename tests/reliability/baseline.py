"""Shared by the reliability tests: a tiny pipeline config, one baseline run, table snapshots, job processes.

The baseline (every stage of STAGES for run `rel-base` on a 300-SERP synthetic log) is run once
per pytest session in the test SparkSession and kept pristine; tests that write copy its warehouse first.
Jobs in separate processes run `python -m jobs.<stage>` from this checkout in their own process group,
so a test can SIGKILL the driver, its JVM and its Python workers together.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from clickeval_spark import tables
from clickeval_spark.context import StageContext
from clickeval_spark.stages import STAGES
from clickeval_spark.config import AppConfig, load_config
from tests.spark_settings import INTERPRETED, SHORT_LIVED_JVM

ROOT = Path(__file__).resolve().parents[2]
BASE_RUN = "rel-base"
DATASET = "rel"
# what every in-process run of these tests uses; the subprocess gets the same through its YAML. AQE's
# partition coalescing is off so that a shuffle really has the configured number of partitions (with it
# on, 2 and 8 partitions of a tiny log would both be coalesced to one and prove nothing).
SESSION_CONF = {"spark.sql.shuffle.partitions": "2", "spark.sql.adaptive.coalescePartitions.enabled": "false"}
# per-attempt columns of `runs`: when and how long; everything else of a run's row must repeat exactly
RUNS_PER_ATTEMPT = ("started_at", "finished_at", "seconds")


def write_conf(directory: Path, warehouse: str, reports: str, *, shuffle_partitions: int = 2,
               default_parallelism: int = 4, codegen: bool = False) -> str:
    """The tiny pipeline: 300 SERPs (train:test 2:1, labelled SERPs), rctr + pbm with 2 EM passes,
    5 bootstrap replicates, pbm as the one generator (2 samples on shuffled lists), a 2-pass DCM surrogate.
    A job run on it evaluates expressions interpreted, as the test session does (tests/spark_settings.py),
    unless `codegen`; one run as a process starts its JVM as the suite's processes do (`SHORT_LIVED_JVM`)."""
    conf = {
        "env": "reliability",
        "spark": {
            "mode": "embedded", "master": "local[2]", "warehouse": warehouse,
            "conf": {
                "spark.sql.shuffle.partitions": str(shuffle_partitions),
                "spark.default.parallelism": str(default_parallelism),
                "spark.sql.adaptive.coalescePartitions.enabled": "false",
                "spark.databricks.delta.snapshotPartitions": "2",
                "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false",
                "spark.driver.memory": "1g",
                "spark.driver.extraJavaOptions": SHORT_LIVED_JVM,
                **({} if codegen else INTERPRETED),
            },
        },
        "ingest": {
            "dataset": DATASET, "format": "synthetic",
            "split": {"seed": 11, "ratios": {"train": 2, "test": 1}},
            "synthetic": {"model": "pbm", "n_serps": 300, "n_queries": 20, "docs_per_query": 12,
                          "labels": "serp", "label_fraction": 0.5, "seed": 5},
        },
        "fit": {"models": ["rctr", "pbm"], "iterations": 2},
        "predict": {"splits": ["test"]},
        "evaluate": {"replicates": 5, "reference_model": "rctr"},
        "generate": {"generators": ["pbm"], "samples": 2, "list_orders": ["shuffled_all"]},
        "surrogate": {"model": "dcm", "iterations": 2},
        "report": {"path": reports},
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "reliability.yaml"
    path.write_text(json.dumps(conf, indent=1))  # JSON is YAML
    return str(path)


@contextmanager
def session_conf(spark: SparkSession, conf: dict[str, str] = SESSION_CONF) -> Iterator[None]:
    before = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def run_stage(spark: SparkSession, cfg: AppConfig, warehouse: str, run_id: str, stage: str):
    with session_conf(spark):
        return STAGES[stage](StageContext(spark, cfg, warehouse, run_id))


@dataclass(frozen=True)
class Baseline:
    root: Path
    warehouse: str
    conf: str
    cfg: AppConfig
    seconds: float

    def copy_to(self, target: Path) -> str:
        """A private copy of the baseline warehouse (Delta logs hold relative paths: a copy is a table)."""
        shutil.copytree(self.warehouse, target)
        return str(target)


_cache: dict[str, Baseline] = {}


def baseline(spark: SparkSession, tmp_path_factory) -> Baseline:
    """Every stage once for BASE_RUN (computed once per pytest session; never written to afterwards)."""
    if "base" not in _cache:
        root = tmp_path_factory.mktemp("reliability_base")
        warehouse, reports = str(root / "wh"), str(root / "reports")
        conf = write_conf(root, warehouse, reports)
        cfg = load_config(conf)
        t0 = time.perf_counter()
        for stage in STAGES:
            run_stage(spark, cfg, warehouse, BASE_RUN, stage)
        _cache["base"] = Baseline(root, warehouse, conf, cfg, time.perf_counter() - t0)
        print(f"baseline pipeline: {_cache['base'].seconds:.1f} s")
    return _cache["base"]


PROC_RUN, SESSION_RUN = "conc-proc", "conc-session"
DATASETS = {PROC_RUN: "ds-proc", SESSION_RUN: "ds-session"}


@dataclass(frozen=True)
class ConcurrentPair:
    """Two whole pipelines written at the same time into one fresh warehouse: PROC_RUN by a separate
    `python -m jobs.pipeline` process with 8 shuffle partitions and default parallelism 8, SESSION_RUN in
    the test session with the baseline's settings (2 shuffle partitions, parallelism 4). Each run has its
    own run_id and dataset name (its dataset's serps are its own slice); config and seeds are the baseline's."""
    warehouse: str
    reports: Path
    log: Path
    returncode: int | None
    session_seconds: float


def concurrent_pair(spark: SparkSession, tmp_path_factory) -> ConcurrentPair:
    """Computed once per pytest session: test_concurrency checks both runs landed completely,
    test_reproducibility that their metrics are bit-identical to the baseline's."""
    if "pair" not in _cache:
        base = baseline(spark, tmp_path_factory)
        root = tmp_path_factory.mktemp("concurrent_pair")
        warehouse, reports, log = str(root / "wh"), root / "reports", root / "pipeline.log"
        # Spark's defaults here: production's code path, against the baseline computed without codegen
        conf8 = write_conf(root, warehouse, str(reports), shuffle_partitions=8, default_parallelism=8,
                           codegen=True)
        proc = start_job(job_command("pipeline", conf8, PROC_RUN, f"ingest.dataset={DATASETS[PROC_RUN]}"), log)
        try:
            # start as the job starts its first stage: both runs also race to create every table
            wait_for_output(proc, log, "ingest: start", timeout=240)
            cfg = load_config(base.conf, {"spark.warehouse": warehouse, "ingest.dataset": DATASETS[SESSION_RUN],
                                          "report.path": str(reports)})
            t0 = time.perf_counter()
            for i, stage in enumerate(STAGES):
                run_stage(spark, cfg, warehouse, SESSION_RUN, stage)
                if i == 0:
                    # The warm in-session run can outpace the job's cold JVM on a busy machine and finish
                    # before the job's first commit: then the runs would be sequential, not concurrent.
                    # Holding on here until the job commits again makes the overlap certain.
                    session_ingested = last_commit_time(warehouse, SESSION_RUN)
                    wait_for_commit_after(proc, log, warehouse, PROC_RUN, session_ingested + 0.01)
            seconds = time.perf_counter() - t0
            proc.wait(timeout=900)
        finally:
            if proc.poll() is None:
                kill_group(proc)
        _cache["pair"] = ConcurrentPair(warehouse, reports, log, proc.returncode, seconds)
        print(f"concurrent pipelines: in-session run {seconds:.1f} s, job exit code {proc.returncode}")
    return _cache["pair"]


# ---------------------------------------------------------------------------------------------- snapshots

def existing_tables(spark: SparkSession, warehouse: str) -> list[str]:
    return [n for n in tables.SCHEMAS if DeltaTable.isDeltaTable(spark, tables.table_path(warehouse, n))]


def versions(spark: SparkSession, warehouse: str) -> dict[str, int]:
    return {n: DeltaTable.forPath(spark, tables.table_path(warehouse, n)).history(1).first()["version"]
            for n in existing_tables(spark, warehouse)}


def _plain(value, digits: int | None = None):
    """A collected value as plain, hashable Python (Rows, lists and maps included); floats rounded to
    `digits` significant digits when given."""
    if hasattr(value, "asDict"):
        return tuple((k, _plain(v, digits)) for k, v in value.asDict().items())
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v, digits) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _plain(v, digits)) for k, v in value.items()))
    if digits is not None and isinstance(value, float):
        return float(f"{value:.{digits}g}")
    return value


def _drop_seconds(value):
    if isinstance(value, dict):
        return {k: _drop_seconds(v) for k, v in value.items() if k != "seconds"}
    if isinstance(value, list):
        return [_drop_seconds(v) for v in value]
    return value


def table_rows(spark: SparkSession, warehouse: str, name: str, *, version: int | None = None,
               rename: dict[str, str] | None = None, where: str | None = None,
               digits: int | None = None) -> Counter:
    """The table's rows as a multiset of exact reprs (repr of a float round-trips: equality is bitwise,
    unless `digits` rounds floats for a comparison that is not about bits).

    `runs` loses its per-attempt columns (and per-iteration seconds inside `details`); `rename` maps
    whole string values (run ids, dataset names) to placeholders so two runs' rows can be compared.
    """
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    df = reader.load(tables.table_path(warehouse, name))
    if where:
        df = df.where(where)
    if name == "runs":
        df = df.drop(*RUNS_PER_ATTEMPT)
    rename = rename or {}
    out = Counter()
    for row in df.collect():
        d = row.asDict(recursive=False)
        if name == "runs":
            d["details"] = json.dumps(_drop_seconds(json.loads(d["details"])), sort_keys=True) if d["details"] else None
            if rename:
                d.pop("config")  # holds the dataset name and paths of its own run
        cells = tuple((k, rename.get(v, v) if isinstance(v, str) else _plain(v, digits)) for k, v in sorted(d.items()))
        out[repr(cells)] += 1
    return out


def snapshot(spark: SparkSession, warehouse: str, names=None) -> dict[str, Counter]:
    return {name: table_rows(spark, warehouse, name) for name in (names or existing_tables(spark, warehouse))}


def diff(expected: Counter, actual: Counter, limit: int = 3) -> str:
    missing, extra = expected - actual, actual - expected
    lines = [f"{sum(missing.values())} row(s) missing, {sum(extra.values())} unexpected"]
    lines += [f"  missing:    {r[:400]}" for r in list(missing)[:limit]]
    lines += [f"  unexpected: {r[:400]}" for r in list(extra)[:limit]]
    return "\n".join(lines)


def assert_same_tables(before: dict[str, Counter], after: dict[str, Counter], context: str) -> None:
    """`after` holds every table of `before` (or, when given fewer, the ones that moved) with the same rows."""
    assert set(after) <= set(before), f"{context}: new tables {sorted(set(after) - set(before))}"
    bad = {name: diff(before[name], after[name]) for name in after if before[name] != after[name]}
    assert not bad, f"{context}: tables changed:\n" + "\n".join(f"{n}: {d}" for n, d in bad.items())


# ---------------------------------------------------------------------------------------------- processes

def job_command(job: str, conf: str, run_id: str, *sets: str) -> list[str]:
    return [sys.executable, "-m", f"jobs.{job}", "--conf", conf, "--run-id", run_id,
            *[arg for s in sets for arg in ("--set", s)]]


def start_job(command: list[str], log: Path) -> subprocess.Popen:
    """The job in its own process group (driver, JVM, Python workers), output to `log`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    out = open(log, "wb")
    try:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    finally:
        out.close()


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the job's process group (the group this test created with start_new_session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)


def _wait_for(proc: subprocess.Popen, log: Path, done: Callable[[], bool], what: str, timeout: float) -> None:
    """Poll `done` until it holds; fail with the job's log tail if the job exits or `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done():
            return
        if proc.poll() is not None:
            raise AssertionError(f"job exited ({proc.returncode}) before {what}:\n{tail(log)}")
        time.sleep(0.2)
    raise AssertionError(f"job did not get to {what} within {timeout} s:\n{tail(log)}")


def wait_for_output(proc: subprocess.Popen, log: Path, text: str, timeout: float) -> None:
    _wait_for(proc, log, lambda: text in log.read_text(errors="replace"), f"printing {text!r}", timeout)


def _commit_times(warehouse: str, run_id: str) -> list[float]:
    """Modification times of the Delta commit files that `run_id` tagged, in every table: the times
    DESCRIBE HISTORY reports on a local file system."""
    tag = f"run_id={run_id} "
    return [path.stat().st_mtime for path in Path(warehouse).glob("*/_delta_log/*.json")
            if tag in path.read_text(errors="replace")]


def last_commit_time(warehouse: str, run_id: str) -> float:
    return max(_commit_times(warehouse, run_id))


def wait_for_commit_after(proc: subprocess.Popen, log: Path, warehouse: str, run_id: str, after: float,
                          timeout: float = 600) -> None:
    _wait_for(proc, log, lambda: any(t > after for t in _commit_times(warehouse, run_id)),
              f"a commit of {run_id} after {after}", timeout)


def tail(log: Path, n: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:])
