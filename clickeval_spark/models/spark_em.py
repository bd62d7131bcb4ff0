"""Distributed EM (and one-pass counting MLE) for click models on Spark.

The equations live in the numpy kernels (`clickeval_spark.models.base.ClickModel`);
this module and `clickeval_spark.models.blocks` only move arrays in and sums out:

1. `pack_serps`: the training SERPs are cut to ``max_rank`` ranks and packed once
   into query blocks (`blocks.pack_log`): every SERP of a query in the same block,
   clicks and block-local (query, doc) indices as numpy arrays in one binary row
   per block. The fit stage packs once and fits every model on the same blocks.
2. Every EM pass is one narrow Spark stage over the blocks (`blocks.run_iteration`):
   each task runs the kernel's ``expected_stats`` over its block, re-estimates
   the block's own qd parameters (num / den per pair: all impressions of a pair
   are in its block, so this needs no shuffle) and returns the block's global
   sums. The driver adds those up in block order (a few hundred numbers: per-rank
   / global sums, the LL sum, the SERP count, the pooled qd sums) and passes the
   new global parameters to the next pass.
3. At the end the qd parameters are unpacked into a DataFrame (`blocks.qd_table`,
   checkpointed: `blocks.checkpointed`): per-query state never goes through the driver.

The result is a `clickeval_spark.models.fitted.FittedModel`; predict and the sampler
bring its parameters to the SERPs they score with `clickeval_spark.models.attach`.
`fit_groups` fits several independent logs packed side by side (`blocks.pack_log`'s
groups: the surrogate stage's real log and every generator variant) in the same
passes, one FittedModel each.

Estimator: maximum a posteriori (models/priors.py). Every M-step is the
posterior mode (num + k m) / (den + k) of its family's Beta prior; the qd
M-step of pass t runs at the start of pass t + 1, where the pooled mean m of
the whole log's pass-t sums is known. With ``k: auto`` one candidate fit per
strength of the grid, plus one whose families take their empirical Bayes
strengths (`_eb_update`), each once per ``seen_means`` variant, runs in the same
passes (each task runs one E-step per candidate: one Spark job per pass whatever
the grid), the held-out SERPs packed beside the training ones are scored in every
pass of the warm-up (below) and in the final one, and the candidate with the best
held-out LL per position after the final pass is the fit. Pooled per-rank global
families (UBM's examination cells) take their empirical Bayes strength in every
candidate. Without held-out SERPs the auto strength is ``priors.DEFAULT_K``.

Pooled means are hyperparameters, estimated during a warm-up: m follows the
fit's pooled estimate while the candidate's held-out LL improves (at most
``prior_warmup`` passes, the whole rule without held-out SERPs) and is then
fixed. A pooled m that kept following the fit would slide along the ridge where
examination and attractiveness trade scale (PBM, UBM): the log posterior would
never settle and held-out LL would fall again with more passes. With m fixed
the log posterior is one objective, which EM never decreases, and ``tol``
compares it from the first pass after the freeze.

Unseen pairs: every qd family's m (the pooled estimate for beta and none,
0.5 for pyclick), recorded as ``prior[p]`` (their relevance), and with
``rank_means`` its pooled estimate at each rank, ``prior_by_rank[p]``: `predict_clicks`
and `sample_serps` use that for every (query, doc) pair absent from the qd table. ``n_obs`` counts a
pair's training impressions at ranks <= max_rank. With k = 0 (the plain MLE) a
parameter whose denominator is 0 keeps its previous value, as in PyClick.

History: ``history`` holds ``(iteration, train_ll, seconds)`` where
``train_ll`` is the MEAN PER-SERP log-likelihood (natural log, sum over the
SERP's ranks of log P(C_r = c_r | clicks above), probabilities clipped to
[1e-6, 1 - 1e-6]) of the training log under the parameters that iteration
produced, and ``seconds`` the wall time of that iteration's pass. Iteration 0 is
the starting point (every parameter 0.5, 0 seconds). The LL of iteration i's
parameters is computed by the next pass; one extra scoring pass after the loop
evaluates the final parameters. ``log_posterior`` adds the Beta log densities
(k m ln v + k (1 - m) ln(1 - v) per parameter with a prior) to each LL. With
``tol`` a candidate stops after the pass whose input log posterior per SERP
differs from the previous one by less than ``tol``, both under the same prior
(from iteration 1 on with fixed means: iteration 0 has no prior term; after the
warm-up with pooled ones); the parameters that pass produced are kept.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from clickeval_spark.models import ENGINES
from clickeval_spark.models.attach import truncate_serps
from clickeval_spark.models.base import INIT_VALUE, ClickModel
from clickeval_spark.models.blocks import (PackedLog, PassPlan, checkpointed, global_params, pack_log, qd_table,
                                           release, run_iteration)
from clickeval_spark.models.fitted import FittedModel
from clickeval_spark.models.resident import EngineLost, ResidentPasses, cluster_slots
from clickeval_spark.models.priors import (DEFAULT_K, DEFAULT_K_GRID, DEFAULT_WARMUP, EB_GRID, ModelPrior, eb_strength,
                                           log_prior, model_prior, pooled_mean, pooled_rank_mean, pooled_rank_means)

_log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------
# the driver
# ---------------------------------------------------------------------------

def pack_serps(serps: DataFrame, max_rank: int = 10, block_serps: int | None = None,
               held_out: DataFrame | None = None) -> PackedLog:
    """The training SERPs (`truncate_serps`'s rule) packed into query blocks, once for any number of fits.

    ``held_out`` SERPs (the valid split) ride along in the same blocks: every fit
    scores them at no extra Spark job, which is how `k: auto` picks a prior strength.
    """
    prep = truncate_serps(serps, max_rank).withColumn("held_out", F.lit(False))
    if held_out is not None:
        prep = prep.unionByName(truncate_serps(held_out, max_rank)
                                .withColumn("held_out", F.lit(True)))
    return pack_log(prep, max_rank, block_serps)


@dataclass
class _Candidate:
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
    choice: float | str | None = None   # the grid entry this candidate stands for (a strength, or "eb")

    @property
    def label(self) -> str:
        ks = sorted({f.k for f in self.prior.qd.values()})
        text = "eb" if self.choice == "eb" else "k=" + ",".join(f"{k:g}" for k in ks) if ks else "-"
        text += " seen->rank" if self.prior.seen_by_rank else ""
        return (f"group {self.group} " if self.group else "") + text

    @property
    def means_text(self) -> str:
        """The qd families' current prior means, for the fit's log."""
        return " ".join(f"{p}={m:.4f}" for p, m in self.unseen.items())


def _qd_update(cand: _Candidate, model: ClickModel, sums: dict[str, np.ndarray], frozen: bool, M: int) -> None:
    """The next pass's qd M-step: (k, m, m by rank) per family, m pooled from these sums where not fixed
    (or, once ``frozen``, the pooled means the warm-up ended with). m by rank is what a pair unseen in
    training takes at each rank: its rank's pooled mean with ``rank_means``, else m."""
    params = model.qd_params
    k, m = cand.prior.qd_arrays(params)
    fixed = ~np.isnan(m)
    if frozen and cand.update is not None:
        pooled, by_rank = cand.update[1], cand.update[2]
    else:
        pooled = np.where(fixed, m, [pooled_mean(*sums[f"pool_{p}"]) for p in params])
        by_rank = np.broadcast_to(pooled[:, None], (len(params), M)).copy()
        if cand.prior.rank_means:
            for j, p in enumerate(params):
                if not fixed[j]:
                    by_rank[j] = pooled_rank_mean(sums[f"rank_{p}"], pooled[j])
    cand.update = (k, pooled, by_rank)
    cand.unseen = {p: float(pooled[j]) for j, p in enumerate(params)}
    cand.unseen_by_rank = {p: by_rank[j].tolist() for j, p in enumerate(params)}


def _candidate_prior(prior: ModelPrior, k: float | str | None) -> ModelPrior:
    """The prior of the candidate for grid entry ``k``: "eb", every auto family's strength by empirical Bayes;
    a number, that strength for the qd families, and empirical Bayes for the pooled global ones (UBM's
    examination cells: a few dozen cells with thousands of impressions each, whose own strength need not
    be the attractiveness's); None, ``prior`` as it is."""
    if k is None:
        return prior
    if k == "eb":
        return prior.with_eb()
    return replace(prior.with_k(k), eb=tuple(f for f in prior.auto if f in prior.glob))


def _eb_update(cand: _Candidate, model: ClickModel, M: int, sums: dict[str, np.ndarray]) -> None:
    """An empirical Bayes candidate's strengths from this pass's counts: each qd family's from its pairs'
    evidence (summed by the blocks), each pooled global family's from its cells around their rank's mean."""
    ks = {}
    for p in cand.prior.eb:
        if p in model.qd_params:
            evidence = sums[f"eb_{p}"]
        else:   # a per-rank global family of several cells per rank (UBM's gamma): a few dozen cells
            from clickeval_spark.models.compiled import beta_binomial_evidence

            shape = model.global_shapes(M)[p]
            size = int(np.prod(shape))
            num, den = sums[p][:size].reshape(shape), sums[p][size:].reshape(shape)
            m = np.broadcast_to(pooled_rank_means(num, den), shape)
            evidence = np.zeros(len(EB_GRID))
            beta_binomial_evidence(num.ravel(), den.ravel(), np.ascontiguousarray(m).ravel(), np.asarray(EB_GRID),
                                   evidence)
        k = eb_strength(evidence)
        if k is not None:
            ks[p] = k
    cand.prior = replace(cand.prior.with_strengths(ks), eb=cand.prior.eb)


def fit(serps: DataFrame | PackedLog, model: ClickModel, *, iterations: int = 20, tol: float | None = None,
        max_rank: int = 10, prior: ModelPrior | None = None, k_grid: Sequence[float] = DEFAULT_K_GRID,
        prior_warmup: int = DEFAULT_WARMUP, logger: logging.Logger | None = None,
        checkpoint_interval: int = 10, engine: str = "auto") -> FittedModel:
    """Fit ``model`` on canonical ``serps`` rows (every row is training data) or an already packed log.

    Ranks beyond ``max_rank`` are ignored (a packed log keeps its own);
    shorter lists are masked. All parameters start at ``INIT_VALUE``;
    ``model.iterative`` False means one counting pass. ``prior`` (default:
    `priors.model_prior`'s beta prior with ``k: auto``) makes every M-step a
    posterior mode; its auto families get one candidate fit per strength in
    ``k_grid`` when the packed log holds held-out SERPs, all in the same passes,
    and the best valid LL wins (else `priors.DEFAULT_K`). See the module
    docstring for the history, the stopping rule and unseen pairs.

    Every ``checkpoint_interval``-th pass's blocks are checkpointed (as ALS's
    ``checkpointInterval``): with a checkpoint directory on the SparkContext to
    reliable storage, so a lost executor's cached blocks are recomputed from the
    last checkpoint, not from pass 1; without one locally, which at least cuts
    the lineage that grows by one stage per pass.
    """
    packed = serps if isinstance(serps, PackedLog) else pack_serps(serps, max_rank)
    try:
        [fitted] = fit_groups(packed, model, iterations=iterations, tol=tol, prior=prior, k_grid=k_grid,
                              prior_warmup=prior_warmup, logger=logger, checkpoint_interval=checkpoint_interval,
                              engine=engine)
    finally:
        if packed is not serps:
            packed.unpersist()
    return fitted


def fit_groups(packed: PackedLog, model: ClickModel, *, iterations: int = 20, tol: float | None = None,
               prior: ModelPrior | None = None, k_grid: Sequence[float] = DEFAULT_K_GRID,
               prior_warmup: int = DEFAULT_WARMUP, logger: logging.Logger | None = None,
               checkpoint_interval: int = 10, select_on_held_out: bool = True,
               ppl_eps: float | None = None, engine: str = "auto") -> list[FittedModel]:
    """`fit` of every group of ``packed`` (`blocks.BlockGroup`), all in the same passes: one FittedModel per
    group, each the fit its group's SERPs would get alone.

    ``select_on_held_out`` False: the held-out SERPs are only scored, never used to pick a prior
    strength or to end the warm-up (the surrogate stage packs the real SERPs beside every
    generator's sequences to score them). ``ppl_eps``: the final pass also sums their perplexity
    terms (`FittedModel.held_out_ppl`).

    ``engine`` (`ENGINES`): how the passes run. "stages": one Spark job per pass (`blocks.run_iteration`),
    checkpointed every ``checkpoint_interval`` passes. "resident": every pass in one barrier stage whose
    tasks keep the blocks (`resident.ResidentPasses`); the same sums bit for bit, without a job per pass;
    if that stage is lost the fit starts again with "stages". "auto": resident for an iterative model
    when the cluster has slots for it (no dynamic allocation), else stages.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if iterations < 1:
        raise ValueError("iterations must be >= 1")
    if checkpoint_interval < 1:
        raise ValueError("checkpoint_interval must be >= 1")
    if prior_warmup < 1:
        raise ValueError("prior_warmup must be >= 1")
    log = logger or _log
    for g, group in enumerate(packed.groups):
        if group.n_serps == 0:
            raise ValueError("fit: no SERP with a query_id and a non-empty doc list"
                             + (f" in group {g}" if len(packed.groups) > 1 else ""))
    options = dict(iterations=iterations, tol=tol, prior=prior, k_grid=k_grid, prior_warmup=prior_warmup, log=log,
                   checkpoint_interval=checkpoint_interval, select_on_held_out=select_on_held_out, ppl_eps=ppl_eps)
    tasks = _resident_tasks(packed, model, engine)
    if tasks:
        try:
            return _fit_groups(packed, model, resident_tasks=tasks, **options)
        except EngineLost as e:
            log.warning("%s: the resident EM stage was lost (%s); fitting again with one Spark stage per pass",
                        model.name, e)
    return _fit_groups(packed, model, resident_tasks=0, **options)


def _resident_tasks(packed: PackedLog, model: ClickModel, engine: str) -> int:
    """Tasks of the resident stage (0: the stage engine): one per block, at most one per slot."""
    if engine == "stages" or (engine == "auto" and not model.iterative):
        return 0
    tasks = min(packed.n_blocks, cluster_slots(packed.blocks))
    if engine == "resident" and tasks < 1:
        raise ValueError("engine 'resident': the cluster has no slot for a barrier stage (dynamic allocation?)")
    return tasks


def _fit_groups(packed: PackedLog, model: ClickModel, *, iterations: int, tol: float | None, prior: ModelPrior | None,
                k_grid: Sequence[float], prior_warmup: int, log: logging.Logger, checkpoint_interval: int,
                select_on_held_out: bool, ppl_eps: float | None, resident_tasks: int) -> list[FittedModel]:
    M = packed.max_rank
    prior = prior or model_prior(model, M)
    init = {k: np.asarray(v, dtype=np.float64) for k, v in model.init_global(M).items()}
    grids, cands = [], []
    for g, group in enumerate(packed.groups):
        selecting = prior.auto and group.n_held_out and select_on_held_out
        # the valid split decides between the shared strengths of the grid and empirical Bayes, and between
        # the seen pairs' prior means
        variants = prior.seen_means if selecting else prior.seen_means[:1]
        grid = [(k, v) for v in variants for k in ([*k_grid, "eb"] if selecting else [DEFAULT_K])]
        grids.append(grid)
        cands += [_Candidate(prior=replace(_candidate_prior(prior, k), seen_means=(v,)), g=dict(init), group=g,
                             choice=k, unseen={q: INIT_VALUE for q in model.qd_params})
                  for k, v in (grid if prior.auto else [(None, variants[0])])]
    # a counting model's empirical Bayes strengths need the pooled means of a first pass: one more
    passes = iterations if model.iterative else 2 if any(c.prior.eb for c in cands) else 1
    # pooled prior means are fixed after the warm-up (module docstring); fixed ones have no prior term at iteration 0
    pooled = any(f.k > 0 and f.m is None for c in cands for f in (*c.prior.qd.values(), *c.prior.glob.values()))
    for c in cands:
        c.compare_from = None if pooled else 1 if any(f.k > 0 for f in c.prior.qd.values()) else 0

    def record(c: _Candidate, it: int, sums: dict[str, np.ndarray], secs: float) -> None:
        n = packed.groups[c.group].n_serps
        ll = float(sums["ll"][0]) / n
        lp_glob = sum(log_prior(c.g[name], f.k, c.g_means[name]) for name, f in c.prior.glob.items()
                      if f.k > 0 and name in c.g_means)
        c.history.append((it, ll, secs))
        c.posterior.append((float(sums["ll"][0]) + float(sums["lp"][0]) + lp_glob) / n)
        scored = sums["n_valid"][0] > 0   # held-out SERPs scored in this pass
        if select_on_held_out and scored:
            c.valid_ll = float(sums["ll_valid"][0] / sums["n_valid"][0])
        log.info("%s %s iteration %d: train LL %.6f per SERP, log posterior %.6f, valid LL %s per position, "
                 "prior m %s, %.2f s", model.name, c.label, it, ll, c.posterior[-1],
                 f"{c.valid_ll:.6f}" if scored and select_on_held_out else "-", c.means_text, secs)

    def drop(old: DataFrame) -> None:   # a pass's blocks, never the packed log's
        if old is not packed.blocks:
            release(old)

    def one_pass(plans: list[PassPlan]) -> list[dict[str, np.ndarray] | None]:
        nonlocal blocks
        if engine is not None:
            return engine.run(plans)
        new_blocks, all_sums = run_iteration(blocks, model, plans, M, packed.first_blocks)
        drop(blocks)
        blocks = new_blocks
        return all_sums

    blocks, engine = packed.blocks, None
    try:
        if resident_tasks:
            t0 = time.perf_counter()
            engine = ResidentPasses(packed.blocks, model, M, packed.first_blocks, resident_tasks)
            log.info("%s resident EM stage: %d tasks up in %.2f s", model.name, engine.n_tasks,
                     time.perf_counter() - t0)
        for it in range(1, passes + 1):
            t0 = time.perf_counter()
            # the held-out LL is read only while it may end a candidate's warm-up (and after the last pass)
            all_sums = one_pass([PassPlan("step" if c.active else "hold", c.g, c.update, c.group,
                                          held_out=select_on_held_out and c.compare_from is None,
                                          eb=bool(c.prior.eb) and c.compare_from is None,
                                          seen_by_rank=c.prior.seen_by_rank) for c in cands])
            secs = time.perf_counter() - t0
            for c, sums in zip(cands, all_sums):
                if sums is None:
                    continue
                valid_before = c.valid_ll
                record(c, it - 1, sums, c.pending_secs)
                post = c.posterior
                converged = (tol is not None and c.compare_from is not None
                             and len(post) >= 2 + c.compare_from and abs(post[-1] - post[-2]) < tol)
                if c.compare_from is None and (it > prior_warmup or c.valid_ll < valid_before):
                    # this pass's update reuses the m that produced the parameters just scored
                    c.compare_from = len(post) - 1
                    log.info("%s %s prior means fixed after pass %d: %s", model.name, c.label, it - 1,
                             c.means_text)
                if c.prior.eb and c.compare_from is None:   # strengths are fixed with the means
                    _eb_update(c, model, M, sums)
                frozen = c.compare_from is not None and pooled
                c.g, c.g_means = global_params(model, M, sums, c.g, c.prior.glob,
                                               c.g_means if frozen else None)
                _qd_update(c, model, sums, frozen, M)
                c.done, c.pending_secs = it, secs
                if converged:
                    log.info("%s %s converged: |d log posterior| < %g per SERP", model.name, c.label, tol)
                    c.active = False
                elif not model.iterative and not c.prior.eb:   # counted; only eb candidates count again
                    c.active = False
            if not any(c.active for c in cands):
                break
            if engine is None and it % checkpoint_interval == 0 and it < passes:
                # past ~80 passes the growing lineage overflows the JVM stack when a task is serialised
                t0 = time.perf_counter()
                blocks = checkpointed(blocks)
                log.info("%s pass %d checkpointed: %.2f s", model.name, it, time.perf_counter() - t0)
        t0 = time.perf_counter()
        final = one_pass([PassPlan("score", c.g, c.update, c.group, ppl_eps, seen_by_rank=c.prior.seen_by_rank)
                          for c in cands])
        if engine is not None:
            blocks = engine.finish()
        log.info("%s final pass: %.2f s", model.name, time.perf_counter() - t0)
        for c, sums in zip(cands, final):
            record(c, c.done, sums, c.pending_secs)
        # per group: the candidate with the best valid LL (the first when there is one), and its state slot
        chosen = []
        for g in range(len(packed.groups)):
            mine = [i for i, c in enumerate(cands) if c.group == g]
            slot = max(range(len(mine)), key=lambda j: (cands[mine[j]].valid_ll if len(mine) > 1 else 0.0, -j))
            chosen.append((mine, slot))
        if model.qd_params:
            qd_all = checkpointed(qd_table(blocks, packed.blocks, model, tuple(slot for _, slot in chosen),
                                             packed.first_blocks))
        else:
            qd_all = packed.blocks.sparkSession.createDataFrame(
                [], "group int, query_id string, doc_id string, n_obs double")
    finally:
        if engine is not None:
            engine.close()
        drop(blocks)
    out = []
    for g, (mine, slot) in enumerate(chosen):
        best, grid = cands[mine[slot]], grids[g]
        selection = None
        if len(mine) > 1:
            selection = {"grid": [{"k": k, "seen_means": v, "valid_ll": cands[i].valid_ll,
                                   "iterations": cands[i].done,
                                   **({"strengths": _strengths(cands[i].prior)} if k == "eb" else {})}
                                  for (k, v), i in zip(grid, mine)],
                         "chosen_k": grid[slot][0], "chosen_seen_means": grid[slot][1],
                         "n_valid_serps": packed.groups[g].n_held_out}
            log.info("%s prior strength by valid LL per position: %s -> %s", model.name,
                     ", ".join(f"{cands[i].label}: {cands[i].valid_ll:.6f}" for i in mine), cands[mine[slot]].label)
        qd = qd_all if len(packed.groups) == 1 else qd_all.where(F.col("group") == g)
        out.append(_fitted(model, M, best, prior, qd.drop("group"), selection,
                           (final[mine[slot]]["ppl_n"], final[mine[slot]]["ppl_ln"]) if ppl_eps is not None else None))
    return out


def _strengths(prior: ModelPrior) -> dict[str, float]:
    """The empirical Bayes strength of each family of an eb candidate."""
    fams = {**prior.qd, **prior.glob}
    return {p: fams[p].k for p in prior.eb}


def _fitted(model: ClickModel, M: int, chosen: _Candidate, prior: ModelPrior, qd: DataFrame, selection: dict | None,
            held_out_ppl: tuple[np.ndarray, np.ndarray] | None) -> FittedModel:
    spec = {"kind": prior.kind, "strengths": "eb" if chosen.choice == "eb" else "grid" if prior.auto else "fixed",
            "seen_means": chosen.prior.seen_means[0],
            "families": {**{p: {"k": f.k, "m": chosen.unseen[p], "pooled": f.m is None,
                                "m_by_rank": chosen.unseen_by_rank.get(p)}
                            for p, f in chosen.prior.qd.items()},
                         **{name: {"k": f.k, "m": chosen.g_means[name].ravel().tolist() if f.m is None else f.m,
                                   "pooled": f.m is None}
                            for name, f in chosen.prior.glob.items() if f.k > 0}}}
    return FittedModel(model=model, max_rank=M, qd=qd, glob=chosen.g, prior=dict(chosen.unseen),
                       prior_by_rank=dict(chosen.unseen_by_rank),
                       history=chosen.history, prior_spec=spec, selection=selection,
                       log_posterior=chosen.posterior,
                       valid_ll=None if math.isnan(chosen.valid_ll) else chosen.valid_ll,
                       held_out_ppl=held_out_ppl)
