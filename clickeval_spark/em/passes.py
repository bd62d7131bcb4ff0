"""The contract between the EM driver and the engines that run its passes.

A pass runs every candidate fit's `PassPlan` over every block of a packed log and returns each
candidate's summed stats (`step.stats_layout`). Two engines implement `Passes`:
`stage_passes.StagePasses` (one Spark job per pass) and `resident.ResidentPasses` (every pass in
one barrier stage). Both run `sums.block_pass` on every block and add the blocks' vectors in block
order, so their sums are the same bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Mapping, Protocol

import numpy as np
from pyspark.sql import DataFrame


class PassMode(StrEnum):
    """What a candidate does in a pass."""
    STEP = "step"     # M-step of its update, LL, E-step
    SCORE = "score"   # M-step, LL only: the final pass
    HOLD = "hold"     # converged: its state kept, nothing computed
    NORM = "norm"     # M-step only, kept as an extrapolation's third point; its differences' squared norms


@dataclass(frozen=True)
class PassPlan:
    """What one candidate fit does in a pass.

    mode: a `PassMode` (its name as a string is taken too: plans cross to the tasks as JSON).
    g: the global parameters the pass runs under.
    update: the qd M-step the pass applies first, (k, m) or (k, m, m by rank), or None (`step.em_block`).
    group: the packed log's group the candidate is fitted on (`blocks.BlockGroup`).
    ppl_eps: also score the held-out SERPs' perplexity terms (`step.em_block`).
    held_out: score the held-out SERPs at all (the driver asks only when it reads their LL).
    eb: also sum the Beta-binomial evidence of the qd families (`step.em_block`).
    seen_by_rank: pairs seen in training shrink toward their ranks' mean (`step.em_block`).
    compiled: the block step by the model's compiled pass (`step.compiled_pass`), False: by the numpy kernels;
        None: the model's default (`step.em_block`).
    keep: after the M-step, keep the values as point 0 or 1 of an extrapolation (`acceleration`); None: not.
    extrapolate: the values are the extrapolation of the kept points 0, 1, 2 by this step length, instead of
        the M-step (`extrapolation.extrapolated`).
    restore: the values are the kept point 2, instead of the M-step (an extrapolation that was refused).
    """

    mode: PassMode
    g: Mapping[str, np.ndarray]
    update: tuple[np.ndarray, ...] | None
    group: int = 0
    ppl_eps: float | None = None
    held_out: bool = True
    eb: bool = False
    seen_by_rank: bool = False
    compiled: bool | None = None
    keep: int | None = None
    extrapolate: float | None = None
    restore: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", PassMode(self.mode))

    @property
    def keeps_points(self) -> bool:
        """The pass's state carries an extrapolation's kept points after it (`step.em_block`: 6 rows, not 3)."""
        return self.keep is not None or self.extrapolate is not None or self.mode == PassMode.NORM


class Passes(Protocol):
    """An engine that runs the passes of one fit over one packed log."""

    def run(self, plans: list[PassPlan]) -> list[dict[str, np.ndarray] | None]:
        """One pass of every candidate: per candidate its stats summed over the blocks (None if it holds)."""

    def finish(self, chosen: tuple[tuple[int, int], ...]) -> DataFrame:
        """End the passes: the blocks (`blocks.PASS_SCHEMA` rows) with, as state, the values of each group's
        chosen candidate only (`codec.chosen_values`), for `blocks.qd_table`. ``chosen``: per group, (the
        candidate's slot, the group's number of candidates). Their data may be empty (the packed log keeps it)."""

    def end(self) -> None:
        """End the passes without their final state (a selection sample's: only its sums were wanted)."""

    def close(self) -> None:
        """Release what the engine holds (its stage, sockets, the blocks `finish` returned); safe to repeat."""


class EngineLost(RuntimeError):
    """An engine lost its state mid-fit (a resident task went away): the driver fits again on another."""
