"""The numpy reference driver: EM monotonicity, EM fixed points, and hand-computed
counting estimates on a tiny literal log."""

from __future__ import annotations

import numpy as np
import pytest

from clickeval_spark.models import MODELS, get_model
from clickeval_spark.models.base import INIT_VALUE, log_likelihood
from tests.models.numpy_em import fit_numpy, gather, simulate, total_log_likelihood

EM_MODELS = sorted(name for name, m in MODELS.items() if m.iterative)


def random_log(seed, B=3000, M=6, Q=30, D=8):
    """Shuffled rankings from fixed per-query pools, list lengths 1..M (padded)."""
    rng = np.random.default_rng(seed)
    q = rng.integers(0, Q, B)
    order = np.argsort(rng.random((B, D)), axis=1)[:, :M]
    qd_index = q[:, None] * D + order
    lengths = rng.integers(1, M + 1, B)
    mask = np.arange(M)[None, :] < lengths[:, None]
    return rng, qd_index, Q * D, mask


def random_truth(model, n_pairs, M, rng):
    qd = {k: rng.uniform(0.1, 0.9, n_pairs) for k in model.qd_params}
    g = {k: rng.uniform(0.2, 0.9, s) for k, s in model.global_shapes(M).items()}
    return qd, g


def test_em_models_are_the_iterative_ones():
    assert EM_MODELS == ["ccm", "dbn", "dcm", "pbm", "sdbn", "ubm"]


# Each EM model on its own data and on data from a different model (misspecified).
MONO_CASES = [(name, name) for name in EM_MODELS] + [
    ("pbm", "dbn"), ("ubm", "ccm"), ("dcm", "ubm"), ("ccm", "pbm"), ("dbn", "dcm"), ("sdbn", "dbn")]


@pytest.mark.parametrize("fit_name,data_name", MONO_CASES)
def test_em_never_lowers_the_training_log_likelihood(fit_name, data_name):
    rng, qd_index, n_pairs, mask = random_log(seed=len(fit_name) * 100 + len(data_name))
    M = mask.shape[1]
    data_model, model = get_model(data_name), get_model(fit_name)
    qd_true, g_true = random_truth(data_model, n_pairs, M, rng)
    clicks = simulate(data_model, gather(qd_true, qd_index, mask), g_true, mask, rng)

    start = total_log_likelihood(model, {k: np.full(n_pairs, INIT_VALUE) for k in model.qd_params},
                                 model.init_global(M), qd_index, clicks, mask)
    _, _, hist = fit_numpy(model, qd_index, n_pairs, clicks, mask, 30, M)
    assert len(hist) == 30
    lls = np.array([start] + hist)
    steps = np.diff(lls)
    assert np.all(steps >= -1e-9), steps.min()
    assert lls[-1] > lls[0] + 100  # and it actually learns something


@pytest.mark.parametrize("name", EM_MODELS)
def test_em_converges_to_a_stationary_point_of_the_likelihood(name):
    """Exact EM's fixed points are stationary points of the true likelihood.

    An approximate E-step (e.g. PyClick's DBN/CCM updates) converges elsewhere,
    where moving a parameter still raises the likelihood; so after many iterations
    the numerical gradient must vanish in every global parameter and in the
    attractiveness of the busiest pairs.
    """
    rng, qd_index, n_pairs, mask = random_log(seed=11, B=1500, M=5, Q=3, D=6)
    M = mask.shape[1]
    model = get_model(name)
    qd_true, g_true = random_truth(model, n_pairs, M, rng)
    clicks = simulate(model, gather(qd_true, qd_index, mask), g_true, mask, rng)
    qd_fit, g_fit, _ = fit_numpy(model, qd_index, n_pairs, clicks, mask, 500, M)

    def ll(qd, g):
        return total_log_likelihood(model, qd, g, qd_index, clicks, mask)

    h = 1e-5
    grads = {}
    for k, v in g_fit.items():
        used = np.zeros(v.shape, dtype=bool)
        if name == "ubm":
            used = np.arange(M)[:, None] >= np.arange(M + 1)[None, :]
        else:
            used[...] = True
        if name == "dcm":
            used[-1] = False  # lambda at the last rank never enters the likelihood
        for i in zip(*np.nonzero(used)) if v.ndim else [()]:
            up, dn = {kk: vv.copy() for kk, vv in g_fit.items()}, {kk: vv.copy() for kk, vv in g_fit.items()}
            up[k][i] += h
            dn[k][i] -= h
            grads[(k, i)] = (ll(qd_fit, up) - ll(qd_fit, dn)) / (2 * h)
    busiest = np.argsort(np.bincount(qd_index[mask], minlength=n_pairs))[-3:]
    for k in model.qd_params:
        for p in busiest:
            up, dn = {kk: vv.copy() for kk, vv in qd_fit.items()}, {kk: vv.copy() for kk, vv in qd_fit.items()}
            up[k][p] += h
            dn[k][p] -= h
            grads[(k, p)] = (ll(up, g_fit) - ll(dn, g_fit)) / (2 * h)
    worst = max(grads, key=lambda key: abs(grads[key]))
    # A non-stationary point on this log has gradients of order 10-1000.
    assert abs(grads[worst]) < 1e-3, (worst, grads[worst])


# --- hand-computed counting estimates -------------------------------------------------
#
# Pairs: query 1 has docs 0, 1, 2; query 2 has docs 3, 4; pair 5 is never shown.
#   S1  q1  [0, 1, 2]   clicks [0, 1, 0]
#   S2  q1  [1, 0, 2]   clicks [1, 0, 1]
#   S3  q1  [2, 1, 0]   clicks [0, 0, 1]
#   S4  q2  [3, 4, --]  clicks [0, 1, -]   (two results; padding index is junk)
QD_INDEX = np.array([[0, 1, 2], [1, 0, 2], [2, 1, 0], [3, 4, -1]])
CLICKS = np.array([[0, 1, 0], [1, 0, 1], [0, 0, 1], [0, 1, 0]], dtype=np.int8)
MASK = np.array([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 0]], dtype=bool)
N_PAIRS = 6
U = INIT_VALUE  # a parameter that no impression informs keeps its initial value


def fit_tiny(name, model=None):
    qd, g, hist = fit_numpy(model or get_model(name), QD_INDEX, N_PAIRS, CLICKS, MASK, 20, 3)
    assert len(hist) == 1  # counting estimators take one pass
    return qd, g, hist


def test_gctr_by_hand():
    qd, g, hist = fit_tiny("gctr")
    assert qd == {}
    assert float(g["ctr"]) == pytest.approx(5 / 11)  # 5 clicks, 11 impressions
    assert hist[0] == pytest.approx(5 * np.log(5 / 11) + 6 * np.log(6 / 11))


def test_rctr_by_hand():
    _, g, _ = fit_tiny("rctr")
    np.testing.assert_allclose(g["ctr"], [1 / 4, 2 / 4, 2 / 3])


def test_dctr_by_hand():
    qd, _, hist = fit_tiny("dctr")
    np.testing.assert_allclose(qd["alpha"], [1 / 3, 2 / 3, 1 / 3, 0, 1, U])


def test_cm_by_hand():
    # Only ranks up to the first click count: S1 ranks 1-2, S2 rank 1, S3 all, S4 all.
    qd, _, _ = fit_tiny("cm")
    np.testing.assert_allclose(qd["alpha"], [1 / 2, 2 / 3, 0, 0, 1, U])


def test_sdbn_by_hand():
    # alpha: ranks up to the last click (S1: 1-2; S2, S3: all; S4: both).
    # sigma: share of a doc's clicks that were the SERP's last click.
    qd, _, _ = fit_tiny("sdbn", get_model("sdbn").counting)
    np.testing.assert_allclose(qd["alpha"], [1 / 3, 2 / 3, 1 / 2, 0, 1, U])
    np.testing.assert_allclose(qd["sigma"], [1, 1 / 2, 1, U, 1, U])


def test_em_keeps_unseen_pairs_and_unused_cells_at_init():
    qd, g, hist = fit_numpy(get_model("ubm"), QD_INDEX, N_PAIRS, CLICKS, MASK, 5, 3)
    assert len(hist) == 5
    assert qd["alpha"][5] == U
    assert np.all(qd["alpha"][:5] != U)
    # gamma[r, k] with k > r (a click below r) can never be observed
    assert np.all(g["gamma"][np.arange(3)[:, None] < np.arange(4)[None, :]] == U)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_estep_and_log_likelihood_is_the_two_calls_in_one(name):
    """PBM and UBM reuse their E-step's click probabilities for the LL: the result must be the two
    separate calls' (expected_stats, log_likelihood of cond_probs), weighted rows included."""
    model = get_model(name)
    rng, qd_index, n_pairs, mask = random_log(seed=len(name), B=500)
    qd_true, g = random_truth(model, n_pairs, mask.shape[1], rng)
    qd = gather(qd_true, qd_index, mask)
    clicks = simulate(model, qd, g, mask, rng)
    weight = rng.integers(1, 5, len(clicks))
    stats, row_ll = model.estep_and_log_likelihood(qd, g, clicks, mask, weight)
    apart = model.expected_stats(qd, g, clicks, mask, weight)
    np.testing.assert_array_equal(row_ll, log_likelihood(model.cond_probs(qd, g, clicks, mask), clicks, mask))
    assert sorted(stats.qd) == sorted(apart.qd) and sorted(stats.glob) == sorted(apart.glob)
    for key in apart.qd:
        for got, want in zip(stats.qd[key], apart.qd[key]):
            np.testing.assert_array_equal(got, want, err_msg=key)
    for key in apart.glob:
        for got, want in zip(stats.glob[key], apart.glob[key]):
            np.testing.assert_array_equal(got, want, err_msg=key)
    # with the row constants an EM block computes once per fit (blocks.BlockArrays), the same bits again
    const = model.row_constants(clicks, mask) or None
    with_const, row_ll_const = model.estep_and_log_likelihood(qd, g, clicks, mask, weight, const)
    np.testing.assert_array_equal(row_ll_const, row_ll)
    np.testing.assert_array_equal(model.scored_log_likelihood(qd, g, clicks, mask, const), row_ll)
    for got, want in [(with_const.qd, stats.qd), (with_const.glob, stats.glob)]:
        for key in want:
            for a, b in zip(got[key], want[key]):
                np.testing.assert_array_equal(a, b, err_msg=key)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_impression_dens_are_the_impressions(name):
    """A qd parameter in `impression_dens` has the den 1 at every shown rank and 0 elsewhere, whatever the
    parameters and clicks: em_block then takes its dens from the block's impression counts."""
    model = get_model(name)
    rng, qd_index, n_pairs, mask = random_log(seed=len(name) + 7, B=400)
    qd_true, g = random_truth(model, n_pairs, mask.shape[1], rng)
    qd = gather(qd_true, qd_index, mask)
    clicks = simulate(model, qd, g, mask, rng)
    stats = model.expected_stats(qd, g, clicks, mask, rng.integers(1, 5, len(clicks)))
    assert set(model.impression_dens) <= set(model.qd_params)
    for p in model.impression_dens:
        np.testing.assert_array_equal(np.asarray(stats.qd[p][1], dtype=float), mask.astype(float), err_msg=p)
    if name in ("pbm", "ubm", "dctr"):
        assert model.impression_dens == ("alpha",)
