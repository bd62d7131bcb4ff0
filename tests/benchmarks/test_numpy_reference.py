"""The benchmark's numpy EM reference fits the same estimator as the package (so its ratio is fair).

The hand-written PBM / UBM references are checked against the numpy oracle driver
(tests/models/numpy_em.py, which runs the package's kernels), and the block E/M-step
that every Spark EM task runs (`step.em_block`) against both, on a simulated log
with lists of uneven length.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.numpy_reference import REFERENCES, prev_click_rank
from clickeval_spark.models import get_model
from clickeval_spark.em.codec import encode_data
from clickeval_spark.em.passes import PassMode, PassPlan
from clickeval_spark.em.step import BlockArrays, em_block, global_params
from clickeval_spark.em.sums import split_stats
from clickeval_spark.models.priors import model_prior, pooled_mean
from tests.models.numpy_em import fit_numpy, simulate

M, B, PAIRS, ITERATIONS = 6, 3000, 90, 4


def _log(name: str, seed: int):
    rng = np.random.default_rng(seed)
    model = get_model(name)
    lens = rng.integers(2, M + 1, B)
    mask = np.arange(M)[None, :] < lens[:, None]
    pair = np.where(mask, rng.integers(0, PAIRS, (B, M)), -1)
    qd_true = {p: rng.uniform(0.1, 0.9, PAIRS)[np.where(mask, pair, 0)] for p in model.qd_params}
    g_true = {k: rng.uniform(0.2, 0.9, s) for k, s in model.global_shapes(M).items()}
    clicks = simulate(model, qd_true, g_true, mask, rng)
    return model, pair, clicks, mask


def test_prev_click_rank():
    clicks = np.array([[0, 1, 0, 1, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]], dtype=np.int8)
    assert prev_click_rank(clicks).tolist() == [[0, 0, 2, 2, 4], [0, 1, 1, 1, 1], [0, 0, 0, 0, 0]]


@pytest.mark.parametrize("name", ["pbm", "ubm", "dbn"])
def test_reference_equals_the_oracle_and_em_block(name):
    model, pair, clicks, mask = _log(name, seed=len(name))
    glob_ref, times = REFERENCES[name](pair, clicks, PAIRS, ITERATIONS)
    qd_np, glob_np, _ = fit_numpy(model, np.where(mask, pair, 0), PAIRS, clicks, mask, ITERATIONS, M)
    assert len(times) == ITERATIONS
    for k in glob_np:
        np.testing.assert_allclose(glob_ref[k], glob_np[k], rtol=0, atol=1e-12, err_msg=k)

    # the Spark task's block step, iterated on one block holding the whole log (via its binary encoding);
    # the qd M-step of pass t runs at the start of pass t + 1, so one scoring pass ends the fit
    block = BlockArrays.decoded(model, encode_data(clicks, pair.astype(np.int32), PAIRS))
    assert block.n_train == B and (block.weight == 1).all()
    plain = model_prior(model, M, "none")
    state, update, g = None, None, model.init_global(M)
    for _ in range(ITERATIONS):
        state, vec = em_block(model, block, state, PassPlan(PassMode.STEP, g, update), slice_rows=700)   # slices
        sums = split_stats(model, M, vec)
        g, _ = global_params(model, M, sums, g, plain.glob)
        update = (np.zeros(len(model.qd_params)),
                  np.array([pooled_mean(*sums[f"pool_{q}"]) for q in model.qd_params]))
        assert sums["n"][0] == B
    state, _ = em_block(model, block, state, PassPlan(PassMode.SCORE, g, update))
    for k in glob_np:
        np.testing.assert_allclose(g[k], glob_np[k], rtol=0, atol=1e-12, err_msg=k)
    for j, q in enumerate(model.qd_params):
        np.testing.assert_allclose(state[0][j], qd_np[q], rtol=0, atol=1e-12, err_msg=q)
