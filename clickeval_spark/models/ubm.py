"""User browsing model (Dupret & Piwowarski 2008).

C_r = E_r * A_r, A_r ~ Bernoulli(alpha), E_r ~ Bernoulli(gamma[r, k]) where r is
the 0-based rank and k the 1-based rank of the last click above r (0: none).
Given the clicks above, E_r is independent of everything else, so
P(C_r = 1 | clicks above) = alpha * gamma[r, k].  Cells with k > r can never be
used; they keep their initial value.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from clickeval_spark.models.base import ClickModel, Stats, binned_sums, log_likelihood, row_weight
from clickeval_spark.models.pbm import examination_posteriors


def last_click_above(clicks: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(B, M) int: 1-based rank of the last click above each rank, 0 if none."""
    B, M = clicks.shape
    out = np.zeros((B, M), dtype=np.int64)
    k = np.zeros(B, dtype=np.int64)
    for r in range(M):
        out[:, r] = k
        k = np.where((clicks[:, r] == 1) & mask[:, r], r + 1, k)
    return out


class UBM(ClickModel):
    name = "ubm"
    qd_params = ("alpha",)
    iterative = True

    def global_shapes(self, M: int) -> dict[str, tuple[int, ...]]:
        return {"gamma": (M, M + 1)}

    def _exam(self, g: Mapping[str, np.ndarray], lastk: np.ndarray) -> np.ndarray:
        gamma = np.asarray(g["gamma"])
        return gamma[np.arange(lastk.shape[1])[None, :], lastk]

    def cond_probs(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                   clicks: np.ndarray, mask: np.ndarray) -> np.ndarray:
        lastk = last_click_above(clicks, mask)
        return np.where(mask, qd["alpha"] * self._exam(g, lastk), 0.0)

    def click_probs(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                    mask: np.ndarray) -> np.ndarray:
        a = qd["alpha"]
        gamma = np.asarray(g["gamma"])
        B, M = a.shape
        # state[:, k] = P(last click above the current rank is at 1-based rank k)
        state = np.zeros((B, M + 1))
        state[:, 0] = 1.0
        out = np.zeros((B, M))
        for r in range(M):
            pc = np.where(mask[:, r, None], a[:, r, None] * gamma[r][None, :], 0.0)
            joint = state * pc
            out[:, r] = joint.sum(axis=1)
            state = state - joint
            state[:, r + 1] += out[:, r]
        return out

    def expected_stats(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                       clicks: np.ndarray, mask: np.ndarray, weight: np.ndarray | None = None) -> Stats:
        lastk = last_click_above(clicks, mask)
        a, gam = qd["alpha"], self._exam(g, lastk)
        return self._stats(a, gam, a * gam, lastk, clicks, mask, weight)

    def estep_and_log_likelihood(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                                 clicks: np.ndarray, mask: np.ndarray,
                                 weight: np.ndarray | None = None) -> tuple[Stats, np.ndarray]:
        lastk = last_click_above(clicks, mask)
        a, gam = qd["alpha"], self._exam(g, lastk)
        p = a * gam   # P(C_r = 1 | clicks above)
        return self._stats(a, gam, p, lastk, clicks, mask, weight), log_likelihood(p, clicks, mask)

    @staticmethod
    def _stats(a, gam, p, lastk, clicks, mask, weight) -> Stats:
        B, M = a.shape
        p_attr, p_exam = examination_posteriors(a, gam, p, clicks, mask)
        m = mask.astype(float)
        # Sum the examination posteriors into their (rank, last click) cells, a masked rank into the spare cell
        n_cells = M * (M + 1)
        cell = np.where(mask, np.arange(M)[None, :] * (M + 1) + lastk, n_cells).ravel()
        w = np.broadcast_to(row_weight(weight), (B, M))
        num = binned_sums(cell, n_cells, (p_exam * w).ravel()).reshape(M, M + 1)
        den = binned_sums(cell, n_cells, w.ravel()).reshape(M, M + 1)
        return Stats(qd={"alpha": (p_attr * m, m)}, glob={"gamma": (num, den)})
