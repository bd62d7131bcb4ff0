"""Single-machine numpy reference EM driver: the oracle the Spark driver is compared to.

Same estimator as the Spark EM: each iteration runs the model's E-step (or
counting pass) on the whole log, sums num/den per (query, doc) pair and over the
log for global parameters, and sets new = num / den.  A parameter whose den is
0 (pair never seen, rank never used) keeps its previous value.

With a prior (a resolved `priors.ModelPrior`, or a plain {family: (k, m)} dict
where m None means pooled) every update is the posterior mode, written out here
on its own: new = (num + k m) / (den + k), m of a pooled qd family = the sum of
its num over the sum of its den in the same iteration, for the first ``warmup``
iterations; later iterations keep the m of iteration ``warmup``. A pair unseen in
training takes, at rank r, its pooled family's sum of num over the sum of den at rank r
(``by_rank``; frozen with m).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from clickeval_spark.models.base import INIT_VALUE, ClickModel, log_likelihood, sample_clicks


def gather(qd_values: Mapping[str, np.ndarray], qd_index: np.ndarray,
           mask: np.ndarray) -> dict[str, np.ndarray]:
    """Per-pair parameter vectors -> (B, M) arrays aligned with the SERPs."""
    idx = np.where(mask, qd_index, 0)
    return {name: v[idx] for name, v in qd_values.items()}


def total_log_likelihood(model: ClickModel, qd_values: Mapping[str, np.ndarray],
                         glob: Mapping[str, np.ndarray], qd_index: np.ndarray,
                         clicks: np.ndarray, mask: np.ndarray) -> float:
    qd = gather(qd_values, qd_index, mask)
    return float(log_likelihood(model.cond_probs(qd, glob, clicks, mask), clicks, mask).sum())


def _family_priors(model: ClickModel, M: int, prior) -> dict[str, tuple[float, float | None]]:
    families = [*model.qd_params, *model.global_shapes(M)]
    if prior is None:
        return {f: (0.0, None) for f in families}
    if isinstance(prior, dict):
        return {f: prior.get(f, (0.0, None)) for f in families}
    fams = {**prior.qd, **prior.glob}
    return {f: (fams[f].k, fams[f].m) for f in families}


def _mode(num, den, prev, k: float, m: float):
    if k > 0:
        return (num + k * m) / (den + k)
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), prev)


def fit_numpy(model: ClickModel, qd_index: np.ndarray, n_pairs: int, clicks: np.ndarray,
              mask: np.ndarray, iterations: int, M: int, prior=None, warmup: int | None = None,
              by_rank: dict | None = None):
    """Fit ``model`` on a padded log (every pair index in 0..n_pairs-1 has impressions).

    Returns (qd_params: name -> (n_pairs,) array, glob: name -> array,
    ll_history: training log-likelihood after each iteration). ``by_rank`` (a dict) receives
    each qd family's (M,) values for unseen pairs by rank.
    """
    fam = _family_priors(model, M, prior)
    clicks = np.asarray(clicks)
    mask = np.asarray(mask, dtype=bool)
    assert clicks.shape == mask.shape == qd_index.shape and clicks.shape[1] == M
    idx = np.where(mask, qd_index, 0)[mask]
    qd_values = {name: np.full(n_pairs, INIT_VALUE) for name in model.qd_params}
    glob = model.init_global(M)
    history: list[float] = []
    last_m: dict[str, object] = {}
    for it in range(1, (iterations if model.iterative else 1) + 1):
        frozen = warmup is not None and it > warmup
        stats = model.expected_stats(gather(qd_values, qd_index, mask), glob, clicks, mask)
        new_qd = {}
        for name, (num, den) in stats.qd.items():
            s_num = np.bincount(idx, weights=num[mask], minlength=n_pairs)
            s_den = np.bincount(idx, weights=den[mask], minlength=n_pairs)
            k, m = fam[name]
            if m is None:
                m = last_m[name] if frozen else s_num.sum() / s_den.sum()
                last_m[name] = m
                if not frozen:
                    r_num, r_den = np.where(mask, num, 0).sum(axis=0), np.where(mask, den, 0).sum(axis=0)
                    last_m["rank_" + name] = np.array([r_num[r] / r_den[r] if r_den[r] > 0 else m for r in range(M)])
                rank_m = last_m["rank_" + name]
            else:
                rank_m = np.full(M, m)
            if by_rank is not None:
                by_rank[name] = rank_m
            new_qd[name] = _mode(s_num, s_den, qd_values[name], k, m)
        new_glob = {}
        for name, (num, den) in stats.glob.items():
            num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
            k, m = fam[name]
            if m is None and k > 0:   # pooled per rank: over the other axes of a 2-D per-rank family
                m = last_m[name] if frozen else num.sum(axis=1, keepdims=True) / den.sum(axis=1, keepdims=True)
                last_m[name] = m
            new_glob[name] = _mode(num, den, glob[name], k, 0.5 if m is None else m)
        qd_values.update(new_qd)
        glob.update(new_glob)
        history.append(total_log_likelihood(model, qd_values, glob, qd_index, clicks, mask))
    return qd_values, glob, history


def simulate(model: ClickModel, qd_true: Mapping[str, np.ndarray], g_true: Mapping[str, np.ndarray],
             mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Draw clicks from the model's own chain rule (base.sample_clicks)."""
    u = rng.random(mask.shape)
    return sample_clicks(model, qd_true, g_true, mask, u)
