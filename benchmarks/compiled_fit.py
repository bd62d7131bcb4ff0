"""`make run`'s fit of each EM model with the numpy kernels and with the compiled passes: the same parameters?

    .venv/bin/python -m benchmarks.compiled_fit                      # conf/local.yaml, every EM model
    .venv/bin/python -m benchmarks.compiled_fit --models dbn,ccm

conf/local.yaml's synthetic log (the one `make run` ingests: its seed, sizes and splits), packed as the fit
stage packs it (train SERPs, valid held out), then each model fitted twice with the fit stage's options
(`EMOptions.from_config`: beta prior, `k: auto`, tol): ``compiled=False`` and the default. Printed per
model: the chosen prior, passes, the largest absolute difference of the pairs' values and of the global
parameters, the training LL per SERP of each, and each fit's seconds. Nothing is written.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from clickeval_spark.config import PROJECT_ROOT, load_config
from clickeval_spark.em import EMOptions, fit, pack_serps
from clickeval_spark.em.step import compiled_pass
from clickeval_spark.models import MODELS
from clickeval_spark.runtime import session_for
from clickeval_spark.sources import synthetic
from clickeval_spark.splits import assign_splits


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conf", default=str(PROJECT_ROOT / "conf" / "local.yaml"))
    ap.add_argument("--models", default=",".join(n for n, m in MODELS.items() if compiled_pass(m)))
    args = ap.parse_args(argv)
    cfg = load_config(args.conf)
    spark = session_for(cfg, "compiled-fit")
    rows = []
    try:
        serps, _, _ = synthetic.generate(spark, cfg.ingest)
        serps = assign_splits(serps, cfg.ingest.split).cache()
        max_rank = cfg.fit.max_rank
        packed = pack_serps(serps.where("split = 'train'"), max_rank=max_rank,
                            held_out=serps.where("split = 'valid'"))
        for name in args.models.split(","):
            model = MODELS[name]
            opts = EMOptions.from_config(cfg.fit, model, packed.max_rank)
            fits, secs = {}, {}
            for compiled in (False, None):
                t = time.perf_counter()
                fits[compiled] = fit(packed, model, opts, compiled=compiled)
                secs[compiled] = time.perf_counter() - t
            values = {c: {(r["query_id"], r["doc_id"]): np.array([r[p] for p in model.qd_params])
                          for r in f.qd.collect()} for c, f in fits.items()}
            assert values[False].keys() == values[None].keys()
            qd_diff = max(float(np.abs(values[None][k] - v).max()) for k, v in values[False].items())
            g_diff = max([float(np.abs(np.asarray(fits[None].glob[k]) - np.asarray(v)).max())
                          for k, v in fits[False].glob.items()], default=0.0)
            chosen = {c: ((f.selection or {}).get("chosen_k"), (f.selection or {}).get("chosen_seen_means"))
                      for c, f in fits.items()}
            rows.append((name, chosen[False], chosen[None], len(fits[False].history), len(fits[None].history),
                         qd_diff, g_diff, fits[False].history[-1][1], fits[None].history[-1][1], secs[False],
                         secs[None]))
            print(rows[-1], flush=True)
        packed.unpersist()
    finally:
        spark.stop()
    print(f"\n{args.conf}: {cfg.ingest.synthetic.n_serps:,} SERPs\n")
    print("| model | chosen k, seen means: numpy | compiled | passes numpy / compiled | max abs diff, pairs "
          "| max abs diff, globals | train LL per SERP numpy | compiled | fit s numpy | compiled |\n"
          "|---|---|---|---|---|---|---|---|---|---|")
    for name, sel_np, sel_c, p_np, p_c, qd_diff, g_diff, ll_np, ll_c, s_np, s_c in rows:
        print(f"| {name} | {sel_np[0]}, {sel_np[1]} | {sel_c[0]}, {sel_c[1]} | {p_np} / {p_c} | {qd_diff:.1e} "
              f"| {g_diff:.1e} | {ll_np:.12f} | {ll_c:.12f} | {s_np:.1f} | {s_c:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
