"""Generate: synthetic click sequences from every generator, per click mode and list order → synthetic_serps.

K sequences per SERP of the generation split, from fitted or external models."""

from __future__ import annotations

import time
from functools import reduce

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from clickeval_spark.context import StageContext
from clickeval_spark.generation import generate
from clickeval_spark.metrics import external
from clickeval_spark.fitted.model import load_fitted_models
from clickeval_spark.fitted.params_io import fitted_qd_rows


def run(ctx: StageContext) -> dict[str, int]:
    gcfg = ctx.cfg.generate
    serps = ctx.serps((gcfg.split,))
    params = ctx.read("model_params")
    written = {}
    names = tuple(ctx.cfg.generator_models)
    if names:
        t0 = time.perf_counter()
        # every fitted generator sampled in one attach and one kernel pass per click mode, written in one
        # commit: the sampling is the cheap part
        with ctx.record("generate") as run:
            fitted = load_fitted_models(params, names, ctx.run_id, ctx.cfg.fit.max_rank)
            qd = fitted_qd_rows(params, ctx.run_id, fitted)
            parts = [generate(serps, fitted, samples=gcfg.samples, click_mode=mode, list_orders=gcfg.list_orders,
                              seed=gcfg.seed, qd=qd)
                     for mode in gcfg.click_modes]
            rows = reduce(DataFrame.unionByName, parts).select(F.lit(ctx.run_id).alias("run_id"), "*")
            ctx.write(rows, "synthetic_serps", {"run_id": ctx.run_id, "generator_model": names})
            counted = dict(ctx.this_run("synthetic_serps").where(F.col("generator_model").isin(*names))
                           .groupBy("generator_model").count().collect())
            for name in names:
                written[name] = run.counts[f"synthetic_serps:{name}"] = counted.get(name, 0)
        print(f"generate: {sum(written.values())} synthetic SERPs from {len(names)} generator(s) "
              f"({len(gcfg.click_modes)} click mode(s) x {len(gcfg.list_orders)} list order(s)), "
              f"{time.perf_counter() - t0:.1f} s")
    for ext in gcfg.external:
        t0 = time.perf_counter()
        with ctx.record(f"generate:{ext.name}") as run:
            raw = ctx.outside_window(external.read_external(ctx.spark, ext.path, ext.format))
            seqs = external.checked_sequences(raw, serps, ext.name, ext.path)
            rows = (seqs.join(serps.drop("doc_ids", "clicks", "vtypes"), on="serp_id", how="inner")
                    .select(F.lit(ctx.run_id).alias("run_id"), F.lit(ext.name).alias("generator_model"), "*",
                            F.lit(None).cast("array<string>").alias("vtypes")))
            written[ext.name] = run.counts["synthetic_serps"] = _write_sequences(ctx, rows, ext.name)
        print(f"generate {ext.name} (external): {written[ext.name]} synthetic SERPs, {time.perf_counter() - t0:.1f} s")
    return written


def _write_sequences(ctx: StageContext, rows: DataFrame, generator: str) -> int:
    keys = {"run_id": ctx.run_id, "generator_model": generator}
    ctx.write(rows, "synthetic_serps", keys)
    return ctx.rows_written("synthetic_serps", keys)
