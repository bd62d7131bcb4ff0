"""Ingest: parse, validate and quarantine the input log (or simulate one) → serps, relevance_labels.

An ingest replaces only the (dataset, log_date) slices it read; bad records go to quarantine."""

from __future__ import annotations

from datetime import date

from clickeval_spark import ingest
from clickeval_spark.context import StageContext
from clickeval_spark.errors import InputError
from clickeval_spark.sources import synthetic


def run(ctx: StageContext) -> dict[str, int]:
    icfg = ctx.cfg.ingest
    with ctx.record("ingest") as run:
        if icfg.format == "synthetic":
            parsed_serps, labels, truth = synthetic.generate(ctx.spark, icfg)
        else:
            parsed_serps, labels, truth = ingest.parse_serps(ctx.spark, icfg), ingest.parse_labels(ctx.spark, icfg), None
        out = ingest.run_ingest(ctx.spark, icfg, parsed_serps, labels, ctx.run_id)
        try:
            counts, refused = ingest.quarantine_check(out, icfg)
            run.counts.update(out.counts, **counts)
            if refused:
                raise InputError(refused)
            # the (dataset, log_date) slices this ingest replaced; null: the undated slice
            run.details["log_dates"] = sorted(out.log_dates, key=lambda d: (d is None, d or date.min))
            run.counts.update(ingest.write_ingest(ctx.spark, out, ctx.warehouse, icfg.dataset, ctx.run_id))
            if truth is not None:  # a simulated log's true parameters, beside the fitted ones
                ctx.write(truth, "model_params", {"run_id": synthetic.truth_run_id(icfg.dataset)})
        finally:
            out.quarantine.unpersist()
    print(f"ingest {icfg.dataset} run_id={ctx.run_id}: " + ", ".join(f"{k}={v}" for k, v in sorted(run.counts.items())))
    return run.counts
