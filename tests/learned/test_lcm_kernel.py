"""The learned model's numpy kernel (models/lcm.py) against independent oracles: exact marginals against
brute-force enumeration of every click pattern, conditional probabilities against the model's formula written
out position by position, and the kernel's contract (registry, stored weights' shapes)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from clickeval_spark.models import LEARNED, MODELS, get_model
from clickeval_spark.models.lcm import FEATURES, QD_STATS, feature_matrix


def _random_case(seed: int, B: int, M: int):
    rng = np.random.default_rng(seed)
    n_imp = rng.integers(0, 30, (B, M)).astype(float)
    clicks = np.floor(n_imp * rng.uniform(0, 0.7, (B, M)))
    clicks0 = np.floor(clicks * rng.uniform(0.3, 1, (B, M)))
    qd = {"n_imp": n_imp, "clicks": clicks, "exp_clicks": n_imp * rng.uniform(0.05, 0.6, (B, M)),
          "clicks0": clicks0, "exp_clicks0": n_imp * rng.uniform(0.05, 0.5, (B, M)),
          "q_serps": rng.integers(1, 200, (B, 1)) * np.ones((1, M)),
          "q_clicks": rng.uniform(0, 100, (B, 1)) * np.ones((1, M)),
          "q_exp_clicks": rng.uniform(1, 100, (B, 1)) * np.ones((1, M))}
    # weights large enough that the clicks above matter a lot (both ways)
    g = {"w_rank": rng.normal(-1, 1, (M, 2)), "w": rng.normal(0, 1.5, len(FEATURES))}
    lens = rng.integers(1, M + 1, B)
    lens[0] = M
    mask = np.arange(M)[None, :] < lens[:, None]
    return qd, g, mask


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_marginals_equal_brute_force_enumeration(seed):
    """P(C_r = 1) from the forward DP equals the sum over all 2^M click patterns of P(pattern) [c_r = 1], with
    P(pattern) the product of the kernel's own conditionals (chain rule), lists of every length up to M = 7."""
    model = get_model("lcm")
    B, M = 12, 7
    qd, g, mask = _random_case(seed, B, M)
    expected = np.zeros((B, M))
    for pattern in itertools.product((0, 1), repeat=M):
        c = np.broadcast_to(np.array(pattern, dtype=np.int8), (B, M)).copy()
        c[~mask] = 0
        p = model.cond_probs(qd, g, c, mask)
        joint = np.prod(np.where(mask, np.where(c == 1, p, 1 - p), 1.0), axis=1)
        # a pattern with clicks past the list's end is the same list's pattern counted again: skip it
        valid = np.all(np.array(pattern)[None, :] * ~mask == 0, axis=1)
        expected += (joint * valid)[:, None] * c
    got = model.click_probs(qd, g, mask)
    np.testing.assert_allclose(np.where(mask, got, 0), np.where(mask, expected, 0), rtol=1e-10, atol=1e-13)
    # the enumeration's probabilities of each list sum to 1 (a check of the oracle itself)
    assert np.all(got[mask] > 0) and np.all(got[mask] < 1)


def test_cond_probs_are_the_formula_position_by_position():
    """cond_probs against the logit written out for one position at a time from the observed clicks: the
    rank's intercept (split by any click above), the count of clicks above, the distance to the last."""
    model = get_model("lcm")
    B, M = 6, 8
    qd, g, mask = _random_case(3, B, M)
    rng = np.random.default_rng(4)
    clicks = ((rng.random((B, M)) < 0.4) & mask).astype(np.int8)
    got = model.cond_probs(qd, g, clicks, mask)
    for b in range(B):
        for r in range(1, M + 1):
            if not mask[b, r - 1]:
                continue
            above = clicks[b, :r - 1]
            n = int(above.sum())
            last = int(np.max(np.nonzero(above)[0]) + 1) if n else 0
            x = feature_matrix({k: v[b, r - 1] for k, v in qd.items()}, r, n, last, M)
            assert x[FEATURES.index("n_above_3plus")] == float(n >= 3)
            assert x[FEATURES.index("dist_1")] == float(n > 0 and r - last == 1)
            z = g["w_rank"][r - 1, int(n > 0)] + x @ g["w"]
            assert got[b, r - 1] == pytest.approx(1 / (1 + np.exp(-z)), rel=1e-12)


def test_unseen_pair_takes_the_rank_statistics():
    """A pair unseen in training (all statistics 0, the stored prior) has every statistic feature 0: its
    probability is the rank's intercept and the click-state terms alone."""
    zeros = {p: np.zeros(3) for p in QD_STATS}
    x = feature_matrix(zeros, np.array([1, 4, 9]), np.array([0, 1, 2]), np.array([0, 2, 5]), 10)
    stat_features = [i for i, f in enumerate(FEATURES) if "coec" in f or "imp" in f or "q_" in f]
    assert np.all(x[:, stat_features] == 0)
    assert x[1, FEATURES.index("dist_2")] == 1 and x[2, FEATURES.index("n_above_2")] == 1


def test_registry_keeps_the_em_models_apart():
    assert "lcm" in LEARNED and "lcm" not in MODELS
    assert get_model("LCM") is LEARNED["lcm"]
    with pytest.raises(NotImplementedError, match="not by EM"):
        get_model("lcm").expected_stats({}, {}, np.zeros((1, 1)), np.ones((1, 1), bool))
    with pytest.raises(ValueError, match="weights"):
        get_model("lcm").relevance({p: np.zeros(2) for p in QD_STATS})
