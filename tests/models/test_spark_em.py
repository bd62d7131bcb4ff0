"""Spark EM driver, predictor, sampler and model_params IO against the numpy oracle."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import textwrap
from datetime import date
from functools import reduce
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from chispa import assert_approx_df_equality, assert_df_equality
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from clickeval_spark.models import MODELS, get_model
from clickeval_spark.models.base import INIT_VALUE, sample_clicks
from clickeval_spark.fitted.params_io import MODEL_PARAMS_SCHEMA, to_param_rows, wide_qd_rows
from clickeval_spark.metrics.click_prediction import by_rank
from clickeval_spark.fitted.predict import predict_clicks, predict_models, relevance_models, relevance_scores
from clickeval_spark.hashing import seeded_uniform
from clickeval_spark.fitted.sampling import sample_models, sample_serps
from clickeval_spark.fitted import attach
from clickeval_spark.em import blocks, codec, driver
from clickeval_spark.models.priors import model_prior
from clickeval_spark.fitted.attach import attach_qd
from clickeval_spark.fitted import FittedModel
from clickeval_spark.em.driver import fit
from tests.models.numpy_em import fit_numpy, gather, simulate, total_log_likelihood

ROOT = Path(__file__).resolve().parents[2]

SERPS_SCHEMA = T.StructType([
    T.StructField("dataset", T.StringType(), False),
    T.StructField("split", T.StringType(), False),
    T.StructField("session_id", T.StringType(), False),
    T.StructField("serp_id", T.StringType(), False),
    T.StructField("serp_pos", T.IntegerType(), False),
    T.StructField("query_id", T.StringType(), False),
    T.StructField("doc_ids", T.ArrayType(T.StringType(), False), False),
    T.StructField("vtypes", T.ArrayType(T.StringType(), True), True),
    T.StructField("clicks", T.ArrayType(T.IntegerType(), False), False),
    T.StructField("log_date", T.DateType(), True),
])

QD_KEYS = [T.StructField("query_id", T.StringType(), True), T.StructField("doc_id", T.StringType(), True)]


# ---------------------------------------------------------------------------
# simulated logs
# ---------------------------------------------------------------------------

class Log:
    """A simulated log: Spark rows plus the padded numpy view of its first M ranks."""

    def __init__(self, model, *, n_serps, M, seed, n_queries=30, pool=14, extra=2, qd_true=None,
                 g_true=None):
        rng = np.random.default_rng(seed)
        L = M + extra                                   # lists up to M+extra: ranks > M are ignored
        assert pool >= L
        self.M, self.pool, self.n_queries = M, pool, n_queries
        self.n_pairs = n_queries * pool
        lens = rng.integers(1, L + 1, n_serps)
        q = rng.integers(0, n_queries, n_serps)
        docs = np.stack([rng.permutation(pool)[:L] for _ in range(n_serps)])
        mask_full = np.arange(L)[None, :] < lens[:, None]
        self.mask = mask_full[:, :M]
        self.pair = q[:, None] * pool + docs            # (B, L) pair index
        self.qd_index = self.pair[:, :M]
        self.qd_true = qd_true or {p: rng.uniform(0.05, 0.95, self.n_pairs) for p in model.qd_params}
        self.g_true = g_true or {k: rng.uniform(0.2, 0.9, s) for k, s in model.global_shapes(M).items()}
        self.clicks = simulate(model, gather(self.qd_true, self.qd_index, self.mask), self.g_true,
                               self.mask, rng)
        tail = ((rng.random((n_serps, extra)) < 0.5) & mask_full[:, M:]).astype(np.int8)
        clicks_full = np.concatenate([self.clicks, tail], axis=1)
        self.rows = [
            ("sim", "train", f"s{i // 3}", f"serp{i}", i % 3 + 1, f"q{q[i]}",
             [self.doc_name(docs[i, r]) for r in range(lens[i])],
             None if i % 5 == 0 else ["web"] * int(lens[i]), [int(c) for c in clicks_full[i, :lens[i]]],
             None if i % 7 == 0 else date(2024, 1, 1 + i % 28))
            for i in range(n_serps)
        ]

    @staticmethod
    def doc_name(j):
        return f"d{j}"

    def pair_key(self, idx):
        return f"q{idx // self.pool}", self.doc_name(idx % self.pool)

    def df(self, spark):
        return spark.createDataFrame(self.rows, SERPS_SCHEMA)

    def seen_pairs(self):
        idx = self.qd_index[self.mask]
        counts = np.bincount(idx, minlength=self.n_pairs)
        return np.nonzero(counts)[0], counts


def qd_frame(spark, log, params, values, counts, pairs):
    schema = T.StructType(QD_KEYS + [T.StructField(p, T.DoubleType(), True) for p in params]
                          + [T.StructField("n_obs", T.DoubleType(), True)])
    rows = [(*log.pair_key(i), *[float(values[p][i]) for p in params], float(counts[i])) for i in pairs]
    return spark.createDataFrame(rows, schema)


# ---------------------------------------------------------------------------
# fit == numpy oracle, every registered model
# ---------------------------------------------------------------------------

ITERATIONS = 3


#: pbm, ubm and dbn meet the same oracle through every engine and block step in tests/em (the fast suite's)
CONTRACT_MODELS = ("pbm", "ubm", "dbn")
#: the default estimator (beta, pooled mean, a fixed strength) for every model; the plain MLE
#: and PyClick's +1/+2 for a spread of model shapes (per-rank, 2-D per-rank, scalar, counting)
ORACLE_CASES = ([(name, "beta") if name not in CONTRACT_MODELS else pytest.param(name, "beta", marks=pytest.mark.slow)
                 for name in sorted(MODELS)]
                + [pytest.param(name, kind, marks=pytest.mark.slow)
                   for kind in ("none", "pyclick") for name in ("dctr", "pbm", "ubm", "ccm", "dbn", "sdbn")])


@pytest.mark.parametrize("name,kind", ORACLE_CASES)
def test_fit_matches_numpy_oracle(spark, name, kind):
    check_fit_matches_numpy_oracle(spark, name, kind)


def check_fit_matches_numpy_oracle(spark, name, kind="beta"):
    model = get_model(name)
    M = 8
    log = Log(model, n_serps=2000, M=M, seed=11 + len(name))
    prior = model_prior(model, M, kind, 3.0)
    fitted = fit(log.df(spark), model, iterations=ITERATIONS, max_rank=M, prior=prior)

    qd_np, glob_np, hist_np = fit_numpy(model, log.qd_index, log.n_pairs, log.clicks, log.mask,
                                        ITERATIONS, M, prior=prior)
    params = list(model.qd_params)
    pairs, counts = log.seen_pairs()
    if params:
        expected = qd_frame(spark, log, params, qd_np, counts, pairs)
        assert_approx_df_equality(fitted.qd.select("query_id", "doc_id", *params, "n_obs"), expected,
                                  1e-9, ignore_nullable=True, ignore_row_order=True)
    else:
        assert fitted.qd.count() == 0
    assert sorted(fitted.glob) == sorted(glob_np)
    for k in glob_np:
        assert fitted.glob[k].shape == model.global_shapes(M)[k]
        np.testing.assert_allclose(fitted.glob[k], glob_np[k], rtol=0, atol=1e-9, err_msg=k)

    # history: iteration 0 (start) + one entry per iteration, LL = mean per SERP of the
    # parameters that iteration produced == the oracle's total LL / n_serps
    n_iter = ITERATIONS if model.iterative else 1
    assert [h[0] for h in fitted.history] == list(range(n_iter + 1))
    np.testing.assert_allclose([h[1] * len(log.rows) for h in fitted.history[1:]], hist_np,
                               rtol=1e-10)
    assert all(h[2] > 0 for h in fitted.history[1:])

    # unseen pairs: pooled num / den over all pairs from the final pass's statistics (PyClick: 0.5)
    if params:
        qd_in, glob_in = last_input(model, log, n_iter, prior)
        stats = model.expected_stats(gather(qd_in, log.qd_index, log.mask), glob_in, log.clicks, log.mask)
        for p in params:
            num, den = stats.qd[p]
            pooled = 0.5 if kind == "pyclick" else num[log.mask].sum() / den[log.mask].sum()
            assert fitted.prior[p] == pytest.approx(pooled, abs=1e-12)
            assert fitted.prior_spec["families"][p]["k"] == (2.0 if kind == "pyclick" else 3.0 if kind == "beta" else 0.0)
    else:
        assert fitted.prior == {}
    assert fitted.prior_spec["kind"] == kind


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
        out = attach._attach_by_size(df, qd, ["alpha", "sigma"], prior, threshold)
        assert out.columns == ["serp_id", "query_id", "doc_ids", "_qd_alpha", "_qd_sigma"]
        got = {r.serp_id: (r.query_id, r.doc_ids, r._qd_alpha, r._qd_sigma) for r in out.collect()}
        assert got == expected, threshold
    assert {r.serp_id: (r.query_id, r.doc_ids, r._qd_alpha, r._qd_sigma)
            for r in attach_qd(df, qd, ["alpha", "sigma"], prior).collect()} == expected


def test_fit_on_many_small_blocks_matches_numpy_oracle(spark, monkeypatch):
    # 2000 SERPs in blocks of ~100: queries spread over 20 blocks, global sums added across them
    monkeypatch.setattr(blocks, "BLOCK_SERPS", 100)
    check_fit_matches_numpy_oracle(spark, "dbn")


@pytest.mark.parametrize("name", ["ubm", "dbn"])
def test_fit_on_repeated_serps_matches_numpy_oracle(spark, name):
    """Every SERP three times (new serp ids): the blocks hold each once, weight 3; the fit is the oracle's on
    the 3x log, SERP by SERP."""
    model, M = get_model(name), 6
    log = Log(model, n_serps=500, M=M, seed=17)
    df = log.df(spark)
    tripled = df.unionByName(df.withColumn("serp_id", F.concat("serp_id", F.lit("b")))).unionByName(
        df.withColumn("serp_id", F.concat("serp_id", F.lit("c"))))
    packed = blocks.pack_serps(tripled, max_rank=M)
    try:
        weights = np.concatenate([codec.decode_data(r["data"])[2] for r in packed.blocks.collect()])
        assert weights.sum() == 1500 and len(weights) <= 500 and (weights % 3 == 0).all()
        prior = model_prior(model, M, "beta", 3.0)
        fitted = fit(packed, model, iterations=ITERATIONS, max_rank=M, prior=prior)
    finally:
        packed.unpersist()
    tile = lambda a: np.concatenate([a] * 3)   # noqa: E731
    qd_np, glob_np, hist_np = fit_numpy(model, tile(log.qd_index), log.n_pairs, tile(log.clicks), tile(log.mask),
                                        ITERATIONS, M, prior=prior)
    pairs, counts = log.seen_pairs()
    expected = qd_frame(spark, log, model.qd_params, qd_np, 3 * counts, pairs)
    assert_approx_df_equality(fitted.qd.select("query_id", "doc_id", *model.qd_params, "n_obs"), expected,
                              1e-9, ignore_nullable=True, ignore_row_order=True)
    for k in glob_np:
        np.testing.assert_allclose(fitted.glob[k], glob_np[k], rtol=0, atol=1e-9, err_msg=k)
    np.testing.assert_allclose([h[1] * 1500 for h in fitted.history[1:]], hist_np, rtol=1e-10)


@pytest.mark.slow
def test_fit_bit_identical_on_any_partitioning(spark):
    """Same SERPs, 1 vs 7 input partitions and 2 vs 8 shuffle partitions: equal to the last bit."""
    model = get_model("ubm")
    log = Log(model, n_serps=600, M=6, seed=5)
    results = []
    for parts, shuffle in ((1, "2"), (7, "8")):
        spark.conf.set("spark.sql.shuffle.partitions", shuffle)
        try:
            df = log.df(spark).repartition(parts)
            fitted = fit(df, model, iterations=3, max_rank=6)
            qd = sorted(tuple(r) for r in fitted.qd.collect())
            results.append((qd, {k: v.tobytes() for k, v in fitted.glob.items()}, fitted.prior,
                            [h[1] for h in fitted.history]))
        finally:
            spark.conf.set("spark.sql.shuffle.partitions", "4")
    assert results[0] == results[1]


@pytest.mark.slow
def test_a_fit_leaves_no_local_checkpoint_persisted(spark):
    """The stage engine cuts its lineage with a local checkpoint every checkpoint_interval passes; each one is freed once the
    next pass is cached. Before the fix every checkpoint stayed persisted until the session ended (one copy of
    the whole EM state each: a 10M-SERP fit ran out of heap). Only the fit's qd table stays."""
    before = set(spark.sparkContext._jsc.getPersistentRDDs().keySet())

    def new_persisted() -> int:   # by id: other tests' leftovers may be cleaned meanwhile
        return len(set(spark.sparkContext._jsc.getPersistentRDDs().keySet()) - before)

    log = Log(get_model("pbm"), n_serps=300, M=5, seed=3)
    packed = blocks.pack_serps(log.df(spark), max_rank=5)
    fitted = fit(packed, get_model("pbm"), iterations=9, tol=None, max_rank=5, checkpoint_interval=2, engine="stages")
    assert fitted.history[-1][0] == 9
    assert new_persisted() == 2   # the packed log and the qd table
    # the resident engine's final blocks (a local checkpoint of its barrier stage) are freed as well
    fit(packed, get_model("pbm"), iterations=3, tol=None, max_rank=5, engine="resident")
    assert new_persisted() == 3   # and the second fit's qd table
    packed.unpersist()
    assert new_persisted() == 2


def test_one_packed_log_serves_several_models(spark):
    log = Log(get_model("pbm"), n_serps=300, M=5, seed=8)
    packed = blocks.pack_serps(log.df(spark), max_rank=5)
    try:
        for name in ("pbm", "dbn"):
            once = fit(log.df(spark), get_model(name), iterations=2, max_rank=5)
            shared = fit(packed, get_model(name), iterations=2, max_rank=5)
            assert sorted(tuple(r) for r in shared.qd.collect()) == sorted(tuple(r) for r in once.qd.collect())
            assert {k: v.tolist() for k, v in shared.glob.items()} == {k: v.tolist() for k, v in once.glob.items()}
        assert packed.blocks.count() == packed.n_blocks == blocks.MIN_BLOCKS
    finally:
        packed.unpersist()


@pytest.mark.slow
def test_groups_of_one_packed_log_fit_as_if_alone_and_score_the_held_out_perplexity(spark):
    """Two logs packed side by side (`blocks.pack_log` groups), each with the same probe SERPs held out beside
    it, fitted in shared passes (the surrogate stage's route): each group's fit is bit-identical to its log
    packed and fitted alone with the probe, within 1e-9 of the plain fit without it, and the final pass's
    perplexity terms give the PPL that SQL over the alone fit's predictions gives."""
    from clickeval_spark.metrics.distributional import Perplexity, perplexity

    model, M = get_model("dcm"), 5
    logs = [Log(model, n_serps=n, M=M, seed=seed) for n, seed in ((200, 31), (150, 32))]
    probe = Log(model, n_serps=60, M=M, seed=34).df(spark)
    cut = lambda df: attach.truncate_serps(df, M, keep=("serp_id",))  # noqa: E731
    prep = None
    for g, log in enumerate(logs):
        part = (cut(log.df(spark)).withColumn("held_out", F.lit(False))
                .unionByName(cut(probe).withColumn("held_out", F.lit(True))).withColumn("group", F.lit(g)))
        prep = part if prep is None else prep.unionByName(part)
    packed = blocks.pack_log(prep, M)
    assert [(grp.n_serps, grp.n_held_out) for grp in packed.groups] == [(200, 60), (150, 60)]
    options = dict(iterations=3, select_on_held_out=False, ppl_eps=1e-6)
    try:
        grouped = driver.fit_groups(packed, model, **options)
    finally:
        packed.unpersist()

    def values(f):
        return (sorted(tuple(r) for r in f.qd.collect()), {k: v.tobytes() for k, v in f.glob.items()}, f.prior,
                [h[1] for h in f.history])

    for g, log in enumerate(logs):
        alone_packed = blocks.pack_serps(log.df(spark), max_rank=M, held_out=probe)
        try:
            [alone] = driver.fit_groups(alone_packed, model, **options)
        finally:
            alone_packed.unpersist()
        assert values(grouped[g]) == values(alone)
        assert [a.tobytes() for a in grouped[g].held_out_ppl] == [a.tobytes() for a in alone.held_out_ppl]
    # the probe's pairs only add zeros to the pooled sums (last-bit differences, no more)
    plain = fit(logs[0].df(spark), model, iterations=3, max_rank=M)
    assert grouped[0].glob["lambda"] == pytest.approx(plain.glob["lambda"], rel=1e-9, abs=0)
    by_sql = perplexity(probe, plain, 1e-6)
    in_pass = Perplexity.from_sums(*grouped[0].held_out_ppl)
    assert in_pass.n_serps == by_sql.n_serps == 60
    # SQL sums its log terms as fixed-point longs, each rounded to 2^-32 (about 1e-11 relative here)
    assert in_pass.at_rank == pytest.approx(by_sql.at_rank, rel=1e-9, abs=0)
    assert in_pass.total == pytest.approx(by_sql.total, rel=1e-9, abs=0)
    # different logs, different fits: the groups did not see each other's SERPs
    assert values(grouped[0])[1] != values(grouped[1])[1]


@pytest.mark.slow
def test_predict_and_sampling_same_on_both_routes(spark, monkeypatch):
    model = get_model("dbn")
    log = Log(model, n_serps=80, M=5, seed=21, n_queries=4, pool=8)
    fitted, _, _ = hand_fitted(spark, model, log, seed=3)
    df = log.df(spark)
    by_map = (predict_clicks(df, fitted), sorted_rows(sample_serps(df, fitted, k=2, seed=5)))
    monkeypatch.setattr(attach, "MAP_MAX_DOCS", 0)
    by_join = (predict_clicks(df, fitted), sorted_rows(sample_serps(df, fitted, k=2, seed=5)))
    assert_df_equality(by_map[0], by_join[0], ignore_nullable=True, ignore_row_order=True)
    assert_df_equality(by_map[1], by_join[1], ignore_nullable=True)


def last_input(model, log, n_iter, prior=None):
    """(qd, glob) entering the final iteration: the oracle run one iteration shorter."""
    if n_iter == 1:
        return {p: np.full(log.n_pairs, INIT_VALUE) for p in model.qd_params}, model.init_global(log.M)
    qd, glob, _ = fit_numpy(model, log.qd_index, log.n_pairs, log.clicks, log.mask, n_iter - 1, log.M, prior)
    return qd, glob


def test_fit_tol_stops_early_and_logs(spark, caplog):
    model = get_model("pbm")
    log = Log(model, n_serps=600, M=6, seed=3)
    hist_np = np.array(fit_numpy(model, log.qd_index, log.n_pairs, log.clicks, log.mask, 4, 6)[2]) / 600
    ll0 = total_log_likelihood(model, {"alpha": np.full(log.n_pairs, 0.5)}, model.init_global(6),
                               log.qd_index, log.clicks, log.mask) / 600
    # tol between the LL changes 1 -> 2 and 0 -> 1: pass 2 (which sees 0 -> 1) goes on,
    # pass 3 (which sees 1 -> 2) stops; the parameters pass 3 produced are kept
    tol = abs(hist_np[1] - hist_np[0]) * 1.001
    assert tol < abs(hist_np[0] - ll0)
    logger = logging.getLogger("test_spark_em")
    with caplog.at_level(logging.INFO, logger="test_spark_em"):
        early = fit(log.df(spark), model, iterations=20, tol=tol, max_rank=6, logger=logger,
                    prior=model_prior(model, 6, "none"))
    assert [h[0] for h in early.history] == [0, 1, 2, 3]
    np.testing.assert_allclose([h[1] for h in early.history], [ll0, *hist_np[:3]], rtol=1e-10)
    lls = [h[1] for h in early.history]
    assert lls[0] < lls[1] < lls[2] < lls[3]             # EM never decreases the LL
    msgs = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("pbm k=0 iteration 3: train LL %.6f per SERP" % lls[3]) for m in msgs), msgs
    assert any("converged" in m for m in msgs), msgs


# ---------------------------------------------------------------------------
# predict
# ---------------------------------------------------------------------------

def hand_fitted(spark, model, log, seed, prior_value=0.37):
    """A FittedModel with random parameters for half of the pairs; the rest are unseen."""
    rng = np.random.default_rng(seed)
    params = list(model.qd_params)
    values = {p: rng.uniform(0.05, 0.95, log.n_pairs) for p in params}
    known = np.arange(log.n_pairs)[rng.random(log.n_pairs) < 0.5]
    counts = rng.integers(1, 50, log.n_pairs)
    qd = (qd_frame(spark, log, params, values, counts, known) if params
          else spark.createDataFrame([], "query_id string, doc_id string, n_obs double"))
    glob = {k: rng.uniform(0.2, 0.9, s) for k, s in model.global_shapes(log.M).items()}
    prior = {p: prior_value + 0.1 * i for i, p in enumerate(params)}
    # the numpy view: every pair's value, unseen pairs at the prior
    full = {p: np.where(np.isin(np.arange(log.n_pairs), known), values[p], prior[p]) for p in params}
    return FittedModel(model=model, max_rank=log.M, qd=qd, glob=glob, prior=prior), full, known


@pytest.mark.parametrize("name", sorted(MODELS))
def test_predict_matches_kernel(spark, name):
    model = get_model(name)
    log = Log(model, n_serps=60, M=6, seed=5, n_queries=4, pool=9, extra=3)
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


def test_relevance_scores(spark):
    log = Log(get_model("dbn"), n_serps=10, M=4, seed=1, n_queries=3, pool=6)
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


def test_models_predicted_together_match_each_kernel(spark):
    """Several models through one wide qd table, one attach and one kernel pass: every model's rows are
    its own kernel's probabilities and scores, a pair another model knows but this one does not
    takes this model's prior, and the wide table built from model_params rows gives the same rows."""
    log = Log(get_model("dbn"), n_serps=50, M=5, seed=11, n_queries=4, pool=8, extra=3)
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


# ---------------------------------------------------------------------------
# sampling
# ---------------------------------------------------------------------------

def sorted_rows(df):
    return df.orderBy("serp_id", "sample_idx")


@pytest.mark.slow
def test_sampling_same_rows_on_any_partitioning(spark):
    model = get_model("dbn")
    log = Log(model, n_serps=150, M=6, seed=8, n_queries=5, pool=9)
    fitted, _, _ = hand_fitted(spark, model, log, seed=4)
    df = log.df(spark)
    one = sample_serps(df.repartition(1), fitted, k=4, seed=123)
    eight = sample_serps(df.repartition(8), fitted, k=4, seed=123)
    assert one.columns == df.columns + ["sample_idx"]
    assert_df_equality(sorted_rows(one), sorted_rows(eight), ignore_nullable=True)
    rows = sorted_rows(one).collect()
    assert len(rows) == 4 * len(log.rows)
    assert {r.sample_idx for r in rows} == {0, 1, 2, 3}
    # lists cut to max_rank (all three list columns), clicks really re-drawn, seed matters
    assert max(len(r.doc_ids) for r in rows) == 6
    assert all(len(r.doc_ids) == len(r.clicks) and (r.vtypes is None or len(r.vtypes) == len(r.clicks))
               for r in rows)
    # the other columns pass through untouched
    originals = {row[3]: row for row in log.rows}
    for r in rows:
        o = originals[r.serp_id]
        assert (r.dataset, r.split, r.session_id, r.serp_pos, r.query_id, r.log_date) == (
            o[0], o[1], o[2], o[4], o[5], o[9])
        assert r.doc_ids == o[6][:6] and r.vtypes == (None if o[7] is None else o[7][:6])
    observed = {row[3]: row[8][:6] for row in log.rows}
    assert sum(r.clicks != observed[r.serp_id] for r in rows) > len(rows) // 4
    other = sorted_rows(sample_serps(df, fitted, k=4, seed=124)).collect()
    assert [r.clicks for r in rows] != [r.clicks for r in other]
    assert [r.serp_id for r in rows] == [r.serp_id for r in other]


def test_sampling_follows_kernel_given_the_hashed_uniforms(spark):
    """Two models sampled together (one attach, one pass): each model's clicks are its own kernel's on the
    shared uniforms, unseen pairs (which differ between the models) at each model's prior."""
    log = Log(get_model("ubm"), n_serps=80, M=5, seed=9, n_queries=4, pool=8)
    parts = {name: hand_fitted(spark, get_model(name), log, seed=seed) for name, seed in (("ubm", 6), ("pbm", 7))}
    k, seed = 3, 99
    got = sample_models(log.df(spark), {name: f for name, (f, _, _) in parts.items()}, k=k, seed=seed)
    got = {(r.model, r.serp_id, r.sample_idx): r.clicks for r in got.select("model", "serp_id", "sample_idx",
                                                                             "clicks").collect()}
    assert len(got) == 2 * k * len(log.rows)
    # the uniforms, recomputed independently of the sampler's plumbing
    u_df = (spark.createDataFrame([(row[3],) for row in log.rows], "serp_id string")
            .crossJoin(spark.range(k).select(F.col("id").cast("int").alias("sample_idx")))
            .crossJoin(spark.range(1, log.M + 1).select(F.col("id").cast("int").alias("rank")))
            .select("serp_id", "sample_idx", "rank",
                    seeded_uniform(seed, F.col("serp_id"), F.col("sample_idx"), F.col("rank")).alias("u")))
    u = np.ones((len(log.rows), k, log.M))
    pos = {row[3]: b for b, row in enumerate(log.rows)}
    for r in u_df.collect():
        u[pos[r.serp_id], r.sample_idx, r.rank - 1] = r.u
    assert ((u >= 0) & (u < 1)).all() and 0.3 < u.mean() < 0.7
    for name, (fitted, full, _) in parts.items():
        qd = gather(full, log.qd_index, log.mask)
        for s in range(k):
            expected = sample_clicks(fitted.model, qd, fitted.glob, log.mask, u[:, s, :])
            for b, row in enumerate(log.rows):
                n = min(len(row[6]), log.M)
                assert got[(name, row[3], s)] == [int(c) for c in expected[b, :n]], (name, row[3], s)


@pytest.mark.parametrize("name", ["dbn", "cm"])
def test_sampled_click_rates_match_click_probs(spark, name):
    model = get_model(name)
    log = Log(model, n_serps=40, M=6, seed=12, n_queries=4, pool=8)
    fitted, full, _ = hand_fitted(spark, model, log, seed=13)
    k = 600
    samples = sample_serps(log.df(spark), fitted, k=k, seed=5)
    rates = (samples.select("serp_id", F.posexplode("clicks").alias("pos", "c"))
             .groupBy("serp_id", "pos").agg(F.avg("c").alias("rate"), F.count("c").alias("n"))
             .collect())
    p = model.click_probs(gather(full, log.qd_index, log.mask), fitted.glob, log.mask)
    pos = {row[3]: b for b, row in enumerate(log.rows)}
    z = []
    for r in rates:
        assert r.n == k
        pr = p[pos[r.serp_id], r.pos]
        se = math.sqrt(max(pr * (1 - pr), 1e-4) / k)
        z.append((r.rate - pr) / se)
    assert len(z) == int(log.mask.sum())
    assert max(abs(x) for x in z) < 5.0
    if name == "cm":  # the cascade stops at the first click: a chain-rule property, not a marginal
        assert samples.filter(F.aggregate("clicks", F.lit(0), lambda a, c: a + c) > 1).count() == 0


def test_sampling_deterministic(spark):
    model = get_model("pbm")
    log = Log(model, n_serps=50, M=5, seed=2, n_queries=3, pool=8)
    fitted, full, _ = hand_fitted(spark, model, log, seed=3)
    got = sample_serps(log.df(spark), fitted, k=2, seed=1, deterministic=True).collect()
    expected = sample_clicks(model, gather(full, log.qd_index, log.mask), fitted.glob, log.mask,
                             np.zeros(log.mask.shape), deterministic=True)
    pos = {row[3]: b for b, row in enumerate(log.rows)}
    assert len(got) == 2 * len(log.rows)
    for r in got:
        b = pos[r.serp_id]
        assert r.clicks == [int(c) for c in expected[b, :len(r.clicks)]]
    assert expected.sum() > 0 and (expected[log.mask] == 0).sum() > 0


# ---------------------------------------------------------------------------
# model_params round trip
# ---------------------------------------------------------------------------

@pytest.mark.slow
def test_param_rows_round_trip(spark, warehouse):
    names = ["ubm", "ccm", "dbn", "gctr"]
    M = 5
    fits = {}
    for name in names:
        log = Log(get_model(name), n_serps=40, M=M, seed=21, n_queries=3, pool=7)
        fits[name] = (log,) + hand_fitted(spark, get_model(name), log, seed=22)
    rows = None
    for name in names:
        for run in ("run-1", "run-2"):
            r = to_param_rows(fits[name][1], run)
            rows = r if rows is None else rows.unionByName(r)
    assert rows.schema.simpleString() == T._parse_datatype_string(MODEL_PARAMS_SCHEMA).simpleString()
    # a stored table (Parquet: same types and nulls as the Delta table, a tenth of the test time)
    path = str(Path(warehouse) / "model_params")
    rows.write.mode("overwrite").parquet(path)
    stored = spark.read.parquet(path).cache()

    counts = {(r.model, r.param): r["count"] for r in
              stored.filter(F.col("run_id") == "run-1").groupBy("model", "param").count().collect()}
    for name in names:
        log, fitted, _, known = fits[name]
        model = get_model(name)
        for p in model.qd_params:
            assert counts[(name, p)] == len(known)
            assert counts[(name, "prior_" + p)] == 1 + M   # m, then an unseen pair's value at each rank
    assert counts[("ubm", "gamma")] == M * (M + 1)
    assert counts[("dbn", "gamma")] == 1 and counts[("gctr", "ctr")] == 1
    assert {k for k in counts if k[0] == "gctr"} == {("gctr", "ctr")}

    # UBM gamma (M, M+1): rank 1..M, prev_click_rank 0..M (0 = no click above)
    ubm_glob = fits["ubm"][1].glob
    g = {(r["rank"], r.prev_click_rank): r.value for r in stored.filter(
        (F.col("run_id") == "run-1") & (F.col("param") == "gamma") & (F.col("model") == "ubm")).collect()}
    assert g == {(i + 1, j): ubm_glob["gamma"][i, j] for i in range(M) for j in range(M + 1)}
    # CCM tau (3,) does not depend on M: scalars tau1..tau3, keys null
    taus = stored.filter((F.col("run_id") == "run-1") & F.col("param").startswith("tau")).collect()
    assert {r.param: r.value for r in taus} == {f"tau{i + 1}": fits["ccm"][1].glob["tau"][i] for i in range(3)}
    assert all(r["rank"] is None and r.query_id is None for r in taus)
    prior = stored.filter((F.col("run_id") == "run-1") & (F.col("param") == "prior_sigma")
                          & F.col("rank").isNull()).first()
    assert prior.value == fits["dbn"][1].prior["sigma"] and prior.query_id is None and prior["rank"] is None
    alpha = stored.filter((F.col("run_id") == "run-1") & (F.col("model") == "dbn")
                          & (F.col("param") == "alpha")).select("query_id", "doc_id", "value", "n_obs")
    assert_df_equality(alpha, fits["dbn"][1].qd.select("query_id", "doc_id", F.col("alpha").alias("value"), "n_obs"),
                       ignore_nullable=True, ignore_row_order=True)

    for name in names:
        log, fitted, _, _ = fits[name]
        back = FittedModel.from_rows(stored, get_model(name), "run-1", M)
        assert back.prior == fitted.prior and back.max_rank == M
        assert all(back.unseen_at_ranks(p) == fitted.unseen_at_ranks(p) for p in fitted.prior)
        assert sorted(back.glob) == sorted(fitted.glob)
        for k in fitted.glob:
            np.testing.assert_array_equal(back.glob[k], fitted.glob[k])
        assert_df_equality(back.qd, fitted.qd, ignore_nullable=True, ignore_row_order=True,
                           ignore_column_order=True)
    log, fitted, _, _ = fits["ubm"]
    back = FittedModel.from_rows(stored, get_model("ubm"), "run-1", M)
    assert_df_equality(back.predict(log.df(spark)), fitted.predict(log.df(spark)),
                       ignore_nullable=True, ignore_row_order=True)
    with pytest.raises(ValueError, match="lack values"):
        FittedModel.from_rows(stored, get_model("ubm"), "run-1", M + 1)
    stored.unpersist()


# ---------------------------------------------------------------------------
# scale: 1 MB driver result limit, >= 200k (query, doc) pairs generated in Spark
# ---------------------------------------------------------------------------

N_SCALE = 50_000
SCALE_SCRIPT = textwrap.dedent("""
    import json, sys, time
    from pyspark.sql import functions as F
    from clickeval_spark.session import build_session
    from clickeval_spark.models import get_model
    from clickeval_spark.em.driver import fit

    N_SERPS, N_QUERIES, POOL, M = {n_serps}, {n_queries}, {pool}, 10
    spark = build_session("scale-test", master="local[2]", warehouse=sys.argv[1], embedded=True, conf={{
        "spark.driver.maxResultSize": "1m",
        "spark.sql.shuffle.partitions": "8",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
    }})
    assert spark.sparkContext.getConf().get("spark.driver.maxResultSize") == "1m"
    # the limit bites: collecting ~5 MB of rows fails
    try:
        spark.range(600_000).collect()
        sys.exit("maxResultSize did not stop a 5 MB collect")
    except Exception as e:
        assert "maxResultSize" in str(e), e
    # every SERP: a query, 10 consecutive docs of the query's pool from a hashed offset,
    # clicks from a hashed coin whose rate falls with rank
    serps = spark.range(N_SERPS).select(
        F.lit("scale").alias("dataset"), F.lit("train").alias("split"),
        F.col("id").cast("string").alias("session_id"), F.concat(F.lit("s"), F.col("id")).alias("serp_id"),
        F.lit(1).alias("serp_pos"),
        F.concat(F.lit("q"), (F.col("id") % N_QUERIES).cast("string")).alias("query_id"),
        F.transform(F.sequence(F.lit(0), F.lit(M - 1)), lambda r: F.concat(
            F.lit("d"), F.pmod(F.xxhash64(F.col("id"), F.lit(7)) + r, F.lit(POOL)).cast("string"))).alias("doc_ids"),
        F.lit(None).cast("array<string>").alias("vtypes"),
        F.transform(F.sequence(F.lit(0), F.lit(M - 1)), lambda r: (
            F.pmod(F.xxhash64(F.col("id"), r), F.lit(1000)) < F.lit(400) / (r + 1)).cast("int")).alias("clicks"),
        F.lit(None).cast("date").alias("log_date"),
    )
    serps = serps.cache()
    out = {{"n_serps": serps.count()}}
    out["n_pairs"] = serps.select("query_id", F.explode("doc_ids").alias("d")).distinct().count()
    for name in ("pbm", "dbn"):
        t = time.perf_counter()
        fitted = fit(serps, get_model(name), iterations=2, max_rank=M)
        out[name] = {{
            "seconds": time.perf_counter() - t,
            "iteration_seconds": [h[2] for h in fitted.history[1:]],
            "ll": [h[1] for h in fitted.history],
            "qd_rows": fitted.qd.count(),
        }}
    print("RESULT " + json.dumps(out))
    spark.stop()
""")


@pytest.fixture(scope="module", autouse=True)
def scale_run(request, tmp_path_factory):
    """Fit PBM and DBN in a dedicated session: spark.driver.maxResultSize = 1m must be set
    before its SparkContext starts, so it runs in a subprocess and the shared test session
    is untouched. Started when the module starts (if the scale test is selected) so it
    overlaps with the other tests, which mostly wait on job scheduling."""
    if not any(item.name == "test_scale_fit_under_1mb_driver_results" for item in request.session.items):
        yield None
        return
    script = tmp_path_factory.mktemp("scale") / "scale_fit.py"
    script.write_text(SCALE_SCRIPT.format(n_serps=N_SCALE, n_queries=22_000, pool=14))
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, str(script), str(script.parent / "wh")], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_scale_fit_under_1mb_driver_results(scale_run):
    stdout, stderr = scale_run.communicate(timeout=900)
    assert scale_run.returncode == 0, stderr[-5000:]
    line = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")][-1]
    out = json.loads(line[len("RESULT "):])
    print(json.dumps(out, indent=1))
    assert out["n_serps"] == N_SCALE
    assert out["n_pairs"] >= 200_000
    for name in ("pbm", "dbn"):
        r = out[name]
        assert r["qd_rows"] == out["n_pairs"]
        assert len(r["ll"]) == 3 and all(math.isfinite(x) for x in r["ll"])
        assert r["ll"][2] > r["ll"][0]


def test_fit_rejects_clicks_of_another_length(spark):
    serps = spark.createDataFrame(
        [("t", "train", "s", "x", 1, "q", ["a", "b", "c"], None, [1, 0], None)], SERPS_SCHEMA)
    with pytest.raises(Exception, match="clicks and doc_ids of different lengths"):
        fit(serps, get_model("pbm"), iterations=1, max_rank=10)


def test_a_pass_plan_for_a_group_the_log_lacks_is_refused():
    from clickeval_spark.em.passes import PassPlan
    from clickeval_spark.em.sums import _lanes
    plans = [PassPlan("step", {}, None, group=g) for g in (0, 1, 0)]
    assert _lanes(plans, 2) == [[0, 2], [1]]
    with pytest.raises(ValueError, match=r"group\(s\) \[1\], but the packed log has groups 0..0"):
        _lanes(plans, 1)
