"""Surrogate: Reverse and Forward PPL of every generator's sequences → distributional_metrics.

A surrogate model is fitted on the real SERPs and on each generator's sequences, and scored on the other.
The real log's own reference is out of sample: the surrogate fitted on one half of the real sessions and
scored on the other half, and the reverse."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import numpy as np
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from clickeval_spark import progress, tables
from clickeval_spark.context import StageContext
from clickeval_spark.errors import ClickevalError
from clickeval_spark.hashing import seeded_uniform
from clickeval_spark.metrics.distributional import (A_ON_B, B_ON_A, CROSS_FITTED, IN_SAMPLE, REAL_LOG, Perplexity,
                                                    coverage_row, perplexities)
from clickeval_spark.em import EMOptions, fit_groups, pack_log
from clickeval_spark.models import get_model
from clickeval_spark.fitted.attach import truncate_serps
from clickeval_spark.fitted import FittedModel

log = logging.getLogger("clickeval")

VARIANT = ("generator_model", "list_order", "click_mode")

# the real log's reference rows: metrics/distributional.py (REAL_LOG and its click_modes)
# the halves: a seeded hash of session_id, so the SERPs of a session (correlated) stay together
HALF_SEED = 20210416
HALF_SALT = "surrogate-half"


def half_column(session_col: str = "session_id") -> Column:
    """"a" or "b": a real SERP's half, from a seeded hash of its session. The salt keeps it independent of the
    train/valid/test split, which hashes the same ids (with the same seed, every test session would land in
    one half)."""
    return F.when(seeded_uniform(HALF_SEED, F.lit(HALF_SALT), session_col) < F.lit(0.5), F.lit("a")).otherwise(
        F.lit("b"))


def real_with_halves(real: DataFrame, max_rank: int) -> DataFrame:
    """The real SERPs as the surrogates see them (`truncate_serps`), each with its half: serp_id, half,
    query_id, doc_ids, clicks."""
    return truncate_serps(real.withColumn("half", half_column()), max_rank, keep=("serp_id", "half"))


def real_assignment(spark: SparkSession, n_variants: int, halves: bool) -> DataFrame:
    """Where the real SERPs go in the packed log: (group, half, held_out), joined to them on half. Group 0 is
    fitted on every real SERP; groups 1..n_variants (the generators' sequences) hold every real SERP out, to
    score their fits on; with ``halves``, group n_variants + 1 is fitted on half a and holds half b out, group
    n_variants + 2 the reverse."""
    rows = [(0, h, False) for h in "ab"] + [(g, h, True) for g in range(n_variants + 1) for h in "ab"]
    if halves:
        a_fit, b_fit = n_variants + 1, n_variants + 2
        rows += [(a_fit, "a", False), (a_fit, "b", True), (b_fit, "b", False), (b_fit, "a", True)]
    return spark.createDataFrame(rows, "group int, half string, held_out boolean")


def packed_inputs(real: DataFrame, synthetic: DataFrame, variants: DataFrame, n_variants: int, max_rank: int,
                  halves: bool = True) -> DataFrame:
    """Every surrogate's training log side by side (`blocks.pack_log`'s groups): group 0 the real SERPs,
    group i the i-th variant's sequences (`variants`: group, generator_model, list_order, click_mode), each
    with the real SERPs beside it as held-out SERPs, scored in the fit's final pass (Reverse PPL); with
    ``halves`` the two out-of-sample fits of the real log (`real_assignment`). ``real``: `real_with_halves`.
    Columns: serp_id (pack_log ignores it), query_id, doc_ids, clicks, held_out, group."""
    seqs = truncate_serps(synthetic.join(F.broadcast(variants), on=list(VARIANT), how="inner"),
                          max_rank, keep=("serp_id", "group"))
    placed = real.join(F.broadcast(real_assignment(real.sparkSession, n_variants, halves)), on="half", how="inner")
    return (
        placed.select("serp_id", "query_id", "doc_ids", "clicks", "held_out", "group")
        .unionByName(seqs.withColumn("held_out", F.lit(False)))
        .select("serp_id", "query_id", "doc_ids", "clicks", "held_out", "group")
    )


def variants_table(model: str, cells: dict[tuple[str, str, str], tuple[Perplexity, Perplexity]]) -> str:
    """The variants' reverse / forward PPL as a table: a row per generator, a column per list order (and click
    mode, when there are several), under a title line naming the surrogate and the synthetic SERPs' count."""
    generators = sorted({g for g, _, _ in cells})
    columns = sorted({(o, m) for _, o, m in cells})
    modes = sorted({m for _, m in columns})
    counts = sorted({fwd.n_serps for _, fwd in cells.values()})
    title = (f"surrogate {model}: reverse / forward PPL per generator and list order"
             + (f", {modes[0]} clicks" if len(modes) == 1 else "")
             + (f", {counts[0]} synthetic SERPs each" if len(counts) == 1
                else f", {counts[0]} to {counts[-1]} synthetic SERPs"))
    table = [["generator", *(o if len(modes) == 1 else f"{o}/{m}" for o, m in columns)]]
    for g in generators:
        table.append([g, *(f"{cells[g, o, m][0].total:.4f} / {cells[g, o, m][1].total:.4f}"
                           if (g, o, m) in cells else "-" for o, m in columns)])
    widths = [max(len(r[j]) for r in table) for j in range(len(table[0]))]
    return "\n".join([title] + ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table])


def pooled(a: FittedModel, b: FittedModel) -> Perplexity:
    """The perplexity of two fits' held-out scorings together (disjoint SERPs), from their per-rank sums
    (`FittedModel.held_out_ppl`)."""
    (n_a, ln_a), (n_b, ln_b) = a.held_out_ppl, b.held_out_ppl
    return Perplexity.from_sums(np.asarray(n_a) + np.asarray(n_b), np.asarray(ln_a) + np.asarray(ln_b))


def run(ctx: StageContext) -> list[dict]:
    scfg, dataset, max_rank, run_id = ctx.cfg.surrogate, ctx.dataset, ctx.cfg.fit.max_rank, ctx.run_id
    surrogate = get_model(scfg.model)
    real = real_with_halves(ctx.serps((ctx.cfg.generate.split,)), max_rank)
    synthetic = ctx.this_run("synthetic_serps", dataset=dataset)
    variants = sorted(tuple(r) for r in synthetic.select(*VARIANT).distinct().collect())
    if not variants:
        raise ClickevalError(f"run {run_id}: no synthetic_serps for dataset {dataset}; "
                             f"run `clickeval generate --run-id {run_id}` first")
    n = len(variants)

    def row(generator: str, order: str, mode: str, reverse, forward, n_real: int) -> dict:
        return coverage_row(run_id, dataset, generator, scfg.model, scfg.iterations, order, mode,
                            reverse, forward, n_real)

    with ctx.record("surrogate") as run:
        t0 = time.perf_counter()
        index = ctx.spark.createDataFrame([(g, *v) for g, v in enumerate(variants, 1)],
                                          "group int, generator_model string, list_order string, click_mode string")
        packed = pack_log(packed_inputs(real, synthetic, index, n, max_rank), max_rank)
        halves = all(g.n_serps and g.n_held_out for g in packed.groups[n + 1:])
        if not halves:
            # a real log so small that one half has no session: no out-of-sample reference, packed again without
            packed.unpersist()
            packed = pack_log(packed_inputs(real, synthetic, index, n, max_rank, halves=False), max_rank)
        run.details["real_log_halves"] = ({"a": packed.groups[n + 1].n_serps, "b": packed.groups[n + 2].n_serps}
                                          if halves else "one half of the real SERPs is empty: in sample only")
        t_pack = time.perf_counter() - t0
        # one pack, one Spark job per EM pass for all 1 + len(variants) (+ 2) fits, the same prior and passes for
        # each: the held-out real SERPs are only scored (select_on_held_out=False), so `k: auto` means
        # priors.DEFAULT_K, as for a fit without held-out SERPs
        options = replace(EMOptions.from_config(ctx.cfg.fit, surrogate, max_rank), iterations=scfg.iterations,
                          tol=None, select_on_held_out=False, ppl_eps=scfg.eps)
        try:
            with progress.current().em(f"{scfg.model} ({len(packed.groups)} fits)") as on_pass:
                fits = fit_groups(packed, surrogate, options, logger=log, on_pass=on_pass)
        finally:
            packed.unpersist()
        t_fit = time.perf_counter() - t0 - t_pack
        on_real = fits[0]
        reverse = [Perplexity.from_sums(*f.held_out_ppl) for f in fits]
        # Forward PPL: the surrogate fitted on every real SERP, on every variant's sequences, in one aggregate
        forward = perplexities(synthetic, on_real, scfg.eps, label=F.concat_ws("/", *VARIANT))
        baseline = reverse[0]
        rows = [row(REAL_LOG, "original", IN_SAMPLE, baseline, baseline, baseline.n_serps)]
        print(f"surrogate {scfg.model}: {n} variants and the real {ctx.cfg.generate.split} SERPs "
              f"({baseline.n_serps}, PPL {baseline.total:.4f} in sample) packed in {t_pack:.1f} s, fitted in "
              f"{t_fit:.1f} s, forward PPL in {time.perf_counter() - t0 - t_pack - t_fit:.1f} s")
        if halves:
            a_on_b, b_on_a = reverse[n + 1], reverse[n + 2]
            both = pooled(fits[n + 1], fits[n + 2])
            rows += [row(REAL_LOG, "original", A_ON_B, a_on_b, b_on_a, a_on_b.n_serps),
                     row(REAL_LOG, "original", B_ON_A, b_on_a, a_on_b, b_on_a.n_serps),
                     row(REAL_LOG, "original", CROSS_FITTED, both, both, both.n_serps)]
            print(f"surrogate real log out of sample: half a ({b_on_a.n_serps} SERPs) -> b {a_on_b.total:.4f}, "
                  f"half b ({a_on_b.n_serps}) -> a {b_on_a.total:.4f}, cross-fitted PPL {both.total:.4f}")
        cells = {}
        for (generator, order, mode), rev in zip(variants, reverse[1:n + 1]):
            fwd = forward["/".join((generator, order, mode))]
            cells[generator, order, mode] = (rev, fwd)
            rows.append(row(generator, order, mode, rev, fwd, baseline.n_serps))
        print(variants_table(scfg.model, cells))
        frame = ctx.spark.createDataFrame(rows, tables.DISTRIBUTIONAL_METRICS)
        ctx.write(frame, "distributional_metrics", {"run_id": run_id, "dataset": dataset})
        run.counts["variants"] = len(variants)
    return rows
