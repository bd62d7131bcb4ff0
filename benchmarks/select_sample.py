"""`k: auto`'s candidates on query samples of several sizes (fit.prior.select_serps): the fit stage's seconds and
each model's choice, on a warehouse `benchmarks.run` left.

    .venv/bin/python -m benchmarks.run --sizes 10000000 --references-max 0 --lcm-max 0 --last-stage fit
    .venv/bin/python -m benchmarks.select_sample --warehouse /tmp/clickeval-bench/warehouse-10000000 \\
        --select-serps 100000,1000000,100000

The fit stage (benchmarks.run's package defaults, `PACKAGE_FIT`, with each ``--select-serps`` in turn) runs in
one session, one size after the other, as runs `select-<i>-<size>`; a size repeated is timed warm. Printed per
run: the stage's and each model's seconds (`benchmarks.run.fit_seconds`), and per model its passes, chosen
strength and seen-pair means, valid LL per position and candidates. A smaller sample may only be the default
if every model chooses as with the default's.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime, timezone

from pyspark.sql import functions as F

from benchmarks.run import PACKAGE_FIT, fit_seconds
from clickeval_spark.config import load_config
from clickeval_spark.context import StageContext
from clickeval_spark.runtime import session_for
from clickeval_spark.stages import STAGES


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warehouse", required=True, help="a benchmarks.run warehouse (warehouse-<n>)")
    ap.add_argument("--select-serps", default="100000,1000000", help="comma-separated sample sizes, in run order")
    ap.add_argument("--conf", default="conf/bench.yaml")
    ap.add_argument("--driver-memory", default="6g", help="spark.driver.memory (benchmarks.run's default)")
    args = ap.parse_args(argv)
    n = args.warehouse.rstrip("/").rsplit("-", 1)[-1]
    spark_conf = {**load_config(args.conf).spark.conf, "spark.driver.memory": args.driver_memory}
    base = {"ingest.dataset": f"bench-{n}", "spark.warehouse": args.warehouse, **PACKAGE_FIT,
            "spark.conf": spark_conf}
    spark = session_for(load_config(args.conf, base), "bench-select-sample")
    try:
        for i, size in enumerate(int(x) for x in args.select_serps.split(",")):
            cfg = load_config(args.conf, {**base, "fit.prior.select_serps": size})
            ctx = StageContext(spark, cfg, args.warehouse, f"select-{i}-{size}")
            start, t = datetime.now(timezone.utc), time.perf_counter()
            STAGES["fit"](ctx)
            secs = time.perf_counter() - t
            per_model, pack = fit_seconds(ctx, start, secs)
            print(f"select_serps {size:,}: fit stage {secs:.1f} s; "
                  + ", ".join(f"{m} {s:.1f}" for m, s in per_model.items()) + f"; pack {pack:.1f}", flush=True)
            rows = (ctx.this_run("runs").where(F.col("job").startswith("fit:"))
                    .select("job", "counts", "details").orderBy("job").collect())
            for r in rows:
                d = json.loads(r["details"])
                sel = d.get("prior_selection") or {}
                print(f"  {r['job']}: passes {r['counts']['iterations']}, chosen k={sel.get('chosen_k')} "
                      f"seen means {sel.get('chosen_seen_means')}, valid LL {d.get('valid_ll')!r}, "
                      f"candidates {len(sel.get('grid', []))}", flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
