"""The compiled pass of the examination models (`compiled.examination_pass`) against the numpy kernels.

The oracle is `step.em_block` with ``compiled=False``: PBM's and UBM's vectorised numpy E-step
and LL, slice by slice. Both paths run the same passes (beta prior M-steps, folded rows with
weights, lists of uneven length, held-out rows, a scoring pass with perplexity terms) and must
give the same state and sums up to rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

from clickeval_spark.models import get_model
from clickeval_spark.models.base import LL_EPS
from clickeval_spark.em.step import BlockArrays, em_block, global_params
from clickeval_spark.em.sums import split_stats
from clickeval_spark.models.priors import model_prior, pooled_mean

M, B, N_TRAIN, N_PAIRS = 7, 3000, 2400, 150


def _block(model, seed: int) -> BlockArrays:
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, M + 1, B)
    mask = np.arange(M)[None, :] < lens[:, None]
    pair = np.where(mask, rng.integers(0, N_PAIRS, (B, M)), -1).astype(np.int32)
    clicks = ((rng.random((B, M)) < 0.3) & mask).astype(np.int8)
    weight = rng.integers(1, 5, B).astype(np.int32)
    return BlockArrays.of(model, clicks, pair, N_PAIRS, N_TRAIN, weight)


def _passes(model, block, compiled: bool):
    prior = model_prior(model, M, "beta", 2.0)
    k_qd = np.array([prior.qd[q].k for q in model.qd_params])
    rng = np.random.default_rng(1)
    g = {k: rng.uniform(0.2, 0.9, s) for k, s in model.global_shapes(M).items()}
    state, update, out = None, None, []
    for _ in range(4):
        state, vec = em_block(model, g, block, state, update, compiled=compiled, slice_rows=700)
        sums = split_stats(model, M, vec)
        g, _ = global_params(model, M, sums, g, prior.glob)
        update = (k_qd, np.array([pooled_mean(*sums[f"pool_{q}"]) for q in model.qd_params]))
        out.append((state, vec))
    out.append(em_block(model, g, block, state, update, estep=False, ppl_eps=1e-4, compiled=compiled))
    return out


@pytest.mark.parametrize("name", ["pbm", "ubm"])
def test_the_compiled_pass_gives_the_numpy_kernels_sums(name):
    model = get_model(name)
    assert model.examination_cells
    block = _block(model, seed=len(name))
    passes = zip(_passes(model, block, False), _passes(model, block, True))
    for i, ((state, vec), (c_state, c_vec)) in enumerate(passes):
        np.testing.assert_allclose(c_state, state, rtol=1e-12, atol=1e-12)
        sums, c_sums = split_stats(model, M, vec), split_stats(model, M, c_vec)
        assert sums["ll"][0] < -100 and sums["ll_valid"][0] < -10   # not trivial
        assert sums["gamma"].max() > 1 if i < 4 else sums["ppl_n"].sum() > 100
        for key in sums:
            np.testing.assert_allclose(c_sums[key], sums[key], rtol=1e-12, atol=1e-9, err_msg=key)


def test_a_long_list_of_clipped_probabilities_does_not_underflow():
    # every rank skipped where alpha = gamma = 1: each rank's probability is clipped to LL_EPS, and a
    # product of 60 of them (1e-360) is below the smallest double: the LL must still be 60 log(LL_EPS)
    model, m = get_model("pbm"), 60
    clicks, pair = np.zeros((3, m), np.int8), np.zeros((3, m), np.int32)
    block = BlockArrays.of(model, clicks, pair, 1, 3, np.array([1, 2, 1]))
    state = np.stack([np.ones((1, 1)), np.zeros((1, 1)), np.zeros((1, 1))])
    g = {"gamma": np.ones(m)}
    for compiled in (False, True):
        _, vec = em_block(model, g, block, state, estep=False, compiled=compiled)
        assert split_stats(model, m, vec)["ll"][0] == pytest.approx(4 * m * np.log(LL_EPS), rel=1e-12)


@pytest.mark.parametrize("name,compiled", [("pbm", True), ("ubm", True), ("ubm", False), ("dbn", False)])
def test_a_pass_without_held_out_rows_gives_the_same_training_sums(name, compiled):
    model = get_model(name)
    block = _block(model, seed=3)
    g = model.init_global(M)
    state, _ = em_block(model, g, block, None, compiled=compiled)
    both, vec = em_block(model, g, block, state, compiled=compiled)
    train_only, t_vec = em_block(model, g, block, state, held_out=False, compiled=compiled)
    sums, t_sums = split_stats(model, M, vec), split_stats(model, M, t_vec)
    assert sums["n_valid"][0] > 0 and sums["ll_valid"][0] < 0
    assert t_sums["n_valid"][0] == 0 and t_sums["ll_valid"][0] == 0
    assert (train_only == both).all()
    for key in sums:
        if key not in ("n_valid", "ll_valid"):
            assert (t_sums[key] == sums[key]).all(), key
