"""PySpark's stock worker daemon against clickeval_spark.python_daemon, in one process, back to back.

    .venv/bin/python -m benchmarks.python_workers                     # 32 tasks, 200,000 SERPs, 5 passes
    .venv/bin/python -m benchmarks.python_workers --tasks 32 --serps 1000000 --passes 5

For each daemon (`pyspark.daemon`, then ours, then both again: the machine's pace drifts) one local[*]
session runs (a) ``--tasks`` trivial Python tasks (mapPartitions returning one row), three times, and
(b) ``--passes`` EM passes of PBM over a synthetic log of ``--serps`` SERPs packed once (conf/bench.yaml's
shape). Printed: the median seconds of each, and ours / stock.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from clickeval_spark.config import PROJECT_ROOT, load_config
from clickeval_spark.models import get_model
from clickeval_spark.em.passes import PassPlan
from clickeval_spark.em.stage_passes import run_iteration
from clickeval_spark.em.blocks import pack_serps
from clickeval_spark.runtime import session_for
from clickeval_spark.sources import synthetic

DAEMONS = ("pyspark.daemon", "clickeval_spark.python_daemon")


def measure(daemon: str, args) -> tuple[float, float]:
    cfg = load_config(str(PROJECT_ROOT / "conf" / "bench.yaml"), {
        "ingest.synthetic.n_serps": args.serps, "ingest.synthetic.n_queries": max(100, args.serps // 25),
        "spark.conf": {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                       "spark.driver.memory": "10g", "spark.python.daemon.module": daemon}})
    spark = session_for(cfg, "python-workers")
    try:
        rdd = spark.sparkContext.parallelize(range(args.tasks), args.tasks)
        rdd.mapPartitions(lambda rows: [1]).collect()   # start the workers
        tasks = []
        for _ in range(3):
            t = time.perf_counter()
            rdd.mapPartitions(lambda rows: [1]).collect()
            tasks.append(time.perf_counter() - t)
        serps, _, _ = synthetic.generate(spark, cfg.ingest)
        packed = pack_serps(serps.select("serp_id", "query_id", "doc_ids", "clicks"), 10)
        model = get_model("pbm")
        plan = [PassPlan("step", {k: np.asarray(v, float) for k, v in model.init_global(10).items()}, None)]
        blocks, passes = packed.blocks, []
        for _ in range(args.passes):
            t = time.perf_counter()
            new, _ = run_iteration(blocks, model, plan, 10)
            if blocks is not packed.blocks:
                blocks.unpersist()
            blocks = new
            passes.append(time.perf_counter() - t)
        blocks.unpersist()
        packed.unpersist()
        return statistics.median(tasks), statistics.median(passes)
    finally:
        spark.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--serps", type=int, default=200000)
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args(argv)
    rows = []
    for daemon in DAEMONS * 2:
        tasks, passes = measure(daemon, args)
        rows.append((daemon, tasks, passes))
        print(f"{daemon}: {args.tasks} trivial tasks {tasks:.3f} s, PBM pass at {args.serps:,} SERPs {passes:.3f} s",
              flush=True)
    print(f"\n| daemon | {args.tasks} trivial tasks, s | PBM EM pass, {args.serps:,} SERPs, s |\n|---|---|---|")
    for daemon, tasks, passes in rows:
        print(f"| {daemon} | {tasks:.3f} | {passes:.3f} |")
    for col, label in ((1, "tasks"), (2, "EM pass")):
        stock = statistics.mean(r[col] for r in rows if r[0] == DAEMONS[0])
        ours = statistics.mean(r[col] for r in rows if r[0] == DAEMONS[1])
        print(f"ours / stock, {label}: {ours / stock:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
