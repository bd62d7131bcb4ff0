"""Rank-aware prior means and empirical Bayes strengths (models/priors.py), against hand-computed
estimators and scipy's Beta function."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import betaln

from clickeval_spark.models import get_model
from clickeval_spark.em.compiled import beta_binomial_evidence
from clickeval_spark.models.priors import EB_GRID, eb_strength, model_prior
from clickeval_spark.em.blocks import pack_serps
from clickeval_spark.em.candidates import Candidate, candidate_prior
from clickeval_spark.em.driver import fit
from tests.em.logs import DCTR_ROWS, SERPS_SCHEMA, split_log


def _evidence(num, den, m, grid=EB_GRID):
    """The Beta-binomial log evidence by scipy: sum of ln B(a + k m, b + k (1 - m)) - ln B(k m, k (1 - m))."""
    num, den, m = (np.asarray(x, dtype=np.float64) for x in (num, den, m))
    return np.array([(betaln(num + k * m, den - num + k * (1 - m)) - betaln(k * m, k * (1 - m))).sum()
                     for k in grid])


def test_evidence_is_the_beta_binomial_marginal_and_eb_takes_its_argmax():
    rng = np.random.default_rng(3)
    den = rng.integers(1, 30, 400).astype(float)
    num = den * rng.beta(2.0, 6.0, 400)          # expected counts: not integers
    m = rng.uniform(0.05, 0.6, 400)
    got = np.zeros(len(EB_GRID))
    beta_binomial_evidence(num, den, m, np.asarray(EB_GRID), got)
    np.testing.assert_allclose(got, _evidence(num, den, m), rtol=1e-12, atol=1e-9)
    assert eb_strength(got) == EB_GRID[int(np.argmax(_evidence(num, den, m)))]
    # counts drawn from Beta(2, 6) (strength 8) around their own mean: EB lands near 8, not at the grid's ends
    assert 2.0 <= eb_strength(_evidence(num, den, np.full(400, 0.25))) <= 32.0
    assert eb_strength(np.zeros(len(EB_GRID))) is None   # no counts, no estimate
    # runs of one m (a pooled mean: the prior's terms are computed once per run), items without counts inside
    den[::7] = 0.0
    num[::7] = 0.0
    runs = np.repeat(rng.uniform(0.05, 0.6, 40), 10)
    got = np.zeros(len(EB_GRID))
    beta_binomial_evidence(num, den, runs, np.asarray(EB_GRID), got)
    kept = den > 0
    np.testing.assert_allclose(got, _evidence(num[kept], den[kept], runs[kept]), rtol=1e-12, atol=1e-9)
    # whole counts inside and beyond the table of ln Gamma(n + k) (256), a few means recurring in any
    # order (the prior's terms are computed once per distinct mean), and whole expected clicks
    den = rng.choice([1.0, 2.0, 3.0, 255.0, 256.0, 300.0, 4000.0], 500)
    num = np.where(np.arange(500) % 5 == 0, np.floor(den / 3), den * rng.beta(2.0, 6.0, 500))
    m = rng.choice([0.1, 0.25, 0.5], 500)
    m[::9] = rng.uniform(0.05, 0.6, m[::9].size)
    got = np.zeros(len(EB_GRID))
    beta_binomial_evidence(num, den, m, np.asarray(EB_GRID), got)
    np.testing.assert_allclose(got, _evidence(num, den, m), rtol=1e-12, atol=1e-9)


def test_unseen_pairs_take_their_rank_mean_and_seen_pairs_can_shrink_toward_their_ranks(spark):
    # rank 1: 4 impressions, 3 clicks (m1 = 3/4); rank 2: 2 impressions, no click (m2 = 0); ranks 3..10 never
    # shown: the pooled m = 3 / 6. d1 is shown at rank 1 only, d2 at rank 2, d3 once at each.
    df = spark.createDataFrame(DCTR_ROWS, SERPS_SCHEMA)
    model = get_model("dctr")
    pooled = fit(df, model, iterations=1, tol=None, max_rank=10, prior=model_prior(model, 10, "beta", 2.0))
    by_rank = fit(df, model, iterations=1, tol=None, max_rank=10,
                  prior=model_prior(model, 10, "beta", 2.0, seen_means=("rank",)))
    assert pooled.prior_by_rank["alpha"] == pytest.approx([3 / 4, 0.0] + [1 / 2] * 8, abs=1e-15)
    assert by_rank.prior_by_rank == pooled.prior_by_rank
    assert pooled.prior["alpha"] == pytest.approx(1 / 2, abs=1e-15)
    # seen pairs toward m = 1/2 (as before), or toward their ranks' mean: d1 3/4, d2 0, d3 (3/4 + 0) / 2
    assert {r.doc_id: r.alpha for r in pooled.qd.collect()} == pytest.approx(
        {"d1": (2 + 1) / 5, "d2": (0 + 1) / 3, "d3": (1 + 1) / 4}, abs=1e-15)
    assert {r.doc_id: r.alpha for r in by_rank.qd.collect()} == pytest.approx(
        {"d1": (2 + 2 * 3 / 4) / 5, "d2": 0.0, "d3": (1 + 2 * 3 / 8) / 4}, abs=1e-15)
    # predicted: an unseen document at rank 1 and at rank 2 of a new query
    new = spark.createDataFrame([("t", "test", "x", "rx", 1, "q-new", ["n1", "n2", "n3"], None, [0, 0, 0], None)],
                                SERPS_SCHEMA)
    assert pooled.predict(new).first().p_click == pytest.approx([3 / 4, 0.0, 1 / 2], abs=1e-15)


def test_eb_candidate_takes_each_familys_evidence_argmax_and_valid_chooses(spark, sparse_log):
    model = get_model("dctr")   # counting: the pairs' counts are their clicks and impressions, exactly
    log = sparse_log(model, seed=5)
    held = np.arange(len(log.rows)) % 4 == 0
    train_df, valid_df = split_log(spark, log, held)
    packed = pack_serps(train_df, max_rank=log.M, held_out=valid_df)
    try:
        fitted = fit(packed, model, iterations=3, tol=None, max_rank=log.M, k_grid=(1.0, 64.0),
                     prior=model_prior(model, log.M, seen_means=("pooled", "rank")))
    finally:
        packed.unpersist()
    mask, clicks, idx = log.mask[~held], log.clicks[~held], log.qd_index[~held]
    shows = np.bincount(idx[mask], minlength=log.n_pairs).astype(float)
    hits = np.bincount(idx[mask], weights=clicks[mask], minlength=log.n_pairs)
    seen = shows > 0
    m = hits.sum() / shows.sum()
    expected = EB_GRID[int(np.argmax(_evidence(hits[seen], shows[seen], np.full(seen.sum(), m))))]
    grid = fitted.selection["grid"]
    assert [(g["k"], g["seen_means"]) for g in grid] == [(k, v) for v in ("pooled", "rank") for k in (1.0, 64.0, "eb")]
    eb = next(g for g in grid if g["k"] == "eb" and g["seen_means"] == "pooled")
    assert eb["strengths"] == {"alpha": expected} and 1.0 < expected < 64.0
    best = max(grid, key=lambda g: g["valid_ll"])
    assert (fitted.selection["chosen_k"], fitted.selection["chosen_seen_means"]) == (best["k"], best["seen_means"])
    assert fitted.valid_ll == best["valid_ll"]


def test_examination_cells_take_their_own_eb_strength():
    # UBM: the grid's strength is the attractiveness's; the cells' (rank x rank of the last click) is their
    # evidence's argmax around their rank's pooled mean
    model, M = get_model("ubm"), 3
    prior = candidate_prior(model_prior(model, M), 8.0)
    assert prior.qd["alpha"].k == 8.0 and prior.eb == ("gamma",)
    rng = np.random.default_rng(1)
    den = rng.integers(50, 500, (M, M + 1)).astype(float)
    num = den * np.clip(rng.normal([[0.9], [0.6], [0.4]], 0.05, (M, M + 1)), 0.01, 0.99)
    sums = {"gamma": np.concatenate([num.ravel(), den.ravel()])}
    cand = Candidate(prior=prior, g={})
    cand.eb_update(model, M, sums)
    rank_m = np.broadcast_to(num.sum(axis=1, keepdims=True) / den.sum(axis=1, keepdims=True), num.shape)
    expected = EB_GRID[int(np.argmax(_evidence(num.ravel(), den.ravel(), rank_m.ravel())))]
    assert cand.prior.glob["gamma"].k == expected and cand.prior.qd["alpha"].k == 8.0
    assert cand.prior.eb == ("gamma",)
