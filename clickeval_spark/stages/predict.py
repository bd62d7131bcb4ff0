"""Predict: click probabilities and relevance scores of every fitted model → click_predictions, relevance_scores.

Scores cover every shown or judged (query, doc) pair."""

from __future__ import annotations

import math

from pyspark.sql import functions as F

from clickeval_spark.context import StageContext
from clickeval_spark.metrics.click_prediction import log_likelihood_by_split
from clickeval_spark.models.params_io import load_fitted


def run(ctx: StageContext) -> dict[str, dict[str, float]]:
    cfg = ctx.cfg
    serps = ctx.serps(tuple(dict.fromkeys(("train", *cfg.predict.splits))))
    params = ctx.read("model_params")
    lls = {}
    for name in cfg.fit.models:
        keys = {"run_id": ctx.run_id, "model": name}
        with ctx.record(f"predict:{name}") as run:
            fitted = load_fitted(params, name, ctx.run_id, cfg.fit.max_rank)
            preds = fitted.predict(serps).select(F.lit(ctx.run_id).alias("run_id"), F.lit(name).alias("model"), "*")
            ctx.write(preds, "click_predictions", keys)
            if fitted.model.qd_params:
                shown = serps.select("query_id", F.explode("doc_ids").alias("doc_id"))
                labels = ctx.labels()
                if labels is not None:
                    # labelled SERPs need a score for every judged doc, seen in training or not
                    shown = shown.unionByName(labels.select("query_id", "doc_id"))
                scores = fitted.relevance(pairs=shown).select(
                    F.lit(ctx.run_id).alias("run_id"), F.lit(name).alias("model"), "*")
                ctx.write(scores, "relevance_scores", keys)
            else:  # GCTR / RCTR give every document the same score: no ranking to evaluate
                run.details["relevance_scores"] = "none: the model has no per-(query, doc) parameter"
            lls[name] = log_likelihood_by_split(ctx.this_run("click_predictions", model=name))
            run.details["log_likelihood"] = lls[name]
            run.counts["serps_predicted"] = ctx.rows_written("click_predictions", keys)
        print(f"predict {name}: " + ", ".join(f"LL[{s}]={v:.4f}" for s, v in sorted(lls[name].items())
                                               if not math.isnan(v)))
    return lls
