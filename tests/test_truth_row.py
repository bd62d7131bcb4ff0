"""The truth row: on a simulated log the true model is scored beside the fitted ones as model `truth`
(predict → evaluate), checked against a numpy computation from the simulation's own parameters; a real
dataset gets none."""

from __future__ import annotations

import numpy as np
import pytest
from pyspark.sql import functions as F

from clickeval_spark import tables
from clickeval_spark.config import (AppConfig, EvaluateConfig, ExternalModelConfig, FitConfig, IngestConfig,
                                    PredictConfig, SplitConfig, SyntheticConfig)
from clickeval_spark.context import StageContext
from clickeval_spark.errors import ClickevalError
from clickeval_spark.metrics.summary import metrics_table
from clickeval_spark.sources import synthetic
from clickeval_spark.stages import STAGES

RUN = "truth-run"
EPS = 1e-6
M = 10


def _config(**ingest) -> AppConfig:
    ingest = {"dataset": "sim-pbm", "format": "synthetic",
              "split": SplitConfig(seed=3, ratios={"train": 2.0, "test": 1.0}),
              "synthetic": SyntheticConfig(model="pbm", n_serps=600, n_queries=20, docs_per_query=12, seed=9,
                                           labels="serp", label_fraction=0.5),
              **ingest}
    return AppConfig(ingest=IngestConfig(**ingest), fit=FitConfig(models=("rctr", "pbm"), iterations=2),
                     predict=PredictConfig(splits=("test",)),
                     evaluate=EvaluateConfig(replicates=20, reference_model="rctr"))


@pytest.fixture(scope="module")
def simulated(spark, tmp_path_factory):
    warehouse = str(tmp_path_factory.mktemp("wh_truth"))
    cfg = _config()
    for stage in ("ingest", "fit", "predict"):
        STAGES[stage](StageContext(spark, cfg, warehouse, RUN))
    rows = STAGES["evaluate"](StageContext(spark, cfg, warehouse, RUN))
    return warehouse, cfg, rows


def _metric(rows, model, metric, cutoff=None):
    [row] = [r for r in rows if (r["model"], r["metric"], r["cutoff"], r["reference_model"]) ==
             (model, metric, cutoff, None)]
    return row


def _numpy_truth(spark, warehouse, cfg):
    """LL, PPL@t and total PPL of the true PBM on the test SERPs, from the simulation's parameters themselves
    (`synthetic.true_qd`, `true_globals`: not the stored model_params, not the prediction code): PBM's
    P(C_r = 1) = gamma_r * alpha(q, d), with or without the clicks above."""
    scfg = cfg.ingest.synthetic
    alpha = {(r["query_id"], r["doc_id"]): r["alpha"] for r in synthetic.true_qd(spark, scfg).collect()}
    gamma = synthetic.true_globals("pbm", scfg.list_size)["gamma"]
    test = (tables.read_table(spark, warehouse, "serps")
            .where((F.col("dataset") == cfg.ingest.dataset) & (F.col("split") == "test")).collect())
    p = np.array([[gamma[r] * alpha[(s["query_id"], d)] for r, d in enumerate(s["doc_ids"])] for s in test])
    c = np.array([s["clicks"] for s in test])
    q = np.clip(p, EPS, 1 - EPS)
    ln = np.where(c == 1, np.log(q), np.log(1 - q))
    ppl_at = np.exp(-ln.mean(axis=0))
    return {"LL": ln.mean(), "PPL": ppl_at.mean(), "PPL_at": ppl_at, "n": len(test)}


@pytest.mark.slow
def test_truth_row_equals_a_numpy_computation_from_the_true_parameters(spark, simulated):
    warehouse, cfg, rows = simulated
    expected = _numpy_truth(spark, warehouse, cfg)
    ll = _metric(rows, "truth", "LL")
    print(f"truth LL {ll['value']:.6f} (numpy {expected['LL']:.6f}), fitted pbm {_metric(rows, 'pbm', 'LL')['value']:.6f}")
    assert ll["value"] == pytest.approx(expected["LL"], rel=1e-9)
    assert ll["n"] == expected["n"] and ll["ci_low"] < ll["value"] < ll["ci_high"]
    for metric in ("PPL", "PPL_cond"):   # PBM: a click does not depend on the clicks above
        assert _metric(rows, "truth", metric)["value"] == pytest.approx(expected["PPL"], rel=1e-9)
        for t in range(1, M + 1):
            assert _metric(rows, "truth", metric, t)["value"] == pytest.approx(expected["PPL_at"][t - 1], rel=1e-9)
    # the same columns and paired rows as a fitted model
    assert ({(r["metric"], r["cutoff"]) for r in rows if r["model"] == "truth"}
            == {(r["metric"], r["cutoff"]) for r in rows if r["model"] == "pbm"})


@pytest.mark.slow
def test_truth_ranks_by_the_relevance_the_labels_were_graded_from(simulated):
    """The simulated grades are floor(5 * alpha), the truth's relevance is alpha: its ranking is ideal."""
    _, cfg, rows = simulated
    for k in cfg.evaluate.ndcg_cutoffs:
        ndcg = _metric(rows, "truth", "NDCG", k)
        assert ndcg["value"] == pytest.approx(1.0, abs=1e-12) and ndcg["n"] > 10, k
    assert _metric(rows, "pbm", "NDCG", 10)["value"] < 1.0


@pytest.mark.slow
def test_truth_is_in_the_tables_and_the_printed_table(spark, simulated):
    warehouse, cfg, rows = simulated
    preds = tables.read_table(spark, warehouse, "click_predictions").where(F.col("run_id") == RUN)
    counts = dict(preds.groupBy("model").count().collect())
    assert counts["truth"] == counts["pbm"] > 0
    scores = tables.read_table(spark, warehouse, "relevance_scores").where(F.col("run_id") == RUN)
    assert {r["model"] for r in scores.select("model").distinct().collect()} == {"pbm", "truth"}
    stored = tables.read_table(spark, warehouse, "metrics").where(
        (F.col("run_id") == RUN) & (F.col("model") == "truth") & (F.col("metric") == "LL")).first()
    assert stored["value"] == _metric(rows, "truth", "LL")["value"]
    last = metrics_table(rows, cfg.evaluated_models).splitlines()[-1]
    assert last.startswith("truth ") and f"{_metric(rows, 'truth', 'LL')['value']:.4f}" in last
    # the truth's parameters are never written as this run's model_params (fit's rows only)
    params = tables.read_table(spark, warehouse, "model_params").where(F.col("run_id") == RUN)
    assert {r["model"] for r in params.select("model").distinct().collect()} == {"rctr", "pbm"}


@pytest.mark.slow
def test_a_real_dataset_gets_no_truth_row(spark, simulated, tmp_path):
    """The same SERPs ingested as canonical Parquet are a real log: nothing named truth anywhere."""
    warehouse, _, _ = simulated
    path = str(tmp_path / "serps.parquet")
    (tables.read_table(spark, warehouse, "serps").where(F.col("dataset") == "sim-pbm")
     .select("split", "session_id", "serp_id", "serp_pos", "query_id", "doc_ids", "clicks").write.parquet(path))
    cfg = _config(dataset="copy", format="parquet", paths={"all": path})
    cfg = AppConfig(ingest=cfg.ingest, fit=FitConfig(models=("rctr",), iterations=1), predict=cfg.predict,
                    evaluate=EvaluateConfig(replicates=5, reference_model=None))
    run = "real-run"
    for stage in ("ingest", "fit", "predict", "evaluate"):
        STAGES[stage](StageContext(spark, cfg, warehouse, run))
    for name in ("click_predictions", "metrics"):
        models = {r["model"] for r in tables.read_table(spark, warehouse, name)
                  .where(F.col("run_id") == run).select("model").distinct().collect()}
        assert models == {"rctr"}, name


@pytest.mark.slow
def test_truth_is_skipped_with_a_reason_when_it_cannot_cover_the_ranks(spark, simulated):
    warehouse, cfg, _ = simulated
    params = tables.read_table(spark, warehouse, "model_params")
    longer = AppConfig(ingest=cfg.ingest, fit=FitConfig(models=("pbm",), max_rank=12))
    truth, why = synthetic.load_truth(params, longer)
    assert truth is None and "fewer than fit.max_rank=12" in why
    # shorter lists than simulated: the truth of the first ranks only
    truth, _ = synthetic.load_truth(params, AppConfig(ingest=cfg.ingest, fit=FitConfig(models=("pbm",), max_rank=4)))
    assert truth is not None and truth.glob["gamma"].shape == (4,)
    np.testing.assert_allclose(truth.glob["gamma"], synthetic.true_globals("pbm", 10)["gamma"][:4])
    other = AppConfig(ingest=IngestConfig(dataset="never-ingested", format="synthetic"))
    truth, why = synthetic.load_truth(params, other)
    assert truth is None and "truth-never-ingested" in why
    assert synthetic.load_truth(params, AppConfig(ingest=IngestConfig(dataset="x", format="parquet",
                                                                      paths={"all": "x"})))[0] is None


@pytest.mark.slow
def test_an_external_model_named_truth_on_a_simulated_log_is_refused():
    cfg = _config()
    cfg = AppConfig(ingest=cfg.ingest, fit=cfg.fit, predict=cfg.predict,
                    evaluate=EvaluateConfig(external=(ExternalModelConfig(name="truth", predictions="x"),)))
    with pytest.raises(ClickevalError, match="rename the external model"):
        synthetic.has_truth(cfg)


@pytest.mark.slow
def test_truth_can_be_the_reference_of_the_paired_differences(spark, simulated):
    warehouse, cfg, rows = simulated
    against = AppConfig(ingest=cfg.ingest, fit=cfg.fit, predict=cfg.predict,
                        evaluate=EvaluateConfig(replicates=20, reference_model="truth"))
    diffs = {(r["model"], r["metric"]): r for r in STAGES["evaluate"](StageContext(spark, against, warehouse, RUN))
             if r["reference_model"] == "truth" and r["cutoff"] is None}
    assert {m for m, _ in diffs} == {"rctr", "pbm"}
    for model in ("rctr", "pbm"):
        gap = _metric(rows, model, "LL")["value"] - _metric(rows, "truth", "LL")["value"]
        assert diffs[(model, "LL_diff")]["value"] == pytest.approx(gap, abs=1e-12)
