"""Surrogate: Reverse and Forward PPL of every generator's sequences → distributional_metrics.

A surrogate model is fitted on the real SERPs and on each generator's sequences, and scored on the other."""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

from pyspark.sql import functions as F

from clickeval_spark import tables
from clickeval_spark.context import StageContext
from clickeval_spark.errors import ClickevalError
from clickeval_spark.metrics.distributional import coverage, coverage_row, fit_surrogate, perplexity
from clickeval_spark.models import get_model
from clickeval_spark.models.priors import model_prior

log = logging.getLogger("clickeval")


def run(ctx: StageContext) -> list[dict]:
    scfg, dataset, max_rank, run_id = ctx.cfg.surrogate, ctx.dataset, ctx.cfg.fit.max_rank, ctx.run_id
    surrogate = get_model(scfg.model)
    real = ctx.serps((ctx.cfg.generate.split,))
    synthetic = ctx.this_run("synthetic_serps", dataset=dataset)
    variants = sorted(tuple(r) for r in synthetic.select("generator_model", "list_order", "click_mode")
                      .distinct().collect())
    if not variants:
        raise ClickevalError(f"run {run_id}: no synthetic_serps for dataset {dataset}; "
                             f"run `clickeval generate --run-id {run_id}` first")

    def row(generator: str, order: str, mode: str, reverse, forward, n_real: int) -> dict:
        return coverage_row(run_id, dataset, generator, scfg.model, scfg.iterations, order, mode,
                            reverse, forward, n_real)

    with ctx.record("surrogate") as run:
        t0 = time.perf_counter()
        prior = model_prior(surrogate, max_rank, *ctx.cfg.fit.prior_overrides(scfg.model))
        on_real = fit_surrogate(real, surrogate, scfg.iterations, max_rank, log, prior)
        baseline = perplexity(real, on_real, scfg.eps)
        rows = [row("real_log", "original", "observed", baseline, baseline, baseline.n_serps)]
        print(f"surrogate {scfg.model} on the real {ctx.cfg.generate.split} SERPs: {baseline.n_serps} SERPs, "
              f"PPL {baseline.total:.4f}, {time.perf_counter() - t0:.1f} s")

        def one(variant: tuple[str, str, str]) -> dict:
            generator, order, mode = variant
            t0 = time.perf_counter()
            seqs = synthetic.where((F.col("generator_model") == generator) & (F.col("list_order") == order)
                                   & (F.col("click_mode") == mode))
            reverse, forward = coverage(real, seqs, on_real, surrogate, scfg.iterations, max_rank, scfg.eps, log,
                                        prior)
            print(f"surrogate {generator} {order}/{mode}: {forward.n_serps} synthetic SERPs, "
                  f"reverse PPL {reverse.total:.4f}, forward PPL {forward.total:.4f}, "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)
            return row(generator, order, mode, reverse, forward, baseline.n_serps)

        # the fits are independent and small next to Spark's per-job latency: run a few at once
        with ThreadPoolExecutor(max_workers=scfg.parallelism) as pool:
            rows += list(pool.map(one, variants))
        frame = ctx.spark.createDataFrame(rows, tables.DISTRIBUTIONAL_METRICS)
        ctx.write(frame, "distributional_metrics", {"run_id": run_id, "dataset": dataset})
        run.counts["variants"] = len(variants)
    return rows
