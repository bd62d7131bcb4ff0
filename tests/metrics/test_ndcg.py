"""NDCG@k against DESIGN §5's worked example and scikit-learn's ndcg_score."""

import numpy as np
import pytest
from sklearn.metrics import ndcg_score

from clickeval_spark.metrics.evaluate import MetricOptions, compute_metrics
from clickeval_spark.metrics.click_prediction import per_serp
from tests.metrics.helpers import LABELS_SCHEMA, PREDICTIONS_SCHEMA, SCORES_SCHEMA, SERPS_SCHEMA


def _predictions_for(serps, model):
    return [(model, d, sp, serp_id, t + 1, c, 0.5, 0.5)
            for d, sp, _, serp_id, _, docs, clicks in serps for t, c in enumerate(clicks)]


def _ndcg(spark, serps, labels, scores, opts, model="m"):
    rows = compute_metrics(
        spark.createDataFrame(_predictions_for(serps, model), PREDICTIONS_SCHEMA).transform(per_serp),
        spark.createDataFrame(serps, SERPS_SCHEMA),
        spark.createDataFrame(labels, LABELS_SCHEMA),
        spark.createDataFrame(scores, SCORES_SCHEMA), [model], opts)
    return {(r["metric"], r["cutoff"]): r for r in rows}


# the worked example: grades 3,2,3,0,1,2 in returned order; equal scores keep that order
EXAMPLE_SERP = [("d", "test", "s1", "serp1", "q", [f"u{i}" for i in range(1, 7)], [0] * 6)]
EXAMPLE_TIED = [("d", "q", f"u{i}", g, "serp1", i, "s1") for i, g in enumerate([3, 2, 3, 0, 1, 2], start=1)]
EXAMPLE_SCORES = [("m", "q", f"u{i}", 0.5) for i in range(1, 7)]


def test_worked_example_linear_gain_serp_ideal(spark):
    got = _ndcg(spark, EXAMPLE_SERP, EXAMPLE_TIED, EXAMPLE_SCORES,
                MetricOptions(ndcg_cutoffs=(6,), ndcg_gain="linear", replicates=5))
    dcg = 3 + 2 / np.log2(3) + 3 / 2 + 0 + 1 / np.log2(6) + 2 / np.log2(7)
    assert round(dcg, 3) == 6.861
    idcg = 3 + 3 / np.log2(3) + 2 / 2 + 2 / np.log2(5) + 1 / np.log2(6)
    assert got[("NDCG", 6)]["value"] == pytest.approx(dcg / idcg, abs=1e-9)


def test_worked_example_query_ideal_with_unreturned_judged_docs(spark):
    extra = [("d", "q", "u7", 3, None, None, None), ("d", "q", "u8", 2, None, None, None)]
    got = _ndcg(spark, EXAMPLE_SERP, EXAMPLE_TIED + extra, EXAMPLE_SCORES,
                MetricOptions(ndcg_cutoffs=(6,), ndcg_gain="linear", ndcg_ideal="query", replicates=5))
    idcg = 3 + 3 / np.log2(3) + 3 / 2 + 2 / np.log2(5) + 2 / np.log2(6) + 2 / np.log2(7)
    assert round(idcg, 3) == 8.740
    assert round(got[("NDCG", 6)]["value"], 3) == 0.785
    assert got[("NDCG", 6)]["value"] == pytest.approx(6.861 / 8.740, abs=1e-3)


def test_equals_sklearn_on_random_lists_with_ties_and_negative_grades(spark):
    rng = np.random.default_rng(5)
    serps, labels, scores, expected = [], [], [], {k: [] for k in (1, 3, 5, 10)}
    excluded = negatives = 0
    for s in range(40):
        n = int(rng.integers(2, 11))
        docs = [f"q{s}-d{i}" for i in range(n)]
        grades = rng.integers(-1, 5, size=n)
        grades[rng.uniform(size=n) < 0.3] = 0
        if s % 9 == 0:
            grades[:] = 0  # IDCG = 0: excluded and counted
        score = np.round(rng.uniform(size=n), 1)  # coarse scores: many ties
        serps.append(("d", "test", f"sess{s // 2}", f"serp{s}", f"q{s}", docs, [0] * n))
        labels += [("d", f"q{s}", doc, int(g), f"serp{s}", i + 1, f"sess{s // 2}") for i, (doc, g) in enumerate(zip(docs, grades))]
        scores += [("m", f"q{s}", doc, float(x)) for doc, x in zip(docs, score)]
        negatives += int((grades < 0).sum())
        gains = 2.0 ** np.maximum(grades, 0) - 1
        if gains.max() == 0:
            excluded += 1
            continue
        tie_broken = score - np.arange(n) * 1e-6  # ties: original rank first
        for k in expected:
            expected[k].append(ndcg_score([gains], [tie_broken], k=k))
    got = _ndcg(spark, serps, labels, scores, MetricOptions(replicates=20))
    for k, values in expected.items():
        assert got[("NDCG", k)]["value"] == pytest.approx(np.mean(values), abs=1e-9)
        assert got[("NDCG", k)]["n"] == len(values)
    assert got[("ndcg_excluded_idcg0", None)]["value"] == excluded
    assert got[("ndcg_negative_grades", None)]["value"] == negatives
