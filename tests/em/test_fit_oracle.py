"""Spark EM fits against the numpy oracle: every registered model and estimator, any block and
partition layout, folded repeats, groups of one packed log, early stopping on ``tol``."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from chispa import assert_approx_df_equality
from pyspark.sql import functions as F

from clickeval_spark.models import MODELS, get_model
from clickeval_spark.models.base import INIT_VALUE
from clickeval_spark.fitted import attach
from clickeval_spark.em import blocks, codec, driver
from clickeval_spark.models.priors import model_prior
from clickeval_spark.em.driver import fit

from tests.models.numpy_em import fit_numpy, gather, total_log_likelihood
from tests.em.logs import SERPS_SCHEMA, qd_frame


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
def test_fit_matches_numpy_oracle(spark, make_log, name, kind):
    check_fit_matches_numpy_oracle(spark, make_log, name, kind)


def check_fit_matches_numpy_oracle(spark, make_log, name, kind="beta"):
    model = get_model(name)
    M = 8
    log = make_log(model, n_serps=2000, M=M, seed=11 + len(name))
    prior = model_prior(model, M, kind, 3.0)
    fitted = fit(log.df(spark), model, iterations=ITERATIONS, tol=None, max_rank=M, prior=prior)
    # PyClick's prior is fitted by PyClick's estimator, where the model has one (SDBN: counting)
    assert fitted.prior_spec.get("estimator") == (None if model.counting is None
                                                  else "counting" if kind == "pyclick" else "em")
    model = model.counting if kind == "pyclick" and model.counting is not None else model

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


def test_fit_on_many_small_blocks_matches_numpy_oracle(spark, make_log, monkeypatch):
    # 2000 SERPs in blocks of ~100: queries spread over 20 blocks, global sums added across them
    monkeypatch.setattr(blocks, "BLOCK_SERPS", 100)
    check_fit_matches_numpy_oracle(spark, make_log, "dbn")


@pytest.mark.parametrize("name", ["ubm", "dbn"])
def test_fit_on_repeated_serps_matches_numpy_oracle(spark, make_log, name):
    """Every SERP three times (new serp ids): the blocks hold each once, weight 3; the fit is the oracle's on
    the 3x log, SERP by SERP."""
    model, M = get_model(name), 6
    log = make_log(model, n_serps=500, M=M, seed=17)
    df = log.df(spark)
    tripled = df.unionByName(df.withColumn("serp_id", F.concat("serp_id", F.lit("b")))).unionByName(
        df.withColumn("serp_id", F.concat("serp_id", F.lit("c"))))
    packed = blocks.pack_serps(tripled, max_rank=M)
    try:
        weights = np.concatenate([codec.decode_data(r["data"])[2] for r in packed.blocks.collect()])
        assert weights.sum() == 1500 and len(weights) <= 500 and (weights % 3 == 0).all()
        prior = model_prior(model, M, "beta", 3.0)
        fitted = fit(packed, model, iterations=ITERATIONS, tol=None, max_rank=M, prior=prior)
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
def test_fit_bit_identical_on_any_partitioning(spark, make_log):
    """Same SERPs, 1 vs 7 input partitions and 2 vs 8 shuffle partitions: equal to the last bit."""
    model = get_model("ubm")
    log = make_log(model, n_serps=600, M=6, seed=5)
    results = []
    for parts, shuffle in ((1, "2"), (7, "8")):
        spark.conf.set("spark.sql.shuffle.partitions", shuffle)
        try:
            df = log.df(spark).repartition(parts)
            fitted = fit(df, model, iterations=3, tol=None, max_rank=6)
            qd = sorted(tuple(r) for r in fitted.qd.collect())
            results.append((qd, {k: v.tobytes() for k, v in fitted.glob.items()}, fitted.prior,
                            [h[1] for h in fitted.history]))
        finally:
            spark.conf.set("spark.sql.shuffle.partitions", "4")
    assert results[0] == results[1]


def test_one_packed_log_serves_several_models(spark, make_log):
    log = make_log(get_model("pbm"), n_serps=300, M=5, seed=8)
    packed = blocks.pack_serps(log.df(spark), max_rank=5)
    try:
        for name in ("pbm", "dbn"):
            once = fit(log.df(spark), get_model(name), iterations=2, tol=None, max_rank=5)
            shared = fit(packed, get_model(name), iterations=2, tol=None, max_rank=5)
            assert sorted(tuple(r) for r in shared.qd.collect()) == sorted(tuple(r) for r in once.qd.collect())
            assert {k: v.tolist() for k, v in shared.glob.items()} == {k: v.tolist() for k, v in once.glob.items()}
        assert packed.blocks.count() == packed.n_blocks == blocks.MIN_BLOCKS
    finally:
        packed.unpersist()


@pytest.mark.slow
def test_groups_of_one_packed_log_fit_as_if_alone_and_score_the_held_out_perplexity(spark, make_log):
    """Two logs packed side by side (`blocks.pack_log` groups), each with the same probe SERPs held out beside
    it, fitted in shared passes (the surrogate stage's route): each group's fit is bit-identical to its log
    packed and fitted alone with the probe, within 1e-9 of the plain fit without it, and the final pass's
    perplexity terms give the PPL that SQL over the alone fit's predictions gives."""
    from clickeval_spark.metrics.distributional import Perplexity, perplexity

    model, M = get_model("dcm"), 5
    logs = [make_log(model, n_serps=n, M=M, seed=seed) for n, seed in ((200, 31), (150, 32))]
    probe = make_log(model, n_serps=60, M=M, seed=34).df(spark)
    cut = lambda df: attach.truncate_serps(df, M, keep=("serp_id",))  # noqa: E731
    prep = None
    for g, log in enumerate(logs):
        part = (cut(log.df(spark)).withColumn("held_out", F.lit(False))
                .unionByName(cut(probe).withColumn("held_out", F.lit(True))).withColumn("group", F.lit(g)))
        prep = part if prep is None else prep.unionByName(part)
    packed = blocks.pack_log(prep, M)
    assert [(grp.n_serps, grp.n_held_out) for grp in packed.groups] == [(200, 60), (150, 60)]
    options = dict(iterations=3, tol=None, select_on_held_out=False, ppl_eps=1e-6)
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
    plain = fit(logs[0].df(spark), model, iterations=3, tol=None, max_rank=M)
    assert grouped[0].glob["lambda"] == pytest.approx(plain.glob["lambda"], rel=1e-9, abs=0)
    by_sql = perplexity(probe, plain, 1e-6)
    in_pass = Perplexity.from_sums(*grouped[0].held_out_ppl)
    assert in_pass.n_serps == by_sql.n_serps == 60
    # SQL sums its log terms as fixed-point longs, each rounded to 2^-32 (about 1e-11 relative here)
    assert in_pass.at_rank == pytest.approx(by_sql.at_rank, rel=1e-9, abs=0)
    assert in_pass.total == pytest.approx(by_sql.total, rel=1e-9, abs=0)
    # different logs, different fits: the groups did not see each other's SERPs
    assert values(grouped[0])[1] != values(grouped[1])[1]


def last_input(model, log, n_iter, prior=None):
    """(qd, glob) entering the final iteration: the oracle run one iteration shorter."""
    if n_iter == 1:
        return {p: np.full(log.n_pairs, INIT_VALUE) for p in model.qd_params}, model.init_global(log.M)
    qd, glob, _ = fit_numpy(model, log.qd_index, log.n_pairs, log.clicks, log.mask, n_iter - 1, log.M, prior)
    return qd, glob


def test_fit_tol_stops_early_and_logs(spark, make_log, caplog):
    model = get_model("pbm")
    log = make_log(model, n_serps=600, M=6, seed=3)
    hist_np = np.array(fit_numpy(model, log.qd_index, log.n_pairs, log.clicks, log.mask, 4, 6)[2]) / 600
    ll0 = total_log_likelihood(model, {"alpha": np.full(log.n_pairs, 0.5)}, model.init_global(6),
                               log.qd_index, log.clicks, log.mask) / 600
    # tol between the LL changes 1 -> 2 and 0 -> 1: pass 2 (which sees 0 -> 1) goes on,
    # pass 3 (which sees 1 -> 2) stops; the parameters pass 3 produced are kept
    tol = abs(hist_np[1] - hist_np[0]) * 1.001
    assert tol < abs(hist_np[0] - ll0)
    logger = logging.getLogger("test_spark_em")
    with caplog.at_level(logging.DEBUG, logger="test_spark_em"):   # every pass logs at DEBUG
        early = fit(log.df(spark), model, iterations=20, tol=tol, max_rank=6, logger=logger,
                    prior=model_prior(model, 6, "none"), converge=None)   # tol's stop alone
    assert [h[0] for h in early.history] == [0, 1, 2, 3]
    np.testing.assert_allclose([h[1] for h in early.history], [ll0, *hist_np[:3]], rtol=1e-10)
    lls = [h[1] for h in early.history]
    assert lls[0] < lls[1] < lls[2] < lls[3]             # EM never decreases the LL
    msgs = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("pbm k=0 iteration 3: train LL %.6f per SERP" % lls[3]) for m in msgs), msgs
    assert any("converged" in m for m in msgs), msgs


def test_fit_rejects_clicks_of_another_length(spark):
    serps = spark.createDataFrame(
        [("t", "train", "s", "x", 1, "q", ["a", "b", "c"], None, [1, 0], None)], SERPS_SCHEMA)
    with pytest.raises(Exception, match="clicks and doc_ids of different lengths"):
        fit(serps, get_model("pbm"), iterations=1, tol=None, max_rank=10)


def test_a_pass_plan_for_a_group_the_log_lacks_is_refused():
    from clickeval_spark.em.passes import PassPlan
    from clickeval_spark.em.sums import plan_lanes
    plans = [PassPlan("step", {}, None, group=g) for g in (0, 1, 0)]
    assert plan_lanes(plans, 2) == [[0, 2], [1]]
    with pytest.raises(ValueError, match=r"group\(s\) \[1\], but the packed log has groups 0..0"):
        plan_lanes(plans, 1)
