"""The compiled EM passes (`compiled.examination_pass` of PBM and UBM, `compiled_chain.chain_pass` of the
cascade models fitted by EM) against the numpy kernels.

The oracle is `step.em_block` with a plan's ``compiled=False``: each model's vectorised numpy E-step and LL,
slice by slice. Both paths run the same passes (beta prior M-steps, folded rows with weights, lists of
uneven length, with and without held-out rows, a scoring pass with perplexity terms; parameters at and
next to 0 and 1, where probabilities are clipped and posteriors divide by 0) and must give the same
state and sums to 1e-12.
"""

from __future__ import annotations

import numpy as np
import pytest

from clickeval_spark.models import MODELS, get_model
from clickeval_spark.models.dbn import DBN
from clickeval_spark.models.base import LL_EPS
from clickeval_spark.em.passes import PassMode, PassPlan
from clickeval_spark.em.step import BlockArrays, compiled_pass, em_block, global_params
from clickeval_spark.em.sums import split_stats
from clickeval_spark.models.priors import model_prior, pooled_mean

M, B, N_TRAIN, N_PAIRS = 7, 3000, 2400, 150
#: every model fitted by EM (a counting model makes one pass, numpy's)
COMPILED = [name for name, model in MODELS.items() if model.iterative]
#: the equality asked of a compiled pass: its kernel's state and sums up to reassociation
RTOL = 1e-12


def _block(model, seed: int, n_train: int = N_TRAIN) -> BlockArrays:
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, M + 1, B)
    mask = np.arange(M)[None, :] < lens[:, None]
    pair = np.where(mask, rng.integers(0, N_PAIRS, (B, M)), -1).astype(np.int32)
    clicks = ((rng.random((B, M)) < 0.3) & mask).astype(np.int8)
    weight = rng.integers(1, 5, B).astype(np.int32)
    return BlockArrays.of(model, clicks, pair, N_PAIRS, n_train, weight)


def _passes(model, block, compiled: bool):
    prior = model_prior(model, M, "beta", 2.0)
    k_qd = np.array([prior.qd[q].k for q in model.qd_params])
    rng = np.random.default_rng(1)
    g = {k: rng.uniform(0.2, 0.9, s) for k, s in model.global_shapes(M).items()}
    state, update, out = None, None, []
    for _ in range(4):
        plan = PassPlan(PassMode.STEP, g, update, compiled=compiled)
        state, vec = em_block(model, block, state, plan, slice_rows=700)
        sums = split_stats(model, M, vec)
        g, _ = global_params(model, M, sums, g, prior.glob)
        update = (k_qd, np.array([pooled_mean(*sums[f"pool_{q}"]) for q in model.qd_params]))
        out.append((state, vec))
    out.append(em_block(model, block, state, PassPlan(PassMode.SCORE, g, update, ppl_eps=1e-4, compiled=compiled)))
    return out


def _assert_same(model, state, vec, c_state, c_vec, where: str) -> dict:
    """The compiled pass's state and sums are the numpy kernel's to `RTOL`; returns the numpy sums."""
    np.testing.assert_allclose(c_state, state, rtol=RTOL, atol=0, err_msg=where)
    sums, c_sums = split_stats(model, M, vec), split_stats(model, M, c_vec)
    assert sums.keys() == c_sums.keys()
    for key in sums:
        np.testing.assert_allclose(c_sums[key], sums[key], rtol=RTOL, atol=0, err_msg=f"{where} {key}")
    return sums


class _Variant(DBN):
    """A subclass may change the maths: it is not DBN's compiled pass."""

    name = "dbn-variant"


def test_every_em_model_has_a_compiled_pass_and_no_counting_model_has_one():
    assert {"pbm", "ubm", "dcm", "ccm", "dbn", "sdbn"} <= set(COMPILED)
    for name, model in MODELS.items():
        assert (compiled_pass(model) is not None) == model.iterative, name
    # a counting model's one pass is numpy's whatever is asked; an EM model without a compiled pass refuses it
    cm = get_model("cm")
    block = _block(cm, seed=2)
    np.testing.assert_array_equal(em_block(cm, block, None, PassPlan(PassMode.STEP, {}, None, compiled=True))[1],
                                  em_block(cm, block, None, PassPlan(PassMode.STEP, {}, None, compiled=False))[1])
    assert compiled_pass(_Variant()) is None
    with pytest.raises(ValueError, match="dbn-variant has no compiled pass"):
        em_block(_Variant(), block, None, PassPlan(PassMode.STEP, {"gamma": np.asarray(0.5)}, None, compiled=True))


@pytest.mark.parametrize("held_out_rows", [True, False])
@pytest.mark.parametrize("name", COMPILED)
def test_the_compiled_pass_gives_the_numpy_kernels_sums(name, held_out_rows):
    model = get_model(name)
    block = _block(model, seed=len(name), n_train=N_TRAIN if held_out_rows else B)
    passes = zip(_passes(model, block, False), _passes(model, block, True))
    for i, ((state, vec), (c_state, c_vec)) in enumerate(passes):
        sums = _assert_same(model, state, vec, c_state, c_vec, f"{name} pass {i}")
        assert sums["ll"][0] < -100   # not trivial
        assert sums["ll_valid"][0] < -10 if held_out_rows else sums["ll_valid"][0] == 0
        if i < 4:   # every global family got counts
            assert all(sums[k][:sums[k].size // 2].max() > 1 for k in model.global_shapes(M)), i
        else:
            assert sums["ppl_n"].sum() > (100 if held_out_rows else -1)


EDGES = np.array([0.0, 1.0, 1e-13, 1 - 1e-13, 1e-7, 1 - 1e-7])


@pytest.mark.parametrize("name", COMPILED)
def test_parameters_at_and_next_to_0_and_1_give_the_numpy_kernels_sums(name):
    """Probabilities clipped to [LL_EPS, 1 - LL_EPS] in the LL, posteriors of impossible clicks (den 0), ranks
    never reached: the same on both paths. Half of the values and globals sit at or next to 0 and 1."""
    model = get_model(name)
    block = _block(model, seed=11)
    rng = np.random.default_rng(12)

    def edgy(shape):
        return np.where(rng.random(shape) < 0.5, rng.choice(EDGES, shape), rng.uniform(0.05, 0.95, shape))

    P = len(model.qd_params)
    state = np.stack([edgy((P, N_PAIRS)), np.zeros((P, N_PAIRS)), np.zeros((P, N_PAIRS))])
    for seed in range(3):
        g = {k: edgy(s) for k, s in model.global_shapes(M).items()}
        state_np, vec = em_block(model, block, state, PassPlan(PassMode.STEP, g, None, compiled=False))
        state_c, c_vec = em_block(model, block, state, PassPlan(PassMode.STEP, g, None, compiled=True))
        sums = _assert_same(model, state_np, vec, state_c, c_vec, f"{name} globals {seed}")
        assert np.isfinite(state_np).all() and np.isfinite(vec).all()
        assert sums["ll"][0] < 20 * np.log(LL_EPS)   # clipped ranks in it


@pytest.mark.parametrize("name", COMPILED)
def test_a_long_list_of_clipped_probabilities_does_not_underflow(name):
    # every rank clicked where alpha = 0: each rank's probability is clipped to LL_EPS, and a product of 60
    # of them (1e-360) is below the smallest double: the LL must still be 60 log(LL_EPS) per SERP
    model, m = get_model(name), 60
    clicks, pair = np.ones((3, m), np.int8), np.zeros((3, m), np.int32)
    block = BlockArrays.of(model, clicks, pair, 1, 3, np.array([1, 2, 1]))
    P = len(model.qd_params)
    state = np.stack([np.zeros((P, 1)), np.zeros((P, 1)), np.zeros((P, 1))])
    for compiled in (False, True):
        _, vec = em_block(model, block, state, PassPlan(PassMode.SCORE, model.init_global(m), None, compiled=compiled))
        assert split_stats(model, m, vec)["ll"][0] == pytest.approx(4 * m * np.log(LL_EPS), rel=1e-12)


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("name", COMPILED)
def test_a_pass_without_held_out_rows_gives_the_same_training_sums(name, compiled):
    model = get_model(name)
    block = _block(model, seed=3)
    g = model.init_global(M)
    state, _ = em_block(model, block, None, PassPlan(PassMode.STEP, g, None, compiled=compiled))
    both, vec = em_block(model, block, state, PassPlan(PassMode.STEP, g, None, compiled=compiled))
    train_only, t_vec = em_block(model, block, state,
                                 PassPlan(PassMode.STEP, g, None, held_out=False, compiled=compiled))
    sums, t_sums = split_stats(model, M, vec), split_stats(model, M, t_vec)
    assert sums["n_valid"][0] > 0 and sums["ll_valid"][0] < 0
    assert t_sums["n_valid"][0] == 0 and t_sums["ll_valid"][0] == 0
    assert (train_only == both).all()
    for key in sums:
        if key not in ("n_valid", "ll_valid"):
            assert (t_sums[key] == sums[key]).all(), key
