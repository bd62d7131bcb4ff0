"""The first pass of a block (`sums.block_pass` before any state): candidates with equal plans start from the same
values, so their step is computed once and shared, to the same bits as each computed on its own."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from clickeval_spark.em import sums
from clickeval_spark.em.passes import PassMode, PassPlan
from clickeval_spark.em.step import em_block, stats_layout
from clickeval_spark.models import get_model

from tests.em.test_acceleration import _block


def test_equal_first_pass_plans_are_computed_once_to_the_same_bits(monkeypatch):
    model, block = get_model("ubm"), _block()
    M = block.clicks.shape[1]
    size = sum(n for _, n in stats_layout(model, M))
    g = {k: np.asarray(v, dtype=np.float64) for k, v in model.init_global(M).items()}
    step = PassPlan(PassMode.STEP, g, None)
    # equal values in distinct arrays share; a plan that differs in one flag or one global does not
    plans = [step, replace(step, g={k: v.copy() for k, v in g.items()}), replace(step, seen_by_rank=True),
             replace(step, g={**g, "gamma": g["gamma"] * 0.5}), step]
    want = [em_block(model, block, None, p) for p in plans]   # each on its own
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[3])
        return em_block(*args, **kwargs)

    monkeypatch.setattr(sums, "em_block", counted)
    lanes = [list(range(len(plans)))]
    state, vec = sums.block_pass(model, plans, lanes, (0,), 0, block, None)
    assert len(calls) == 3
    for c, (out, part) in enumerate(want):
        assert state[c].tobytes() == out.tobytes()
        assert vec[c * size:(c + 1) * size].tobytes() == part.tobytes()
    calls.clear()
    sums.block_pass(model, plans, lanes, (0,), 0, block, state)   # from their own states: each its own step
    assert len(calls) == len(plans)
