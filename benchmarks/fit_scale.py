"""One model's fit stage on a large synthetic log, to convergence, with the default prior (issue 17's 10M target).

    .venv/bin/python -m benchmarks.fit_scale --train-serps 10000000 --model ubm [--shuffle-width 0]

The log is conf/bench.yaml's synthetic TianGong-ST-shaped log (10 results, Zipf-like queries,
n_queries = SERPs / 25), split train : valid = 10 : 1 and no test split, so the train split
holds about --train-serps SERPs and the valid split (by which `k: auto` picks the prior
strength) a tenth of that. --shuffle-width overrides how much a query's doc list varies between
its SERPs (bench.yaml: 6, almost every SERP distinct; 0: one fixed list per query, so SERPs
repeat and the packed blocks fold them into weighted rows, as on a real log's head queries).
The fit is the fit stage as `clickeval fit` runs it, with the package defaults: pack train +
valid once, then EM until the log posterior per training SERP moves by less than fit.tol
(1e-4) or --iterations passes (default 50, the package default), beta prior with k auto (every grid
value a candidate in the same passes).
Ingest (generate, validate, write) is timed too, outside the target.

Prints, and writes to <workdir>/fit_scale.json: SERPs, distinct packed rows, passes,
the fit stage's wall time (read + pack + EM + model_params write), the EM passes' own seconds,
and the peak resident memory of the process tree (driver, JVM, Python workers) during the fit.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import yaml

from benchmarks.run import PeakRss, distinct_rows, timed
from clickeval_spark.config import PROJECT_ROOT, load_config
from clickeval_spark.context import StageContext
from clickeval_spark.runtime import session_for
from clickeval_spark.stages import STAGES


def cluster_engine() -> str:
    """conf/cluster.yaml's fit.engine (read as YAML: its locations are buckets this machine cannot reach)."""
    return yaml.safe_load((PROJECT_ROOT / "conf" / "cluster.yaml").read_text())["fit"]["engine"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train-serps", type=int, default=10_000_000)
    ap.add_argument("--model", default="ubm")
    ap.add_argument("--shuffle-width", type=float, default=None)
    ap.add_argument("--iterations", type=int, default=50, help="the cap on passes (fit.iterations; 50 by default)")
    ap.add_argument("--conf", default=str(PROJECT_ROOT / "conf" / "bench.yaml"))
    ap.add_argument("--workdir", default="/tmp/clickeval-fit-scale")
    ap.add_argument("--skip-ingest", action="store_true", help="fit the log an earlier run left in --workdir")
    ap.add_argument("--engine", default=cluster_engine(),
                    help="fit.engine (default: conf/cluster.yaml's, the engine a cluster runs)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")   # the fit's per-pass lines
    n = args.train_serps * 11 // 10
    wh = str(Path(args.workdir) / f"warehouse-{n}-w{args.shuffle_width}")
    overrides = {
        "ingest.dataset": f"scale-{n}", "ingest.synthetic.n_serps": n, "ingest.synthetic.n_queries": n // 25,
        "ingest.split.ratios": {"train": 10, "valid": 1, "test": 0},
        "fit.models": [args.model], "generate.generators": [args.model],
        "fit.iterations": args.iterations, "fit.tol": 1e-4, "fit.prior": {"kind": "beta", "k": "auto"},
        "spark.warehouse": wh, "report.path": str(Path(args.workdir) / "reports"), "fit.engine": args.engine,
    }
    if args.shuffle_width is not None:
        overrides["ingest.synthetic.shuffle_width"] = args.shuffle_width
    cfg = load_config(args.conf, overrides)
    spark = session_for(cfg, "benchmark")
    try:
        ctx = StageContext(spark, cfg, wh, f"scale-{n}")
        if args.skip_ingest:
            counts, ingest_s = {f"serps_{s}": ctx.serps((s,)).count() for s in ("train", "valid")}, float("nan")
        else:
            counts, ingest_s = timed(STAGES["ingest"], ctx)
            print(f"ingest: {n:,} SERPs in {ingest_s:.1f} s", flush=True)
        with PeakRss() as rss:
            histories, fit_s = timed(STAGES["fit"], ctx)
        history = histories[args.model]
        out = {
            "model": args.model, "engine": args.engine, "serps": n, "shuffle_width": cfg.ingest.synthetic.shuffle_width,
            "train_serps": int(counts["serps_train"]), "valid_serps": int(counts["serps_valid"]),
            "ingest_s": ingest_s, "fit_stage_s": fit_s,
            "passes": len(history) - 1, "em_pass_s": [s for _, _, s in history[1:]],
            # the stopping rule (fit.tol) ended the fit before the cap on passes
            "iterations_cap": args.iterations, "converged": len(history) - 1 < args.iterations,
            "train_ll_per_serp": history[-1][1], "peak_rss_gb": rss.peak / 2**30,
            "packed_rows": distinct_rows(ctx.serps(("train",)), cfg.fit.max_rank),
        }
    finally:
        spark.stop()
    (Path(args.workdir) / "fit_scale.json").write_text(json.dumps(out, indent=1))
    print(f"{args.model} ({args.engine} engine): {out['train_serps']:,} train SERPs ({out['packed_rows']:,} packed rows), "
          f"{out['valid_serps']:,} valid; fit stage {fit_s:.1f} s, {out['passes']} passes "
          f"({'converged under fit.tol' if out['converged'] else 'stopped at the cap'}) "
          f"(EM passes {sum(out['em_pass_s']):.1f} s, {sum(out['em_pass_s']) / max(1, out['passes']):.2f} s each), "
          f"peak RSS {out['peak_rss_gb']:.1f} GiB; ingest {ingest_s:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
