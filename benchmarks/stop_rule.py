"""Where EM's stopping rule stops on a dense simulated log, against the fit's fixed point (its LL after 300 passes).

    .venv/bin/python -m benchmarks.stop_rule                       # pbm, ubm: 300 passes, then the converging stop
    .venv/bin/python -m benchmarks.stop_rule --models pbm,ubm,dbn --passes 300 --json /tmp/stop.json
    .venv/bin/python -m benchmarks.stop_rule --models pbm,ubm,dcm,ccm,dbn --conf conf/trec-demo.yaml \
        --warehouse <a TREC run's warehouse>                        # the TREC sample, its conf's fit options

The log (issue 57 point 4): 20 queries x 1,500 SERPs simulated from a UBM (examination by rank and distance
to the last click; tests/em/logs.py's `Log`, 14 documents a query, lists of 1-12 cut at rank 10), every
tenth SERP held out as the valid split (27,000 training, 3,000 held-out SERPs); ``--seed`` / ``--extra``
change it (``--extra 0``: lists of 1-10). Each model is fitted twice with the package defaults
(`EMOptions()`: beta prior, `k: auto`, seen pairs toward the pooled mean; with ``--conf``, that config's fit
section): once for ``--passes`` passes with no tolerance (the fixed point), once as they stop with
fit.converge.gain ``--gain`` where the config sets none (the package's default is 3e-6, on a log whose
held-out positions are at least 90% of pairs seen in training: fit.converge.min_seen_share). A candidate's
passes do not depend on the others', so every candidate of the stopping fit is compared with its own path
in the long fit. Printed per model: the chosen prior; where fit.tol alone stopped it (the package's
default: `tol_passes`) and where the converging stop stopped it (`prior_spec["stop"]`), each with the gap of
its training LL to its LL after ``--passes`` passes, per training position; the pass from which that LL
stays within 1e-5; its valid LL at the choice and at the end. ``--json``: every number, and the long fits'
per-pass train LL and log posterior (per SERP) of every candidate, for replaying other rules.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import numpy as np
from pyspark.sql import functions as F

from clickeval_spark.catalog import register_temp_views
from clickeval_spark.config import PROJECT_ROOT, FitConfig, load_config
from clickeval_spark.em import EMOptions, driver, fit, pack_serps
from clickeval_spark.models import MODELS
from clickeval_spark.runtime import session_for

from tests.em.logs import Log, split_log

TARGET = 1e-5   # nats per training position


def dense_log(spark, seed: int = 1, extra: int = 2):
    """(packed log, training positions, training SERPs): the dense UBM log of issue 57 point 4."""
    log = Log(MODELS["ubm"], n_serps=30_000, M=10, seed=seed, n_queries=20, pool=14, extra=extra)
    held = np.arange(len(log.rows)) % 10 == 9
    train, valid = split_log(spark, log, held)
    packed = pack_serps(train, max_rank=10, held_out=valid.withColumn("split", F.lit("valid")))
    return packed, int(log.mask[~held].sum()), int((~held).sum())


def warehouse_log(spark, warehouse: str):
    """(packed log, training positions, training SERPs) of the serps table of ``warehouse`` (a run's: the TREC
    sample's, `make run`'s), packed as the fit stage packs it."""
    register_temp_views(spark, warehouse)
    serps = spark.table("serps")
    train, valid = serps.where("split = 'train'"), serps.where("split = 'valid'")
    packed = pack_serps(train, max_rank=10, held_out=valid)
    return packed, None, packed.groups[0].n_serps


def within(ll: np.ndarray, per_pos: float) -> int:
    """The first iteration from which the LL stays within TARGET per position of its last entry."""
    gap = np.abs(ll[-1] - ll) * per_pos
    outside = np.nonzero(gap >= TARGET)[0]
    return int(outside[-1] + 1) if len(outside) else 0


def fit_keeping(packed, model, opts):
    """`fit`, and the candidates its passes ran (their histories: the driver keeps only the chosen one's)."""
    kept = []
    run = driver._run

    def keep(packed_, ctx, cands, passes, phase=""):
        kept[:] = cands
        return run(packed_, ctx, cands, passes, phase)
    driver._run = keep
    try:
        return fit(packed, model, opts), kept
    finally:
        driver._run = run


def label_of(fitted, cands) -> str:
    """The label of the candidate ``fitted`` is (the one whose history it carries)."""
    return next(c.label for c in cands if c.history == fitted.history)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="pbm,ubm")
    ap.add_argument("--passes", type=int, default=300)
    ap.add_argument("--json", default=None)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--extra", type=int, default=2)
    ap.add_argument("--conf", default=None,
                    help="the fit options of this config's fit section; 'package': the package's (`FitConfig()`); "
                         "default: EMOptions()")
    ap.add_argument("--gain", type=float, default=3e-6,
                    help="fit.converge.gain of the stopping fit when its options set none (the package's default "
                         "is 3e-6)")
    ap.add_argument("--warehouse", default=None,
                    help="instead: the train / valid SERPs of the serps table of this warehouse (one dataset)")
    args = ap.parse_args(argv)
    spark = session_for(load_config(str(PROJECT_ROOT / "conf" / "local.yaml")), "stop-rule")
    out = {}
    try:
        packed, n_pos, n_serps = (dense_log(spark, args.seed, args.extra) if args.warehouse is None
                                  else warehouse_log(spark, args.warehouse))
        print(f"log: {n_serps} training SERPs, {n_pos} training positions, "
              f"{packed.groups[0].n_held_out} held-out SERPs")
        for name in args.models.split(","):
            model = MODELS[name]
            fit_cfg = (None if args.conf is None else FitConfig() if args.conf == "package"
                       else load_config(args.conf).fit)
            opts = EMOptions() if fit_cfg is None else EMOptions.from_config(fit_cfg, model, 10)
            t = time.perf_counter()
            long, long_cands = fit_keeping(packed, model, replace(opts, iterations=args.passes, tol=None))
            t_long = time.perf_counter() - t
            t = time.perf_counter()
            short, short_cands = fit_keeping(packed, model, opts if opts.converge is not None
                                             else replace(opts, converge=args.gain))
            t_short = time.perf_counter() - t
            per_pos = long_cands[0].per_position   # the fit's own count of training positions
            # a candidate's passes do not depend on the others': the default's candidates are the long fit's,
            # stopped earlier; each one's gap is to its own LL after the long fit's passes
            ends = {c.label: np.array([h[1] for h in c.history]) for c in long_cands}
            cands = [{"label": c.label, "passes": c.done, "needed": within(ends[c.label], per_pos),
                      "gap_per_position": (ends[c.label][-1] - c.history[-1][1]) * per_pos}
                     for c in short_cands]
            chosen = next(c for c in cands if c["label"] == label_of(short, short_cands))
            stop = short.prior_spec["stop"]
            tol_gap = (ends[chosen["label"]][-1] - ends[chosen["label"]][stop["tol_passes"]]) * per_pos
            row = {"chosen": chosen["label"], "chosen_long": label_of(long, long_cands),
                   "tol_passes": stop["tol_passes"], "tol_gap_per_position": tol_gap,
                   "passes": chosen["passes"], "stop": short.prior_spec.get("stop"),
                   "gap_per_position": chosen["gap_per_position"], "needed": chosen["needed"],
                   "worst_gap": max(c["gap_per_position"] for c in cands), "candidates": cands,
                   "valid_ll_at_choice": next(c.chosen_at for c in short_cands if c.chosen_at is not None)[0],
                   "secs": t_short, "secs_long": t_long, "valid_ll": short.valid_ll, "valid_ll_long": long.valid_ll,
                   "long": {c.label: {"train_ll": [h[1] for h in c.history], "log_posterior": c.posterior,
                                      "compare_from": c.compare_from} for c in long_cands}}
            out[name] = row
            print(f"{name}: chosen {row['chosen']} (long fit: {row['chosen_long']}); fit.tol alone: "
                  f"{row['tol_passes']} passes, gap {tol_gap:.2e}; default stop after "
                  f"{row['passes']} passes ({t_short:.1f} s, {args.passes} passes {t_long:.1f} s), gap to LL_"
                  f"{args.passes} {row['gap_per_position']:.2e} per position (worst candidate "
                  f"{row['worst_gap']:.2e}); LL stays within {TARGET:g} from pass {row['needed']}; valid LL "
                  f"{short.valid_ll:.6f} (at the choice {row['valid_ll_at_choice']:.6f}) vs {long.valid_ll:.6f}; "
                  f"rule {row['stop']}")
        packed.unpersist()
    finally:
        spark.stop()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"n_pos": n_pos, "n_serps": n_serps, "models": out}, fh, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
