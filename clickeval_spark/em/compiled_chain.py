"""The EM pass of the cascade models fitted by EM (DBN, CCM, DCM, SDBN) as one compiled loop over a block (numba).

The numpy kernels (`models.chain.chain_posteriors` and each model's ``expected_stats``) build a dozen
(B, M) arrays per slice; here each row's examination chain lives in a few M-long buffers, and its LL
and posteriors go straight into their pair's, rank's and global sums. The per-rank terms are the
kernels' own expressions in the same order; the sums differ from theirs by reassociation only (and a
row's LL is the log of its ranks' product, as in `compiled.examination_pass`). The kernels stay the
definition: tests/em/test_compiled.py holds this module to them.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from clickeval_spark.em.compiled import CACHE, UNDERFLOW

_DBN, _CCM, _DCM = 0, 1, 2
#: the kernel a model's pass runs (`chain_pass`'s ``kind``): SDBN's is DBN's at gamma = 1 (its probabilities and
#: its E-step of alpha and sigma), without gamma's sums
KINDS = {"dbn": _DBN, "ccm": _CCM, "dcm": _DCM, "sdbn": _DBN}
#: rows per chunk of `chain_block_pass` (`em.step.SLICE_ROWS`, the numpy path's slice)
CHUNK_ROWS = 16384


@njit(cache=CACHE, nogil=True)
def _div(num: float, den: float) -> float:
    """`chain.safe_div` of two numbers: 0 where den <= 0 (impossible observations)."""
    return num / den if den > 0.0 else 0.0


@njit(cache=CACHE, nogil=True)
def chain_pass(kind: int, values: np.ndarray, bins: np.ndarray, clicks: np.ndarray, mask: np.ndarray,
               weight: np.ndarray, glob: np.ndarray, lo: int, hi: int, estep: bool, eps: float,
               qd_num: np.ndarray, qd_den: np.ndarray, rank_num: np.ndarray, rank_den: np.ndarray,
               g_num: np.ndarray, g_den: np.ndarray) -> float:
    """Rows lo..hi-1 of a block: their weighted LL sum; with ``estep`` their E-step sums added in place.

    values (P, V): the qd families' values by bin (alpha, then DBN's sigma), bins (B, M) a rank's
    bin; glob: the model's global family flattened (DBN gamma (1,), CCM tau (3,), DCM lambda (M,)).
    Masks are prefixes (`models.chain`). qd_num / qd_den (P, V) and rank_num / rank_den (P, M) get
    each family's num and den times the row's weight, by bin and by rank; g_num / g_den (glob's
    shape) the global family's.
    """
    M = clicks.shape[1]
    a, s, k, T = np.empty(M), np.empty(M), np.empty(M), np.empty(M + 1)
    total = 0.0
    for b in range(lo, hi):
        w = weight[b]
        n, last = 0, -1
        while n < M and mask[b, n]:
            if clicks[b, n] == 1:
                last = n
            n += 1
        for r in range(n):   # the continuation: (alpha, go on after a skip, go on after a click)
            i = bins[b, r]
            a[r] = values[0, i]
            if kind == _DBN:
                s[r] = glob[0]
                k[r] = glob[0] * (1 - values[1, i])
            elif kind == _CCM:
                s[r] = glob[0]
                k[r] = glob[1] * (1 - a[r]) + glob[2] * a[r]
            else:
                s[r] = 1.0
                k[r] = glob[r]
        # the LL: `chain_cond_probs`, P(E_r = 1 | clicks above) forward
        e, ll, prod = 1.0, 0.0, 1.0
        for r in range(n):
            p = e * a[r]
            if clicks[b, r] == 1:
                q = p
                e = k[r]
            else:
                q = 1 - p
                e = _div(e * (1 - a[r]) * s[r], q)
            prod *= min(max(q, eps), 1.0 - eps)
            if prod < UNDERFLOW:
                ll += np.log(prod)
                prod = 1.0
        total += (ll + np.log(prod)) * w
        if not estep:
            continue
        # `chain_posteriors`: T[r] = P(no click at ranks >= r | E_r = 1), then the click-free tail after `last`
        T[n] = 1.0
        for r in range(n - 1, last, -1):
            T[r] = (1 - a[r]) * ((1 - s[r]) + s[r] * T[r + 1])
        start = last + 1
        e0 = k[last] if last >= 0 else 1.0
        t_start = T[start]
        inv_z = _div(1.0, (1 - e0) + e0 * t_start)
        f = e0
        for r in range(n):
            i = bins[b, r]
            clicked = clicks[b, r] == 1
            exam = exam_next = 1.0
            if r >= start:
                step = f * (1 - a[r]) * s[r]
                exam = f * T[r] * inv_z
                exam_next = step * T[r + 1] * inv_z
                f = step
            attract = 1.0 if clicked else a[r] * (1 - exam)
            w1, w0 = (1.0, 0.0) if r < last else (t_start, 1.0)
            z = k[r] * w1 + (1 - k[r]) * w0
            go_on = r + 1 < n
            num, den = attract, 1.0   # alpha's, before the click's continuation adds to it (CCM)
            if kind == _DBN:
                if clicked and go_on:
                    sig, gam = values[1, i], glob[0]
                    p_sat = _div(sig * w0, z)
                    g_num[0] += _div((1 - sig) * gam * w1, z) * w
                    g_den[0] += _div((1 - sig) * ((1 - gam) * w0 + gam * w1), z) * w
                    qd_num[1, i] += p_sat * w
                    qd_den[1, i] += w
                    rank_num[1, r] += p_sat * w
                    rank_den[1, r] += w
            elif kind == _CCM:
                if clicked and go_on:
                    t2, t3 = glob[1], glob[2]
                    p_r1 = _div(a[r] * (t3 * w1 + (1 - t3) * w0), z)
                    g_num[1] += _div((1 - a[r]) * t2 * w1, z) * w
                    g_den[1] += _div((1 - a[r]) * (t2 * w1 + (1 - t2) * w0), z) * w
                    g_num[2] += _div(a[r] * t3 * w1, z) * w
                    g_den[2] += p_r1 * w
                    num, den = attract + p_r1, 2.0
            elif clicked and go_on:
                g_num[r] += _div(k[r] * w1, k[r] * w1 + (1 - k[r]) * w0) * w
                g_den[r] += w
            if kind != _DCM and go_on and not clicked:   # a skip's continuation: gamma's, tau1's
                g_num[0] += exam_next * w
                g_den[0] += exam * w
            qd_num[0, i] += num * w
            qd_den[0, i] += den * w
            rank_num[0, r] += num * w
            rank_den[0, r] += den * w
    return total


def chain_block_pass(name: str, glob: np.ndarray | None, block, values: np.ndarray, estep: bool,
                     held_out: bool, eps: float, qd_num: np.ndarray, qd_den: np.ndarray, rank_num: np.ndarray,
                     rank_den: np.ndarray, g_num: np.ndarray | None, g_den: np.ndarray | None) -> tuple[float, float]:
    """(training LL, held-out LL or 0 without ``held_out``) of a cascade model's block (`em.step.BlockArrays`)
    by `chain_pass`; with ``estep`` the training rows' E-step sums are added to qd_num / qd_den (P, n_pairs),
    rank_num / rank_den (P, M) and g_num / g_den (the global family's shape). ``values`` (P, V): em_block's
    padded values by bin; ``glob``: the model's one global family, None for SDBN (gamma = 1; g_num / g_den None).

    The rows go through in chunks of `CHUNK_ROWS`, the LL and the rank and global sums of each chunk added
    to the block's, as the numpy path sums slice by slice: a block-long running sum of millions of terms
    drifts from numpy's by more than 1e-12 (a pair's sums have few terms: one running sum each).
    """
    flat = np.ones(1) if glob is None else np.ascontiguousarray(np.asarray(glob, dtype=np.float64).ravel())
    P, n_pairs, M = values.shape[0], qd_num.shape[1], block.clicks.shape[1]
    q_num, q_den = np.zeros(values.shape), np.zeros(values.shape)
    rows = (KINDS[name], np.ascontiguousarray(values), block.bins, block.clicks, block.mask, block.weight, flat)
    lls = []
    for lo, hi, step in [(0, block.n_train, estep)] + ([(block.n_train, len(block.weight), False)] if held_out else []):
        ll = 0.0
        for c_lo in range(lo, hi, CHUNK_ROWS):
            r_num, r_den = np.zeros((P, M)), np.zeros((P, M))
            e_num, e_den = np.zeros(flat.size), np.zeros(flat.size)
            ll += chain_pass(*rows, c_lo, min(c_lo + CHUNK_ROWS, hi), step, eps, q_num, q_den, r_num, r_den, e_num,
                             e_den)
            if step:
                rank_num += r_num
                rank_den += r_den
                if g_num is not None:
                    g_num += e_num.reshape(g_num.shape)
                    g_den += e_den.reshape(g_den.shape)
        lls.append(ll)
    qd_num += q_num[:, :n_pairs]
    qd_den += q_den[:, :n_pairs]
    return lls[0], lls[1] if held_out else 0.0
