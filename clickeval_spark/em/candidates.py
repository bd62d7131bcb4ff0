"""A candidate fit of the EM loop: one resolved prior on one group of the packed log, and its running state.

With ``k: auto`` a fit runs one candidate per (strength, seen-means variant) in the same passes and keeps
the one with the best held-out LL; every candidate is also how each group of a grouped log is fitted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
from pyspark.sql import DataFrame

from clickeval_spark.em.context import FitContext
from clickeval_spark.em.options import EMOptions
from clickeval_spark.em.passes import PassMode, PassPlan
from clickeval_spark.em.step import cell_evidence, global_params, qd_prior_means
from clickeval_spark.models.base import ClickModel
from clickeval_spark.fitted import FittedModel
from clickeval_spark.models.priors import ModelPrior, Strength, eb_strength, log_prior


@dataclass
class Candidate:
    """One fit of the lockstep EM: a fully resolved prior and its running state, on one group of the packed log."""

    prior: ModelPrior
    g: dict[str, np.ndarray]
    group: int = 0
    g_means: dict[str, np.ndarray] = field(default_factory=dict)   # the prior means that produced g
    update: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None   # (k, m, m by rank) of the next qd M-step
    unseen: dict[str, float] = field(default_factory=dict)
    unseen_by_rank: dict[str, list[float]] = field(default_factory=dict)
    history: list[tuple[int, float, float]] = field(default_factory=list)
    posterior: list[float] = field(default_factory=list)
    compare_from: int | None = None   # first posterior entry under the final prior (None: m still moving)
    valid_ll: float = float("nan")
    active: bool = True
    done: int = 0
    pending_secs: float = 0.0   # wall time of the pass that produced the current parameters
    choice: float | Strength | None = None   # the grid entry this candidate stands for
    per_position: float = 1.0   # training SERPs per training position (a per-SERP LL step times this: per position)
    chosen_at: tuple[float, int] | None = None   # (valid LL, passes) when valid chose it and it went on
    competes: bool = False   # one of several candidates valid chooses among: successive halving applies
    valid_at: int | None = None   # the iteration whose parameters valid_ll scored
    dropped_at: int | None = None   # the iteration at whose valid LL successive halving stopped it (`selection.halve`)
    stop: dict = field(default_factory=dict)   # how its passes ended (`driver._run`), for the fit's record
    #: the history entry from which its passes are plain EM steps again, after an extrapolation (`acceleration`)
    plain_from: int = 0
    #: the rate of its plain EM steps before its first extrapolation (`acceleration`), for the runs after one
    #: that are too short to read their own
    rate: float | None = None

    @property
    def label(self) -> str:
        return (f"group {self.group} " if self.group else "") + self.prior_label

    @property
    def prior_label(self) -> str:
        """The prior this candidate stands for: eb, k=<the qd families' strengths> or - (none); seen->rank when
        seen pairs shrink toward their ranks' means."""
        ks = sorted({f.k for f in self.prior.qd.values()})
        text = Strength.EB.value if self.choice == Strength.EB else "k=" + ",".join(f"{k:g}" for k in ks) if ks else "-"
        return text + (" seen->rank" if self.prior.seen_by_rank else "")

    @property
    def means_text(self) -> str:
        """The qd families' current prior means, for the fit's log."""
        return " ".join(f"{p}={m:.4f}" for p, m in self.unseen.items())

    def plan(self, opts: EMOptions, final: bool = False) -> PassPlan:
        """This candidate's part of the next pass; ``final``: the scoring pass after the loop."""
        if final:
            return PassPlan(PassMode.SCORE, self.g, self.update, self.group, opts.ppl_eps,
                            seen_by_rank=self.prior.seen_by_rank, compiled=opts.compiled)
        # the held-out LL is read only while it may end the warm-up, at a round of successive halving (the pass
        # scores iteration `done`), and after the last pass
        halving = self.competes and any(it == self.done for it, _ in opts.halving)
        return PassPlan(PassMode.STEP if self.active else PassMode.HOLD, self.g, self.update, self.group,
                        held_out=opts.select_on_held_out and (self.compare_from is None or halving),
                        # the blocks sum evidence for qd families only (a global family's is the driver's)
                        eb=self.compare_from is None and any(p in self.prior.qd for p in self.prior.eb),
                        seen_by_rank=self.prior.seen_by_rank, compiled=opts.compiled)

    def record(self, it: int, sums: dict[str, np.ndarray], n_serps: int, ctx: FitContext) -> None:
        """The history entry of the parameters a pass scored (iteration ``it``)."""
        opts, model = ctx.opts, ctx.model
        ll = float(sums["ll"][0]) / n_serps
        if sums["n_pos"][0] > 0:
            self.per_position = n_serps / float(sums["n_pos"][0])
        self.history.append((it, ll, self.pending_secs))
        self.posterior.append(self.log_posterior(sums, n_serps))
        scored = sums["n_valid"][0] > 0   # held-out SERPs scored in this pass
        if opts.select_on_held_out and scored:
            self.valid_ll, self.valid_at = float(sums["ll_valid"][0] / sums["n_valid"][0]), it
        ctx.log.debug("%s %s iteration %d: train LL %.6f per SERP, log posterior %.6f, valid LL %s per position, "
                      "prior m %s, %.2f s", model.name, self.label, it, ll, self.posterior[-1],
                      f"{self.valid_ll:.6f}" if scored and opts.select_on_held_out else "-", self.means_text,
                      self.pending_secs)

    def log_posterior(self, sums: dict[str, np.ndarray], n_serps: int) -> float:
        """The log posterior per training SERP of the parameters a pass scored (its ``sums``) under ``self.g``."""
        lp_glob = sum(log_prior(self.g[name], f.k, self.g_means[name]) for name, f in self.prior.glob.items()
                      if f.k > 0 and name in self.g_means)
        return (float(sums["ll"][0]) + float(sums["lp"][0]) + lp_glob) / n_serps

    def advance(self, it: int, sums: dict[str, np.ndarray], secs: float, n_serps: int, ctx: FitContext) -> None:
        """After pass ``it``: record what it scored, end the warm-up or the fit, and plan the M-steps."""
        opts, model, M, log = ctx.opts, ctx.model, ctx.max_rank, ctx.log
        valid_before = self.valid_ll
        self.record(it - 1, sums, n_serps, ctx)
        post, tol = self.posterior, opts.tol
        # why this candidate has converged (None: it has not)
        if self.chosen_at is None:   # among the candidates: today's rule, on the log posterior per SERP
            converged = (f"|d log posterior| < {tol:g} per SERP"
                         if tol is not None and self.compare_from is not None and len(post) >= 2 + self.compare_from
                         and abs(post[-1] - post[-2]) < tol else None)
        else:   # the chosen one going on (`driver._run`): on the training LL it may still gain
            gain = self.remaining_gain()
            converged = (f"training LL still to gain about {gain:.2e} < {opts.converge:g} per position"
                         if opts.converge is not None and gain < opts.converge else None)
        if self.compare_from is None and (it > opts.prior_warmup or self.valid_ll < valid_before):
            # this pass's update reuses the m that produced the parameters just scored
            self.compare_from = len(post) - 1
            log.debug("%s %s prior means fixed after pass %d: %s", model.name, self.label, it - 1, self.means_text)
        if self.prior.eb and self.compare_from is None:   # strengths are fixed with the means
            self.eb_update(model, M, sums)
        frozen = self.compare_from is not None and ctx.pooled
        self.g, self.g_means = global_params(model, M, sums, self.g, self.prior.glob, self.g_means if frozen else None)
        if frozen and self.update is not None:   # the pooled means the warm-up ended with
            means, by_rank = self.update[1], self.update[2]
        else:
            means, by_rank = qd_prior_means(self.prior, model, sums, M)
        self.update = (self.prior.qd_arrays(model.qd_params)[0], means, by_rank)
        self.unseen = {p: float(means[j]) for j, p in enumerate(model.qd_params)}
        self.unseen_by_rank = {p: by_rank[j].tolist() for j, p in enumerate(model.qd_params)}
        self.done, self.pending_secs = it, secs
        if converged is not None:
            log.debug("%s %s converged: %s", model.name, self.label, converged)
            self.active = False
        elif not model.iterative and not self.prior.eb:   # counted; only eb candidates count again
            self.active = False

    def remaining_gain(self) -> float:
        """`remaining_gain` of this candidate's training LL under its final prior, over its plain EM steps since
        its last extrapolation, at their own rate or, while they are too few to read it, at ``self.rate``
        (inf while m still moves)."""
        if self.compare_from is None:
            return math.inf
        ll = [h[1] for h in self.history[max(self.compare_from, self.plain_from):]]
        short = len(ll) < GAIN_SPAN + 2 and self.rate is not None
        return remaining_gain(ll, self.per_position, rate=self.rate if short else None)

    def eb_update(self, model: ClickModel, M: int, sums: dict[str, np.ndarray]) -> None:
        """An empirical Bayes candidate's strengths from this pass's counts: each qd family's from its pairs'
        evidence (summed by the blocks), each pooled global family's from its cells around their rank's mean."""
        ks = {}
        for p in self.prior.eb:
            k = eb_strength(sums[f"eb_{p}"] if p in model.qd_params else cell_evidence(model, M, sums, p))
            if k is not None:
                ks[p] = k
        self.prior = replace(self.prior.with_strengths(ks), eb=self.prior.eb)

    def strengths(self) -> dict[str, float]:
        """The empirical Bayes strength of each family of an eb candidate."""
        fams = {**self.prior.qd, **self.prior.glob}
        return {p: fams[p].k for p in self.prior.eb}

    def fitted(self, model: ClickModel, M: int, prior: ModelPrior, qd: DataFrame, selection: dict | None,
               held_out_ppl: tuple[np.ndarray, np.ndarray] | None) -> FittedModel:
        """This candidate as the fit's result; ``prior`` is the fit's (before candidates resolved it)."""
        strengths = Strength.EB.value if self.choice == Strength.EB else "grid" if prior.auto else "fixed"
        spec = {"kind": prior.kind, "strengths": strengths, **({"stop": self.stop} if self.stop else {}),
                "seen_means": self.prior.seen_means[0],
                "families": {**{p: {"k": f.k, "m": self.unseen[p], "pooled": f.m is None,
                                    "m_by_rank": self.unseen_by_rank.get(p)}
                                for p, f in self.prior.qd.items()},
                             **{name: {"k": f.k, "m": self.g_means[name].ravel().tolist() if f.m is None else f.m,
                                       "pooled": f.m is None}
                                for name, f in self.prior.glob.items() if f.k > 0}}}
        return FittedModel(model=model, max_rank=M, qd=qd, glob=self.g, prior=dict(self.unseen),
                           prior_by_rank=dict(self.unseen_by_rank), history=self.history, prior_spec=spec,
                           selection=selection, log_posterior=self.posterior,
                           valid_ll=None if math.isnan(self.valid_ll) else self.valid_ll,
                           held_out_ppl=held_out_ppl)


#: `remaining_gain`: the steps whose ratio gives the rate, and the rate of a step that is not a rise
GAIN_SPAN, FALLBACK_RATE = 3, 0.99


def remaining_gain(ll: list[float], per_position: float, span: int = GAIN_SPAN, rate: float | None = None) -> float:
    """The training LL (nats per position) EM may still gain after the last entry of ``ll`` (per SERP, one entry
    a pass, one prior), if its steps go on shrinking geometrically: d r / (1 - r), d the last step, r the rate
    over the last ``span`` steps, (d / d_span)^(1/span). EM converges linearly, so this is the tail of its
    steps; a step that is not a rise (a prior's LL may fall as the posterior rises), or a step ``span``
    back that was not one, counts at r = FALLBACK_RATE (99 |d|); inf while there are fewer than span + 1
    steps or if r >= 1. A ``rate`` given is r (`step_rate`), for a run of steps too short to read its own:
    then one step is enough.

    Why the LL and not the log posterior: on the dense log of benchmarks/stop_rule.py the log posterior per
    SERP still rose at a rate of 0.993-0.997 a pass after 100 passes, when the LL had long settled within
    1e-5 per position; and the LL is what the fit is scored by."""
    if len(ll) < (2 if rate is not None else span + 2):
        return math.inf
    d = (ll[-1] - ll[-2]) * per_position
    r = (rate if d > 0 else FALLBACK_RATE) if rate is not None else step_rate(ll, span)
    return math.inf if r >= 1 else abs(d) * r / (1 - r)


def step_rate(ll: list[float], span: int = GAIN_SPAN) -> float:
    """The rate r of `remaining_gain` of the last ``span`` steps of ``ll`` (at least span + 2 entries)."""
    d, back = ll[-1] - ll[-2], ll[-1 - span] - ll[-2 - span]
    return (d / back) ** (1.0 / span) if d > 0 and back > 0 else FALLBACK_RATE


def candidate_prior(prior: ModelPrior, k: float | Strength | None) -> ModelPrior:
    """The prior of the candidate for grid entry ``k``: "eb", every auto family's strength by empirical Bayes;
    a number, that strength for the qd families, and empirical Bayes for the pooled global ones (UBM's
    examination cells: a few dozen cells with thousands of impressions each, whose own strength need not
    be the attractiveness's); None, ``prior`` as it is."""
    if k is None:
        return prior
    if k == Strength.EB:
        return prior.with_eb()
    return replace(prior.with_k(k), eb=tuple(f for f in prior.auto if f in prior.glob))
