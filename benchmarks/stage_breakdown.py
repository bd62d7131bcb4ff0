"""Where the ingest, predict and evaluate stages spend their time, on a warehouse `benchmarks.run` left behind.

    .venv/bin/python -m benchmarks.run --sizes 1000000            # leaves <workdir>/warehouse-1000000
    .venv/bin/python -m benchmarks.stage_breakdown --size 1000000 [--stages predict,evaluate]

Each stage is timed cumulatively, one step more each time, every step ending in Spark's `noop`
sink (the plan runs in full, nothing is written), then the stage itself as the stage runs it
(its Delta writes into a scratch warehouse): the differences say what each step costs. Each
step runs twice in one session; the table shows the second (warm) time and the first.

Ingest's last step before the stage is its floor: the same checked rows written by a plain Delta write into
an empty table, without what the stage adds around it (the day slices' replaceWhere into the existing
table, the quarantine, the reconciliation and the `runs` row). The single-process reference
(benchmarks/stage_reference.py) runs twice in the same session, first and last, and each ingest row shows
its ratio to the reference's warm time (the bound of issue 36: at least 0.4).
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from benchmarks import stage_reference as SR
from clickeval_spark import ingestion
from clickeval_spark.config import PROJECT_ROOT, load_config
from clickeval_spark.context import StageContext
from clickeval_spark.metrics import click_prediction
from clickeval_spark.metrics.evaluate import MetricOptions, statistic_replicates
from clickeval_spark.fitted.attach import attach_qd, truncate_serps, wide_cols, wide_prior
from clickeval_spark.fitted.model import load_fitted_models
from clickeval_spark.fitted.params_io import wide_qd_rows
from clickeval_spark.fitted.predict import predict_models
from clickeval_spark.runtime import session_for
from clickeval_spark.sources.files import split_lines
from clickeval_spark.stages import STAGES


def _noop(df: DataFrame) -> None:
    df.write.format("noop").mode("overwrite").save()


def _twice(label: str, fn, out: list) -> None:
    times = []
    for _ in range(2):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    out.append((label, times[1], times[0]))
    print(f"{label}: {times[1]:.1f} s (first {times[0]:.1f} s)", flush=True)


def ingest_steps(ctx: StageContext, text_cfg, scratch: Path, out: list) -> None:
    icfg = text_cfg.ingest
    parsed = lambda: ingestion.parse_serps(ctx.spark, icfg)  # noqa: E731
    # the reader's Arrow pass is opaque to Spark: selecting fewer of its columns would still run all of it
    _twice("ingest: read the lines (text -> raw rows)", lambda: _noop(split_lines(ctx.spark, icfg.paths["all"])), out)
    _twice("ingest: + parse the fields and lists, number lines and sessions within file splits",
           lambda: _noop(parsed()), out)

    def checked() -> None:
        o = ingestion.run_ingest(ctx.spark, icfg, parsed(), None, "breakdown")
        _noop(o.serps)
        o.release()
    _twice("ingest: + rules, splits, persist, per-file counts, sessions spanning file splits (accepted rows)",
           checked, out)

    def written() -> None:
        shutil.rmtree(scratch, ignore_errors=True)
        o = ingestion.run_ingest(ctx.spark, icfg, parsed(), None, "breakdown")
        o.serps.write.format("delta").save(str(scratch))
        o.release()
    _twice("ingest: + the accepted rows written to an empty Delta table (the floor: no replaceWhere, quarantine "
           "or runs row)", written, out)
    shutil.rmtree(scratch, ignore_errors=True)


def ingest_reference(text_cfg, directory: Path, out: list) -> None:
    """The single-process reference of the ingest (pyarrow + numpy, Parquet out) on the same text file."""
    icfg = text_cfg.ingest
    directory.mkdir(parents=True, exist_ok=True)
    _twice("ingest: single-process reference (pyarrow + numpy, one Parquet file)",
           lambda: SR.ingest(icfg.paths["all"], directory / "reference.parquet", dataset=icfg.dataset,
                             max_rank=icfg.max_rank, split_seed=icfg.split.seed, ratios=icfg.split.ratios), out)


def predict_steps(ctx: StageContext, out: list) -> None:
    cfg = ctx.cfg
    serps = ctx.serps(tuple(dict.fromkeys(("train", *cfg.predict.splits))))
    params = ctx.read("model_params")
    fitted = load_fitted_models(params, cfg.fit.models, ctx.run_id, cfg.fit.max_rank)
    qd = wide_qd_rows(params, ctx.run_id, {n: f.model for n, f in fitted.items() if f.model.qd_params})
    cols, prior = wide_cols(fitted), wide_prior(fitted)
    _twice("predict: read the SERPs (N rows)", lambda: _noop(serps.select("serp_id", "doc_ids", "clicks")), out)

    def attached() -> None:
        base = truncate_serps(serps, cfg.fit.max_rank, keep=("dataset", "split", "serp_id"))
        _noop(attach_qd(base, qd, cols, prior))
    _twice(f"predict: + attach every model's qd parameters at once ({len(fitted)} models)", attached, out)
    _twice("predict: + the kernels in Python (mapInArrow), every model",
           lambda: _noop(predict_models(serps, fitted, qd)), out)


def evaluate_steps(ctx: StageContext, out: list) -> None:
    ecfg, models = ctx.cfg.evaluate, ctx.cfg.evaluated_models
    opts = MetricOptions.from_config(ecfg, ctx.cfg.fit.max_rank)
    preds = ctx.this_run("click_predictions", dataset=ctx.dataset).where(
        F.col("split").isin(*ecfg.splits) & F.col("model").isin(*models))
    scores = ctx.this_run("relevance_scores").where(F.col("model").isin(*models)).select(
        "model", "query_id", "doc_id", "score")
    ranked = sorted({r["model"] for r in scores.select("model").distinct().collect()})
    _twice("evaluate: read click_predictions", lambda: _noop(preds), out)

    def replicates(with_ndcg: bool):
        return statistic_replicates(preds.select("model", "dataset", "split", "serp_id", "clicks", "p_click_cond",
                                                 "p_click"), ctx.serps(ecfg.splits), ctx.labels() if with_ndcg else None,
                                    scores, ranked, opts)[0]
    sessions = ctx.serps(ecfg.splits).select("dataset", "serp_id", "session_id")
    _twice("evaluate: + per-SERP click statistics, joined to their sessions",
           lambda: _noop(click_prediction.serp_session_stats(preds, sessions, opts.max_rank, opts.eps)), out)
    _twice(f"evaluate: + their {opts.replicates} bootstrap replicates (collected sums)",
           lambda: replicates(False).collect(), out)
    _twice("evaluate: + NDCG per labelled SERP and its replicates (collected sums)",
           lambda: replicates(True).collect(), out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--workdir", default="/tmp/clickeval-bench")
    ap.add_argument("--stages", default="ingest,predict,evaluate", help="which of ingest, predict, evaluate")
    args = ap.parse_args(argv)
    stages = args.stages.split(",")
    n, workdir = args.size, Path(args.workdir)
    wh = str(workdir / f"warehouse-{n}")
    conf = PROJECT_ROOT / "conf" / "bench.yaml"
    cfg = load_config(conf, {"ingest.dataset": f"bench-{n}", "spark.warehouse": wh})
    [text] = (workdir / f"reference-{n}" / "text").glob("part-*")
    text_cfg = load_config(conf, {"ingest.dataset": f"bench-{n}-text", "ingest.format": "per_query_text",
                                  "ingest.paths": {"all": str(text)}, "ingest.text_variant": "graphcm"})
    spark = session_for(cfg, "stage-breakdown")
    out: list = []
    scratch = workdir / "breakdown-scratch"
    try:
        ctx = StageContext(spark, cfg, wh, f"bench-{n}")
        if "ingest" in stages:
            ingest_reference(text_cfg, workdir / "breakdown-reference", out)
        steps = {"ingest": lambda: ingest_steps(ctx, text_cfg, scratch / "floor", out),
                 "predict": lambda: predict_steps(ctx, out),
                 "evaluate": lambda: evaluate_steps(ctx, out)}
        for stage in stages:
            steps[stage]()
        # the stages themselves, writing into a scratch copy of the warehouse (ingest: of the text file)
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.copytree(wh, scratch)
        copy = StageContext(spark, cfg, str(scratch), f"bench-{n}")
        whole = {"ingest": ("ingest stage (text log, Delta writes and counts)",
                            StageContext(spark, text_cfg, str(scratch), f"bench-{n}-text")),
                 "predict": ("predict stage (Delta writes, LL re-read, relevance scores)", copy),
                 "evaluate": ("evaluate stage (Delta write)", copy)}
        for stage in stages:
            label, stage_ctx = whole[stage]
            _twice(label, lambda: STAGES[stage](stage_ctx), out)
        if "ingest" in stages:
            ingest_reference(text_cfg, workdir / "breakdown-reference", out)
    finally:
        spark.stop()
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(workdir / "breakdown-reference", ignore_errors=True)
    print(f"\n`.venv/bin/python -m benchmarks.stage_breakdown --size {n}`, {n:,} SERPs:\n")
    # the reference's warm time, the better of its two pairs of runs (first and last in the session)
    reference = min((warm for label, warm, _ in out if "reference" in label), default=None)
    print("| step (cumulative) | s (second run) | s (first run) | reference / step |\n|---|---|---|---|")
    for label, warm, first in out:
        ratio = f"{reference / warm:.3f}" if reference and label.startswith("ingest") and "reference" not in label else ""
        print(f"| {label} | {warm:.1f} | {first:.1f} | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
