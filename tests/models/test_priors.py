"""Beta priors in the M-step (models/priors.py): hand-computed estimators, the log posterior,
and `k: auto` against a numpy oracle that fits every candidate strength on its own."""

from __future__ import annotations

import numpy as np
import pytest
from pyspark.sql import functions as F

from clickeval_spark.config import load_config
from clickeval_spark.errors import ConfigError
from clickeval_spark.models import get_model
from clickeval_spark.models.base import log_likelihood
from clickeval_spark.fitted import FittedModel
from clickeval_spark.fitted.params_io import to_param_rows
from clickeval_spark.fitted.predict import predict_clicks
from clickeval_spark.models.priors import model_prior
from clickeval_spark.em.blocks import pack_serps
from clickeval_spark.em.driver import fit
from tests.models.numpy_em import fit_numpy, gather
from tests.em.logs import DCTR_ROWS, SERPS_SCHEMA, split_log

@pytest.mark.parametrize("kind,k,expected,unseen", [
    # plain ratio: the never-clicked pair goes to 0
    ("none", 1.0, {"d1": 2 / 3, "d2": 0.0, "d3": 1 / 2}, 3 / 6),
    # PyClick: (clicks + 1) / (shows + 2), unseen pairs 0.5
    ("pyclick", 1.0, {"d1": 3 / 5, "d2": 1 / 3, "d3": 2 / 4}, 0.5),
    # beta, k = 2 toward the pooled CTR m = 3 clicks / 6 shows = 0.5 ... and k = 6
    ("beta", 2.0, {"d1": (2 + 1) / 5, "d2": (0 + 1) / 3, "d3": (1 + 1) / 4}, 0.5),
    ("beta", 6.0, {"d1": (2 + 3) / 9, "d2": (0 + 3) / 7, "d3": (1 + 3) / 8}, 0.5),
])
def test_dctr_estimators_by_hand(spark, kind, k, expected, unseen):
    fitted = fit(spark.createDataFrame(DCTR_ROWS, SERPS_SCHEMA), get_model("dctr"), iterations=1, tol=None, max_rank=10,
                 prior=model_prior(get_model("dctr"), 10, kind, k))
    got = {r.doc_id: r.alpha for r in fitted.qd.collect()}
    assert got == pytest.approx(expected, abs=1e-15)
    assert fitted.prior == pytest.approx({"alpha": unseen}, abs=1e-15)
    assert fitted.prior_spec["kind"] == kind


def test_pbm_pyclick_global_update_by_hand(spark):
    # one pass of PBM from 0.5: a click at rank 1 gives exam = 1; a skip gives
    # P(E=1 | C=0) = g(1-a) / (1 - a g) = 1/3. Rank 1: clicked twice, skipped once.
    rows = [("t", "train", f"s{i}", f"r{i}", 1, "q", ["a"], None, [c], None) for i, c in enumerate([1, 1, 0])]
    fitted = fit(spark.createDataFrame(rows, SERPS_SCHEMA), get_model("pbm"), iterations=1, tol=None, max_rank=1,
                 prior=model_prior(get_model("pbm"), 1, "pyclick"))
    assert fitted.glob["gamma"][0] == pytest.approx((2 + 1 / 3 + 1) / (3 + 2), abs=1e-15)
    # alpha: P(A=1 | C=0) = a(1-g) / (1 - a g) = 1/3 as well
    assert fitted.qd.first().alpha == pytest.approx((2 + 1 / 3 + 1) / (3 + 2), abs=1e-15)


@pytest.mark.slow
def test_auto_strength_is_the_best_valid_ll_of_independent_fits(spark, sparse_log):
    model = get_model("pbm")
    log = sparse_log(model)
    held = np.arange(len(log.rows)) % 4 == 0
    train_df, valid_df = split_log(spark, log, held)
    grid = (0.5, 4.0, 32.0)
    packed = pack_serps(train_df, max_rank=log.M, held_out=valid_df)
    try:
        assert (packed.n_serps, packed.n_held_out) == ((~held).sum(), held.sum())
        auto = fit(packed, model, iterations=4, tol=None, max_rank=log.M, prior=model_prior(model, log.M), k_grid=grid)
        plain = fit(packed, model, iterations=4, tol=None, max_rank=log.M, prior=model_prior(model, log.M, "none"))
    finally:
        packed.unpersist()

    seen = np.zeros(log.n_pairs, dtype=bool)
    seen[log.qd_index[~held][log.mask[~held]]] = True
    unseen = log.mask[held] & ~seen[np.where(log.mask[held], log.qd_index[held], 0)]
    assert unseen.sum() > 20   # held-out ranks whose pair has no training impression

    def valid_ll(qd, glob, by_rank):
        qd_v = gather(qd, log.qd_index[held], log.mask[held])
        # a pair with no training impression takes its family's pooled mean at the rank it is shown at
        qd_v = {p: np.where(unseen, by_rank[p][None, :], v) for p, v in qd_v.items()}
        p = model.cond_probs(qd_v, glob, log.clicks[held], log.mask[held])
        return log_likelihood(p, log.clicks[held], log.mask[held]).sum() / log.mask[held].sum()

    def fit_train(iterations, k, warmup=None):
        by_rank = {}
        qd, glob, _ = fit_numpy(model, log.qd_index[~held], log.n_pairs, log.clicks[~held], log.mask[~held],
                                iterations, log.M, prior={"alpha": (k, None)}, warmup=warmup, by_rank=by_rank)
        return qd, glob, by_rank

    expected = []
    for k in grid:
        # the warm-up ends at the first iteration whose valid LL is below its predecessor's
        # (iteration 0: every parameter 0.5)
        path = [valid_ll({"alpha": np.full(log.n_pairs, 0.5)}, model.init_global(log.M),
                         {"alpha": np.full(log.M, 0.5)})]
        path += [valid_ll(*fit_train(t, k)) for t in range(1, 4)]
        warmup = next((t for t in range(1, 4) if path[t] < path[t - 1]), None)
        expected.append(valid_ll(*fit_train(4, k, warmup)))
    cands = auto.selection["grid"]
    assert [g["k"] for g in cands] == [*grid, "eb"]   # the grid's strengths, then empirical Bayes
    np.testing.assert_allclose([g["valid_ll"] for g in cands[:-1]], expected, rtol=0, atol=1e-12)
    best = max(cands, key=lambda g: g["valid_ll"])
    assert auto.selection["chosen_k"] == best["k"] and auto.valid_ll == best["valid_ll"]
    if best["k"] != "eb":
        assert auto.prior_spec["families"]["alpha"]["k"] == best["k"]
        assert best["valid_ll"] == pytest.approx(max(expected), abs=1e-12)
    # the point of the prior: on a sparse log it beats the plain ratio on SERPs it has not seen
    assert auto.valid_ll > plain.valid_ll + 0.01, (auto.valid_ll, plain.valid_ll)


def test_log_posterior_is_ll_plus_beta_log_density(spark, sparse_log):
    model, k = get_model("dbn"), 3.0
    log = sparse_log(model, seed=9)
    fitted = fit(log.df(spark), model, iterations=3, tol=None, max_rank=log.M, prior=model_prior(model, log.M, "beta", k))
    n = len(log.rows)
    seen = np.bincount(log.qd_index[log.mask], minlength=log.n_pairs) > 0
    for it in (1, 2, 3):
        qd_prev, g_prev, _ = (fit_numpy(model, log.qd_index, log.n_pairs, log.clicks, log.mask, it - 1, log.M,
                                        prior={p: (k, None) for p in model.qd_params})
                              if it > 1 else ({p: np.full(log.n_pairs, 0.5) for p in model.qd_params},
                                              model.init_global(log.M), None))
        stats = model.expected_stats(gather(qd_prev, log.qd_index, log.mask), g_prev, log.clicks, log.mask)
        qd, glob, hist = fit_numpy(model, log.qd_index, log.n_pairs, log.clicks, log.mask, it, log.M,
                                   prior={p: (k, None) for p in model.qd_params})
        lp = 0.0
        for p in model.qd_params:
            num, den = stats.qd[p]
            m = num[log.mask].sum() / den[log.mask].sum()
            v = qd[p][seen]
            lp += (k * (m * np.log(v) + (1 - m) * np.log1p(-v))).sum()
        assert fitted.log_posterior[it] == pytest.approx((hist[-1] + lp) / n, abs=1e-10)


def test_prior_is_stored_with_the_parameters_and_read_back(spark, sparse_log):
    model = get_model("dbn")
    log = sparse_log(model, seed=2)
    prior = model_prior(model, log.M, "beta", 5.0, {"sigma": ("pyclick", 1.0), "gamma": ("pyclick", 1.0)})
    assert prior.kind == "mixed"
    fitted = fit(log.df(spark), model, iterations=2, tol=None, max_rank=log.M, prior=prior)
    rows = to_param_rows(fitted, "run-p")
    small = {r.param: r.value for r in rows.where(F.col("query_id").isNull() & F.col("rank").isNull()).collect()}
    by_rank = {(r.param, r.rank): r.value for r in rows.where(F.col("param").isin("prior_alpha", "prior_sigma")
                                                               & F.col("rank").isNotNull()).collect()}
    # an unseen pair's alpha at rank r: the pooled mean of rank r (numpy oracle); sigma's m is fixed (pyclick)
    expected = {}
    fit_numpy(model, log.qd_index, log.n_pairs, log.clicks, log.mask, 2, log.M, prior, by_rank=expected)
    np.testing.assert_allclose([by_rank["prior_alpha", r] for r in range(1, log.M + 1)], expected["alpha"],
                               rtol=0, atol=1e-12)
    assert [by_rank["prior_sigma", r] for r in range(1, log.M + 1)] == [0.5] * log.M
    assert by_rank["prior_alpha", 1] > by_rank["prior_alpha", log.M] + 0.01
    assert small["prior_kind:mixed"] == 1.0
    assert small["prior_strength_alpha"] == 5.0 and small["prior_strength_sigma"] == 2.0
    assert small["prior_strength_gamma"] == 2.0 and small["prior_gamma"] == 0.5
    assert small["prior_sigma"] == 0.5 and small["prior_alpha"] == fitted.prior["alpha"] != 0.5
    back = FittedModel.from_rows(rows, model, "run-p", log.M)
    assert back.prior_spec["kind"] == "mixed"
    assert {f: (v["k"], v["m"]) for f, v in back.prior_spec["families"].items()} == \
        {f: (v["k"], v["m"]) for f, v in fitted.prior_spec["families"].items()}
    # unseen pairs get m: a SERP of unseen documents is predicted with the stored means
    unseen = spark.createDataFrame([("t", "test", "x", "rx", 1, "q-new", ["n1", "n2"], None, [0, 0], None)],
                                   SERPS_SCHEMA)
    p1 = predict_clicks(unseen, back).first().p_click[0]
    assert p1 == pytest.approx(by_rank["prior_alpha", 1], abs=1e-15)   # DBN: P(C_1) = alpha_1
    assert back.prior_by_rank == fitted.prior_by_rank


def test_prior_config(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("fit:\n  prior: {kind: beta, k: auto, grid: [1, 8]}\n"
                    "  model_priors: {sdbn: {kind: pyclick}, dbn.sigma: {k: 2}, ubm: {k: 16}}\n")
    cfg = load_config(path).fit
    assert cfg.prior.grid == (1.0, 8.0)
    assert cfg.prior_overrides("pbm") == ("beta", "auto", {})
    assert cfg.prior_overrides("sdbn") == ("pyclick", "auto", {})
    assert cfg.prior_overrides("dbn") == ("beta", "auto", {"sigma": ("beta", 2)})
    assert cfg.prior_overrides("ubm") == ("beta", 16, {})
    dbn = model_prior(get_model("dbn"), 10, *cfg.prior_overrides("dbn"))
    assert dbn.auto == ("alpha",) and dbn.qd["sigma"].k == 2 and dbn.glob["gamma"].k == 0
    for text, message in [
        ("fit: {prior: {kind: laplace}}", "fit.prior.kind: 'laplace' is not allowed"),
        ("fit: {prior: {k: -1}}", "fit.prior.k: -1 is not allowed; a number > 0 or auto"),
        ("fit: {prior: {grid: [1, auto]}}", "fit.prior.grid: expected a number, got 'auto'"),
        ("fit: {prior: {grid: [1, 0]}}", "fit.prior.grid: 0.0 is not allowed; a number > 0"),
        ("fit: {model_priors: {ncm: {k: 1}}}", "fit.model_priors.ncm: unknown model 'ncm'"),
        ("fit: {model_priors: {pbm.sigma: {k: 1}}}", "fit.model_priors.pbm.sigma: pbm has no parameter family 'sigma'"),
    ]:
        path.write_text(text)
        with pytest.raises(ConfigError) as err:
            load_config(path)
        assert message in str(err.value), (text, str(err.value))


@pytest.mark.parametrize("name", ["pbm", "ubm"])
@pytest.mark.slow
def test_pooled_means_are_fixed_after_the_warmup_and_em_then_converges(spark, sparse_log, name):
    """m follows the pooled estimate for `prior_warmup` passes, then stays: every fitted number equals
    the numpy oracle with the same freeze, the log posterior never decreases from the freeze on (EM
    on one fixed objective), and tol stops the fit there. UBM's examination cells shrink per rank."""
    model, k, warmup = get_model(name), 3.0, 2
    log = sparse_log(model, seed=4)
    families = {"gamma": ("beta", 8.0)} if name == "ubm" else None
    prior = model_prior(model, log.M, "beta", k, families)
    fitted = fit(log.df(spark), model, iterations=8, tol=None, max_rank=log.M, prior=prior, prior_warmup=warmup)
    qd_np, glob_np, hist_np = fit_numpy(model, log.qd_index, log.n_pairs, log.clicks, log.mask, 8, log.M,
                                        prior=prior, warmup=warmup)
    got = {(r.query_id, r.doc_id): r.alpha for r in fitted.qd.collect()}
    pairs, _ = log.seen_pairs()
    assert len(got) == len(pairs)
    for i in pairs:
        assert got[log.pair_key(i)] == pytest.approx(qd_np["alpha"][i], abs=1e-9)
    for g in glob_np:
        np.testing.assert_allclose(fitted.glob[g], glob_np[g], rtol=0, atol=1e-9, err_msg=g)
    np.testing.assert_allclose([ll for _, ll, _ in fitted.history[1:]], np.array(hist_np) / len(log.rows),
                               rtol=0, atol=1e-9)
    # unseen pairs get the frozen m: the pooled mean of pass `warmup`'s E-step (on the parameters
    # of pass warmup - 1), not the last pass's
    qd_w, glob_w, _ = fit_numpy(model, log.qd_index, log.n_pairs, log.clicks, log.mask, warmup - 1, log.M,
                                prior=prior)
    num, den = model.expected_stats(gather(qd_w, log.qd_index, log.mask), glob_w, log.clicks, log.mask).qd["alpha"]
    m = num[log.mask].sum() / den[log.mask].sum()
    assert fitted.prior["alpha"] == pytest.approx(m, abs=1e-12)
    assert fitted.prior_spec["families"]["alpha"]["m"] == fitted.prior["alpha"]
    moving, _, _ = fit_numpy(model, log.qd_index, log.n_pairs, log.clicks, log.mask, 8, log.M, prior=prior)
    assert np.abs(moving["alpha"] - qd_np["alpha"]).max() > 1e-4   # the freeze is not a no-op
    post = fitted.log_posterior
    assert all(b >= a - 1e-12 for a, b in zip(post[warmup:], post[warmup + 1:])), post

    stopped = fit(log.df(spark), model, iterations=200, tol=1e-5, max_rank=log.M, prior=prior,
                  prior_warmup=warmup, converge=None)   # tol's stop alone (test_stop_rule: the chosen going on)
    n = len(stopped.history) - 1
    assert warmup + 1 < n < 200, n
    assert abs(stopped.log_posterior[-2] - stopped.log_posterior[-3]) < 1e-5
    assert all(abs(b - a) >= 1e-5 for a, b in zip(stopped.log_posterior[warmup:-2], stopped.log_posterior[warmup + 1:-2]))
