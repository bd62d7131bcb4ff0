"""Surrogate: Reverse and Forward PPL of every generator's sequences → distributional_metrics.

A surrogate model is fitted on the real SERPs and on each generator's sequences, and scored on the other."""

from __future__ import annotations

import logging
import time

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from clickeval_spark import tables
from clickeval_spark.context import StageContext
from clickeval_spark.errors import ClickevalError
from clickeval_spark.metrics.distributional import Perplexity, coverage_row, perplexities
from clickeval_spark.models import get_model
from clickeval_spark.models.attach import truncate_serps
from clickeval_spark.models.blocks import pack_log
from clickeval_spark.models.priors import model_prior
from clickeval_spark.models.spark_em import fit_groups

log = logging.getLogger("clickeval")

VARIANT = ("generator_model", "list_order", "click_mode")


def packed_inputs(real: DataFrame, synthetic: DataFrame, variants: DataFrame, max_rank: int) -> DataFrame:
    """Every surrogate's training log side by side (`blocks.pack_log`'s groups): group 0 the real SERPs,
    group i the i-th variant's sequences (`variants`: group, generator_model, list_order, click_mode), each
    with the real SERPs beside it as held-out SERPs, scored in the fit's final pass (Reverse PPL)."""
    real = truncate_serps(real, max_rank)
    seqs = truncate_serps(synthetic.join(F.broadcast(variants), on=list(VARIANT), how="inner"),
                          max_rank, keep=("group",))
    groups = variants.select("group").union(variants.sparkSession.range(1).select(F.lit(0).cast("int")))
    return (
        real.withColumn("group", F.lit(0)).unionByName(seqs).withColumn("held_out", F.lit(False))
        .unionByName(real.crossJoin(F.broadcast(groups)).withColumn("held_out", F.lit(True)))
        .select("query_id", "doc_ids", "clicks", "held_out", "group")
    )


def run(ctx: StageContext) -> list[dict]:
    scfg, dataset, max_rank, run_id = ctx.cfg.surrogate, ctx.dataset, ctx.cfg.fit.max_rank, ctx.run_id
    surrogate = get_model(scfg.model)
    real = ctx.serps((ctx.cfg.generate.split,))
    synthetic = ctx.this_run("synthetic_serps", dataset=dataset)
    variants = sorted(tuple(r) for r in synthetic.select(*VARIANT).distinct().collect())
    if not variants:
        raise ClickevalError(f"run {run_id}: no synthetic_serps for dataset {dataset}; "
                             f"run `clickeval generate --run-id {run_id}` first")

    def row(generator: str, order: str, mode: str, reverse, forward, n_real: int) -> dict:
        return coverage_row(run_id, dataset, generator, scfg.model, scfg.iterations, order, mode,
                            reverse, forward, n_real)

    with ctx.record("surrogate") as run:
        t0 = time.perf_counter()
        index = ctx.spark.createDataFrame([(g, *v) for g, v in enumerate(variants, 1)],
                                          "group int, generator_model string, list_order string, click_mode string")
        packed = pack_log(packed_inputs(real, synthetic, index, max_rank), max_rank)
        t_pack = time.perf_counter() - t0
        # one pack, one Spark job per EM pass for all 1 + len(variants) fits, the same prior and passes for
        # each: the held-out real SERPs are only scored (select_on_held_out=False), so `k: auto` means
        # priors.DEFAULT_K, as for a fit without held-out SERPs
        prior = model_prior(surrogate, max_rank, *ctx.cfg.fit.prior_overrides(scfg.model))
        try:
            fits = fit_groups(packed, surrogate, iterations=scfg.iterations, prior=prior, logger=log,
                              select_on_held_out=False, ppl_eps=scfg.eps, engine=ctx.cfg.fit.engine)
        finally:
            packed.unpersist()
        t_fit = time.perf_counter() - t0 - t_pack
        on_real = fits[0]
        reverse = [Perplexity.from_sums(*f.held_out_ppl) for f in fits]
        # Forward PPL: the real-log surrogate on every variant's sequences, in one aggregate
        forward = perplexities(synthetic, on_real, scfg.eps, label=F.concat_ws("/", *VARIANT))
        baseline = reverse[0]
        rows = [row("real_log", "original", "observed", baseline, baseline, baseline.n_serps)]
        print(f"surrogate {scfg.model}: {len(variants)} variants and the real {ctx.cfg.generate.split} SERPs "
              f"({baseline.n_serps}, PPL {baseline.total:.4f}) packed in {t_pack:.1f} s, fitted in {t_fit:.1f} s, "
              f"forward PPL in {time.perf_counter() - t0 - t_pack - t_fit:.1f} s")
        for (generator, order, mode), rev in zip(variants, reverse[1:]):
            fwd = forward["/".join((generator, order, mode))]
            print(f"surrogate {generator} {order}/{mode}: {fwd.n_serps} synthetic SERPs, "
                  f"reverse PPL {rev.total:.4f}, forward PPL {fwd.total:.4f}")
            rows.append(row(generator, order, mode, rev, fwd, baseline.n_serps))
        frame = ctx.spark.createDataFrame(rows, tables.DISTRIBUTIONAL_METRICS)
        ctx.write(frame, "distributional_metrics", {"run_id": run_id, "dataset": dataset})
        run.counts["variants"] = len(variants)
    return rows
