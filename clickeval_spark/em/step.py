"""The block step: one EM pass of one candidate over one block, and both M-steps, on numpy arrays alone.

`em_block` runs the qd M-step the driver planned (posterior modes of the block's own pairs: all of a
pair's impressions are in its block), the LL and a new E-step; `global_params` is the M-step of the
global parameters from the whole log's sums; `qd_prior_means` the pooled prior means the next qd
M-step shrinks toward. The equations are the kernels' (`models.base.ClickModel`); every EM model with a
compiled pass (`compiled_pass`) runs it instead of the numpy kernels by default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from clickeval_spark.em.codec import decode_data
from clickeval_spark.em.extrapolation import extrapolated
from clickeval_spark.em.passes import PassMode, PassPlan
from clickeval_spark.models.base import INIT_VALUE, LL_EPS, ClickModel, binned_sums
from clickeval_spark.models.ccm import CCM
from clickeval_spark.models.dbn import DBN
from clickeval_spark.models.dcm import DCM
from clickeval_spark.models.sdbn import SDBN
from clickeval_spark.models.priors import (EB_GRID, FamilyPrior, ModelPrior, log_prior, pooled_mean, pooled_rank_mean,
                                           pooled_rank_means, posterior_mode, ratio_or)

#: SERPs per E-step slice inside a task: keeps the kernels' (slice, M) temporaries in cache
SLICE_ROWS = 16384
#: the cascade models, by exact class (a subclass may change the maths), and their kernel in
#: `compiled_chain.chain_pass` when they are fitted by EM
_CHAIN_PASSES = {DBN: "dbn", CCM: "ccm", DCM: "dcm", SDBN: "sdbn"}


def compiled_pass(model: ClickModel) -> str | None:
    """The compiled pass `em_block` runs for an EM model by default: "examination" (``examination_cells``:
    `compiled.examination_pass`), a cascade model's `compiled_chain.chain_pass` kernel, or None (numpy; every
    counting model: its one pass is not an E-step)."""
    if not model.iterative:
        return None
    return "examination" if model.examination_cells else _CHAIN_PASSES.get(type(model))


def stats_layout(model: ClickModel, M: int) -> list[tuple[str, int]]:
    """(name, length) of the sections of one candidate's stats vector, in order.

    ll: summed per-SERP log-likelihood of the training SERPs under the pass's
    parameters; n: their count; ll_valid / n_valid: summed log-likelihood and
    position count of the held-out (valid) SERPs; lp: log prior density of the
    block's qd values; n_pos: the training SERPs' positions (the stopping rule's
    per-position scale, `candidates.remaining_gain`); ppl_n / ppl_ln: per rank, the held-out SERPs reaching it and
    their summed ln P(observed click) under the unconditional click probability
    (perplexity's terms; only in a pass given ``ppl_eps``); pool_<p>: pooled
    (num, den) of qd parameter p; rank_<p>: the same by rank (num..., den...: the
    rank-aware prior means); eb_<p>: p's Beta-binomial log evidence per strength of
    `priors.EB_GRID` (only in a pass asked for it); <global>: (num..., den...) of each global
    parameter, flattened; accel: a `PassMode.NORM` pass's squared norms of the kept points' first and second
    differences (`extrapolation.extrapolated`; 0 in any other pass).
    """
    layout = [("ll", 1), ("n", 1), ("ll_valid", 1), ("n_valid", 1), ("lp", 1), ("n_pos", 1),
              ("ppl_n", M), ("ppl_ln", M)]
    layout += [(f"pool_{p}", 2) for p in model.qd_params]
    layout += [(f"rank_{p}", 2 * M) for p in model.qd_params]
    layout += [(f"eb_{p}", len(EB_GRID)) for p in model.qd_params]
    layout += [(name, 2 * int(np.prod(shape))) for name, shape in sorted(model.global_shapes(M).items())]
    return layout + [("accel", 2)]


@dataclass(frozen=True)
class BlockArrays:
    """One block's rows as `em_block` reads them, with what every pass derives from the rows alone.

    The resident engine builds each of its blocks' once per fit (its tasks keep their blocks between
    passes); the stage engine once per pass. Beside the 54 bytes of a packed row (M = 10) it holds
    about 50 more (mask and bins), and a kernel's `row_constants` (UBM: 10). Indices are int32, not intp: a
    fit's blocks are held whole, and every byte of them is memory a worker takes from the machine.
    """

    clicks: np.ndarray     # int8 (B, M)
    pair: np.ndarray       # int32 (B, M): the block-local pair index, -1 = no rank
    n_pairs: int
    n_train: int           # the first n_train rows are training rows, the rest held out
    weight: np.ndarray     # float64 (B,): how many identical SERPs each row stands for
    mask: np.ndarray       # bool (B, M): the rank exists
    #: int32 (B, M): the pair; n_pairs (the spare bin of `base.binned_sums`) where masked; a held-out rank
    #: whose pair has no training impression reads its rank's prior mean, in bin n_pairs + 1 + rank
    bins: np.ndarray
    impressions: np.ndarray   # float64 (n_pairs,): the pair's training impressions, weighted
    rank_impressions: np.ndarray   # float64 (M,): the training impressions at each rank, weighted
    n_valid: float         # positions of the held-out rows, weighted
    const: Mapping[str, np.ndarray]   # the model's `row_constants`
    #: `pair_means` by the rank means asked for: [value, asked for in this pass]
    _kept_pair_means: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, model: ClickModel, clicks: np.ndarray, pair: np.ndarray, n_pairs: int, n_train: int | None = None,
           weight: np.ndarray | None = None) -> "BlockArrays":
        B = clicks.shape[0]
        n_train = B if n_train is None else int(n_train)
        weight = np.ones(B) if weight is None else np.asarray(weight, dtype=np.float64)
        # built in place, without (B, M) temporaries: every byte of them is memory a worker takes fresh
        mask = pair >= 0
        bins = pair.astype(np.int32)   # int32, not intp: 40 bytes a row less to hold
        bins[~mask] = n_pairs
        impressions = _pair_sums(bins, weight, np.ones((1, clicks.shape[1])), n_train, n_pairs)[0]
        # whole weights: exact in any order
        rank_impressions = np.array([weight[:n_train][mask[:n_train, r]].sum() for r in range(clicks.shape[1])])
        held = bins[n_train:]   # a view
        unseen = held < n_pairs
        if n_pairs:
            unseen &= impressions[np.where(unseen, held, 0)] == 0
        held[unseen] = n_pairs + 1 + np.nonzero(unseen)[1]
        return cls(clicks, pair, int(n_pairs), n_train, weight, mask, bins, impressions=impressions,
                   rank_impressions=rank_impressions,
                   n_valid=float(weight[n_train:] @ mask[n_train:].sum(axis=1)),
                   const=model.row_constants(clicks, mask))

    @classmethod
    def decoded(cls, model: ClickModel, buf) -> "BlockArrays":
        """From an `encode_data` buffer (the arrays are views of it: keep it alive)."""
        clicks, pair, weight, n_pairs, n_train = decode_data(buf)
        return cls.of(model, clicks, pair, n_pairs, n_train, weight)

    def pair_means(self, by_rank: np.ndarray) -> np.ndarray:
        """`_pair_means` of ``by_rank`` (read-only), kept for the passes after while it is asked for: a
        candidate's rank means stay fixed after its warm-up, and the resident engine keeps its blocks
        between passes, so each pass after saves a sum over every training row of the block per candidate."""
        key = np.asarray(by_rank, dtype=np.float64).tobytes()
        entry = self._kept_pair_means.get(key)
        if entry is None:
            value = _pair_means(self, by_rank)
            value.flags.writeable = False
            entry = self._kept_pair_means[key] = [value, True]
        entry[1] = True
        return entry[0]

    def end_pass(self) -> None:
        """Forget the pair means no candidate asked for in the pass that ends (their candidate moved on
        or stopped): at most one per candidate is kept."""
        for key in [k for k, (_, asked) in self._kept_pair_means.items() if not asked]:
            del self._kept_pair_means[key]
        for entry in self._kept_pair_means.values():
            entry[1] = False


def em_block(model: ClickModel, block: BlockArrays, state: np.ndarray | None, plan: PassPlan, *,
             slice_rows: int = SLICE_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """One EM pass of one candidate over a block, as its ``plan`` says: the qd M-step of the last E-step,
    then the LL and (`PassMode.STEP`) a new E-step; `PassMode.SCORE` estimates nothing new.

    ``state`` is float64 (3, P, n_pairs): the pairs' current values, and the
    num / den of the last E-step (None: the start, every value ``INIT_VALUE``).
    ``plan.g`` holds the global parameters. ``plan.update`` = (k, m), each (P,), applies that M-step first
    as a posterior mode (`priors.posterior_mode`; m is the pooled mean the driver computed from every
    block's sums); None leaves the values as they are. The M-step is deferred to
    the next pass because m needs the whole log's sums. Pairs without a training
    impression (seen only in held-out SERPs) get m; or, with a third entry m_rank (P, M),
    the prior mean of the rank they are shown at. ``plan.seen_by_rank``: a pair with training
    impressions is shrunk toward the impression-weighted mean of its ranks' m_rank instead of m.

    Row b stands for ``weight[b]`` identical SERPs (`fold_rows`); every sum counts
    it that many times. The first ``n_train`` rows are training data: they give the
    E-step's sums and the training LL. The rest are held out (the valid split):
    scored only, unless ``plan.held_out`` is False (their sums, n_valid included, are then 0);
    with ``plan.ppl_eps`` also by unconditional click probability per rank,
    clipped to [ppl_eps, 1 - ppl_eps] (perplexity, DESIGN §5). ``plan.compiled`` (None: whether the model
    has a `compiled_pass`): the LL and the E-step by that compiled pass over the whole block, instead of the
    numpy kernels ``slice_rows`` SERPs at a time (the perplexity terms stay numpy's); True for an EM model
    without one is an error (a counting model's one pass is numpy's either way). ``plan.eb``: also the
    Beta-binomial evidence of the new E-step's counts of the pairs, under the m of ``plan.update``
    (empirical Bayes strengths).
    Returns (new state, stats vector in `stats_layout` order).
    """
    if plan.mode == PassMode.HOLD:
        raise ValueError("em_block: a held candidate runs no pass (its state is kept as it is)")
    g, update, held_out, ppl_eps = plan.g, plan.update, plan.held_out, plan.ppl_eps
    estep = plan.mode == PassMode.STEP
    clicks, mask, spare, weight, n_train, n_pairs = (block.clicks, block.mask, block.bins, block.weight,
                                                     block.n_train, block.n_pairs)
    B, M = clicks.shape
    params = model.qd_params
    P = len(params)
    shapes = dict(sorted(model.global_shapes(M).items()))
    if state is None:
        values, num_prev, den_prev = np.full((P, n_pairs), INIT_VALUE), np.zeros((P, n_pairs)), np.zeros((P, n_pairs))
    else:
        values, num_prev, den_prev = state[0], state[1], state[2]
    # the points an extrapolation keeps (`acceleration`): rows 3-5 of a state that has them
    kept = state[3:] if state is not None and len(state) == 6 else np.zeros((3, P, n_pairs))
    if (plan.extrapolate is not None or plan.restore) and (state is None or len(state) != 6):
        raise ValueError("em_block: an extrapolation needs the points a cycle kept, and the state has none")
    lp = 0.0
    unseen = np.full((P, M), INIT_VALUE)
    if update is not None and P:
        k, m = (np.asarray(a, dtype=np.float64)[:, None] for a in update[:2])
        seen = block.impressions > 0
        unseen = np.asarray(update[2], dtype=np.float64) if len(update) > 2 else np.broadcast_to(m, (P, M))
        m_pair = block.pair_means(unseen) if plan.seen_by_rank else np.broadcast_to(m, (P, n_pairs))
        if plan.restore:
            values = kept[2].copy()
        elif plan.extrapolate is not None:
            values = extrapolated(kept[0], kept[1], kept[2], plan.extrapolate)
        else:
            values = np.where(seen[None, :], posterior_mode(num_prev, den_prev, values, k, m_pair), m)
        lp = log_prior(values[:, seen], k, m_pair[:, seen])
    if plan.mode == PassMode.NORM:   # the third point, and what the step length is made of
        kept = np.stack([kept[0], kept[1], values])
        r, v = kept[1] - kept[0], kept[2] - 2 * kept[1] + kept[0]
        parts = np.zeros(sum(n for _, n in stats_layout(model, M)))
        parts[-2:] = float(np.sum(r * r)), float(np.sum(v * v))
        return np.concatenate([np.stack([values, num_prev, den_prev]), kept]), parts
    if plan.keep is not None:
        kept = kept.copy()
        kept[plan.keep] = values
    # each pair's value; in the spare bin one a masked rank reads (kernels ignore masked ranks); then the
    # values of held-out ranks whose pair has no training impression, by rank (`BlockArrays.bins`)
    padded = np.concatenate([values, np.full((P, 1), INIT_VALUE), unseen], axis=1)
    qd_num = np.zeros((P, n_pairs))
    qd_den = np.zeros((P, n_pairs))
    rank_num, rank_den = np.zeros((P, M)), np.zeros((P, M))
    g_num = {k_: np.zeros(s) for k_, s in shapes.items()}
    g_den = {k_: np.zeros(s) for k_, s in shapes.items()}
    ll = ll_valid = 0.0
    ppl_n, ppl_ln = np.zeros(M), np.zeros(M)
    # training slices, then held-out slices: a slice never mixes the two
    train = [(lo, min(lo + slice_rows, n_train)) for lo in range(0, n_train, slice_rows)]
    valid = [(lo, min(lo + slice_rows, B)) for lo in range(n_train, B, slice_rows)] if held_out else []

    def slice_of(lo, hi):
        qd = {p: padded[j][spare[lo:hi]] for j, p in enumerate(params)}
        return qd, clicks[lo:hi], mask[lo:hi], weight[lo:hi], {k_: v[lo:hi] for k_, v in block.const.items()} or None

    steps = train if estep else []               # slices the numpy E-step runs on
    scored = ([] if estep else train) + valid   # slices only scored
    kernel = compiled_pass(model) if plan.compiled is not False else None
    if plan.compiled and kernel is None and model.iterative:
        raise ValueError(f"{model.name} has no compiled pass")
    if kernel == "examination":
        ll, ll_valid = _examination_pass(g, block, padded[0], estep, held_out, qd_num[0], g_num["gamma"],
                                         g_den["gamma"], rank_num[0])
    elif kernel is not None:
        from clickeval_spark.em.compiled_chain import chain_block_pass   # numba: see `_examination_pass`

        name = next(iter(shapes), None)   # the one global family (SDBN: none)
        ll, ll_valid = chain_block_pass(kernel, g.get(name), block, padded, estep, held_out, LL_EPS, qd_num, qd_den,
                                        rank_num, rank_den, g_num.get(name), g_den.get(name))
    if kernel is not None:
        steps = scored = []   # the compiled pass did both
    for lo, hi in steps:
        qd, c, m_, w, const = slice_of(lo, hi)
        # the E-step and the LL under the same parameters, in one kernel call
        st, row_ll = model.estep_and_log_likelihood(qd, g, c, m_, w, const)
        ll += float(row_ll @ w)
        flat, w_col = spare[lo:hi].ravel(), w[:, None]
        for j, p in enumerate(params):
            num, den = st.qd[p]
            num_w = np.broadcast_to(num * w_col, m_.shape)
            qd_num[j] += binned_sums(flat, n_pairs, num_w.ravel())
            rank_num[j] += np.where(m_, num_w, 0.0).sum(axis=0)
            if p not in model.impression_dens:
                den_w = np.broadcast_to(den * w_col, m_.shape)
                qd_den[j] += binned_sums(flat, n_pairs, den_w.ravel())
                rank_den[j] += np.where(m_, den_w, 0.0).sum(axis=0)
        for k_, s in shapes.items():
            num, den = st.glob[k_]
            g_num[k_] += np.broadcast_to(np.asarray(num, dtype=np.float64), s)
            g_den[k_] += np.broadcast_to(np.asarray(den, dtype=np.float64), s)
    for lo, hi in scored:
        qd, c, m_, w, const = slice_of(lo, hi)
        part = float(model.scored_log_likelihood(qd, g, c, m_, const) @ w)
        if lo < n_train:
            ll += part
        else:
            ll_valid += part
    for lo, hi in valid if ppl_eps is not None else []:
        qd, c, m_, w, _ = slice_of(lo, hi)
        p = np.clip(model.click_probs(qd, g, m_), ppl_eps, 1 - ppl_eps)
        # log(1 - p), not log1p: the same terms as the SQL perplexity (click_prediction.log_lik)
        ppl_ln += w @ np.where(m_, np.where(c == 1, np.log(p), np.log(1.0 - p)), 0.0)
        ppl_n += w @ m_
    if not estep:
        qd_num, qd_den = num_prev, den_prev
    else:   # sums of whole weights: the same in any order, so the same bits as summing them slice by slice
        for j, p in enumerate(params):
            if p in model.impression_dens:
                qd_den[j] = block.impressions
                rank_den[j] = block.rank_impressions
    new_state = np.stack([values, qd_num, qd_den, *(kept if plan.keeps_points else ())])
    parts = [np.array([ll, float(weight[:n_train].sum()), ll_valid, block.n_valid if held_out else 0.0, lp,
                       float(block.rank_impressions.sum())]),
             ppl_n, ppl_ln]
    parts += [np.array([qd_num[j].sum(), qd_den[j].sum()]) for j in range(P)]
    parts += [np.concatenate([rank_num[j], rank_den[j]]) for j in range(P)]
    parts += [_evidence(qd_num[j], qd_den[j], m_pair[j]) if plan.eb and estep and update is not None
              else np.zeros(len(EB_GRID)) for j in range(P)]
    parts += [np.concatenate([g_num[k_].ravel(), g_den[k_].ravel()]) for k_ in shapes]
    parts += [np.zeros(2)]   # accel: a NORM pass's
    return new_state, np.concatenate(parts)


def _evidence(num: np.ndarray, den: np.ndarray, m: np.ndarray) -> np.ndarray:
    """The items' Beta-binomial log evidence per strength of `EB_GRID`, each around its prior mean m."""
    from clickeval_spark.em.compiled import beta_binomial_evidence   # numba: see `_examination_pass`

    out = np.zeros(len(EB_GRID))
    beta_binomial_evidence(num, den, np.ascontiguousarray(m, dtype=np.float64), np.asarray(EB_GRID), out)
    return out


def _pair_sums(bins: np.ndarray, weight: np.ndarray, by_rank: np.ndarray, n_train: int, n_pairs: int) -> np.ndarray:
    """(F, n_pairs): per pair, the sum over the training rows' ranks in it of weight * by_rank[f, rank]
    (`compiled.rank_weighted_sums`: bincount's terms and order, without its (B, M) temporaries)."""
    from clickeval_spark.em.compiled import rank_weighted_sums   # numba: see `_examination_pass`

    sums = np.zeros((len(by_rank), n_pairs + 1))   # the spare bin n_pairs: masked ranks
    rank_weighted_sums(bins, weight, np.ascontiguousarray(by_rank, dtype=np.float64), n_train, sums)
    return sums[:, :-1]


def _pair_means(block: BlockArrays, by_rank: np.ndarray) -> np.ndarray:
    """(P, n_pairs): each pair's impression-weighted mean of ``by_rank`` (P, M) over its training ranks
    (INIT_VALUE for a pair without one)."""
    sums = _pair_sums(block.bins, block.weight, by_rank, block.n_train, block.n_pairs)
    return ratio_or(sums, block.impressions[None, :], INIT_VALUE)


def _examination_pass(g: Mapping[str, np.ndarray], block: BlockArrays, alpha: np.ndarray, estep: bool, held_out: bool,
                      alpha_num: np.ndarray, gamma_num: np.ndarray, gamma_den: np.ndarray,
                      alpha_rank_num: np.ndarray) -> tuple[float, float]:
    """(training LL, held-out LL or 0 without ``held_out``) of an examination model's block
    (`compiled.examination_pass`); with ``estep`` the training rows' E-step sums are added to
    alpha_num (n_pairs,), gamma_num, gamma_den and alpha_rank_num (M,)."""
    # imported here: numba is heavy to import (memory and start-up time), and only processes that run EM passes need it
    from clickeval_spark.em.compiled import examination_pass

    gamma = np.asarray(g["gamma"], dtype=np.float64)
    exam = np.append(gamma.ravel(), 0.0)   # the spare cell: masked ranks
    a_num, e_num, e_den = np.zeros(alpha.size), np.zeros(exam.size), np.zeros(exam.size)
    r_num = np.zeros(block.clicks.shape[1])
    rows = (alpha, block.bins, block.const["cell"], block.clicks, block.mask, block.weight, exam)
    ll = examination_pass(*rows, 0, block.n_train, estep, LL_EPS, a_num, e_num, e_den, r_num)
    ll_valid = (examination_pass(*rows, block.n_train, len(block.weight), False, LL_EPS, a_num, e_num, e_den, r_num)
                if held_out else 0.0)
    alpha_num += a_num[:block.n_pairs]
    alpha_rank_num += r_num
    gamma_num += e_num[:-1].reshape(gamma.shape)
    gamma_den += e_den[:-1].reshape(gamma.shape)
    return ll, ll_valid


def global_params(model: ClickModel, M: int, sums: Mapping[str, np.ndarray], old: Mapping[str, np.ndarray],
                  prior: Mapping[str, FamilyPrior], frozen_means: Mapping[str, np.ndarray] | None = None,
                  ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """M-step of the global parameters from summed (num..., den...) sections, as posterior modes.

    Returns (values, prior means m): a pooled family's m is its rank's pooled mean, or its
    entry in ``frozen_means`` once the warm-up has fixed it.
    """
    out, means = {}, {}
    for name, shape in sorted(model.global_shapes(M).items()):
        size = int(np.prod(shape))
        num, den = sums[name][:size].reshape(shape), sums[name][size:].reshape(shape)
        prev = np.broadcast_to(np.asarray(old[name], dtype=np.float64), shape)
        fam = prior[name]
        if frozen_means is not None and name in frozen_means:
            m = frozen_means[name]
        elif fam.m is None and fam.k > 0:
            m = pooled_rank_means(num, den)
        else:
            m = np.asarray(INIT_VALUE if fam.m is None else fam.m)
        out[name] = posterior_mode(num, den, prev, fam.k, m)
        means[name] = m
    return out, means


def qd_prior_means(prior: ModelPrior, model: ClickModel, sums: Mapping[str, np.ndarray], M: int,
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(m, m by rank) of the next qd M-step: each family's m pooled from this pass's ``sums`` unless the prior
    fixes it. m by rank is what a pair unseen in training takes at each rank: its family's pooled mean at
    that rank with ``rank_means``, else m."""
    params = model.qd_params
    m = prior.qd_arrays(params)[1]
    fixed = ~np.isnan(m)
    pooled = np.where(fixed, m, [pooled_mean(*sums[f"pool_{p}"]) for p in params])
    by_rank = np.broadcast_to(pooled[:, None], (len(params), M)).copy()
    if prior.rank_means:
        for j, p in enumerate(params):
            if not fixed[j]:
                by_rank[j] = pooled_rank_mean(sums[f"rank_{p}"], pooled[j])
    return pooled, by_rank


def cell_evidence(model: ClickModel, M: int, sums: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    """The Beta-binomial log evidence per strength of `EB_GRID` of a per-rank global family's cells (UBM's
    gamma: a few dozen), each around its rank's pooled mean."""
    shape = model.global_shapes(M)[name]
    size = int(np.prod(shape))
    num, den = sums[name][:size].reshape(shape), sums[name][size:].reshape(shape)
    m = np.broadcast_to(pooled_rank_means(num, den), shape)
    return _evidence(num.ravel(), den.ravel(), m.ravel())
