"""Successive halving of `k: auto`'s candidates (`fit.prior.halving`) against the full selection, per EM model.

    .venv/bin/python -m benchmarks.halving --conf conf/trec-demo.yaml            # the TREC sample
    .venv/bin/python -m benchmarks.halving --conf conf/local.yaml                # make run's log
    .venv/bin/python -m benchmarks.halving --conf conf/bench.yaml --warehouse /tmp/clickeval-bench/warehouse-1000000 \\
        --set ingest.dataset=bench-1000000 --set fit.tol=1.0e-4 --set fit.iterations=50 --set fit.prior.kind=beta

The conf's log (ingested into a temporary warehouse, or read from --warehouse) is packed as the fit stage packs
it (train SERPs, valid held out). Each model is fitted with the conf's fit options three ways:
- **trace:** no candidate dropped, but every candidate's valid LL read at every iteration (a halving round at
  each with a margin nothing trails by). From it, for each round of the conf's schedule: how far the full
  selection's winner trailed that round's leader, as a share of the round's margin (above 1, halving would
  have dropped it);
- **full:** `halving: {}`, the selection before halving;
- **halving:** the conf's schedule.
Printed per model: the choice of each, whether the halving fit's training LL path and valid LL are the full
one's bit for bit, the candidates' passes (summed) and each fit's seconds. Nothing is written.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from dataclasses import replace

import yaml

from clickeval_spark.config import PROJECT_ROOT, load_config
from clickeval_spark.context import StageContext
from clickeval_spark.em import EMOptions, fit, pack_serps
from clickeval_spark.models import get_model
from clickeval_spark.runtime import session_for
from clickeval_spark.stages import STAGES

EM_MODELS = "pbm,ubm,dcm,ccm,dbn,sdbn"
NEVER = 1e9   # a margin no candidate trails by: the round only reads the valid LL


class ValidTrace(logging.Handler):
    """Every candidate's valid LL per iteration, from `Candidate.record`'s debug line (6 decimals)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lls: dict[str, dict[int, float]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg.startswith("%s %s iteration %d: train LL") and record.args[5] != "-":
            self.lls.setdefault(record.args[1], {})[record.args[2]] = float(record.args[5])


def label(fitted) -> str:
    s = fitted.selection
    return f"{s['chosen_k']}/{s['chosen_seen_means']}"


def worst_share(trace: dict[str, dict[int, float]], winner: str, rounds: tuple[tuple[int, float], ...]) -> float:
    """The largest share of a round's margin by which ``winner`` trailed the round's leader (candidates that had
    stopped before the round count with their last valid LL)."""
    worst = 0.0
    for it, margin in rounds:
        at = {c: lls.get(it, lls[max(lls)]) for c, lls in trace.items()}
        worst = max(worst, (max(at.values()) - at[winner]) / margin)
    return worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conf", default=str(PROJECT_ROOT / "conf" / "trec-demo.yaml"))
    ap.add_argument("--warehouse", help="a warehouse the conf's log was ingested into (default: ingest it now)")
    ap.add_argument("--models", default=EM_MODELS)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override (YAML value)")
    args = ap.parse_args(argv)
    warehouse = args.warehouse or tempfile.mkdtemp(prefix="clickeval-halving-")
    overrides = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)}
    cfg = load_config(args.conf, {**overrides, "spark.warehouse": warehouse})
    spark = session_for(cfg, "halving")
    try:
        ctx = StageContext(spark, cfg, warehouse, "halving")
        if args.warehouse is None:
            STAGES["ingest"](ctx)
        packed = pack_serps(ctx.serps(("train",)), max_rank=cfg.fit.max_rank, held_out=ctx.serps(("valid",)))
        for name in args.models.split(","):
            model = get_model(name)
            opts = EMOptions.from_config(cfg.fit, model, packed.max_rank)
            log = logging.getLogger(f"benchmarks.halving.{name}")
            log.setLevel(logging.DEBUG)
            log.propagate = False
            trace = ValidTrace()
            log.addHandler(trace)
            fit(packed, model, replace(opts, halving=tuple((i, NEVER) for i in range(1, opts.iterations + 1))),
                logger=log)
            runs = {}
            for how, o in (("full", replace(opts, halving=())), ("halving", opts)):
                t0 = time.perf_counter()
                fitted = fit(packed, model, o)
                runs[how] = (fitted, time.perf_counter() - t0, sum(e["iterations"] for e in fitted.selection["grid"]),
                             sum("dropped_at" in e for e in fitted.selection["grid"]))
            (full, full_s, full_n, _), (half, half_s, half_n, dropped) = runs["full"], runs["halving"]
            same = [h[1] for h in full.history] == [h[1] for h in half.history] and full.valid_ll == half.valid_ll
            # the trace's own choice: the best valid LL of the scoring pass (the last one each candidate logged)
            winner = max(trace.lls, key=lambda c: trace.lls[c][max(trace.lls[c])])
            # (the debug line prints 6 decimals)
            assert abs(trace.lls[winner][max(trace.lls[winner])] - full.valid_ll) < 1e-6, "the trace chose another"
            print(f"{name}: choice {label(full)} -> {label(half)}; the same fit bit for bit: {same}; candidate "
                  f"passes {full_n} -> {half_n} ({1 - half_n / full_n:.0%} fewer, {dropped} of "
                  f"{len(full.selection['grid'])} dropped); {full_s:.1f} -> {half_s:.1f} s; the winner trailed "
                  f"by at most {worst_share(trace.lls, winner, opts.halving):.2f} of a round's margin", flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
