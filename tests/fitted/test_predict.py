"""The predictor of fitted models (fitted/predict.py, fitted/attach.py) against the numpy kernels:
click probabilities, relevance scores, both routes of attaching the qd parameters."""

from __future__ import annotations

from functools import reduce

import numpy as np
import pyarrow as pa
import pytest
from chispa import assert_approx_df_equality, assert_df_equality
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from clickeval_spark.models import MODELS, get_model
from clickeval_spark.models.base import INIT_VALUE
from clickeval_spark.fitted.params_io import wide_qd_rows
from clickeval_spark.metrics.click_prediction import by_rank
from clickeval_spark.fitted.predict import predict_clicks, predict_models, relevance_models, relevance_scores
from clickeval_spark.fitted.sampling import sample_serps
from clickeval_spark.fitted import attach
from clickeval_spark.fitted.attach import attach_qd
from clickeval_spark.fitted import FittedModel

from tests.models.numpy_em import gather
from tests.em.logs import SERPS_SCHEMA, sorted_rows


# ---------------------------------------------------------------------------
# attach_qd: the map route (small queries) and the join route (large queries)
# ---------------------------------------------------------------------------

def test_arrow_batches_to_padded_arrays_and_back():
    """The kernels' side of mapInArrow: a sliced batch (list offsets not starting at 0) to (B, M) arrays,
    INIT_VALUE / 0 where no rank; and the values back to one list per row; unequal lists fail."""
    alpha = attach.qd_array_col("alpha")
    batch = pa.RecordBatch.from_arrays(
        [pa.array([["x"], ["a", "b", "c"], ["d"], ["e", "f"]]),
         pa.array([[1], [0, 1, 0], [1], [0, 1]], pa.list_(pa.int32())),
         pa.array([[0.9], [0.1, 0.2, 0.3], [0.4], [0.6, 0.7]])],
        names=["doc_ids", "clicks", alpha]).slice(1)
    clicks, mask, lens, qd = attach.batch_arrays(batch, 4, ["alpha"])
    assert lens.tolist() == [3, 1, 2]
    assert clicks.tolist() == [[0, 1, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0]]
    assert qd["alpha"].tolist() == [[0.1, 0.2, 0.3, INIT_VALUE], [0.4] + [INIT_VALUE] * 3, [0.6, 0.7] + [INIT_VALUE] * 2]
    assert attach.list_array(qd["alpha"] * 10, mask, lens).to_pylist() == [[1.0, 2.0, 3.0], [4.0], [6.0, 7.0]]
    bad = pa.RecordBatch.from_arrays([batch.column("doc_ids"), pa.array([[0], [1], [0, 1]], pa.list_(pa.int32()))],
                                     names=["doc_ids", "clicks"])
    with pytest.raises(ValueError, match="different lengths"):
        attach.batch_arrays(bad, 4, [])


@pytest.mark.slow
def test_attach_qd_routes_agree(spark):
    df = spark.createDataFrame([
        ("s1", "q1", ["a", "b", "c"]), ("s2", "q1", ["c", "z", "a"]), ("s3", "q2", ["a", "b"]),
        ("s4", None, ["a"]), ("s5", "q1", []), ("s6", "q1", None), ("s7", "q3", ["x"]),
        ("s8", "q1", ["a", "a", None]), ("s9", "q4", ["a"]),
    ], "serp_id string, query_id string, doc_ids array<string>")
    qd = spark.createDataFrame([
        ("q1", "a", 0.1, 0.2), ("q1", "b", 0.3, 0.4), ("q1", "c", 0.5, 0.6), ("q1", "d", 0.7, 0.8),
        ("q2", "a", 0.9, 0.15), ("q3", "y", 0.25, 0.35)], "query_id string, doc_id string, alpha double, sigma double")
    prior = {"alpha": 0.01, "sigma": 0.02}
    table = {("q1", "a"): (0.1, 0.2), ("q1", "b"): (0.3, 0.4), ("q1", "c"): (0.5, 0.6), ("q2", "a"): (0.9, 0.15)}

    def arrays(q, docs, i):
        return None if docs is None else [table.get((q, d), (0.01, 0.02))[i] for d in docs]

    expected = {r[0]: (r[1], r[2], arrays(r[1], r[2], 0), arrays(r[1], r[2], 1)) for r in df.collect()}
    # 0: every query by the join; 1 and 3: q1 (4 pairs) by the join, q2 / q3 by maps; 100: maps only
    for threshold in (0, 1, 3, 100):
        out = attach.attach_by_size(df, qd, ["alpha", "sigma"], prior, threshold)
        assert out.columns == ["serp_id", "query_id", "doc_ids", "_qd_alpha", "_qd_sigma"]
        got = {r.serp_id: (r.query_id, r.doc_ids, r._qd_alpha, r._qd_sigma) for r in out.collect()}
        assert got == expected, threshold
    assert {r.serp_id: (r.query_id, r.doc_ids, r._qd_alpha, r._qd_sigma)
            for r in attach_qd(df, qd, ["alpha", "sigma"], prior).collect()} == expected


@pytest.mark.slow
def test_predict_and_sampling_same_on_both_routes(spark, make_log, hand_fitted, monkeypatch):
    model = get_model("dbn")
    log = make_log(model, n_serps=80, M=5, seed=21, n_queries=4, pool=8)
    fitted, _, _ = hand_fitted(spark, model, log, seed=3)
    df = log.df(spark)
    by_map = (predict_clicks(df, fitted), sorted_rows(sample_serps(df, fitted, k=2, seed=5)))
    monkeypatch.setattr(attach, "MAP_MAX_DOCS", 0)
    by_join = (predict_clicks(df, fitted), sorted_rows(sample_serps(df, fitted, k=2, seed=5)))
    assert_df_equality(by_map[0], by_join[0], ignore_nullable=True, ignore_row_order=True)
    assert_df_equality(by_map[1], by_join[1], ignore_nullable=True)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_predict_matches_kernel(spark, make_log, hand_fitted, name):
    model = get_model(name)
    log = make_log(model, n_serps=60, M=6, seed=5, n_queries=4, pool=9, extra=3)
    fitted, full, known = hand_fitted(spark, model, log, seed=17)
    qd = gather(full, log.qd_index, log.mask)
    p_cond = model.cond_probs(qd, fitted.glob, log.clicks, log.mask)
    p_click = model.click_probs(qd, fitted.glob, log.mask)
    expected_rows = []
    for b, row in enumerate(log.rows):
        for r in range(log.M):
            if log.mask[b, r]:
                expected_rows.append((row[0], row[1], row[3], r + 1, int(log.clicks[b, r]),
                                      float(p_cond[b, r]), float(p_click[b, r])))
    expected = spark.createDataFrame(expected_rows, "dataset string, split string, serp_id string, rank int, "
                                                    "click int, p_click_cond double, p_click double")
    predicted = predict_clicks(log.df(spark), fitted)
    assert predicted.columns == ["dataset", "split", "serp_id", "clicks", "p_click_cond", "p_click"]
    assert predicted.count() == len(log.rows)  # one row per SERP
    assert_approx_df_equality(predicted.transform(by_rank), expected, 1e-12, ignore_nullable=True,
                              ignore_row_order=True)
    if model.qd_params:
        # the log does show unseen pairs, so the prior was exercised
        assert not np.isin(log.qd_index[log.mask], known).all()


def test_predict_unseen_pair_gets_prior(spark):
    model = get_model("pbm")
    qd = spark.createDataFrame([("q1", "a", 0.8, 3.0)], "query_id string, doc_id string, alpha double, n_obs double")
    fitted = FittedModel(model=model, max_rank=3, qd=qd, glob={"gamma": np.array([0.9, 0.5, 0.25])},
                         prior={"alpha": 0.2})
    serps = spark.createDataFrame(
        [("t", "test", "s", "x", 1, "q1", ["a", "b", "a", "c"], None, [1, 0, 0, 1], None),
         ("t", "test", "s", "y", 2, "q2", ["a"], None, [0], None)], SERPS_SCHEMA)
    got = predict_clicks(serps, fitted).transform(by_rank).select("serp_id", "rank", "click", "p_click_cond")
    expected = spark.createDataFrame(
        [("x", 1, 1, 0.8 * 0.9), ("x", 2, 0, 0.2 * 0.5), ("x", 3, 0, 0.8 * 0.25),   # docs a, b, a
         ("y", 1, 0, 0.2 * 0.9)],   # (q2, a) is unseen although (q1, a) is known
        "serp_id string, rank int, click int, p_click_cond double")
    assert_approx_df_equality(got, expected, 1e-15, ignore_nullable=True, ignore_row_order=True)


def test_relevance_scores(spark, make_log, hand_fitted):
    log = make_log(get_model("dbn"), n_serps=10, M=4, seed=1, n_queries=3, pool=6)
    fitted, full, known = hand_fitted(spark, get_model("dbn"), log, seed=2)
    expected = spark.createDataFrame(
        [(*log.pair_key(i), float(full["alpha"][i] * full["sigma"][i])) for i in known],
        "query_id string, doc_id string, score double")
    assert_approx_df_equality(relevance_scores(fitted), expected, 1e-15, ignore_nullable=True,
                              ignore_row_order=True)
    pbm, pfull, pknown = hand_fitted(spark, get_model("pbm"), log, seed=2)
    got = {(r.query_id, r.doc_id): r.score for r in relevance_scores(pbm).collect()}
    assert got == {log.pair_key(i): pytest.approx(pfull["alpha"][i], abs=1e-15) for i in pknown}
    gctr, _, _ = hand_fitted(spark, get_model("gctr"), log, seed=2)
    with pytest.raises(ValueError, match="gctr"):
        relevance_scores(gctr)


def test_models_predicted_together_match_each_kernel(spark, make_log, hand_fitted):
    """Several models through one wide qd table, one attach and one kernel pass: every model's rows are
    its own kernel's probabilities and scores, a pair another model knows but this one does not
    takes this model's prior, and the wide table built from model_params rows gives the same rows."""
    log = make_log(get_model("dbn"), n_serps=50, M=5, seed=11, n_queries=4, pool=8, extra=3)
    parts = {name: hand_fitted(spark, get_model(name), log, seed=seed)
             for name, seed in (("pbm", 3), ("dbn", 4), ("ubm", 8), ("gctr", 5))}
    fitted = {name: f for name, (f, _, _) in parts.items()}
    assert not np.array_equal(parts["pbm"][2], parts["dbn"][2])   # the models know different pairs
    expected = []
    for name, (f, full, _) in parts.items():
        qd = gather(full, log.qd_index, log.mask)
        p_cond = f.model.cond_probs(qd, f.glob, log.clicks, log.mask)
        p_click = f.model.click_probs(qd, f.glob, log.mask)
        for b, row in enumerate(log.rows):
            m = log.mask[b]
            expected.append((name, row[3], log.clicks[b, m].tolist(), p_cond[b, m].tolist(), p_click[b, m].tolist()))
    schema = "model string, serp_id string, clicks array<int>, p_click_cond array<double>, p_click array<double>"
    cols = ["model", "serp_id", "clicks", "p_click_cond", "p_click"]
    together = predict_models(log.df(spark), fitted).select(*cols)
    assert_approx_df_equality(together, spark.createDataFrame(expected, schema), 1e-14, ignore_nullable=True,
                              ignore_row_order=True)
    stored = reduce(DataFrame.unionByName, [f.to_rows("run-1") for f in fitted.values()])
    ranked = {name: get_model(name) for name in ("pbm", "dbn", "ubm")}
    wide = wide_qd_rows(stored, "run-1", ranked)
    assert_df_equality(predict_models(log.df(spark), fitted, wide).select(*cols), together,
                       ignore_nullable=True, ignore_row_order=True)

    pairs = log.df(spark).select("query_id", F.explode("doc_ids").alias("doc_id"))
    scores = relevance_models({name: fitted[name] for name in ranked}, pairs=pairs, qd=wide)
    # every pair of the lists (all ranks) and every pair a model knows
    shown = sorted({int(r[5][1:]) * log.pool + int(d[1:]) for r in log.rows for d in r[6]}
                   | set(np.concatenate([parts[n][2] for n in ranked]).tolist()))
    want = []
    for name in ranked:
        full = parts[name][1]
        score = full["alpha"] * full["sigma"] if name == "dbn" else full["alpha"]
        want += [(name, *log.pair_key(i), float(score[i])) for i in shown]
    assert_approx_df_equality(scores, spark.createDataFrame(want, "model string, query_id string, doc_id string, "
                                                                  "score double"),
                              1e-15, ignore_nullable=True, ignore_row_order=True)
    with pytest.raises(ValueError, match="gctr"):
        relevance_models(fitted)
