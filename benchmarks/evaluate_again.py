"""Re-time the evaluate stage on a warehouse `benchmarks.run` left behind (no re-ingest, no re-fit).

    .venv/bin/python -m benchmarks.evaluate_again --size 1000000 [--models pbm] [--repeat 2]

Runs the evaluate stage --repeat times in one session (the first includes JVM warm-up)
on <workdir>/warehouse-<size>, run id bench-<size>; --models restricts the evaluated
models (the benchmark evaluates pbm, ubm and dbn).
"""

from __future__ import annotations

import argparse
import time

from clickeval_spark.context import StageContext
from clickeval_spark.stages import STAGES
from clickeval_spark.config import PROJECT_ROOT, load_config
from clickeval_spark.runtime import session_for


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--models", default=None, help="comma-separated; default: conf/bench.yaml's fit.models")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--workdir", default="/tmp/clickeval-bench")
    args = ap.parse_args(argv)
    wh = f"{args.workdir}/warehouse-{args.size}"
    overrides = {"ingest.dataset": f"bench-{args.size}", "spark.warehouse": wh}
    if args.models:
        overrides.update({"fit.models": args.models.split(","), "generate.generators": args.models.split(",")})
    cfg = load_config(PROJECT_ROOT / "conf" / "bench.yaml", overrides)
    spark = session_for(cfg, "benchmark-evaluate")
    try:
        for i in range(args.repeat):
            t = time.perf_counter()
            STAGES["evaluate"](StageContext(spark, cfg, wh, f"bench-{args.size}"))
            print(f"evaluate {args.size:,} SERPs, models {list(cfg.evaluated_models)}, "
                  f"{cfg.evaluate.replicates} replicates, run {i + 1}: {time.perf_counter() - t:.1f} s", flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
