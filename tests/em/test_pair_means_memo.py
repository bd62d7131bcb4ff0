"""A block's pair means (a seen->rank candidate's prior means per pair) are computed once while its candidate's
rank means stay the same, and forgotten when no candidate asks for them; the pass's sums do not change."""

import numpy as np

from clickeval_spark.em import step
from clickeval_spark.em.passes import PassPlan
from clickeval_spark.em.step import BlockArrays
from clickeval_spark.em.sums import block_pass, pass_plans
from clickeval_spark.models import get_model

M = 5


def _block(model) -> BlockArrays:
    rng = np.random.default_rng(11)
    B, n_pairs = 400, 37
    pair = rng.integers(0, n_pairs, (B, M)).astype(np.int32)
    pair[rng.random((B, M)) < 0.1] = -1
    clicks = ((rng.random((B, M)) < 0.3) & (pair >= 0)).astype(np.int8)
    return BlockArrays.of(model, clicks, pair, n_pairs, n_train=350)


def _plans(model, means: list[float | None]) -> tuple[list[PassPlan], list[list[int]]]:
    """One candidate per entry: seen->rank toward rank means around ``m``; None: toward the pooled mean."""
    g = {k: np.full(s, 0.4) for k, s in model.global_shapes(M).items()}
    plans = [PassPlan("step", g, (np.array([3.0]), np.array([0.3 if m is None else m]),
                                  np.linspace(0.2, 0.5, M)[None, :] + (m or 0.0)), seen_by_rank=m is not None)
             for m in means]
    return pass_plans(plans, 1)


def test_pair_means_are_computed_once_per_rank_means_and_swept(monkeypatch):
    model = get_model("ubm")
    calls = []
    real = step._pair_means
    monkeypatch.setattr(step, "_pair_means", lambda block, by_rank: calls.append(1) or real(block, by_rank))
    kept, state = _block(model), None
    for means, new_calls, entries in [([0.0, 0.1, None], 2, 2),     # two seen->rank candidates: two means
                                      ([0.0, 0.1, None], 0, 2),     # the same means again: none computed
                                      ([0.0, 0.2, None], 1, 2),     # one candidate moved on: its old means go
                                      ([0.0, None, None], 0, 1)]:   # one left: one kept
        plans, lanes = _plans(model, means)
        before = len(calls)
        buf = None if state is None else state.tobytes()
        state, vec = block_pass(model, plans, lanes, (0,), 0, kept, buf)
        assert (len(calls) - before, len(kept._kept_pair_means)) == (new_calls, entries)
        fresh_state, fresh_vec = block_pass(model, plans, lanes, (0,), 0, _block(model), buf)
        assert np.array_equal(state, fresh_state) and np.array_equal(vec, fresh_vec)
