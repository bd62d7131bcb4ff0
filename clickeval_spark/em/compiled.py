"""The EM pass of the examination models (PBM, UBM) as one compiled loop over a block (numba).

Both models are C_r = E_r * A_r: A_r ~ Bernoulli(alpha of the rank's pair), E_r ~ Bernoulli(gamma at
the rank's cell: PBM's the rank, UBM's the rank and the rank of the last click above). Each rank is
read once and its posteriors go straight into their pair's and cell's sums, instead of the numpy
kernels' dozen (B, M) temporaries per slice. The sums equal the numpy kernels' up to rounding (a
row's LL is the log of its ranks' product, logged early near underflow); those stay the reference
(tests/em/test_compiled.py). The cascade models' pass is `compiled_chain.chain_pass`, on the pieces
shared here (`CACHE`, `UNDERFLOW`).

Compiled on first use in each process and cached in ``__pycache__`` where that is writable; elsewhere
(a read-only install, a ``--py-files`` zip) compiled in memory rather than numba's fallback cache under
the home directory of whatever user runs the executors.
"""

from __future__ import annotations

import math
import os

import numpy as np
from numba import njit

#: a row's product of probabilities is logged and restarted below this (1e-6 ** 41 ~ 1e-246)
UNDERFLOW = 1e-250
#: `beta_binomial_evidence` tabulates ln Gamma(n + k) of the whole counts below this (99% of a 10M log's pairs)
_COUNTS = 256
CACHE = os.access(os.path.dirname(os.path.abspath(__file__)), os.W_OK)


@njit(cache=CACHE, nogil=True)
def examination_pass(alpha: np.ndarray, pairs: np.ndarray, cells: np.ndarray, clicks: np.ndarray,
                     mask: np.ndarray, weight: np.ndarray, exam: np.ndarray, lo: int, hi: int, estep: bool,
                     eps: float, alpha_num: np.ndarray, exam_num: np.ndarray, exam_den: np.ndarray,
                     alpha_rank_num: np.ndarray) -> float:
    """Rows lo..hi-1 of a block: their weighted LL sum; with ``estep`` their E-step sums added in place.

    alpha (n_pairs + 1,): each pair's attractiveness (any value in the spare entry);
    pairs, cells (B, M): a rank's pair and gamma cell; exam (n_cells + 1,): gamma flattened, 0 in the
    spare cell; weight (B,) float64: SERPs per row. alpha_num (n_pairs + 1,) gets P(A_r = 1 | C),
    exam_num / exam_den (n_cells + 1,) get P(E_r = 1 | C) and the impressions, each times the weight;
    alpha_rank_num (M,) gets P(A_r = 1 | C) by rank (the pooled per-rank prior means).
    """
    M = clicks.shape[1]
    total = 0.0
    for b in range(lo, hi):
        w = weight[b]
        ll = 0.0
        prod = 1.0
        for r in range(M):
            if not mask[b, r]:
                continue
            pair, cell = pairs[b, r], cells[b, r]
            a, e = alpha[pair], exam[cell]
            p = a * e   # P(C_r = 1 | clicks above)
            if clicks[b, r] == 1:
                q = p
                if estep:
                    alpha_num[pair] += w
                    alpha_rank_num[r] += w
                    exam_num[cell] += w
            else:
                q = 1.0 - p
                if estep and q > 0.0:   # a skip: not examined, or examined and not attracted
                    post = a * (1.0 - e) / q * w
                    alpha_num[pair] += post
                    alpha_rank_num[r] += post
                    exam_num[cell] += e * (1.0 - a) / q * w
            if estep:
                exam_den[cell] += w
            prod *= min(max(q, eps), 1.0 - eps)
            if prod < UNDERFLOW:
                ll += np.log(prod)
                prod = 1.0
        total += (ll + np.log(prod)) * w
    return total


@njit(cache=CACHE, nogil=True)
def rank_weighted_sums(bins: np.ndarray, weight: np.ndarray, by_rank: np.ndarray, n_rows: int,
                       out: np.ndarray) -> None:
    """Adds weight[b] * by_rank[f, r] to out[f, bins[b, r]] for the rows b < n_rows and every rank r, in row
    then rank order: `base.binned_sums` of those products (the same terms in the same order, so the same
    sums) without its (B, M) temporaries, which take most of its time on a large block (benchmarks/RESULTS.md)."""
    M = bins.shape[1]
    for f in range(by_rank.shape[0]):
        for b in range(n_rows):
            w = weight[b]
            for r in range(M):
                out[f, bins[b, r]] += w * by_rank[f, r]


def beta_binomial_evidence(num: np.ndarray, den: np.ndarray, m: np.ndarray, grid: np.ndarray,
                           out: np.ndarray) -> None:
    """Adds to out[j], for the prior strength k = grid[j], the Beta-binomial log evidence of the counts:
    sum_i ln B(num_i + k m_i, den_i - num_i + k (1 - m_i)) - ln B(k m_i, k (1 - m_i)).

    Expected (real) counts are allowed: the Beta function is defined for real arguments. Items
    without a count add nothing; m is kept inside (1e-9, 1 - 1e-9). The terms of the prior alone,
    ln Gamma(k m) and ln Gamma(k (1 - m)), are computed once per distinct m: a family's pooled mean
    is every item's, and of the means of the ranks an item was shown at (``seen_by_rank``) most
    recur (a 10M log's block: 98k pairs, 9k distinct means). ln Gamma(n + k) of a whole count n
    below `_COUNTS` (an examination model's attractiveness counts impressions, most of them a few)
    comes from a table. The same arguments, so the same values and sums, with half the lgamma calls.
    """
    m = np.asarray(m, dtype=np.float64)
    if m.size and m.min() == m.max():   # one mean (pooled): no sort
        means, index = m[:1], np.zeros(m.size, dtype=np.intp)
    else:
        means, index = np.unique(m, return_inverse=True)
    _evidence(num, den, index, np.minimum(np.maximum(means, 1e-9), 1.0 - 1e-9), grid, out)


@njit(cache=CACHE, nogil=True)
def _evidence(num: np.ndarray, den: np.ndarray, index: np.ndarray, means: np.ndarray, grid: np.ndarray,
              out: np.ndarray) -> None:
    """`beta_binomial_evidence` with item i's mean at means[index[i]] (distinct, inside (0, 1))."""
    lg_k = np.empty(grid.size)
    for j in range(grid.size):
        lg_k[j] = math.lgamma(grid[j])
    lg_n = np.empty((_COUNTS, grid.size))
    for n in range(_COUNTS):
        for j in range(grid.size):
            lg_n[n, j] = math.lgamma(float(n) + grid[j])
    lg_p, lg_q = np.empty((means.size, grid.size)), np.empty((means.size, grid.size))
    for u in range(means.size):
        for j in range(grid.size):
            lg_p[u, j], lg_q[u, j] = math.lgamma(grid[j] * means[u]), math.lgamma(grid[j] * (1.0 - means[u]))
    for i in range(num.size):
        a = num[i]
        b = max(den[i] - a, 0.0)
        n = a + b
        if n <= 0.0:
            continue
        whole = n < _COUNTS and n == math.floor(n)
        u = index[i]
        mi = means[u]
        for j in range(grid.size):
            k = grid[j]
            p, q = k * mi, k * (1.0 - mi)
            lg_total = lg_n[int(n), j] if whole else math.lgamma(n + k)
            out[j] += (math.lgamma(a + p) + math.lgamma(b + q) - lg_total - lg_p[u, j] - lg_q[u, j] + lg_k[j])
