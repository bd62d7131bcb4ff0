"""SQUAREM for the chosen fit's continuation (`driver._run`): the same fixed point in fewer passes.

EM's steps here shrink by 0.97-0.99 a pass on a dense log, so a fit that goes on to its fixed point makes
70-160 more passes after tol's stop. SQUAREM (Varadhan & Roland 2008, Scand. J. Stat. 35:335, scheme S3, the
R package's defaults) extrapolates along the path of two EM steps: from the points p0, p1 = F(p0),
p2 = F(p1) to p0 + 2a r + a^2 v, r = p1 - p0, v = p2 - 2 p1 + p0, with the step length a = |r| / |v| held
in [1, a_max]; a = 1 is p2, plain EM. a_max starts at 1 and grows fourfold each time a reaches it.

In passes: a pass runs the M-step of the last E-step, then the E-step, so a cycle is
  1. the M-step's values kept as p0 (E-step and LL at p0),
  2. kept as p1 (E-step and LL at p1),
  3. a `PassMode.NORM` pass: the M-step's values kept as p2, no E-step; the blocks' squared norms of r and v
     (the global parameters' are the driver's, which holds g0, g1, g2),
  4. the extrapolated point (E-step and LL there).
The point is kept if its log posterior is at least p1's (EM's own steps never lower it); else the next pass
runs at p2 instead (`PassPlan.restore`), and a_max shrinks fourfold if a had reached it. The next cycle's
p0 is the M-step from the extrapolated point: SQUAREM's stabilising EM step.

The stop is the plain continuation's (`candidates.remaining_gain` below ``converge``), read off plain EM
steps alone: those from the last extrapolated point's first EM step, p0, on (`Candidate.plain_from`; the
step into p0 carries what the extrapolation overshot). A cycle has one, p0 to p1, too few to read a rate
from: its rate is the one the plain steps had before the first extrapolation (`Candidate.rate`), that of
the EM map's slowest mode, which extrapolating does not change. A fit whose plain steps under its final
prior are too few to read a rate (its pooled prior means were fixed a pass or two before tol's stop) makes
plain steps until they are enough.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from enum import StrEnum

import numpy as np

from clickeval_spark.em.blocks import PackedLog
from clickeval_spark.em.candidates import FALLBACK_RATE, GAIN_SPAN, Candidate, step_rate
from clickeval_spark.em.context import FitContext
from clickeval_spark.em.passes import PassMode, PassPlan, Passes
from clickeval_spark.em.extrapolation import extrapolated

#: SQUAREM's step length bounds: a_max's start, and the factor it grows and shrinks by
STEP_MAX0, STEP_FACTOR = 1.0, 4.0


class Phase(StrEnum):
    FIRST = "first"       # the pass at p0
    SECOND = "second"     # at p1
    NORM = "norm"         # p2 kept, the norms summed
    JUMP = "jump"         # at the extrapolated point
    RESTORE = "restore"   # at p2, the extrapolation refused
    PLAIN = "plain"       # plain EM steps, until they are enough to read their rate


@dataclass
class Squarem:
    """One candidate's SQUAREM cycle."""

    phase: Phase = Phase.PLAIN
    step_max: float = STEP_MAX0
    alpha: float = 1.0
    g: list = field(default_factory=list)   # the global parameters of p0, p1, p2
    posterior_p1: float = -math.inf
    cycles: int = 0
    refused: int = 0
    norm_passes: int = 0

    def plan(self, plan: PassPlan) -> PassPlan:
        """The candidate's plan for this pass, as its phase says."""
        if plan.mode != PassMode.STEP:
            return plan
        return {Phase.FIRST: replace(plan, keep=0), Phase.SECOND: replace(plan, keep=1),
                Phase.NORM: replace(plan, mode=PassMode.NORM), Phase.JUMP: replace(plan, extrapolate=self.alpha),
                Phase.RESTORE: replace(plan, restore=True), Phase.PLAIN: plan}[self.phase]

    def record(self, c: Candidate) -> dict:
        """What `runs.details.prior.stop` adds for candidate ``c``."""
        return {"accelerate": "squarem", "cycles": self.cycles,
                "refused": self.refused, "norm_passes": self.norm_passes, "step_max": self.step_max, "rate": c.rate}


def accelerated_passes(packed: PackedLog, ctx: FitContext, cands: list[Candidate], passes: Passes, cap: int,
                       phase: str) -> list[dict[str, np.ndarray] | None]:
    """`driver._passes` for the active candidates by SQUAREM cycles (above): passes until none is active or
    each has made ``cap`` passes in its history, then the scoring pass of those that were active: its sums. The
    cap does not count a cycle's NORM pass or a refused jump's (`Squarem.record`: norm_passes, refused)."""
    opts = ctx.opts
    scored = [c.active for c in cands]
    cycle = {id(c): Squarem() for c in cands if c.active}
    for c in cands:
        if c.active:
            _read_rate(c, cycle[id(c)])
    while any(c.active for c in cands):
        plans = [cycle[id(c)].plan(c.plan(opts)) if c.active else c.plan(opts) for c in cands]
        t0 = time.perf_counter()
        all_sums = passes.run(plans)
        secs = time.perf_counter() - t0
        for c, sums in zip(cands, all_sums):
            if sums is not None:
                _step(c, cycle[id(c)], sums, secs, packed.groups[c.group].n_serps, ctx)
                if c.done >= cap:
                    c.active = False
        if ctx.on_pass is not None:
            ctx.on_pass(max(c.done for c in cands), cap, phase)
    for c, on in zip(cands, scored):
        if on:   # what it stopped by: after an extrapolation its next step may be larger than the last one was
            gain = c.remaining_gain()   # inf if the cap stopped it before two plain steps: none to read
            c.stop.update(cycle[id(c)].record(c), gain=gain if math.isfinite(gain) else None)
    t0 = time.perf_counter()
    final = passes.run([c.plan(opts, final=on) for c, on in zip(cands, scored)])
    ctx.log.debug("%s final pass (%s): %.2f s", ctx.model.name, phase, time.perf_counter() - t0)
    for c, sums, on in zip(cands, final, scored):
        if on:
            c.record(c.done, sums, packed.groups[c.group].n_serps, ctx)
    return final


def _step(c: Candidate, sq: Squarem, sums: dict[str, np.ndarray], secs: float, n_serps: int,
          ctx: FitContext) -> None:
    """Candidate ``c`` after a pass of its cycle ``sq``: what the pass gave, and the cycle's next phase."""
    if sq.phase == Phase.NORM:
        g0, g1, g2 = sq.g
        r2 = float(sums["accel"][0]) + sum(float(np.sum((g1[k] - g0[k]) ** 2)) for k in g0)
        v2 = float(sums["accel"][1]) + sum(float(np.sum((g2[k] - 2 * g1[k] + g0[k]) ** 2)) for k in g0)
        sq.alpha = min(max(math.sqrt(r2 / v2), 1.0), sq.step_max) if v2 > 0 else 1.0
        c.g = {k: extrapolated(g0[k], g1[k], g2[k], sq.alpha) for k in g0}
        sq.norm_passes += 1
        sq.phase = Phase.JUMP
        return
    if sq.phase == Phase.JUMP:
        if not c.log_posterior(sums, n_serps) >= sq.posterior_p1:   # refused (or NaN): the next pass runs at p2
            c.g = sq.g[2]
            sq.refused += 1
            if sq.alpha == sq.step_max:
                sq.step_max = max(STEP_MAX0, sq.step_max / STEP_FACTOR)
            sq.phase = Phase.RESTORE
            ctx.log.debug("%s %s: extrapolation by %.3g refused", ctx.model.name, c.label, sq.alpha)
            return
        if sq.alpha == sq.step_max:
            sq.step_max *= STEP_FACTOR
        sq.cycles += 1
        c.plain_from = len(c.history) + 1   # plain EM steps from this point's first one on
    if sq.phase == Phase.FIRST:
        sq.g = [c.g]
    c.advance(c.done + 1, sums, secs, n_serps, ctx)
    if sq.phase == Phase.FIRST:
        sq.g.append(c.g)
        sq.phase = Phase.SECOND
    elif sq.phase == Phase.SECOND:
        sq.g.append(c.g)
        sq.posterior_p1 = c.posterior[-1]
        sq.phase = Phase.NORM
    elif sq.phase in (Phase.JUMP, Phase.RESTORE):
        sq.phase = Phase.FIRST
    else:
        _read_rate(c, sq)


def _read_rate(c: Candidate, sq: Squarem) -> None:
    """Once ``c``'s plain steps under its final prior are enough to read their rate (`candidates.step_rate`):
    that rate, and the first cycle next."""
    plain = [h[1] for h in c.history[c.compare_from:]]
    if len(plain) >= GAIN_SPAN + 2 and step_rate(plain) < 1:   # steps that still grow have no rate yet
        c.rate, sq.phase = max(step_rate(plain), FALLBACK_RATE), Phase.FIRST
