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


def _ndcg_models(spark, serps, labels, scores, opts, models):
    """{model: {(metric, cutoff): metric row}} of one compute_metrics call ranking with every model."""
    rows = compute_metrics(
        spark.createDataFrame([p for m in models for p in _predictions_for(serps, m)],
                              PREDICTIONS_SCHEMA).transform(per_serp),
        spark.createDataFrame(serps, SERPS_SCHEMA),
        spark.createDataFrame(labels, LABELS_SCHEMA),
        spark.createDataFrame(scores, SCORES_SCHEMA), list(models), opts)
    return {m: {(r["metric"], r["cutoff"]): r for r in rows if r["model"] == m} for m in models}


def _ndcg(spark, serps, labels, scores, opts, model="m"):
    return _ndcg_models(spark, serps, labels, scores, opts, [model])[model]


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


def _oracle_ndcg(docs, grades, scores, cutoffs, ideal_gains):
    """NDCG@k of one list by the DESIGN §5 definition: documents ordered by score (unscored last), ties
    by original rank; unjudged documents (grade None) gain 0; IDCG over ``ideal_gains``."""
    order = sorted(range(len(docs)), key=lambda i: (scores[i] is None, -(scores[i] or 0.0), i))
    gains = [2.0 ** max(grades[i], 0) - 1 if grades[i] is not None else 0.0 for i in order]
    ideal = sorted(ideal_gains, reverse=True)
    dcg = {k: sum(g / np.log2(p + 2) for p, g in enumerate(gains[:k])) for k in cutoffs}
    idcg = {k: sum(g / np.log2(p + 2) for p, g in enumerate(ideal[:k])) for k in cutoffs}
    return None if idcg[max(cutoffs)] <= 0 else {k: dcg[k] / idcg[k] for k in cutoffs}


@pytest.mark.parametrize("ideal", ["serp", "query"])
def test_two_models_with_unscored_and_unjudged_docs_equal_a_brute_force_oracle(spark, ideal):
    rng = np.random.default_rng(11)
    cutoffs, models = (1, 3, 5, 10), ("a", "b")
    serps, labels, scores = [], [], []
    lists = []  # (query, docs, grades)
    for s in range(30):
        n, q = int(rng.integers(1, 11)), f"q{s % 6}"
        docs = [f"d{int(x)}" for x in rng.choice(25, size=n, replace=False)]
        grades = [int(g) if rng.uniform() < 0.7 else None for g in rng.integers(-1, 5, size=n)]
        if all(g is None for g in grades):
            grades[0] = int(rng.integers(0, 5))
        serps.append(("d", "test", f"sess{s // 3}", f"serp{s}", q, docs, [0] * n))
        labels += [("d", q, doc, g, f"serp{s}", i + 1, f"sess{s // 3}")
                   for i, (doc, g) in enumerate(zip(docs, grades)) if g is not None]
        lists.append((q, docs, grades))
    # one score per (model, query, doc), a fifth of them missing: those documents rank last
    pairs = sorted({(q, doc) for q, docs, _ in lists for doc in docs})
    known = {m: {p: float(np.round(rng.uniform(), 1)) for p in pairs if rng.uniform() < 0.8} for m in models}
    scores = [(m, q, doc, x) for m in models for (q, doc), x in known[m].items()]
    pool: dict[tuple[str, str], int] = {}
    for _, q, doc, g, *_ in labels:
        pool[(q, doc)] = max(g, pool.get((q, doc), g))

    got = _ndcg_models(spark, serps, labels, scores, MetricOptions(replicates=5, ndcg_ideal=ideal), models)
    for m in models:
        values, unscored = [], 0
        for q, docs, grades in lists:
            ideal_gains = ([2.0 ** max(g, 0) - 1 for (pq, _), g in pool.items() if pq == q] if ideal == "query"
                           else [2.0 ** max(g, 0) - 1 if g is not None else 0.0 for g in grades])
            v = _oracle_ndcg(docs, grades, [known[m].get((q, doc)) for doc in docs], cutoffs, ideal_gains)
            unscored += sum((q, doc) not in known[m] for doc in docs)
            if v is not None:
                values.append(v)
        for k in cutoffs:
            assert got[m][("NDCG", k)]["value"] == pytest.approx(np.mean([v[k] for v in values]), abs=1e-9)
            assert got[m][("NDCG", k)]["n"] == len(values)
        assert got[m][("ndcg_unscored_docs", None)]["value"] == unscored
        assert got[m][("ndcg_unjudged_docs", None)]["value"] == sum(g is None for *_, gs in lists for g in gs)
        assert got[m][("ndcg_negative_grades", None)]["value"] == sum(g == -1 for *_, gs in lists for g in gs)


def test_pooled_labels_grade_every_serp_of_their_query_and_tied_labels_take_precedence(spark):
    serps = [("d", "test", "sess1", "s1", "q", ["a", "b", "c"], [0] * 3),
             ("d", "test", "sess2", "s2", "q", ["c", "a", "d"], [0] * 3),
             ("d", "test", "sess3", "s3", "r", ["x", "y"], [0] * 2)]       # no label reaches it
    labels = [("d", "q", "a", 2, None, None, None), ("d", "q", "a", 3, None, None, None),  # best grade kept
              ("d", "q", "c", 1, None, None, None),
              ("d", "q", "c", 0, "s2", 1, "sess2"), ("d", "q", "d", 4, "s2", 3, "sess2")]  # s2's own grades
    score = {"a": 0.9, "b": 0.5, "c": 0.7, "d": 0.1, "x": 0.3, "y": 0.2}
    scores = [("m", q, doc, score[doc]) for q, docs in (("q", "abcd"), ("r", "xy")) for doc in docs]
    got = _ndcg(spark, serps, labels, scores, MetricOptions(replicates=5))
    graded = {"s1": [3, None, 1], "s2": [0, 3, 4]}
    expected = [_oracle_ndcg(docs, graded[serp], [score[d] for d in docs], (1, 3, 5, 10),
                             [2.0 ** g - 1 for g in graded[serp] if g is not None])
                for _, _, _, serp, _, docs, _ in serps[:2]]
    for k in (1, 3):
        assert got[("NDCG", k)]["value"] == pytest.approx(np.mean([e[k] for e in expected]), abs=1e-9)
        assert got[("NDCG", k)]["n"] == 2
    assert got[("ndcg_unjudged_docs", None)]["value"] == 1
    # s2 by hand, ranked a (gain 7), c (tied grade 0, not the pooled 1), d (15): the oracle's inputs
    assert expected[1][3] == pytest.approx((7 + 0 / np.log2(3) + 15 / 2) / (15 + 7 / np.log2(3)), abs=1e-12)
