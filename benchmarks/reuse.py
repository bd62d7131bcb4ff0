"""A daily run's reuse of a recent choice (fit.prior.reuse) against the whole selection, on a benchmark log.

    .venv/bin/python -m benchmarks.run --sizes 1000000 --references-max 0 --lcm-max 0 --last-stage ingest
    .venv/bin/python -m benchmarks.reuse --warehouse benchmarks/out/warehouse-1000000 --rounds 2

The fit stage (benchmarks.run's package defaults, `PACKAGE_FIT`, with fit.prior.reuse.days 1) runs on the
warehouse's log in one session: first once to warm the session (its seconds are not compared), then
``--rounds`` times the pair (the whole selection with reuse off; the same stage with reuse on, which reuses
the choice the run before it made). Printed per pair and model: seconds (`benchmarks.run.fit_seconds`: the last
model's include the model_params write), passes, the choice, candidates fitted, whether the choice was reused
and held, the ratio reuse / whole selection, and whether the reused fit's valid LL equals the selection's bit
for bit (it must: a candidate's passes do not depend on the others').
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime, timezone

from pyspark.sql import functions as F

from benchmarks.run import PACKAGE_FIT, fit_seconds
from clickeval_spark.config import AppConfig, load_config
from clickeval_spark.context import StageContext
from clickeval_spark.runtime import session_for
from clickeval_spark.stages import STAGES


def _fit_stage(spark, cfg: AppConfig, warehouse: str, run_id: str) -> tuple[float, dict, dict]:
    """The fit stage as run ``run_id``: its seconds, each model's seconds, each model's runs.details."""
    ctx = StageContext(spark, cfg, warehouse, run_id)
    t0, t = datetime.now(timezone.utc), time.perf_counter()
    STAGES["fit"](ctx)
    secs = time.perf_counter() - t
    per_model, _pack = fit_seconds(ctx, t0, secs)
    rows = ctx.this_run("runs").where(F.col("job").startswith("fit:")).select("job", "counts", "details").collect()
    details = {r["job"].split(":", 1)[1]: {**json.loads(r["details"]), "passes": r["counts"]["iterations"]}
               for r in rows}
    return secs, per_model, details


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warehouse", required=True, help="a benchmarks.run warehouse (warehouse-<n>)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--conf", default="conf/bench.yaml")
    args = ap.parse_args(argv)
    n = args.warehouse.rstrip("/").rsplit("-", 1)[-1]
    on = load_config(args.conf, {"ingest.dataset": f"bench-{n}", "spark.warehouse": args.warehouse, **PACKAGE_FIT,
                                 "fit.prior.reuse.days": 1})
    off = load_config(args.conf, {"ingest.dataset": f"bench-{n}", "spark.warehouse": args.warehouse, **PACKAGE_FIT})
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    spark = session_for(on, "bench-reuse")
    try:
        _fit_stage(spark, off, args.warehouse, f"reuse-{stamp}-warm")
        for r in range(args.rounds):
            full_s, full_m, full_d = _fit_stage(spark, off, args.warehouse, f"reuse-{stamp}-{r}-full")
            reuse_s, reuse_m, reuse_d = _fit_stage(spark, on, args.warehouse, f"reuse-{stamp}-{r}-reuse")
            print(f"round {r}: fit stage {full_s:.1f} s whole selection, {reuse_s:.1f} s reused "
                  f"(ratio {reuse_s / full_s:.2f}), {n} SERPs")
            for name in full_d:
                a, b = full_d[name], reuse_d[name]
                sel_a, sel_b = a.get("prior_selection") or {}, b.get("prior_selection") or {}
                reused = sel_b.get("reused") or sel_b.get("reuse_refused") or {}
                choice = [f"{sel.get('chosen_k')}/{sel.get('chosen_seen_means')}" for sel in (sel_a, sel_b)]
                print(f"  {name}: {full_m[name]:.1f} -> {reuse_m[name]:.1f} s "
                      f"(ratio {reuse_m[name] / full_m[name]:.2f}), passes {a['passes']} / {b['passes']}, "
                      f"choice {choice[0]} / {choice[1]}, candidates {len(sel_a.get('grid', []))} / "
                      f"{len(sel_b.get('grid', []))}, held {reused.get('held')}, "
                      f"the same valid LL bit for bit: {a.get('valid_ll') == b.get('valid_ll')}", flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
