"""The pipeline's stages as functions of (session, config, warehouse, run id).

Each job in jobs/ runs one of these; jobs/pipeline.py runs them in order in one
session. Every stage reads and writes Delta tables only, and records its run.
"""

from __future__ import annotations

import logging
import math

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from clickeval_spark import ingest, tables
from clickeval_spark.config import AppConfig, config_as_dict
from clickeval_spark.models import get_model
from clickeval_spark.models.params_io import from_param_rows, to_param_rows
from clickeval_spark.models.predict import predict_clicks, relevance_scores
from clickeval_spark.models.spark_em import fit
from clickeval_spark.runs import recorded_run
from clickeval_spark.sources import synthetic

log = logging.getLogger("clickeval")


def ingest_stage(spark: SparkSession, cfg: AppConfig, warehouse: str, run_id: str) -> dict[str, int]:
    icfg = cfg.ingest
    with recorded_run(spark, warehouse, run_id, "ingest", icfg.dataset, config_as_dict(cfg)) as run:
        if icfg.format == "synthetic":
            parsed_serps, labels = synthetic.generate(spark, icfg, warehouse, run_id)
        else:
            parsed_serps, labels = ingest.parse_serps(spark, icfg), ingest.parse_labels(spark, icfg)
        out = ingest.run_ingest(spark, icfg, parsed_serps, labels, run_id)
        run.counts.update(ingest.write_ingest(spark, out, warehouse, icfg.dataset, run_id))
    print(f"ingest {icfg.dataset} run_id={run_id}: " + ", ".join(f"{k}={v}" for k, v in sorted(run.counts.items())))
    return run.counts


def _serps(spark: SparkSession, warehouse: str, dataset: str, splits: tuple[str, ...]) -> DataFrame:
    return tables.read_table(spark, warehouse, "serps").where(
        (F.col("dataset") == dataset) & F.col("split").isin(*splits)
    )


def fit_stage(spark: SparkSession, cfg: AppConfig, warehouse: str, run_id: str) -> dict[str, list]:
    """Fit every configured model on the train split; write model_params (one slice per model)."""
    train = _serps(spark, warehouse, cfg.ingest.dataset, ("train",))
    histories = {}
    for name in cfg.fit.models:
        with recorded_run(spark, warehouse, run_id, f"fit:{name}", cfg.ingest.dataset, config_as_dict(cfg)) as run:
            fitted = fit(train, get_model(name), iterations=cfg.fit.iterations, tol=cfg.fit.tol,
                         max_rank=cfg.fit.max_rank, logger=log)
            tables.replace_slice(to_param_rows(fitted, run_id), warehouse, "model_params",
                                 {"run_id": run_id, "model": name}, run_id)
            run.counts["iterations"] = max(0, len(fitted.history) - 1)
            run.details["history"] = [{"iteration": i, "train_ll": ll, "seconds": s} for i, ll, s in fitted.history]
            run.details["prior"] = fitted.prior
            histories[name] = fitted.history
        last = fitted.history[-1]
        print(f"fit {name}: {run.counts['iterations']} iteration(s), train LL per SERP {last[1]:.4f}")
    return histories


def log_likelihood_by_split(predictions: DataFrame, eps: float = 1e-6) -> dict[str, float]:
    """Mean per-position log-likelihood of p_click_cond (DESIGN §5 LL), per split: a small global aggregate."""
    p = F.least(F.greatest(F.col("p_click_cond"), F.lit(eps)), F.lit(1 - eps))
    ll = F.when(F.col("click") == 1, F.log(p)).otherwise(F.log(1 - p))
    return {r["split"]: r["ll"] for r in predictions.groupBy("split").agg(F.avg(ll).alias("ll")).collect()}


def predict_stage(spark: SparkSession, cfg: AppConfig, warehouse: str, run_id: str) -> dict[str, dict[str, float]]:
    """Predict clicks on the configured splits and score (query, doc) pairs, for every fitted model."""
    splits = tuple(dict.fromkeys(("train", *cfg.predict.splits)))
    serps = _serps(spark, warehouse, cfg.ingest.dataset, splits)
    params = tables.read_table(spark, warehouse, "model_params")
    lls = {}
    for name in cfg.fit.models:
        model = get_model(name)
        with recorded_run(spark, warehouse, run_id, f"predict:{name}", cfg.ingest.dataset,
                          config_as_dict(cfg)) as run:
            fitted = from_param_rows(params, model, run_id, cfg.fit.max_rank)
            preds = predict_clicks(serps, fitted).select(
                F.lit(run_id).alias("run_id"), F.lit(name).alias("model"), "*")
            tables.replace_slice(preds, warehouse, "click_predictions", {"run_id": run_id, "model": name}, run_id)
            if model.qd_params:
                shown = serps.select("query_id", F.explode("doc_ids").alias("doc_id"))
                if DeltaTable.isDeltaTable(spark, tables.table_path(warehouse, "relevance_labels")):
                    # labelled SERPs need a score for every judged doc, seen in training or not
                    shown = shown.unionByName(tables.read_table(spark, warehouse, "relevance_labels")
                                              .where(F.col("dataset") == cfg.ingest.dataset)
                                              .select("query_id", "doc_id"))
                scores = relevance_scores(fitted, pairs=shown).select(
                    F.lit(run_id).alias("run_id"), F.lit(name).alias("model"), "*")
                tables.replace_slice(scores, warehouse, "relevance_scores", {"run_id": run_id, "model": name}, run_id)
            else:  # GCTR / RCTR give every document the same score: no ranking to evaluate
                run.details["relevance_scores"] = "none: the model has no per-(query, doc) parameter"
            written = tables.read_table(spark, warehouse, "click_predictions").where(
                (F.col("run_id") == run_id) & (F.col("model") == name))
            lls[name] = log_likelihood_by_split(written)
            run.details["log_likelihood"] = lls[name]
            run.counts["predictions"] = written.count()
        print(f"predict {name}: " + ", ".join(f"LL[{s}]={v:.4f}" for s, v in sorted(lls[name].items())
                                               if not math.isnan(v)))
    return lls
