"""Evaluate: LL, PPL@t and NDCG@k with bootstrap intervals for every model of the run → metrics.

DESIGN §5. Externally trained models are checked and imported into the run first. On a simulated
dataset the true model, which the predict stage wrote as model `truth`, is scored like any other."""

from __future__ import annotations

from pyspark.sql import functions as F

from clickeval_spark.context import StageContext
from clickeval_spark.errors import ClickevalError
from clickeval_spark.metrics import external, ndcg
from clickeval_spark.metrics.evaluate import MetricOptions, compute_metrics, metrics_frame
from clickeval_spark.metrics.summary import metrics_table
from clickeval_spark.sources.synthetic import TRUTH_MODEL, has_truth


def run(ctx: StageContext) -> list[dict]:
    ecfg, dataset, models = ctx.cfg.evaluate, ctx.dataset, ctx.cfg.evaluated_models
    # the true model of a simulated log, when predict wrote it (it has no rows where the truth could not be
    # loaded: predict says why); never required, never on a real dataset
    scored = (*models, TRUTH_MODEL) if has_truth(ctx.cfg) else models
    with ctx.record("evaluate") as run:
        run.details["external"] = import_external_models(ctx)
        preds = ctx.this_run("click_predictions", dataset=dataset).where(
            F.col("split").isin(*ecfg.splits) & F.col("model").isin(*scored))
        scores = ctx.this_run("relevance_scores").where(F.col("model").isin(*scored))
        ranked = sorted({r["model"] for r in scores.select("model").distinct().collect()})
        # `truth` may be the reference too: every model's paired gap to the true model
        reference = ecfg.reference_model if ecfg.reference_model in scored else None
        if ecfg.reference_model and reference is None:
            run.details["reference_model"] = f"{ecfg.reference_model} is not evaluated in this run: no _diff rows"
        rows = compute_metrics(preds.select("model", "dataset", "split", "serp_id", "clicks", "p_click_cond",
                                            "p_click"),
                               ctx.serps(ecfg.splits), ctx.labels(),
                               scores.select("model", "query_id", "doc_id", "score"),
                               ranked, MetricOptions.from_config(ecfg, ctx.cfg.fit.max_rank), reference)
        # checked on the result rather than by a scan of click_predictions up front (8 s at 30M rows)
        present = {r["model"] for r in rows}
        absent = [m for m in models if m not in present]
        if absent:
            raise ClickevalError(f"run {ctx.run_id}: no click_predictions for {absent} on splits {list(ecfg.splits)} "
                                 f"of dataset {dataset}; run `clickeval predict --run-id {ctx.run_id}` first")
        ctx.write(metrics_frame(ctx.spark, rows, ctx.run_id), "metrics", {"run_id": ctx.run_id, "dataset": dataset})
        run.counts["metrics"] = len(rows)
        run.counts["models"] = len(models)
        if scored != models:
            run.details["truth"] = TRUTH_MODEL in present
    print(f"evaluate {dataset} run_id={ctx.run_id}: {len(rows)} metric rows, {ecfg.replicates} bootstrap replicates")
    print(metrics_table(rows, scored))
    return rows


def import_external_models(ctx: StageContext) -> dict[str, str]:
    """Check each configured external model and write it into this run's click_predictions /
    relevance_scores, so from here on it is evaluated exactly like a built-in model."""
    ecfg, max_rank = ctx.cfg.evaluate, ctx.cfg.fit.max_rank
    if not ecfg.external:
        return {}
    all_serps = ctx.serps()
    labels = ctx.labels()
    imported = {}
    for ext in ecfg.external:
        keys = {"run_id": ctx.run_id, "model": ext.name}
        # every check of both files runs before anything of this model is written
        raw = ctx.outside_window(external.read_external(ctx.spark, ext.predictions, ext.format))
        preds = external.checked_predictions(raw, all_serps, max_rank, ecfg.splits, ext)
        scores = None
        if ext.relevance_scores is not None:
            evaluated = all_serps.where(F.col("split").isin(*ecfg.splits))
            needed = (ndcg.graded_docs(evaluated, labels, max_rank, ecfg.ndcg_gain) if labels is not None
                      else ctx.spark.createDataFrame([], "query_id string, doc_id string"))
            scores = external.checked_scores(external.read_external(ctx.spark, ext.relevance_scores, ext.format),
                                             needed, ext)
        ctx.write(preds.select(F.lit(ctx.run_id).alias("run_id"), "*"), "click_predictions", keys)
        if scores is None:
            imported[ext.name] = "predictions only (no relevance_scores: no NDCG)"
            continue
        ctx.write(scores.select(F.lit(ctx.run_id).alias("run_id"), "*"), "relevance_scores", keys)
        imported[ext.name] = "predictions and relevance scores"
    return imported
