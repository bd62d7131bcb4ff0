"""The EM loop: candidates, prior means, stopping and selection, talking to the engine only through `Passes`.

`fit` fits one log; `fit_groups` every group of a packed log (the surrogate's real log and every
generator's sequences) in the same passes, one FittedModel each. The estimator (MAP with Beta
priors, the warm-up of pooled means, the stopping rule, the history) is described in the README,
"How a fit runs".

Logging: one INFO line per fit (its passes, prior, engine and time); every pass, candidate and engine
detail at DEBUG. ``on_pass``, if given, is called after every pass (a progress display's hook).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import numpy as np
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from clickeval_spark.em.acceleration import accelerated_passes
from clickeval_spark.em.blocks import PackedLog, checkpointed, cluster_slots, pack_serps, qd_table, sample_of
from clickeval_spark.em.candidates import Candidate, candidate_prior
from clickeval_spark.em.context import FitContext, OnPass
from clickeval_spark.em.options import EMOptions
from clickeval_spark.em.selection import (chosen_slot, grid_selection, halve, reuse_record, reused_candidate,
                                         reused_selection)
from clickeval_spark.em.passes import EngineLost, Passes
from clickeval_spark.em.resident import ResidentPasses
from clickeval_spark.em.stage_passes import StagePasses
from clickeval_spark.models import Engine
from clickeval_spark.models.base import INIT_VALUE, ClickModel
from clickeval_spark.fitted import FittedModel
from clickeval_spark.models.priors import DEFAULT_K, Strength, model_prior

_log = logging.getLogger(__name__)


def fit(serps: DataFrame | PackedLog, model: ClickModel, options: EMOptions | None = None, *, max_rank: int = 10,
        logger: logging.Logger | None = None, on_pass: OnPass | None = None, **changes) -> FittedModel:
    """Fit ``model`` on canonical ``serps`` rows (every row is training data; ranks beyond ``max_rank``
    ignored) or on an already packed log (`blocks.pack_serps`, with held-out SERPs to choose on).
    ``changes``: `EMOptions` fields to set on ``options`` (one-off calls: notebooks, tests)."""
    packed = serps if isinstance(serps, PackedLog) else pack_serps(serps, max_rank)
    try:
        [fitted] = fit_groups(packed, model, options, logger=logger, on_pass=on_pass, **changes)
    finally:
        if packed is not serps:
            packed.unpersist()
    return fitted


def fit_groups(packed: PackedLog, model: ClickModel, options: EMOptions | None = None, *,
               logger: logging.Logger | None = None, on_pass: OnPass | None = None,
               **changes) -> list[FittedModel]:
    """`fit` of every group of ``packed`` (`blocks.BlockGroup`), all in the same passes: one FittedModel per
    group, each the fit its group's SERPs would get alone.

    The engine (``options.engine``): "resident" runs every pass in one barrier stage; if that stage is lost
    the fit starts again on "stages", one Spark job per pass. "auto": resident for an iterative model when
    the cluster has slots for it (no dynamic allocation), else stages. Both give the same bits.
    """
    opts = replace(options or EMOptions(), **changes)
    log = logger or _log
    for g, group in enumerate(packed.groups):
        if group.n_serps == 0:
            raise ValueError("fit: no SERP with a query_id and a non-empty doc list"
                             + (f" in group {g}" if len(packed.groups) > 1 else ""))
    if model.counting is None:
        return _fit_groups(packed, model, opts, log, on_pass)
    if (opts.prior or model_prior(model, packed.max_rank)).kind == "pyclick":   # PyClick's estimator
        return [_as_model(f, model, "counting", None) for f in _fit_groups(packed, model.counting, opts, log, on_pass)]
    fits = _fit_groups(packed, model, opts, log, on_pass)
    if not opts.select_on_held_out or not any(group.n_held_out for group in packed.groups):
        return [_as_model(f, model, "em", None) for f in fits]
    # the recent choice (fit.prior.reuse) is the EM estimator's; counting's candidates compete in their one pass
    counted = _fit_groups(packed, model.counting, replace(opts, reuse=None), log, on_pass)
    return [_better_estimator(model, em, count, log) for em, count in zip(fits, counted)]


def _as_model(fitted: FittedModel, model: ClickModel, estimator: str, valid_ll: dict | None) -> FittedModel:
    """``fitted`` (by one of ``model``'s estimators) as ``model``'s fit, the estimator in its prior record."""
    spec = {**fitted.prior_spec, "estimator": estimator,
            **({"estimator_valid_ll": valid_ll} if valid_ll else {})}
    return replace(fitted, model=model, prior_spec=spec)


def _better_estimator(model: ClickModel, em: FittedModel, counted: FittedModel, log: logging.Logger) -> FittedModel:
    """The fit whose estimator scored the better valid LL per position (EM on a tie)."""
    scores = {"em": em.valid_ll, "counting": counted.valid_ll}
    chosen = "counting" if counted.valid_ll is not None and em.valid_ll is not None \
        and counted.valid_ll > em.valid_ll else "em"
    log.debug("%s estimator by valid LL per position: em %s, counting %s -> %s", model.name, em.valid_ll,
              counted.valid_ll, chosen)
    return _as_model(counted if chosen == "counting" else em, model, chosen, scores)


def _fit_groups(packed: PackedLog, model: ClickModel, opts: EMOptions, log: logging.Logger,
                on_pass: OnPass | None) -> list[FittedModel]:
    """`fit_groups` by ``model``'s own estimator."""
    t0 = time.perf_counter()
    prior = opts.prior or model_prior(model, packed.max_rank)
    tasks = resident_tasks(packed, model, opts.engine)
    if tasks:
        stages_up: list[ResidentPasses] = []

        def resident(log_: PackedLog, shared: int = 0) -> Passes:
            """The stage over ``log_``; ``shared`` (a number of candidates, a selection sample's: a few blocks of
            unequal size, which blocks alone cannot balance): each task holds every block and runs its share."""
            t_up = time.perf_counter()
            engine = ResidentPasses(log_.blocks, model, log_.max_rank, log_.first_blocks,
                                    min(tasks, shared or log_.n_blocks), shared=shared > 1)
            log.debug("%s resident EM stage: %d tasks up in %.2f s%s", model.name, engine.n_tasks,
                      time.perf_counter() - t_up, ", candidates shared out" if engine.shared else "")
            stages_up.append(engine)
            return engine
        try:
            fits, labels = _fit(packed, FitContext(model, packed.max_rank, opts, prior, resident, log, on_pass))
            engine = (f"resident EM stage: {stages_up[-1].n_tasks} tasks up"
                      + (", candidates shared out on the sample" if any(e.shared for e in stages_up) else ""))
            log.info("%s", _summary(model, fits, labels, engine, t0))
            return fits
        except EngineLost as e:
            log.warning("%s: the resident EM stage was lost (%s); fitting again with one Spark stage per pass",
                        model.name, e)

    def stages(log_: PackedLog, shared: int = 0) -> Passes:   # a job per pass: nothing to share out
        return StagePasses(log_, model, opts.checkpoint_interval, log)

    fits, labels = _fit(packed, FitContext(model, packed.max_rank, opts, prior, stages, log, on_pass))
    log.info("%s", _summary(model, fits, labels, "a Spark job per pass", t0))
    return fits


def _summary(model: ClickModel, fits: list[FittedModel], labels: list[str], engine: str, t0: float) -> str:
    """The fit's INFO line: its passes (the most of any group), the chosen prior(s), the engine, the time."""
    passes = max(len(f.history) - 1 for f in fits)
    labels = [f.prior_spec["kind"] if label == "-" else label for f, label in zip(fits, labels)]
    chosen = [f.selection for f in fits if f.selection]
    reused = [s["reused"]["run_id"] for s in chosen if "reused" in s]
    how = (f" reused from run {reused[0]}" if reused else
           " chosen by valid LL" + (" on a sample of queries" if any("sample" in s for s in chosen) else "")
           if chosen else "")
    return (f"{model.name}: " + (f"{len(fits)} fits, " if len(fits) > 1 else "")
            + f"{passes} pass{'' if passes == 1 else 'es'}, prior {', '.join(sorted(set(labels)))}{how}, "
            + f"{engine}, {time.perf_counter() - t0:.1f} s")


def resident_tasks(packed: PackedLog, model: ClickModel, engine: Engine | str) -> int:
    """Tasks of the resident stage (0: the stage engine): one per block, at most one per slot."""
    if engine == Engine.STAGES or (engine == Engine.AUTO and not model.iterative):
        return 0
    tasks = min(packed.n_blocks, cluster_slots(packed.blocks))
    if engine == Engine.RESIDENT and tasks < 1:
        raise ValueError("engine 'resident': the cluster has no slot for a barrier stage (dynamic allocation?)")
    return tasks


def _candidates(packed: PackedLog, ctx: FitContext) -> tuple[list, list[Candidate]]:
    """Per group its grid of (strength, seen-means) entries, and every group's candidates in one list."""
    model, opts, prior = ctx.model, ctx.opts, ctx.prior
    init = {k: np.asarray(v, dtype=np.float64) for k, v in model.init_global(packed.max_rank).items()}
    grids, cands = [], []
    for g, group in enumerate(packed.groups):
        selecting = prior.auto and group.n_held_out and opts.select_on_held_out
        # the valid split decides between the shared strengths of the grid and empirical Bayes, and between
        # the seen pairs' prior means
        variants = prior.seen_means if selecting else prior.seen_means[:1]
        grid = [(k, v) for v in variants for k in ([*opts.k_grid, Strength.EB] if selecting else [DEFAULT_K])]
        grids.append(grid)
        cands += [Candidate(prior=replace(candidate_prior(prior, k), seen_means=(v,)), g=dict(init), group=g,
                            choice=k, unseen={q: INIT_VALUE for q in model.qd_params}, competes=len(grid) > 1)
                  for k, v in (grid if prior.auto else [(None, variants[0])])]
    return grids, cands


def _fit(packed: PackedLog, ctx: FitContext) -> tuple[list[FittedModel], list[str]]:
    """Every group's FittedModel, and the prior each group's chosen candidate stands for (`Candidate.prior_label`)."""
    model, opts, M, log = ctx.model, ctx.opts, ctx.max_rank, ctx.log
    grids, cands = _candidates(packed, ctx)
    ctx = replace(
        ctx,
        # a counting model's empirical Bayes strengths need the pooled means of a first pass: one more
        n_passes=opts.iterations if model.iterative else 2 if any(c.prior.eb for c in cands) else 1,
        pooled=any(f.k > 0 and f.m is None for c in cands for f in (*c.prior.qd.values(), *c.prior.glob.values())))
    for c in cands:
        _set_start(c, ctx.pooled)
    reused = reused_candidate(ctx, cands, grids)
    sampled = None if reused is not None else _select_on_sample(packed, ctx, cands, grids)
    if reused is not None:   # only the recent choice runs
        cands = reused
    elif sampled is not None:   # only the chosen candidate goes on, from the start, on the whole log
        cands, sample_selection = sampled
    passes, refused = None, None
    try:
        passes = ctx.engine(packed)
        final = _run(packed, ctx, cands, passes)
        if reused is not None and not opts.reuse.holds(cands[0].valid_ll):
            refused = reuse_record(cands[0], opts.reuse)   # the log has moved: no table for this fit
            passes.end()
        else:
            chosen = [chosen_slot(cands, g) for g in range(len(packed.groups))]
            blocks = passes.finish(tuple((slot, len(mine)) for mine, slot in chosen))
            if model.qd_params:
                qd_all = checkpointed(qd_table(blocks, packed.blocks, model, packed.first_blocks))
            else:
                qd_all = packed.blocks.sparkSession.createDataFrame(
                    [], "group int, query_id string, doc_id string, n_obs double")
    finally:
        if passes is not None:
            passes.close()
    if refused is not None:   # every candidate competes again, once this fit's engine is closed
        log.info("%s: the choice of run %s (%s) no longer holds: valid LL per position %.6f, then %.6f; selecting "
                 "again", model.name, refused["run_id"], cands[0].prior_label, refused["valid_ll_now"],
                 refused["valid_ll_then"])
        fits, labels = _fit(packed, replace(ctx, opts=replace(opts, reuse=None)))
        return [replace(f, selection={**f.selection, "reuse_refused": refused}) if f.selection else f
                for f in fits], labels
    out, labels = [], []
    for g, (mine, slot) in enumerate(chosen):
        best = cands[mine[slot]]
        n_valid = packed.groups[g].n_held_out
        selection = (reused_selection(best, opts.reuse, n_valid) if reused is not None
                     else sample_selection if sampled is not None
                     else grid_selection(cands, mine, slot, grids[g], n_valid, model, log))
        qd = qd_all if len(packed.groups) == 1 else qd_all.where(F.col("group") == g)
        ppl = (final[mine[slot]]["ppl_n"], final[mine[slot]]["ppl_ln"]) if opts.ppl_eps is not None else None
        out.append(best.fitted(model, M, ctx.prior, qd.drop("group"), selection, ppl))
        labels.append(best.prior_label)
    return out, labels


def _run(packed: PackedLog, ctx: FitContext, cands: list[Candidate], passes: Passes,
         phase: str = "", go_on: bool = True) -> list[dict[str, np.ndarray] | None]:
    """Every pass of ``cands`` until none is active (or ``ctx.n_passes``), then the scoring pass: its sums.

    Then, with ``go_on`` (not on a selection sample: only its choice is wanted), ``opts.tol`` and
    ``opts.converge``, each group's chosen candidate (`chosen_slot`, by the valid LL of that scoring pass: the
    choice is the one the candidates' own stop gives), if tol stopped it (not ``ctx.n_passes``: a cap the
    caller set holds) and its group is dense (at least ``opts.converge_min_seen`` of the held-out positions
    of pairs seen in training, `BlockGroup.seen_share`), goes on alone until the training LL it may still gain
    (`Candidate.remaining_gain`) is below ``opts.converge`` per position, or it has made
    ``opts.converge_iterations`` passes; then its own scoring pass. A pass after a scoring pass is the one
    that would have come without it (the scoring pass's M-step is the next pass's, and repeating it on the
    same sums gives the same values), so the chosen fit is exact EM's path, only longer; with
    ``opts.converge_accelerate`` it goes on by SQUAREM's extrapolations instead (`acceleration`), toward the
    same fixed point. Every candidate's `Candidate.stop` records how its passes ended.
    """
    opts = ctx.opts
    final = _passes(packed, ctx, cands, passes, ctx.n_passes, phase)
    settled = "counted" if not ctx.model.iterative else "tol" if opts.tol is not None else "fixed passes"
    for c in cands:
        c.stop = {"rule": settled if settled != "tol" or c.done < ctx.n_passes else "cap",
                  "tol": opts.tol, "tol_passes": c.done, "passes": c.done}
    if not (go_on and ctx.model.iterative and opts.tol is not None and opts.converge is not None):
        return final
    going = []
    for g, group in enumerate(packed.groups):
        mine, slot = chosen_slot(cands, g)
        c = cands[mine[slot]]
        c.chosen_at = (c.valid_ll, c.done)
        c.stop.update(converge=opts.converge, cap=opts.converge_iterations, gain=c.remaining_gain(),
                      seen_share=group.seen_share, min_seen_share=opts.converge_min_seen)
        if c.stop["rule"] == "cap":   # fit.iterations stopped it before tol did: the cap holds for it
            continue
        if group.seen_share is not None and group.seen_share < opts.converge_min_seen:
            continue   # a sparse log: tol's stop stands (`EMOptions.converge_min_seen`)
        if c.stop["gain"] < opts.converge:
            c.stop["rule"] = "converged"
        elif c.done >= opts.converge_iterations:
            c.stop["rule"] = "cap"
        else:
            going.append(c)
    if not going:
        return final
    for c in cands:
        c.active = any(c is x for x in going)
    for c in going:   # the scoring pass's entry: the next pass scores the same parameters again
        c.history.pop()
        c.posterior.pop()
    on = [i for i, c in enumerate(cands) if c.active]
    run = accelerated_passes if opts.converge_accelerate else _passes
    again = run(packed, ctx, cands, passes, opts.converge_iterations, phase + ("; " if phase else "") + "converge")
    for i in on:
        c = cands[i]
        final[i] = again[i]
        c.stop.update(rule="converged" if c.done < opts.converge_iterations else "cap", passes=c.done,
                      # SQUAREM's is the gain it stopped by (`acceleration`)
                      **({} if opts.converge_accelerate else {"gain": c.remaining_gain()}))
        ctx.log.debug("%s %s went on to %d passes: training LL still to gain about %.2e per position (%s)",
                      ctx.model.name, c.label, c.done, c.stop["gain"], c.stop["rule"])
    return final


def _passes(packed: PackedLog, ctx: FitContext, cands: list[Candidate], passes: Passes, cap: int,
            phase: str) -> list[dict[str, np.ndarray] | None]:
    """Passes of the active candidates until none is active or each has made ``cap`` passes, then the scoring
    pass of those that were active: its sums (None for the others)."""
    scored = [c.active for c in cands]
    while any(c.active for c in cands):
        t0 = time.perf_counter()
        all_sums = passes.run([c.plan(ctx.opts) for c in cands])
        secs = time.perf_counter() - t0
        for c, sums in zip(cands, all_sums):
            if sums is not None:
                c.advance(c.done + 1, sums, secs, packed.groups[c.group].n_serps, ctx)
                if c.done >= cap:
                    c.active = False
        halve([c for c, sums in zip(cands, all_sums) if sums is not None], ctx)
        if ctx.on_pass is not None:
            ctx.on_pass(max(c.done for c in cands), cap, phase)
    scored = [on and c.dropped_at is None for c, on in zip(cands, scored)]   # a dropped candidate is not chosen
    t0 = time.perf_counter()
    final = passes.run([c.plan(ctx.opts, final=on) for c, on in zip(cands, scored)])   # the others hold
    ctx.log.debug("%s final pass%s: %.2f s", ctx.model.name, f" ({phase})" if phase else "",
                  time.perf_counter() - t0)
    for c, sums, on in zip(cands, final, scored):
        if on:
            c.record(c.done, sums, packed.groups[c.group].n_serps, ctx)
    return final


def _select_on_sample(packed: PackedLog, ctx: FitContext, cands: list[Candidate],
                      grids: list) -> tuple[list[Candidate], dict] | None:
    """On a log larger than ``opts.select_serps``, the candidates of ``k: auto`` compete on a sample of whole
    queries (`blocks.sample_of`) instead of the whole log: (the chosen candidate, fresh, as the only one;
    the selection record). None: every candidate runs on the whole log.

    A candidate's passes do not depend on the others', so the chosen one then fits the whole log as it would
    among all of them: only the choice is made on the sample. Why a query sample: a pair's impressions all
    lie in its query's block, so the sample's pairs are counted as in the whole log and a strength shrinks
    them alike; the grid's cost stays fixed while the log grows.
    """
    model, log = ctx.model, ctx.log
    if ctx.opts.select_serps is None or len(cands) < 2 or len(packed.groups) != 1:
        return None
    sample = sample_of(packed, ctx.opts.select_serps)
    if sample is None:
        return None
    [group] = sample.groups
    log.debug("%s: %d candidates compete on %d of %d blocks (%d training, %d held-out SERPs)", model.name,
              len(cands), group.n_blocks, packed.groups[0].n_blocks, group.n_serps, group.n_held_out)
    passes = None
    try:
        passes = ctx.engine(sample, shared=len(cands))
        _run(sample, ctx, cands, passes, "sample", go_on=False)
        passes.end()   # the stage ends as a fit's does, not cancelled (its tasks would log a lost socket)
    finally:
        if passes is not None:
            passes.close()
    mine, slot = chosen_slot(cands, 0)
    selection = grid_selection(cands, mine, slot, grids[0], group.n_held_out, model, log)
    selection["sample"] = {"blocks": group.n_blocks, "of_blocks": packed.groups[0].n_blocks,
                           "train_serps": group.n_serps, "valid_serps": group.n_held_out}
    fresh = replace(_candidates(packed, ctx)[1][mine[slot]], competes=False)
    _set_start(fresh, ctx.pooled)
    return [fresh], selection


def _set_start(c: Candidate, pooled: bool) -> None:
    """Before the first pass: pooled prior means are fixed after the warm-up; fixed ones have no prior term
    at iteration 0."""
    c.compare_from = None if pooled else 1 if any(f.k > 0 for f in c.prior.qd.values()) else 0


