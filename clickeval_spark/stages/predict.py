"""Predict: click probabilities and relevance scores of every fitted model → click_predictions, relevance_scores.

Scores cover every shown or judged (query, doc) pair."""

from __future__ import annotations

import math

from pyspark.sql import functions as F

from clickeval_spark.context import StageContext
from clickeval_spark.metrics.click_prediction import observe_log_likelihood
from clickeval_spark.models.params_io import fitted_qd_rows, load_fitted
from clickeval_spark.models.predict import predict_models, relevance_models


def run(ctx: StageContext) -> dict[str, dict[str, float]]:
    cfg = ctx.cfg
    splits = tuple(dict.fromkeys(("train", *cfg.predict.splits)))
    serps = ctx.serps(splits)
    params = ctx.read("model_params")
    names = tuple(cfg.fit.models)

    # every model in one attach, one kernel pass and one write per table (one job and one commit,
    # not one per model): the models share their (query, doc) pairs
    with ctx.record("predict") as run:
        fitted = {name: load_fitted(params, name, ctx.run_id, cfg.fit.max_rank) for name in names}
        ranked = tuple(name for name, f in fitted.items() if f.model.qd_params)
        qd = fitted_qd_rows(params, ctx.run_id, fitted)
        tag = F.lit(ctx.run_id).alias("run_id")
        # the LL per split is summed by the write's own tasks, not by re-reading what it wrote
        predictions, log_likelihoods = observe_log_likelihood(predict_models(serps, fitted, qd), names, splits)
        ctx.write(predictions.select(tag, "*"), "click_predictions", {"run_id": ctx.run_id, "model": names})
        if ranked:
            shown = serps.select("query_id", F.explode("doc_ids").alias("doc_id"))
            labels = ctx.labels()
            if labels is not None:
                # labelled SERPs need a score for every judged doc, seen in training or not
                shown = shown.unionByName(labels.select("query_id", "doc_id"))
            scores = relevance_models({name: fitted[name] for name in ranked}, pairs=shown, qd=qd)
            ctx.write(scores.select(tag, "*"), "relevance_scores", {"run_id": ctx.run_id, "model": ranked})
        # GCTR / RCTR give every document the same score: no ranking to evaluate
        run.details["relevance_scores"] = {name: name in ranked for name in names}
        stats = log_likelihoods()
        lls = {}
        for name in names:
            lls[name], run.counts[f"serps_predicted:{name}"] = stats.get(name, ({}, 0))
        run.details["log_likelihood"] = lls
    for name in names:
        print(f"predict {name}: " + ", ".join(f"LL[{s}]={v:.4f}" for s, v in sorted(lls[name].items())
                                               if not math.isnan(v)))
    return lls
