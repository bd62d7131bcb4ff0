"""What one Spark EM pass costs, piece by piece, beside the numpy reference, in one session.

    .venv/bin/python -m benchmarks.em_pass                                   # 1M SERPs, 8 and 4 blocks
    .venv/bin/python -m benchmarks.em_pass --serps 200000 --block-serps 131072 --models pbm

On conf/bench.yaml's synthetic log (written to Parquet under --workdir once, reused afterwards),
in one local[*] session:

1. the numpy reference's PBM / UBM passes (benchmarks/numpy_reference.py) on the same SERPs;
2. per --block-serps: the log packed as `fit` packs it, then --passes EM passes of each model (one
   candidate, no prior) through `stage_passes.run_iteration` (the "stages" engine: a Spark job per pass),
   and as many in one barrier stage (`resident.ResidentPasses`, the "resident" engine; the stage's
   start-up is printed apart), the median of all passes but the first;
3. on the last packing, what a pass is made of: every block's E- and M-step in this process
   (`iteration_fn` over the collected blocks: the kernels alone), a pass that sends the blocks
   through Python unchanged and caches them (Arrow and the cache, no kernel), and a pass over the
   block numbers alone (a job of as many Python tasks, nothing moved);
4. Spark's barrier all-gather (`BarrierTaskContext.allGather`), the sync a one-job EM would need
   per pass: seconds per call, averaged over --gathers calls of every task.

Printed: seconds, and numpy / Spark per model and block size.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from benchmarks.numpy_reference import REFERENCES
from benchmarks.run import reference_arrays_of
from clickeval_spark.config import PROJECT_ROOT, load_config
from clickeval_spark.models import get_model
from clickeval_spark.em.blocks import PASS_SCHEMA, release
from clickeval_spark.em.passes import PassPlan
from clickeval_spark.em.stage_passes import iteration_fn, run_iteration
from clickeval_spark.em.resident import ResidentPasses
from clickeval_spark.em.blocks import pack_serps
from clickeval_spark.em.driver import resident_tasks
from clickeval_spark.runtime import session_for
from clickeval_spark.sources import synthetic

M = 10


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def first_pass(name: str):
    """The model and a pass plan of one candidate from the start values, no prior."""
    model = get_model(name)
    return model, [PassPlan("step", {k: np.asarray(v, float) for k, v in model.init_global(M).items()}, None)]


def spark_passes(packed, name: str, passes: int) -> list[float]:
    model, plan = first_pass(name)
    blocks, times = packed.blocks, []
    for _ in range(passes):
        t = time.perf_counter()
        new, _ = run_iteration(blocks, model, plan, M)
        if blocks is not packed.blocks:
            release(blocks)
        blocks = new
        times.append(time.perf_counter() - t)
    release(blocks)
    return times


def resident_passes(packed, name: str, passes: int) -> tuple[list[float], float]:
    """``passes`` passes in one barrier stage (`resident.ResidentPasses`): (seconds per pass, seconds to start)."""
    model, plan = first_pass(name)
    t = time.perf_counter()
    engine = ResidentPasses(packed.blocks, model, M, packed.first_blocks, resident_tasks(packed, model, "resident"))
    start, times = time.perf_counter() - t, []
    try:
        for _ in range(passes):
            times.append(_timed(lambda: engine.run(plan)))
        release(engine.finish(((0, 1),)))
    finally:
        engine.close()
    return times, start


def pass_anatomy(packed, name: str, repeats: int = 3) -> dict[str, list[float]]:
    model, plan = first_pass(name)
    rows = packed.blocks.select(*PASS_SCHEMA.fieldNames())
    local = rows.toArrow().to_batches()   # the benchmark's setup: the blocks in this process, untimed
    kernel = iteration_fn(model, plan, (0,))

    def unchanged(batches):
        yield from batches

    def through_python():
        out = rows.mapInArrow(unchanged, PASS_SCHEMA).cache()
        out.select("block", "stats").collect()
        out.unpersist()

    out = {"kernels in one process": [], "blocks through Python, cached": [], "block numbers only": []}
    for _ in range(repeats):
        out["kernels in one process"].append(_timed(lambda: list(kernel(iter(local)))))
        out["blocks through Python, cached"].append(_timed(through_python))
        out["block numbers only"].append(
            _timed(lambda: packed.blocks.select("block").mapInArrow(unchanged, "block int").collect()))
    return out


def all_gather_seconds(spark, gathers: int) -> float:
    tasks = spark.sparkContext.defaultParallelism

    def run(_):
        from pyspark import BarrierTaskContext
        ctx = BarrierTaskContext.get()
        t = time.perf_counter()
        for i in range(gathers):
            ctx.allGather(str(i))
        yield (time.perf_counter() - t) / gathers

    per_task = spark.sparkContext.parallelize(range(tasks), tasks).barrier().mapPartitions(run).collect()
    return statistics.mean(per_task)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serps", type=int, default=1_000_000)
    ap.add_argument("--block-serps", default="131072,262144")
    ap.add_argument("--models", default="pbm,ubm,dbn")
    ap.add_argument("--passes", type=int, default=6)
    ap.add_argument("--gathers", type=int, default=20)
    ap.add_argument("--workdir", default="/tmp/clickeval-em-pass")
    args = ap.parse_args(argv)
    models = args.models.split(",")
    cfg = load_config(str(PROJECT_ROOT / "conf" / "bench.yaml"), {
        "ingest.synthetic.n_serps": args.serps, "ingest.synthetic.n_queries": max(100, args.serps // 25)})
    spark = session_for(cfg, "em-pass")
    try:
        path = Path(args.workdir) / f"serps-{args.serps}.parquet"
        if not path.exists():
            serps, _, _ = synthetic.generate(spark, cfg.ingest)
            serps.select("serp_id", "query_id", "doc_ids", "clicks").write.parquet(str(path))
        serps = spark.read.parquet(str(path))
        pair, clicks, n_pairs = reference_arrays_of(serps, M)
        numpy_s = {}
        for name in models:
            _, times = REFERENCES[name](pair, clicks, n_pairs, args.passes)
            numpy_s[name] = statistics.median(times[1:])
            print(f"numpy {name}: {numpy_s[name]:.3f} s per pass ({', '.join(f'{t:.3f}' for t in times)})", flush=True)
        del pair, clicks
        rows, sizes = [], [int(b) for b in args.block_serps.split(",")]
        for i, block_serps in enumerate(sizes):
            packed = pack_serps(serps, M, block_serps=block_serps)
            for name in models:
                times = spark_passes(packed, name, args.passes)
                spark_s = statistics.median(times[1:])
                rows.append((block_serps, packed.n_blocks, "stages", name, spark_s, numpy_s[name] / spark_s))
                print(f"spark {name}, {packed.n_blocks} blocks: {spark_s:.3f} s per pass "
                      f"({', '.join(f'{t:.3f}' for t in times)})", flush=True)
                times, start = resident_passes(packed, name, args.passes)
                spark_s = statistics.median(times[1:])
                rows.append((block_serps, packed.n_blocks, "resident", name, spark_s, numpy_s[name] / spark_s))
                print(f"spark resident {name}, {packed.n_blocks} blocks: {spark_s:.3f} s per pass "
                      f"({', '.join(f'{t:.3f}' for t in times)}), stage up in {start:.2f} s", flush=True)
            if i < len(sizes) - 1:
                packed.unpersist()
        anatomy, n_blocks = pass_anatomy(packed, models[0]), packed.n_blocks
        packed.unpersist()
        gather = all_gather_seconds(spark, args.gathers)
    finally:
        spark.stop()
    print(f"\n{args.serps:,} SERPs, {args.passes} passes, medians of all but the first\n")
    print("| block_serps | blocks | engine | model | Spark s per pass | numpy s per pass | numpy / Spark |\n"
          "|---|---|---|---|---|---|---|")
    for block_serps, n_blocks, engine, name, spark_s, ratio in rows:
        print(f"| {block_serps} | {n_blocks} | {engine} | {name} | {spark_s:.3f} | {numpy_s[name]:.3f} | {ratio:.2f} |")
    print(f"\n| a pass of {models[0]}, {n_blocks} blocks, taken apart | s (each try) |\n|---|---|")
    for what, times in anatomy.items():
        print(f"| {what} | {', '.join(f'{t:.3f}' for t in times)} |")
    print(f"| BarrierTaskContext.allGather, per call | {gather:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
