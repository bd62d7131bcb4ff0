"""Predict: click probabilities and relevance scores of every fitted model → click_predictions, relevance_scores.

Scores cover every shown or judged (query, doc) pair. On a simulated dataset the true model (the
parameters the log was drawn from) is predicted beside the fitted ones as model `truth`."""

from __future__ import annotations

import math
from functools import reduce

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from clickeval_spark.context import StageContext
from clickeval_spark.metrics.click_prediction import observe_log_likelihood
from clickeval_spark.fitted.attach import wide_cols
from clickeval_spark.fitted.model import load_fitted_models
from clickeval_spark.fitted.params_io import fitted_qd_rows
from clickeval_spark.fitted.predict import predict_models, relevance_models
from clickeval_spark.sources.synthetic import TRUTH_MODEL, has_truth, load_truth, truth_param_rows


def run(ctx: StageContext) -> dict[str, dict[str, float]]:
    cfg = ctx.cfg
    splits = tuple(dict.fromkeys(("train", *cfg.predict.splits)))
    serps = ctx.serps(splits)
    params = ctx.read("model_params")
    # the slice this stage replaces: on a simulated dataset also the truth's rows, even when it has none now
    extra = (TRUTH_MODEL,) if has_truth(cfg) else ()
    written = (*cfg.fit.models, *extra)

    # every model in one attach, one kernel pass and one write per table (one job and one commit,
    # not one per model): the models share their (query, doc) pairs
    with ctx.record("predict") as run:
        fitted = load_fitted_models(params, cfg.fit.models, ctx.run_id, cfg.fit.max_rank)
        truth, run.details["truth"] = load_truth(params, cfg)
        if truth is not None:
            # the truth rides with the fitted models: its rows relabelled as this run's model `truth`
            fitted[TRUTH_MODEL] = truth
            params = params.unionByName(truth_param_rows(params, cfg, ctx.run_id))
        names = tuple(fitted)
        ranked = tuple(name for name, f in fitted.items() if f.model.qd_params)
        qd = fitted_qd_rows(params, ctx.run_id, fitted)
        tag = F.lit(ctx.run_id).alias("run_id")
        # the LL per split is summed by the write's own tasks, not by re-reading what it wrote
        predictions, log_likelihoods = observe_log_likelihood(predict_models(serps, fitted, qd), names, splits)
        ctx.write(predictions.select(tag, "*"), "click_predictions", {"run_id": ctx.run_id, "model": written})
        if ranked:
            shown = serps.select("query_id", F.explode("doc_ids").alias("doc_id"))
            labels = ctx.labels()
            if labels is not None:
                # labelled SERPs need a score for every judged doc, seen in training or not
                shown = shown.unionByName(labels.select("query_id", "doc_id"))
            own = [name for name in ranked if name != TRUTH_MODEL]
            parts = []
            if own:
                # the fitted models score the pairs of their own training log (and the shown and judged ones):
                # the rows of the wide table where one of them has a value, not the truth's whole pools
                cols = wide_cols({name: fitted[name] for name in own})
                parts.append(relevance_models({name: fitted[name] for name in own}, pairs=shown,
                                              qd=qd.where(F.coalesce(*map(F.col, cols)).isNotNull())))
            if TRUTH_MODEL in ranked:
                parts.append(relevance_models({TRUTH_MODEL: truth}, pairs=shown))
            scores = reduce(DataFrame.unionByName, parts)
            ctx.write(scores.select(tag, "*"), "relevance_scores",
                      {"run_id": ctx.run_id, "model": tuple(dict.fromkeys((*ranked, *extra)))})
        # GCTR / RCTR give every document the same score: no ranking to evaluate
        run.details["relevance_scores"] = {name: name in ranked for name in names}
        stats = log_likelihoods()
        lls = {}
        for name in names:
            lls[name], run.counts[f"serps_predicted:{name}"] = stats.get(name, ({}, 0))
        run.details["log_likelihood"] = lls
    if extra and truth is None:
        print(f"predict: {run.details['truth']}")
    for name in names:
        print(f"predict {name}: " + ", ".join(f"LL[{s}]={v:.4f}" for s, v in sorted(lls[name].items())
                                               if not math.isnan(v)))
    return lls
