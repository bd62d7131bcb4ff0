"""What a pass returns: a candidate's stats vector (its layout: `step.stats_layout`), one pass of every
candidate over a block, and the blocks' vectors summed in block order (so the sums do not depend on task order)."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Iterable, Mapping

import numpy as np

from clickeval_spark.em.codec import decode_state, group_of
from clickeval_spark.em.passes import PassMode, PassPlan
from clickeval_spark.em.step import BlockArrays, em_block, stats_layout
from clickeval_spark.models.base import ClickModel


def split_stats(model: ClickModel, M: int, vec: np.ndarray) -> dict[str, np.ndarray]:
    out, off = {}, 0
    for name, size in stats_layout(model, M):
        out[name] = vec[off:off + size]
        off += size
    return out


def plan_lanes(plans: list[PassPlan], n_groups: int) -> list[list[int]]:
    """Per group, the indices of its candidates: the order of their state slots in the group's blocks."""
    stray = sorted({p.group for p in plans} - set(range(n_groups)))
    if stray:   # its blocks do not exist: the fit would silently sum zeros
        raise ValueError(f"pass plan for group(s) {stray}, but the packed log has groups 0..{n_groups - 1}")
    return [[c for c, plan in enumerate(plans) if plan.group == g] for g in range(n_groups)]


def block_pass(model: ClickModel, plans: list[PassPlan], lanes: list[list[int]], first_blocks: tuple[int, ...],
               block: int, arrays: BlockArrays, state_buf) -> tuple[np.ndarray, np.ndarray]:
    """One pass of every candidate over one block: (the block's new state (C_g, D, P, n_pairs), its stats vector
    for all C candidates, zeros where a candidate is not the block's group's or holds).

    ``arrays``: the block's rows (`BlockArrays`); ``state_buf``: its state (None before the first pass). D is 3
    (`step.em_block`'s values, num, den), or 6 while a candidate's plan keeps points for an extrapolation
    (`acceleration`; the others' extra rows are zeros).
    """
    P = len(model.qd_params)
    mine = lanes[group_of(block, first_blocks)]
    n_pairs = arrays.n_pairs
    state = decode_state(state_buf, len(mine), P, n_pairs)
    size = sum(n for _, n in stats_layout(model, arrays.clicks.shape[1]))
    keeping = any(plans[c].keeps_points for c in mine)
    new, vec = np.zeros((len(mine), 6 if keeping else 3, P, n_pairs)), np.zeros(len(plans) * size)
    # before the first pass every candidate starts from the same values: equal plans (the grid's strengths
    # differ only from the second pass's M-step on) give the same step, computed once
    first: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
    for slot, c in enumerate(mine):
        plan = plans[c]
        if plan.mode == PassMode.HOLD:   # only after a first pass: the state exists
            out = state[slot]
        else:
            key = plan_key(plan) if state is None else None
            if key in first:
                out, part = first[key]
            else:
                out, part = em_block(model, arrays, None if state is None else state[slot], plan)
                if key is not None:
                    first[key] = out, part
            vec[c * size:(c + 1) * size] = part
        new[slot, :min(len(out), new.shape[1])] = out[:new.shape[1]]
    arrays.end_pass()
    return new, vec


def plan_key(plan: PassPlan) -> tuple:
    """``plan`` as a hashable value, arrays by their bytes: equal keys, the same computation."""
    def frozen(v):
        if isinstance(v, np.ndarray):
            return v.dtype.str, v.shape, v.tobytes()
        if isinstance(v, Mapping):
            return tuple((k, frozen(x)) for k, x in sorted(v.items()))
        if isinstance(v, (tuple, list)):
            return tuple(frozen(x) for x in v)
        return v
    return tuple(frozen(getattr(plan, f.name)) for f in fields(PassPlan))


def pass_plans(plans: list[PassPlan], n_groups: int) -> tuple[list[PassPlan], list[list[int]]]:
    """The plans with float64 global parameters, and their lanes (`plan_lanes`): what a task needs for `block_pass`."""
    plans = [replace(p, g={k: np.asarray(v, dtype=np.float64) for k, v in p.g.items()}) for p in plans]
    return plans, plan_lanes(plans, n_groups)


def sum_block_stats(model: ClickModel, M: int, plans: list[PassPlan], vecs: Iterable[np.ndarray],
                    ) -> list[dict[str, np.ndarray] | None]:
    """Per candidate, the sum of the blocks' stats vectors ``vecs`` (in block order: the sums are then the
    same whatever task finished first); None for a held candidate."""
    size = sum(n for _, n in stats_layout(model, M))
    total = np.zeros(len(plans) * size)
    for vec in vecs:
        total = total + vec
    return [None if plan.mode == PassMode.HOLD else split_stats(model, M, total[c * size:(c + 1) * size])
            for c, plan in enumerate(plans)]
