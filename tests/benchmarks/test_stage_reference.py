"""The single-process stage references (benchmarks/stage_reference.py) do the work their Spark stages do.

On the reliability baseline (a 300-SERP synthetic pipeline, computed once per test session), the ingest
reference reads back the log the stage wrote, the predict reference gives the stage's probabilities and
scores, and the evaluate reference its metric values; a hand-written text log exercises each SERP rule.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from benchmarks import stage_reference as R
from clickeval_spark import tables
from clickeval_spark.metrics.evaluate import MetricOptions
from clickeval_spark.models import get_model
from tests.reliability import baseline as P

# minutes of Spark: `make test-fast` leaves it out (docs/development.md)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base(spark, tmp_path_factory):
    return P.baseline(spark, tmp_path_factory)


def _serps(spark, base):
    return tables.read_table(spark, base.warehouse, "serps").where(F.col("dataset") == P.DATASET)


def test_ingest_reference_rules_on_a_hand_written_log(tmp_path):
    lines = [
        's1\tq1\t["d1","d2"]\t["1","1"]\t[0,1]',        # accepted, s1-1
        's1\tq2\t["d3"]\t["1"]\t[1]',                  # accepted, s1-2
        's2\tq1\t["d1", "d2"]\t["1", "1"]\t[1, 0]',    # accepted (blanks after commas), s2-1
        ' \tq1\t["d1"]\t["1"]\t[0]',                   # missing_id (blank session)
        's3\tq1\t["d1",""]\t["1","1"]\t[0,0]',         # missing_id (blank doc id)
        's3\tq1\t[]\t[]\t[]',                          # empty_result_list
        's3\tq1\t["d1","d2"]\t["1","1"]\t[0]',         # length_mismatch (clicks)
        's3\tq1\t["d1","d2"]\t["1"]\t[0,0]',           # length_mismatch (vtypes)
        's3\tq1\t["d1","d2"]\t["1","1"]\t[0,2]',       # click_not_binary
        's3\tq1\t["a","b","c"]\t["1","1","1"]\t[0,0,0]',  # rank_out_of_range (max_rank 2)
        's4\tq1\t["d1"]',                              # three fields: unparseable
    ]
    log = tmp_path / "log.txt"
    log.write_text("\n".join(lines) + "\n")
    counts = R.ingest(log, tmp_path / "serps.parquet", dataset="d", max_rank=2, split_seed=1,
                      ratios={"train": 1, "test": 1})
    assert {k: v for k, v in counts.items() if k.startswith("quarantined:")} == {
        "quarantined:unparseable": 1, "quarantined:missing_id": 2, "quarantined:empty_result_list": 1,
        "quarantined:length_mismatch": 2, "quarantined:click_not_binary": 1, "quarantined:rank_out_of_range": 1}
    assert (counts["serps_read"], counts["serps_accepted"], counts["serps_quarantined"]) == (11, 3, 8)
    rows = pq.read_table(tmp_path / "serps.parquet").to_pylist()
    assert [(r["serp_id"], r["serp_pos"], r["query_id"], r["doc_ids"], r["clicks"]) for r in rows] == [
        ("s1-1", 1, "q1", ["d1", "d2"], [0, 1]), ("s1-2", 2, "q2", ["d3"], [1]), ("s2-1", 1, "q1", ["d1", "d2"], [1, 0])]
    assert rows[0]["split"] == rows[1]["split"]   # a session's SERPs share their split
    assert counts.get("serps_train", 0) + counts.get("serps_test", 0) == 3


def test_ingest_reference_reads_back_the_log_the_stage_wrote(spark, base, tmp_path):
    serps = _serps(spark, base)
    text = R.export_text(serps, tmp_path / "text")
    split = base.cfg.ingest.split
    counts = R.ingest(text, tmp_path / "serps.parquet", dataset="d", max_rank=base.cfg.ingest.max_rank,
                      split_seed=split.seed, ratios=split.ratios)
    n = serps.count()
    assert (counts["serps_read"], counts["serps_accepted"]) == (n, n)
    got = sorted((r["session_id"], r["serp_pos"], r["query_id"], tuple(r["doc_ids"]), tuple(r["clicks"]))
                 for r in pq.read_table(tmp_path / "serps.parquet").to_pylist())
    assert got == sorted((r["session_id"], r["serp_pos"], r["query_id"], tuple(r["doc_ids"]), tuple(r["clicks"]))
                         for r in serps.collect())
    # a seeded hash split of 2:1 over ~100 sessions: both splits used, roughly 2:1
    assert 0.45 < counts["serps_train"] / n < 0.85


@pytest.fixture(scope="module")
def predicted(spark, base, tmp_path_factory):
    """The predict reference for every model of the baseline run, on the baseline's SERPs."""
    root = tmp_path_factory.mktemp("stage_reference")
    serps = R.export_parquet(_serps(spark, base).select("dataset", "split", "session_id", "serp_id", "query_id",
                                                         "doc_ids", "clicks"), root / "serps")
    params = tables.read_table(spark, base.warehouse, "model_params")
    # the fitted models and the simulated log's true model `truth`, as the stage predicts them
    models = R.run_params(params, base.cfg, P.BASE_RUN, root)
    assert set(models) == {*base.cfg.fit.models, "truth"}
    lls = {name: R.predict(serps, p, root / name, base.cfg.fit.max_rank) for name, p in models.items()}
    return root, serps, lls


def test_predict_reference_gives_the_stage_probabilities_and_scores(spark, base, predicted):
    root, _, lls = predicted
    preds = tables.read_table(spark, base.warehouse, "click_predictions").where(F.col("run_id") == P.BASE_RUN)
    assert {r["model"] for r in preds.select("model").distinct().collect()} == set(lls)
    for name in lls:
        stage = {r["serp_id"]: r for r in preds.where(F.col("model") == name).collect()}
        mine = {r["serp_id"]: r for r in pq.read_table(root / name / "predictions.parquet").to_pylist()
                if r["split"] in {"train", *base.cfg.predict.splits}}
        assert set(mine) == set(stage) and len(stage) > 100
        for serp_id, r in stage.items():
            assert mine[serp_id]["clicks"] == r["clicks"]
            np.testing.assert_allclose(mine[serp_id]["p_click_cond"], r["p_click_cond"], rtol=1e-12)
            np.testing.assert_allclose(mine[serp_id]["p_click"], r["p_click"], rtol=1e-12)
        # the LL per split the stage recorded in its runs row
        details = tables.read_table(spark, base.warehouse, "runs").where(
            (F.col("run_id") == P.BASE_RUN) & (F.col("job") == "predict")).first()["details"]
        for split, ll in json.loads(details)["log_likelihood"][name].items():
            assert lls[name][split] == pytest.approx(ll, rel=1e-12)
    for name in ("pbm", "truth"):
        scores = tables.read_table(spark, base.warehouse, "relevance_scores").where(
            (F.col("run_id") == P.BASE_RUN) & (F.col("model") == name)).collect()
        mine = pq.read_table(root / name / "scores.parquet").to_pydict()
        mine = dict(zip(mine["pair"], mine["score"]))
        assert len(scores) > 100 and len(scores) == len(mine)
        for r in scores:
            assert mine[f"{r['query_id']}\x1f{r['doc_id']}"] == pytest.approx(r["score"], rel=1e-12)


def test_evaluate_reference_gives_the_stage_metric_values(spark, base, predicted, tmp_path):
    root, serps, _ = predicted
    labels = R.export_parquet(tables.read_table(spark, base.warehouse, "relevance_labels")
                              .where(F.col("dataset") == P.DATASET), tmp_path / "labels")
    ecfg = base.cfg.evaluate
    models = [*base.cfg.fit.models, "truth"]   # the truth row is scored as any model (stage and reference)
    ranked = [m for m in models if (root / m / "scores.parquet").exists()]
    assert set(ranked) == {m for m in base.cfg.fit.models if get_model(m).qd_params} | {"truth"}
    rows = R.evaluate({m: root / m / "predictions.parquet" for m in models}, serps, labels,
                      {m: root / m / "scores.parquet" for m in ranked},
                      MetricOptions.from_config(ecfg, base.cfg.fit.max_rank),
                      ecfg.splits, ecfg.reference_model)
    mine = {(r["model"], r["split"], r["metric"], r["cutoff"]): r for r in rows}
    stage = {(r["model"], r["split"], r["metric"], r["cutoff"]): r for r in
             tables.read_table(spark, base.warehouse, "metrics").where(F.col("run_id") == P.BASE_RUN).collect()
             if r["value"] is not None and r["ci_low"] is not None}   # the metrics, not the bookkeeping counts
    assert set(mine) == set(stage) and {k[0] for k in stage} == set(models)
    assert {k[2] for k in stage} >= {"LL", "PPL", "PPL_cond", "NDCG", "LL_diff", "PPL_diff"}   # rctr (the reference) has no NDCG
    for key, r in stage.items():
        assert mine[key]["value"] == pytest.approx(r["value"], rel=1e-9, abs=1e-9), key
        # another session hash draws other replicates: intervals agree in width's order, not in value
        if r["ci_high"] > r["ci_low"]:
            width = mine[key]["ci_high"] - mine[key]["ci_low"]
            assert 0.2 < width / (r["ci_high"] - r["ci_low"]) < 5, key
    assert not any(math.isnan(r["value"]) for r in rows)
