"""The pipeline's stages as functions of (session, config, warehouse, run id).

Each job in jobs/ runs one of these; jobs/pipeline.py runs them in order in one
session. Every stage reads and writes Delta tables only, and records its run.
"""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from functools import reduce

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from clickeval_spark import ingest, tables
from clickeval_spark.config import SPLITS, AppConfig, config_as_dict, resolve_location
from clickeval_spark.errors import ClickevalError, InputError
from clickeval_spark.generation import generate
from clickeval_spark.metrics import external, ndcg
from clickeval_spark.metrics.click_prediction import clipped, log_lik
from clickeval_spark.metrics.distributional import coverage, fit_surrogate, perplexity
from clickeval_spark.metrics.evaluate import MetricOptions, compute_metrics, metrics_frame
from clickeval_spark.metrics.summary import metrics_table
from clickeval_spark.models import get_model
from clickeval_spark.models.params_io import from_param_rows, to_param_rows
from clickeval_spark.models.predict import predict_clicks, relevance_scores
from clickeval_spark.models.priors import model_prior
from clickeval_spark.models.spark_em import fit, pack_serps
from clickeval_spark.progress import stage
from clickeval_spark.report import build_report, write_text
from clickeval_spark.runs import recorded_run
from clickeval_spark.sources import synthetic

log = logging.getLogger("clickeval")


@stage("ingest")
def ingest_stage(spark: SparkSession, cfg: AppConfig, warehouse: str, run_id: str) -> dict[str, int]:
    icfg = cfg.ingest
    with recorded_run(spark, warehouse, run_id, "ingest", icfg.dataset, config_as_dict(cfg)) as run:
        if icfg.format == "synthetic":
            parsed_serps, labels = synthetic.generate(spark, icfg, warehouse, run_id)
        else:
            parsed_serps, labels = ingest.parse_serps(spark, icfg), ingest.parse_labels(spark, icfg)
        out = ingest.run_ingest(spark, icfg, parsed_serps, labels, run_id)
        try:
            counts, refused = ingest.quarantine_check(out, icfg)
            run.counts.update(out.counts, **counts)
            if refused:
                raise InputError(refused)
            # the (dataset, log_date) slices this ingest replaced; null: the undated slice
            run.details["log_dates"] = sorted(out.log_dates, key=lambda d: (d is None, d or date.min))
            run.counts.update(ingest.write_ingest(spark, out, warehouse, icfg.dataset, run_id))
        finally:
            out.quarantine.unpersist()
    print(f"ingest {icfg.dataset} run_id={run_id}: " + ", ".join(f"{k}={v}" for k, v in sorted(run.counts.items())))
    return run.counts


def _serps(spark: SparkSession, warehouse: str, cfg: AppConfig, splits: tuple[str, ...] = SPLITS) -> DataFrame:
    """The dataset's SERPs of `splits` in the configured log_date window: what every stage after ingest reads."""
    return tables.read_table(spark, warehouse, "serps").where(
        (F.col("dataset") == cfg.ingest.dataset) & F.col("split").isin(*splits) & tables.in_window(cfg.window)
    )


def _labels(spark: SparkSession, warehouse: str, cfg: AppConfig) -> DataFrame | None:
    """The dataset's labels; with a window, the dated ones of its days and every undated one."""
    if not DeltaTable.isDeltaTable(spark, tables.table_path(warehouse, "relevance_labels")):
        return None
    return tables.read_table(spark, warehouse, "relevance_labels").where(
        (F.col("dataset") == cfg.ingest.dataset) & tables.in_window(cfg.window, undated=True))


def _outside_window(spark: SparkSession, warehouse: str, cfg: AppConfig, external_rows: DataFrame) -> DataFrame:
    """External rows (predictions, sequences) without those of the dataset's SERPs outside the window:
    they are not evaluated in this run. A serp_id the dataset does not have at all still fails the checks."""
    if cfg.window is None or "serp_id" not in external_rows.columns:
        return external_rows
    outside = tables.read_table(spark, warehouse, "serps").where(
        (F.col("dataset") == cfg.ingest.dataset) & ~tables.in_window(cfg.window)).select(F.col("serp_id").alias("_out"))
    return external_rows.join(outside, on=F.col("serp_id").cast("string") == F.col("_out"), how="left_anti")


@stage("fit")
def fit_stage(spark: SparkSession, cfg: AppConfig, warehouse: str, run_id: str) -> dict[str, list]:
    """Fit every configured model on the train split; write model_params (one slice per model).

    The valid split is packed beside the training SERPs: every fit scores it in the
    same passes, which is what `fit.prior.k: auto` chooses the prior strength by.
    """
    fcfg = cfg.fit
    train = _serps(spark, warehouse, cfg, ("train",))
    valid = _serps(spark, warehouse, cfg, ("valid",))
    histories = {}
    # packed once: every model's EM runs on the same query blocks
    packed = pack_serps(train, max_rank=fcfg.max_rank, held_out=valid)
    try:
        for name in fcfg.models:
            with recorded_run(spark, warehouse, run_id, f"fit:{name}", cfg.ingest.dataset,
                              config_as_dict(cfg)) as run:
                model = get_model(name)
                kind, k, families = fcfg.prior_overrides(name)
                fitted = fit(packed, model, iterations=fcfg.iterations, tol=fcfg.tol,
                             prior=model_prior(model, packed.max_rank, kind, k, families),
                             k_grid=fcfg.prior.grid, prior_warmup=fcfg.prior.warmup, logger=log,
                             checkpoint_interval=fcfg.checkpoint_interval)
                tables.replace_slice(to_param_rows(fitted, run_id), warehouse, "model_params",
                                     {"run_id": run_id, "model": name}, run_id)
                run.counts["iterations"] = max(0, len(fitted.history) - 1)
                run.details["history"] = [{"iteration": i, "train_ll": ll, "log_posterior": lp, "seconds": s}
                                          for (i, ll, s), lp in zip(fitted.history, fitted.log_posterior)]
                run.details["prior"] = fitted.prior_spec
                run.details["valid_ll"] = fitted.valid_ll
                if fitted.selection is not None:
                    run.details["prior_selection"] = fitted.selection
                histories[name] = fitted.history
            chosen = (f", prior k={fitted.selection['chosen_k']:g} by valid LL" if fitted.selection
                      else f", prior {fitted.prior_spec['kind']}")
            valid_ll = "" if fitted.valid_ll is None else f", valid LL per position {fitted.valid_ll:.4f}"
            print(f"fit {name}: {run.counts['iterations']} iteration(s), "
                  f"train LL per SERP {fitted.history[-1][1]:.4f}{valid_ll}{chosen}")
    finally:
        packed.unpersist()
    return histories


def log_likelihood_by_split(predictions: DataFrame, eps: float = 1e-6) -> dict[str, float]:
    """Mean per-position log-likelihood of p_click_cond (DESIGN §5 LL), per split: a small global aggregate."""
    ll = log_lik(clipped("p_click_cond", eps))
    return {r["split"]: r["ll"] for r in predictions.groupBy("split").agg(F.avg(ll).alias("ll")).collect()}


def fitted_model(params: DataFrame, name: str, run_id: str, max_rank: int):
    """Model `name` of run `run_id` from model_params. A run or model never fitted, or a model name the
    code does not know, is a user error: one line saying what to run, not a traceback."""
    try:
        model = get_model(name)
    except ValueError as exc:
        raise ClickevalError(f"model_params: {exc}") from None
    try:
        return from_param_rows(params, model, run_id, max_rank)
    except ValueError as exc:
        if params.where((F.col("run_id") == run_id) & (F.col("model") == name)).limit(1).count() == 0:
            raise ClickevalError(f"run {run_id}: no model_params for model {name}; "
                                 f"run `clickeval fit --run-id {run_id}` first") from None
        raise ClickevalError(f"run {run_id}: {exc}; rerun `clickeval fit --run-id {run_id}`") from None


@stage("predict")
def predict_stage(spark: SparkSession, cfg: AppConfig, warehouse: str, run_id: str) -> dict[str, dict[str, float]]:
    """Predict clicks on the configured splits and score (query, doc) pairs, for every fitted model."""
    splits = tuple(dict.fromkeys(("train", *cfg.predict.splits)))
    serps = _serps(spark, warehouse, cfg, splits)
    params = tables.read_table(spark, warehouse, "model_params")
    lls = {}
    for name in cfg.fit.models:
        model = get_model(name)
        with recorded_run(spark, warehouse, run_id, f"predict:{name}", cfg.ingest.dataset,
                          config_as_dict(cfg)) as run:
            fitted = fitted_model(params, name, run_id, cfg.fit.max_rank)
            preds = predict_clicks(serps, fitted).select(
                F.lit(run_id).alias("run_id"), F.lit(name).alias("model"), "*")
            tables.replace_slice(preds, warehouse, "click_predictions", {"run_id": run_id, "model": name}, run_id)
            if model.qd_params:
                shown = serps.select("query_id", F.explode("doc_ids").alias("doc_id"))
                labels = _labels(spark, warehouse, cfg)
                if labels is not None:
                    # labelled SERPs need a score for every judged doc, seen in training or not
                    shown = shown.unionByName(labels.select("query_id", "doc_id"))
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


def _positions(serps: DataFrame, max_rank: int) -> DataFrame:
    """dataset, split, serp_id, query_id, doc_id, rank, click: one row per evaluated position."""
    return (
        serps.select("dataset", "split", "serp_id", "query_id",
                     F.posexplode(F.arrays_zip("doc_ids", "clicks")).alias("pos", "dc"))
        .where(F.col("pos") < max_rank)
        .select("dataset", "split", "serp_id", "query_id", F.col("dc.doc_ids").alias("doc_id"),
                (F.col("pos") + 1).cast("int").alias("rank"), F.col("dc.clicks").alias("click"))
    )


def import_external_models(spark: SparkSession, cfg: AppConfig, warehouse: str, run_id: str) -> dict[str, str]:
    """Check each configured external model and write it into this run's click_predictions /
    relevance_scores, so from here on it is evaluated exactly like a built-in model."""
    ecfg, max_rank = cfg.evaluate, cfg.fit.max_rank
    if not ecfg.external:
        return {}
    all_serps = _serps(spark, warehouse, cfg)
    positions = _positions(all_serps, max_rank)
    labels = _labels(spark, warehouse, cfg)
    imported = {}
    for ext in ecfg.external:
        # every check of both files runs before anything of this model is written
        raw = _outside_window(spark, warehouse, cfg, external.read_external(spark, ext.predictions, ext.format))
        preds = external.checked_predictions(raw, positions, ecfg.splits, ext)
        scores = None
        if ext.relevance_scores is not None:
            evaluated = all_serps.where(F.col("split").isin(*ecfg.splits))
            needed = (ndcg.graded_docs(evaluated, labels, max_rank, ecfg.ndcg_gain) if labels is not None
                      else spark.createDataFrame([], "query_id string, doc_id string"))
            scores = external.checked_scores(external.read_external(spark, ext.relevance_scores, ext.format),
                                             needed, ext)
        tables.replace_slice(preds.select(F.lit(run_id).alias("run_id"), "*"), warehouse, "click_predictions",
                             {"run_id": run_id, "model": ext.name}, run_id)
        if scores is None:
            imported[ext.name] = "predictions only (no relevance_scores: no NDCG)"
            continue
        tables.replace_slice(scores.select(F.lit(run_id).alias("run_id"), "*"), warehouse, "relevance_scores",
                             {"run_id": run_id, "model": ext.name}, run_id)
        imported[ext.name] = "predictions and relevance scores"
    return imported


@stage("evaluate")
def evaluate_stage(spark: SparkSession, cfg: AppConfig, warehouse: str, run_id: str) -> list[dict]:
    """LL, PPL@t, NDCG@k with bootstrap intervals for every model of the run → metrics (DESIGN §5)."""
    ecfg, dataset = cfg.evaluate, cfg.ingest.dataset
    models = cfg.evaluated_models
    with recorded_run(spark, warehouse, run_id, "evaluate", dataset, config_as_dict(cfg)) as run:
        run.details["external"] = import_external_models(spark, cfg, warehouse, run_id)
        serps = _serps(spark, warehouse, cfg, ecfg.splits)
        preds = tables.read_table(spark, warehouse, "click_predictions").where(
            (F.col("run_id") == run_id) & (F.col("dataset") == dataset)
            & F.col("split").isin(*ecfg.splits) & F.col("model").isin(*models))
        scores = tables.read_table(spark, warehouse, "relevance_scores").where(
            (F.col("run_id") == run_id) & F.col("model").isin(*models))
        ranked = sorted({r["model"] for r in scores.select("model").distinct().collect()})
        reference = ecfg.reference_model if ecfg.reference_model in models else None
        if ecfg.reference_model and reference is None:
            run.details["reference_model"] = f"{ecfg.reference_model} is not evaluated in this run: no _diff rows"
        opts = MetricOptions(max_rank=cfg.fit.max_rank, eps=ecfg.eps, replicates=ecfg.replicates, seed=ecfg.seed,
                             confidence=ecfg.confidence, ndcg_cutoffs=tuple(ecfg.ndcg_cutoffs),
                             ndcg_gain=ecfg.ndcg_gain, ndcg_ideal=ecfg.ndcg_ideal)
        rows = compute_metrics(preds.select("model", "dataset", "split", "serp_id", "rank", "click",
                                            "p_click_cond", "p_click"),
                               serps, _labels(spark, warehouse, cfg), scores.select("model", "query_id", "doc_id", "score"),
                               ranked, opts, reference)
        # checked on the result rather than by a scan of click_predictions up front (8 s at 30M rows)
        present = {r["model"] for r in rows}
        absent = [m for m in models if m not in present]
        if absent:
            raise ClickevalError(f"run {run_id}: no click_predictions for {absent} on splits {list(ecfg.splits)} "
                                 f"of dataset {dataset}; run `clickeval predict --run-id {run_id}` first")
        tables.replace_slice(metrics_frame(spark, rows, run_id), warehouse, "metrics",
                             {"run_id": run_id, "dataset": dataset}, run_id)
        run.counts["metrics"] = len(rows)
        run.counts["models"] = len(models)
    print(f"evaluate {dataset} run_id={run_id}: {len(rows)} metric rows, {ecfg.replicates} bootstrap replicates")
    print(metrics_table(rows, models))
    return rows


@stage("generate")
def generate_stage(spark: SparkSession, cfg: AppConfig, warehouse: str, run_id: str) -> dict[str, int]:
    """K synthetic click sequences per SERP of the generation split, per generator, click mode and list order."""
    gcfg, dataset = cfg.generate, cfg.ingest.dataset
    serps = _serps(spark, warehouse, cfg, (gcfg.split,))
    params = tables.read_table(spark, warehouse, "model_params")
    written = {}
    for name in cfg.generator_models:
        t0 = time.perf_counter()
        with recorded_run(spark, warehouse, run_id, f"generate:{name}", dataset, config_as_dict(cfg)) as run:
            fitted = fitted_model(params, name, run_id, cfg.fit.max_rank)
            parts = [generate(serps, fitted, name, samples=gcfg.samples, click_mode=mode,
                              list_orders=gcfg.list_orders, seed=gcfg.seed)
                     for mode in gcfg.click_modes]
            rows = reduce(DataFrame.unionByName, parts).select(F.lit(run_id).alias("run_id"), "*")
            written[name] = _write_sequences(spark, rows, warehouse, run_id, name)
            run.counts["synthetic_serps"] = written[name]
        print(f"generate {name}: {written[name]} synthetic SERPs "
              f"({len(gcfg.click_modes)} click mode(s) x {len(gcfg.list_orders)} list order(s)), "
              f"{time.perf_counter() - t0:.1f} s")
    for ext in gcfg.external:
        t0 = time.perf_counter()
        with recorded_run(spark, warehouse, run_id, f"generate:{ext.name}", dataset, config_as_dict(cfg)) as run:
            raw = _outside_window(spark, warehouse, cfg, external.read_external(spark, ext.path, ext.format))
            seqs = external.checked_sequences(raw, serps, ext.name, ext.path)
            rows = (seqs.join(serps.drop("doc_ids", "clicks", "vtypes"), on="serp_id", how="inner")
                    .select(F.lit(run_id).alias("run_id"), F.lit(ext.name).alias("generator_model"), "*",
                            F.lit(None).cast("array<string>").alias("vtypes")))
            written[ext.name] = _write_sequences(spark, rows, warehouse, run_id, ext.name)
            run.counts["synthetic_serps"] = written[ext.name]
        print(f"generate {ext.name} (external): {written[ext.name]} synthetic SERPs, {time.perf_counter() - t0:.1f} s")
    return written


def _write_sequences(spark: SparkSession, rows: DataFrame, warehouse: str, run_id: str, generator: str) -> int:
    keys = {"run_id": run_id, "generator_model": generator}
    tables.replace_slice(rows, warehouse, "synthetic_serps", keys, run_id)
    return tables.rows_written(spark, warehouse, "synthetic_serps", keys, run_id)


@stage("surrogate")
def surrogate_stage(spark: SparkSession, cfg: AppConfig, warehouse: str, run_id: str) -> list[dict]:
    """Reverse / Forward PPL of every generator's sequences → distributional_metrics."""
    scfg, dataset, max_rank = cfg.surrogate, cfg.ingest.dataset, cfg.fit.max_rank
    surrogate = get_model(scfg.model)
    real = _serps(spark, warehouse, cfg, (cfg.generate.split,))
    synthetic = tables.read_table(spark, warehouse, "synthetic_serps").where(
        (F.col("run_id") == run_id) & (F.col("dataset") == dataset))
    variants = sorted(tuple(r) for r in synthetic.select("generator_model", "list_order", "click_mode")
                      .distinct().collect())
    if not variants:
        raise ClickevalError(f"run {run_id}: no synthetic_serps for dataset {dataset}; "
                             f"run `clickeval generate --run-id {run_id}` first")
    rows = []
    with recorded_run(spark, warehouse, run_id, "surrogate", dataset, config_as_dict(cfg)) as run:
        t0 = time.perf_counter()
        prior = model_prior(surrogate, max_rank, *cfg.fit.prior_overrides(scfg.model))
        on_real = fit_surrogate(real, surrogate, scfg.iterations, max_rank, log, prior)
        baseline = perplexity(real, on_real, scfg.eps)
        rows.append(_coverage_row(run_id, dataset, "real_log", scfg, "original", "observed", baseline, baseline,
                                  baseline.n_serps))
        print(f"surrogate {scfg.model} on the real {cfg.generate.split} SERPs: {baseline.n_serps} SERPs, "
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
            return _coverage_row(run_id, dataset, generator, scfg, order, mode, reverse, forward, baseline.n_serps)

        # the fits are independent and small next to Spark's per-job latency: run a few at once
        with ThreadPoolExecutor(max_workers=scfg.parallelism) as pool:
            rows += list(pool.map(one, variants))
        frame = spark.createDataFrame(rows, tables.DISTRIBUTIONAL_METRICS)
        tables.replace_slice(frame, warehouse, "distributional_metrics", {"run_id": run_id, "dataset": dataset}, run_id)
        run.counts["variants"] = len(variants)
    return rows


def _coverage_row(run_id, dataset, generator, scfg, order, mode, reverse, forward, n_real) -> dict:
    def finite(v: float) -> float | None:
        return None if math.isnan(v) else v

    return {"run_id": run_id, "dataset": dataset, "generator_model": generator, "surrogate_model": scfg.model,
            "variant": f"{order}/{mode}", "list_order": order, "click_mode": mode,
            "reverse_ppl": finite(reverse.total), "forward_ppl": finite(forward.total),
            "reverse_ppl_at": [finite(v) for v in reverse.at_rank], "forward_ppl_at": [finite(v) for v in forward.at_rank],
            "n_synthetic": forward.n_serps, "n_real": n_real, "surrogate_iterations": scfg.iterations}


@stage("report")
def report_stage(spark: SparkSession, cfg: AppConfig, warehouse: str, run_id: str) -> str:
    """The run's HTML report (tables + plots from metrics and distributional_metrics) → <report.path>/<run_id>.html."""
    target = f"{resolve_location(cfg.report.path).rstrip('/')}/{run_id}.html"
    with recorded_run(spark, warehouse, run_id, "report", cfg.ingest.dataset, config_as_dict(cfg)) as run:
        page = build_report(spark, warehouse, run_id, cfg.ingest.dataset, list(cfg.evaluated_models),
                            list(cfg.evaluate.ndcg_cutoffs))
        write_text(spark, target, page)
        run.details["path"] = target
        run.counts["bytes"] = len(page.encode("utf-8"))
    print(f"report: {target}")
    return target
