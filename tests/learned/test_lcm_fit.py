"""The learned model trained on Spark (learned/): out-of-fold features, no leakage on a log whose clicks depend
on the rank only, and a held-out LL above every classic model's on a log whose clicks depend on the count of
clicks above; the fitted model goes through model_params and back unchanged."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from pyspark.sql import functions as F

from clickeval_spark.em import fit as em_fit
from clickeval_spark.fitted import FittedModel
from clickeval_spark.fitted.predict import predict_models
from clickeval_spark.learned import LearnerOptions, train_lcm
from clickeval_spark.learned.features import out_of_fold, positions, rank_rates, with_expected
from clickeval_spark.metrics.evaluate import MetricOptions, compute_metrics
from clickeval_spark.models import MODELS, get_model
from clickeval_spark.models.lcm import QD_STATS

from tests.learned.sim import rank_only, second_click, serps_frame, simulate

M = 10


def _metric(rows, model, metric, split="test"):
    [row] = [r for r in rows if r["model"] == model and r["metric"] == metric and r["split"] == split
             and r["cutoff"] is None]
    return row


def _oof_rows(spark, rows, folds=3, seed=11, ctr=None):
    """out_of_fold's rows keyed by (serp_id, rank), and the positions they came from (with fold)."""
    pos = positions(serps_frame(spark, rows), M, seed, folds)
    if ctr is None:
        ctr, ctr0, _ = rank_rates(pos, M)
    else:
        ctr0 = ctr
    expected = with_expected(pos, ctr, ctr0)
    out = {(r["serp_id"], r["rank"]): r.asDict() for r in out_of_fold(expected, keep=("serp_id",)).collect()}
    return out, [r.asDict() for r in expected.collect()]


def test_out_of_fold_statistics_are_the_other_folds_sums(spark):
    """Every training row's statistics equal the sums, computed here in Python from the positions, over the
    rows of the other folds only (pair sums over the same (query, doc), query sums over the same query)."""
    rows = simulate(second_click, n_serps=150, seed=3, n_queries=4, pool=12, test_fraction=0.0)
    folds = 3
    got, data = _oof_rows(spark, rows, folds=folds)
    assert len(got) == len(data) and len({r["fold"] for r in data}) == folds
    pair, query = defaultdict(lambda: np.zeros(5)), defaultdict(lambda: np.zeros(3))
    for r in data:
        pair[r["query_id"], r["doc_id"], r["fold"]] += [1.0, r["click"], r["exp_clicks"], r["clicks0"],
                                                         r["exp_clicks0"]]
        query[r["query_id"], r["fold"]] += [float(r["rank"] == 1), r["click"], r["exp_clicks"]]
    for r in data:
        others = [f for f in range(folds) if f != r["fold"]]
        want = np.r_[sum((pair[r["query_id"], r["doc_id"], f] for f in others), np.zeros(5)),
                     sum((query[r["query_id"], f] for f in others), np.zeros(3))]
        row = got[r["serp_id"], r["rank"]]
        # expected clicks are summed in units of 2^-32 (features._exact_sum): a few 1e-9 from Python's float sum
        np.testing.assert_allclose([row[c] for c in QD_STATS], want, rtol=0, atol=1e-6)
        assert (row["click"], row["n_above"], row["fold"]) == (r["click"], r["n_above"], r["fold"])


def test_a_rows_own_click_never_enters_its_features(spark):
    """Flip every click of one SERP: that SERP's rows keep exactly the same statistics (its clicks are in its
    own fold), while rows of other folds that share its pairs see the change (so the check can fail)."""
    rows = simulate(second_click, n_serps=80, seed=5, n_queries=2, pool=12, test_fraction=0.0)
    i = 7
    flipped = list(rows)
    flipped[i] = (*rows[i][:8], [1 - c for c in rows[i][8]], rows[i][9])
    # rank rates fixed: they are global (2 M numbers) and would move every row's expected clicks
    before, _ = _oof_rows(spark, rows, ctr=[0.3] * M)
    after, _ = _oof_rows(spark, flipped, ctr=[0.3] * M)
    mine = [k for k in before if k[0] == f"serp{i}"]
    assert mine
    for k in mine:
        # equal up to the order of a float sum (totals minus the own fold's): a flipped click would move a
        # count by 1 and an expected click by at least 0.3
        np.testing.assert_allclose([after[k][c] for c in QD_STATS], [before[k][c] for c in QD_STATS],
                                   rtol=1e-12, atol=1e-9, err_msg=str(k))
    changed = [k for k in before if k[0] != f"serp{i}" and before[k]["clicks"] != after[k]["clicks"]]
    assert changed


def test_no_leakage_on_a_rank_only_log(spark):
    """Clicks depend on the rank only: the (query, doc) statistics are noise. lcm's train and test LL are equal
    within their intervals, and its test LL equals RCTR's (the paired difference's interval holds 0)."""
    rows = simulate(rank_only, n_serps=2500, seed=21, n_queries=60, pool=15)
    serps = serps_frame(spark, rows).cache()
    train = serps.where(F.col("split") == "train")
    lcm, _ = train_lcm(train, M)
    rctr = em_fit(train, get_model("rctr"), max_rank=M)
    preds = predict_models(serps, {"lcm": lcm, "rctr": rctr})
    rows_m = compute_metrics(preds, serps, None, None, [], MetricOptions(max_rank=M, replicates=200),
                             reference_model="rctr")
    tr, te = _metric(rows_m, "lcm", "LL", "train"), _metric(rows_m, "lcm", "LL", "test")
    r_tr, r_te = _metric(rows_m, "rctr", "LL", "train"), _metric(rows_m, "rctr", "LL", "test")
    print({k: (round(v["value"], 5), round(v["ci_low"], 5), round(v["ci_high"], 5))
           for k, v in (("lcm train", tr), ("lcm test", te), ("rctr train", r_tr), ("rctr test", r_te))})
    assert tr["ci_low"] <= te["value"] <= tr["ci_high"] and te["ci_low"] <= tr["value"] <= te["ci_high"], (tr, te)
    # equal to RCTR's on both splits: each value inside the other's interval
    for a, b in ((te, r_te), (tr, r_tr)):
        assert b["ci_low"] <= a["value"] <= b["ci_high"] and a["ci_low"] <= b["value"] <= a["ci_high"], (a, b)
    # paired, per position, on test: weights trained on leaked labels would lean on the (query, doc) statistics,
    # noise here, and lose clearly to RCTR on unseen SERPs; out of fold they cost at most a few 1e-4 - 1e-3.
    # (On train the statistics at predict time include the SERP's own clicks, as every fitted model's
    # parameters do: that in-sample gain is the classic models' too, and is not asserted on.)
    diff = _metric(rows_m, "lcm", "LL_diff", "test")
    print("test LL_diff lcm - rctr", diff["value"], diff["ci_low"], diff["ci_high"])
    assert abs(diff["value"]) < 2e-3, diff
    serps.unpersist()


def test_beats_every_classic_model_when_clicks_depend_on_the_count_above(spark):
    """A second click made likelier by a first and a third unlikely (tests/learned/sim.second_click): lcm's test
    LL beats every one of the ten classic models', each paired 95% interval of (lcm - classic) above 0."""
    rows = simulate(second_click, n_serps=3000, seed=8, n_queries=40, pool=15)
    serps = serps_frame(spark, rows).cache()
    train = serps.where(F.col("split") == "train")
    fitted = {"lcm": train_lcm(train, M)[0]}
    for name in sorted(MODELS):
        fitted[name] = em_fit(train, get_model(name), max_rank=M, iterations=15)
    preds = predict_models(serps.where(F.col("split") == "test"), fitted)
    rows_m = compute_metrics(preds, serps, None, None, [], MetricOptions(max_rank=M, replicates=200),
                             reference_model="lcm")
    # <classic>_diff = classic - lcm: its interval wholly below 0 means lcm's LL is above with 95% confidence
    print("test LL lcm", round(_metric(rows_m, "lcm", "LL")["value"], 5))
    for name in sorted(MODELS):
        diff = _metric(rows_m, name, "LL_diff")
        print(f"lcm - {name}: {-diff['value']:+.5f} [{-diff['ci_high']:+.5f}, {-diff['ci_low']:+.5f}]")
        assert diff["ci_high"] < 0, (name, diff)
    serps.unpersist()


def test_fitted_model_round_trips_through_model_params(spark):
    """to_rows / from_rows keep the weights and the statistics: the same predictions and relevance."""
    rows = simulate(second_click, n_serps=300, seed=2, n_queries=8, pool=12)
    serps = serps_frame(spark, rows)
    fitted, details = train_lcm(serps.where(F.col("split") == "train"), M, LearnerOptions(max_iter=20))
    back = FittedModel.from_rows(fitted.to_rows("r1"), get_model("lcm"), "r1", M)
    np.testing.assert_array_equal(back.glob["w_rank"], fitted.glob["w_rank"])
    np.testing.assert_array_equal(back.glob["w"], fitted.glob["w"])
    a = {r["serp_id"]: r["p_click"] for r in fitted.predict(serps).collect()}
    b = {r["serp_id"]: r["p_click"] for r in back.predict(serps).collect()}
    assert a == b
    assert details["rows"] == sum(len(r[6]) for r in rows if r[1] == "train")
