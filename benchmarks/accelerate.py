"""The chosen fit's continuation by plain EM steps against SQUAREM's (fit.converge.accelerate): the fit stage's
seconds, each model's passes and its training and valid LL, in one session on one log.

    .venv/bin/python -m benchmarks.accelerate --serps 1000000 --modes plain,squarem,plain,squarem

The log is `benchmarks.run`'s of that size (SERPs / 25 queries, conf/bench.yaml), ingested into
``--workdir``/warehouse-<n> unless it is there. The fit stage runs the package defaults (`PACKAGE_FIT`) once per
mode, in the order given (`off`: fit.converge.gain null, the candidates' stop; `fixed`: the chosen fit's plain
passes to fit.converge.iterations, the fixed point's stand-in): runs `accel-<i>-<mode>`. Printed
per run: the stage's and each model's seconds (`benchmarks.run.fit_seconds`), and per model its passes, the
training LL per SERP of its last pass, its valid LL per position and its stop record; then each mode's median
seconds and their ratio to plain's.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from pyspark.sql import functions as F

from benchmarks.run import PACKAGE_FIT, fit_seconds
from clickeval_spark import tables
from clickeval_spark.config import load_config
from clickeval_spark.context import StageContext
from clickeval_spark.runtime import session_for
from clickeval_spark.stages import STAGES

MODES = {"plain": {"fit.converge.accelerate": False}, "squarem": {"fit.converge.accelerate": True},
         "off": {"fit.converge.gain": None},
         # the fixed point's stand-in: the chosen fit's plain passes to fit.converge.iterations (300 in all)
         "fixed": {"fit.converge.accelerate": False, "fit.converge.gain": 1e-12}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serps", type=int, default=1_000_000)
    ap.add_argument("--modes", default="plain,squarem,plain,squarem", help=f"comma-separated, of {sorted(MODES)}")
    ap.add_argument("--workdir", default="/tmp/clickeval-bench")
    ap.add_argument("--conf", default="conf/bench.yaml")
    ap.add_argument("--driver-memory", default="6g", help="spark.driver.memory (benchmarks.run's default)")
    ap.add_argument("--debug", action="store_true",
                    help="the fits' DEBUG lines with timestamps (each pass, the last pass, the per-pair table)")
    args = ap.parse_args(argv)
    if args.debug:
        logging.basicConfig(format="%(asctime)s.%(msecs)03d %(message)s", datefmt="%H:%M:%S")
        logging.getLogger("clickeval").setLevel(logging.DEBUG)
    modes = args.modes.split(",")
    if unknown := sorted(set(modes) - set(MODES)):
        ap.error(f"--modes: unknown {unknown}, expected some of {sorted(MODES)}")
    n, wh = args.serps, str(Path(args.workdir) / f"warehouse-{args.serps}")
    spark_conf = {**load_config(args.conf).spark.conf, "spark.driver.memory": args.driver_memory}
    base = {"ingest.dataset": f"bench-{n}", "ingest.synthetic.n_serps": n, "ingest.synthetic.n_queries": max(100, n // 25),
            "spark.warehouse": wh, "spark.conf": spark_conf, **PACKAGE_FIT}
    spark = session_for(load_config(args.conf, base), "bench-accelerate")
    seconds: dict[str, list[float]] = {m: [] for m in MODES}
    try:
        if not tables.exists(spark, wh, "serps"):
            t = time.perf_counter()
            STAGES["ingest"](StageContext(spark, load_config(args.conf, base), wh, f"bench-{n}"))
            print(f"ingest of {n:,} SERPs: {time.perf_counter() - t:.1f} s", flush=True)
        for i, mode in enumerate(modes):
            ctx = StageContext(spark, load_config(args.conf, {**base, **MODES[mode]}), wh, f"accel-{i}-{mode}")
            start, t = datetime.now(timezone.utc), time.perf_counter()
            histories = STAGES["fit"](ctx)
            secs = time.perf_counter() - t
            seconds[mode].append(secs)
            per_model, pack = fit_seconds(ctx, start, secs)
            print(f"{i} {mode}: fit stage {secs:.1f} s; " + ", ".join(f"{m} {s:.1f}" for m, s in per_model.items())
                  + f"; pack {pack:.1f}", flush=True)
            for r in (ctx.this_run("runs").where(F.col("job").startswith("fit:"))
                      .select("job", "counts", "details").orderBy("job").collect()):
                d, name = json.loads(r["details"]), r["job"].split(":", 1)[1]
                stop = (d.get("prior") or {}).get("stop")
                print(f"  {name}: passes {r['counts']['iterations']}, train LL per SERP {histories[name][-1][1]!r}, "
                      f"valid LL {d.get('valid_ll')!r}, stop {stop}", flush=True)
    finally:
        spark.stop()
    done = {m: float(np.median(s)) for m, s in seconds.items() if s}
    print(f"{n:,} SERPs, fit stage median seconds: " + ", ".join(
        f"{m} {s:.1f}" + (f" ({s / done['plain']:.2f}x plain)" if "plain" in done and m != "plain" else "")
        for m, s in done.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
