"""Driver of test_em_faults.py: EM fits on a `local-cluster` master with executors killed mid-fit.

    python -m tests.cluster.em_faults OUT_JSON WORK_DIR [CLASS_DATA_ARCHIVE]

`local-cluster[2,1,1024]` is Spark's own multi-process test master: a master and two
one-core workers inside the driver JVM, each executor its own JVM (and Python workers),
so an executor can be SIGKILLed like a lost machine while the driver lives on. Three fits
of the same log, on one session:

1. control, no checkpoint directory: an executor is killed after pass 3; the packed
   blocks were local checkpoints on the executors, so the fit must fail;
2. reference, with `spark.checkpoint_dir` (set through `runtime.session_for`): undisturbed;
3. disturbed, same directory: one executor killed after pass 3 and another after pass 5.

Writes what happened and every fitted number (floats as hex, compared bit for bit by the test).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
import time
from pathlib import Path

import numpy as np

import clickeval_spark
from clickeval_spark.config import PROJECT_ROOT, load_config
from clickeval_spark.models import get_model
from clickeval_spark.em.driver import fit
from clickeval_spark.runtime import session_for
from tests.cluster.standalone import jvm_settings
from tests.spark_settings import INTERPRETED

MODEL = "dbn"  # qd (attractiveness, satisfaction) and global (gamma) parameters
ITERATIONS = 6
CHECKPOINT_INTERVAL = 3  # EM's blocks are checkpointed after pass 3
KILL_AFTER = (2, 4)  # kill when fit logs "iteration k": right after pass k + 1 collected its sums
N_EXECUTORS = 2


def synthetic_serps(spark, n_serps: int = 3000, n_queries: int = 60, pool: int = 15, M: int = 10, seed: int = 5):
    """A small click log: each SERP shows M of its query's `pool` docs; clicks from a position-biased coin."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n_serps):
        q = int(rng.integers(n_queries))
        docs = rng.choice(pool, size=M, replace=False)
        attractive = ((docs * 37 + q * 11) % 100 + 1) / 101
        clicks = rng.random(M) < attractive / np.sqrt(np.arange(1, M + 1))
        rows.append((f"s{i}", f"q{q}", [f"q{q}d{d}" for d in docs], clicks.astype(int).tolist()))
    return spark.createDataFrame(rows, "serp_id string, query_id string, doc_ids array<string>, clicks array<int>")


def executor_pids(app_id: str) -> dict[int, int]:
    """Executor id -> pid of this application's live executor JVMs (from /proc)."""
    found = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:  # exited while we looked
            continue
        if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in args and app_id.encode() in args:
            found[int(args[args.index(b"--executor-id") + 1])] = int(cmdline.parent.name)
    return found


def registered_executors(spark) -> list[int]:
    """Executor ids the driver has registered (the driver itself excluded)."""
    return [int(x) for x in re.findall(r"\d+", spark.sparkContext._jsc.sc().getExecutorIds().toString())]


def wait_for_executors(spark, n: int, timeout: float = 180) -> list[int]:
    deadline = time.monotonic() + timeout
    while len(ids := registered_executors(spark)) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only executors {ids} registered after {timeout:.0f}s")
        time.sleep(0.5)
    return ids


def replaced_executors(spark, n: int, timeout: float = 120) -> list[int]:
    """The executors once the master has replaced the killed ones, or those registered at the timeout: a fit may
    end before a replacement JVM has started (CI, sixteenth session: a kill after pass 5 of 6)."""
    try:
        return wait_for_executors(spark, n, timeout)
    except TimeoutError:
        return registered_executors(spark)


class KillExecutor(logging.Handler):
    """SIGKILLs the oldest live executor of the app when fit logs one of the `after` iterations."""

    def __init__(self, app_id: str, after: tuple[int, ...]):
        super().__init__(logging.DEBUG)   # the EM loop logs every pass at DEBUG
        self.app_id, self.after, self.kills = app_id, after, []

    def emit(self, record: logging.LogRecord) -> None:
        found = re.search(r" iteration (\d+):", record.getMessage())
        if not found or int(found[1]) not in self.after:
            return
        iteration = int(found[1])
        executor, pid = min(executor_pids(self.app_id).items())
        os.kill(pid, signal.SIGKILL)
        self.kills.append({"after_pass": iteration + 1, "executor": executor, "pid": pid})
        print(f"[em-faults] killed executor {executor} (pid {pid}) after pass {iteration + 1}", flush=True)


def fit_logger(name: str, app_id: str, kill_after: tuple[int, ...]) -> tuple[logging.Logger, KillExecutor]:
    logger = logging.getLogger(f"em-faults.{name}")
    logger.setLevel(logging.DEBUG)
    killer = KillExecutor(app_id, kill_after)
    logger.addHandler(killer)
    return logger, killer


def fitted_values(fitted) -> dict:
    """Every fitted number, floats as hex strings (exact)."""
    qd = fitted.qd.orderBy("query_id", "doc_id").collect()
    return {
        "glob": {k: [float(x).hex() for x in np.ravel(v)] for k, v in sorted(fitted.glob.items())},
        "prior": {k: float(v).hex() for k, v in sorted(fitted.prior.items())},
        "train_ll": [[it, float(ll).hex()] for it, ll, _ in fitted.history],
        "qd": [[r["query_id"], r["doc_id"], *(float(r[c]).hex() for c in (*fitted.model.qd_params, "n_obs"))]
               for r in qd],
    }


def run_fit(spark, serps, name: str, kill_after: tuple[int, ...]) -> dict:
    logger, killer = fit_logger(name, spark.sparkContext.applicationId, kill_after)
    t0 = time.monotonic()
    out = {"executors_before": wait_for_executors(spark, N_EXECUTORS)}
    try:
        # the stage engine: its checkpoints are what a lost executor is recovered from (the resident
        # engine refits from the start instead: tests/models/test_resident.py)
        fitted = fit(serps, get_model(MODEL), iterations=ITERATIONS, tol=None, checkpoint_interval=CHECKPOINT_INTERVAL,
                     logger=logger, engine="stages")
        out["values"] = fitted_values(fitted)
    except Exception as exc:  # the control fit is meant to fail: keep what Spark said
        out["error"] = f"{type(exc).__name__}: {exc}"
    out.update(seconds=round(time.monotonic() - t0, 1), kills=killer.kills,
               executors_after=replaced_executors(spark, N_EXECUTORS))
    print(f"[em-faults] {name}: {out['seconds']}s, kills {killer.kills}, "
          f"{'failed' if 'error' in out else 'fitted'}", flush=True)
    return out


def main(out_path: str, work_dir: str, class_data: str = "") -> None:
    work = Path(work_dir)
    overrides = {
        "spark.master": f"local-cluster[{N_EXECUTORS},1,1024]",
        "spark.warehouse": str(work / "warehouse"),
        "spark.conf": {
            "spark.executor.memory": "768m",
            "spark.sql.shuffle.partitions": "4",
            "spark.ui.enabled": "false",
            # every fit starts with both executors, so each holds some of the blocks
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            **jvm_settings(Path(class_data) if class_data else None),
            **INTERPRETED,
        },
    }
    t0 = time.monotonic()
    spark = session_for(load_config(PROJECT_ROOT / "conf" / "local.yaml", overrides), "em-faults")
    sc = spark.sparkContext
    result = {"app_id": sc.applicationId, "session_seconds": round(time.monotonic() - t0, 1),
              "checkpoint_dir_before": sc.getCheckpointDir()}
    # the executors' Python imports this checkout's package (PYTHONPATH), not another copy
    result["executor_package"] = sc.parallelize([0], 1).map(lambda _: clickeval_spark.__file__).first()
    serps = synthetic_serps(spark).cache()
    result["n_serps"] = serps.count()

    result["control"] = run_fit(spark, serps, "control", KILL_AFTER)

    # the same session through the config key: build_session sets the directory on it
    overrides["spark.checkpoint_dir"] = str(work / "checkpoints")
    spark = session_for(load_config(PROJECT_ROOT / "conf" / "local.yaml", overrides), "em-faults")
    result["checkpoint_dir"] = spark.sparkContext.getCheckpointDir()
    result["reference"] = run_fit(spark, serps, "reference", ())
    result["disturbed"] = run_fit(spark, serps, "disturbed", KILL_AFTER)
    result["checkpoint_files"] = sorted(str(p.relative_to(work)) for p in (work / "checkpoints").glob("*/rdd-*"))
    result["total_seconds"] = round(time.monotonic() - t0, 1)
    Path(out_path).write_text(json.dumps(result, indent=1))
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
