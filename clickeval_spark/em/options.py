"""EMOptions: everything a fit is told besides its log and its model, passed whole from the stage to the loop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from clickeval_spark.config import FitConfig
from clickeval_spark.models import Engine
from clickeval_spark.models.base import ClickModel
from clickeval_spark.models.priors import ModelPrior, model_prior

# the fit's defaults are the config's (`FitConfig`): a notebook's or a test's fit runs as the fit stage's would
_FIT = FitConfig()


def halving_rounds(halving: dict[int, float]) -> tuple[tuple[int, float], ...]:
    """fit.prior.halving's {iteration: margin} as `EMOptions.halving`'s rounds, in iteration order."""
    return tuple(sorted(halving.items()))


@dataclass(frozen=True)
class RecentChoice:
    """What `k: auto` chose in a recent fit of the same model on the same dataset (its `runs` row), for a daily
    run to fit alone while its valid LL holds (fit.prior.reuse, `selection.reused_candidate`).

    run_id: the run whose choice it is. k: a grid strength, or "eb". seen_means: "pooled" or "rank".
    valid_ll: that fit's valid LL per position. margin: today's may differ by at most this.
    """

    run_id: str
    k: float | str
    seen_means: str
    valid_ll: float
    margin: float

    def holds(self, valid_ll: float) -> bool:
        """Whether today's valid LL per position of the reused choice is within the margin of the reused fit's."""
        return abs(valid_ll - self.valid_ll) <= self.margin


@dataclass(frozen=True)
class EMOptions:
    """How a fit runs (DESIGN's fit stage; README "How a fit runs").

    iterations: the cap on the candidates' EM passes (a counting model makes one, or two for empirical Bayes);
        a fit that reaches it stops there.
    tol: stop a candidate once its log posterior per training SERP moves by less than this; None: never (a fit
        then makes exactly ``iterations`` passes, and ``converge`` does not apply).
    converge: after the candidates stopped (and valid chose one), the chosen fit, if ``tol`` stopped it before
        ``iterations`` did, goes on until the training LL it may still gain (`candidates.remaining_gain`) is
        below this, in nats per training position; None: it stops with the candidates.
    converge_iterations: the cap on the chosen fit's passes while it goes on (those in its history: not
        SQUAREM's NORM passes or refused jumps).
    converge_accelerate: the chosen fit goes on by SQUAREM's extrapolations of its EM steps (`acceleration`);
        False: by plain EM steps.
    converge_min_seen: the chosen fit goes on only on a dense log: one where at least this share of the held-out
        positions are of (query, doc) pairs the training SERPs show (`blocks.BlockGroup.seen_share`; a log
        with nothing held out counts as dense).
    prior: the resolved Beta priors (`priors.model_prior`); None: the model's default (beta, k auto).
    k_grid: the shared strengths `k: auto` tries, beside empirical Bayes.
    prior_warmup: at most this many passes pooled prior means follow the fit.
    checkpoint_interval: the stage engine checkpoints every this many passes.
    engine: a `models.Engine` (its name as a string is taken too).
    select_on_held_out: the held-out SERPs choose the strength and end the warm-up; False: only scored.
    ppl_eps: also sum the held-out SERPs' perplexity terms in the final pass (the surrogate's Reverse PPL).
    compiled: the block step of an EM model (`step.em_block`): its compiled pass, or the numpy kernel;
        None: compiled (every EM model has a compiled pass, `step.compiled_pass`).
    select_serps: on a larger log the candidates compete on a query sample of about this many SERPs
        (`driver._select_on_sample`); None: on the whole log.
    halving: successive halving of the candidates, (iteration, margin) pairs (`selection.halve`); (): none.
    reuse: a recent fit's choice to fit alone instead of the candidates while its valid LL holds
        (`selection.reused_candidate`); None: the candidates compete.
    """

    iterations: int = _FIT.iterations
    tol: float | None = _FIT.tol
    converge: float | None = _FIT.converge.gain
    converge_iterations: int = _FIT.converge.iterations
    converge_accelerate: bool = _FIT.converge.accelerate
    converge_min_seen: float = _FIT.converge.min_seen_share
    prior: ModelPrior | None = None
    k_grid: Sequence[float] = _FIT.prior.grid
    prior_warmup: int = _FIT.prior.warmup
    checkpoint_interval: int = _FIT.checkpoint_interval
    engine: Engine = Engine(_FIT.engine)
    select_on_held_out: bool = True
    ppl_eps: float | None = None
    compiled: bool | None = None
    select_serps: int | None = _FIT.prior.select_serps
    halving: tuple[tuple[int, float], ...] = halving_rounds(_FIT.prior.halving)
    reuse: RecentChoice | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "engine", Engine(self.engine))
        except ValueError:
            raise ValueError(f"engine must be one of {[e.value for e in Engine]}, got {self.engine!r}") from None
        if self.iterations < 1 or self.converge_iterations < 1:
            raise ValueError("iterations and converge_iterations must be >= 1")
        if self.checkpoint_interval < 1:
            raise ValueError("checkpoint_interval must be >= 1")
        if self.prior_warmup < 1:
            raise ValueError("prior_warmup must be >= 1")
        if self.select_serps is not None and self.select_serps < 1:
            raise ValueError("select_serps must be >= 1 or None")
        if any(it < 1 or margin <= 0 for it, margin in self.halving):
            raise ValueError(f"halving: each round is (iteration >= 1, margin > 0), got {self.halving}")

    @classmethod
    def from_config(cls, fit: FitConfig, model: ClickModel, max_rank: int,
                    reuse: RecentChoice | None = None) -> "EMOptions":
        """The options of the fit stage's ``model`` from the config's ``fit`` section (and the recent choice the
        stage found for it, with fit.prior.reuse)."""
        kind, k, families = fit.prior_overrides(model.name)
        prior = model_prior(model, max_rank, kind, k, families, rank_means=fit.prior.rank_means,
                            seen_means=fit.prior.seen_means)
        return cls(iterations=fit.iterations, tol=fit.tol, converge=fit.converge.gain,
                   converge_iterations=fit.converge.iterations, converge_accelerate=fit.converge.accelerate,
                   converge_min_seen=fit.converge.min_seen_share,
                   prior=prior, k_grid=fit.prior.grid,
                   prior_warmup=fit.prior.warmup, checkpoint_interval=fit.checkpoint_interval, engine=fit.engine,
                   select_serps=fit.prior.select_serps, halving=halving_rounds(fit.prior.halving),
                   reuse=reuse)
