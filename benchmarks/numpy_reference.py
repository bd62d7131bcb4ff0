"""Single-process, vectorised numpy EM: the reference the Spark EM is timed against.

The whole training log sits in memory as padded (B, M) arrays: ``pair`` (index of
the rank's (query, doc) pair, -1 = no rank) and ``clicks``. One iteration is one
E-step over all SERPs at once plus an M-step by ``np.bincount`` — no Python loop
over SERPs, nothing distributed.

PBM and UBM are written out by hand here (the textbook E-steps, Chuklin et al.
2015 §4), independently of `clickeval_spark.models`, so the reference is not
slowed down by, or wrong in the same way as, the package's kernels. DBN's exact
E-step over the examination chain is long; its reference runs the package's own
DBN kernel (`expected_stats`) on the whole log in one process, which times the
distributed engine against the same maths without Spark.

Every reference returns its final global parameters so the benchmark can check
that Spark and numpy fitted the same model (max |difference| is printed).
"""

from __future__ import annotations

import time

import numpy as np

from clickeval_spark.models import get_model
from clickeval_spark.models.base import INIT_VALUE


def _ratio(num: np.ndarray, den: np.ndarray, old: np.ndarray) -> np.ndarray:
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), old)


def prev_click_rank(clicks: np.ndarray) -> np.ndarray:
    """1-based rank of the last click above each rank (0 = none), shape (B, M)."""
    B, M = clicks.shape
    ranks = np.where(clicks == 1, np.arange(1, M + 1)[None, :], 0)
    upto = np.maximum.accumulate(ranks, axis=1)
    out = np.zeros_like(upto)
    out[:, 1:] = upto[:, :-1]
    return out


def _examination_em(pair: np.ndarray, clicks: np.ndarray, cell: np.ndarray, n_pairs: int, n_cells: int,
                    iterations: int):
    """EM of C = E * A with P(A) = alpha[pair] and P(E) = gamma[cell] per impression (PBM, UBM)."""
    mask = pair >= 0
    flat, c, cell = pair[mask], clicks[mask].astype(bool), cell[mask]
    alpha, gamma = np.full(n_pairs, INIT_VALUE), np.full(n_cells, INIT_VALUE)
    alpha_den = np.bincount(flat, minlength=n_pairs).astype(float)
    gamma_den = np.bincount(cell, minlength=n_cells).astype(float)
    times = []
    for _ in range(iterations):
        t = time.perf_counter()
        a, g = alpha[flat], gamma[cell]
        skip = 1.0 - a * g     # a skip is "not examined" or "examined, not attracted"
        p_attr = np.where(c, 1.0, a * (1.0 - g) / skip)
        p_exam = np.where(c, 1.0, g * (1.0 - a) / skip)
        alpha = _ratio(np.bincount(flat, weights=p_attr, minlength=n_pairs), alpha_den, alpha)
        gamma = _ratio(np.bincount(cell, weights=p_exam, minlength=n_cells), gamma_den, gamma)
        times.append(time.perf_counter() - t)
    return gamma, times


def fit_pbm(pair: np.ndarray, clicks: np.ndarray, n_pairs: int, iterations: int):
    """PBM: examination gamma[r] per rank."""
    M = pair.shape[1]
    rank = np.broadcast_to(np.arange(M)[None, :], pair.shape)
    gamma, times = _examination_em(pair, clicks, rank, n_pairs, M, iterations)
    return {"gamma": gamma}, times


def fit_ubm(pair: np.ndarray, clicks: np.ndarray, n_pairs: int, iterations: int):
    """UBM: gamma[r, k], k = rank of the previous click (0 = none), as `clickeval_spark.models.ubm`."""
    M = pair.shape[1]
    cell = np.arange(M)[None, :] * (M + 1) + prev_click_rank(clicks)     # flat index into gamma (M, M+1)
    gamma, times = _examination_em(pair, clicks, cell, n_pairs, M * (M + 1), iterations)
    return {"gamma": gamma.reshape(M, M + 1)}, times


def fit_with_kernel(name: str, pair: np.ndarray, clicks: np.ndarray, n_pairs: int, iterations: int):
    """Any package model, its own kernel over the whole log in one process (used for DBN)."""
    model = get_model(name)
    B, M = pair.shape
    mask = pair >= 0
    flat = np.where(mask, pair, 0)
    idx = flat[mask]
    qd = {p: np.full(n_pairs, INIT_VALUE) for p in model.qd_params}
    glob = model.init_global(M)
    times = []
    for _ in range(iterations):
        t = time.perf_counter()
        stats = model.expected_stats({p: v[flat] for p, v in qd.items()}, glob, clicks, mask)
        for p, (num, den) in stats.qd.items():
            qd[p] = _ratio(np.bincount(idx, weights=np.broadcast_to(num, mask.shape)[mask], minlength=n_pairs),
                           np.bincount(idx, weights=np.broadcast_to(den, mask.shape)[mask], minlength=n_pairs),
                           qd[p])
        glob = {k: _ratio(np.asarray(num, float), np.asarray(den, float), glob[k])
                for k, (num, den) in stats.glob.items()}
        times.append(time.perf_counter() - t)
    return glob, times


REFERENCES = {
    "pbm": fit_pbm,
    "ubm": fit_ubm,
    "dbn": lambda pair, clicks, n_pairs, iterations: fit_with_kernel("dbn", pair, clicks, n_pairs, iterations),
}
