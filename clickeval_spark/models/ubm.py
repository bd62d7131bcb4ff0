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


def last_click_above(clicks: np.ndarray, mask: np.ndarray, dtype=np.int64) -> np.ndarray:
    """(B, M) ``dtype``: 1-based rank of the last click above each rank, 0 if none."""
    B, M = clicks.shape
    out = np.zeros((B, M), dtype=dtype)
    k = np.zeros(B, dtype=dtype)
    for r in range(M):
        out[:, r] = k
        k = np.where((clicks[:, r] == 1) & mask[:, r], r + 1, k)
    return out


class UBM(ClickModel):
    name = "ubm"
    qd_params = ("alpha",)
    iterative = True
    impression_dens = ("alpha",)
    examination_cells = True

    def global_shapes(self, M: int) -> dict[str, tuple[int, ...]]:
        return {"gamma": (M, M + 1)}

    def row_constants(self, clicks: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
        """``cell`` (B, M): rank r's cell r * (M + 1) + k of gamma flattened, k the rank of the last
        click above; the spare cell M * (M + 1) where masked (a rank with no examination). The smallest
        unsigned type that holds it (uint8 up to M = 15): a fit holds it for every row, and the compiled
        pass reads it at every rank (uint8 rather than int32: a quarter of the bytes; benchmarks/RESULTS.md)."""
        M = clicks.shape[1]
        dtype = np.min_scalar_type(M * (M + 1))
        cell = last_click_above(clicks, mask, dtype)   # in place from here: no (B, M) int64 temporaries
        cell += (np.arange(M) * (M + 1)).astype(dtype)
        cell[~mask] = M * (M + 1)
        return {"cell": cell}

    def _exam(self, g: Mapping[str, np.ndarray], cell: np.ndarray) -> np.ndarray:
        """gamma of each rank's cell; 0 in the spare cell."""
        return np.append(np.asarray(g["gamma"], dtype=np.float64).ravel(), 0.0)[cell]

    def _cells(self, clicks: np.ndarray, mask: np.ndarray, const: Mapping[str, np.ndarray] | None) -> np.ndarray:
        return (const or self.row_constants(clicks, mask))["cell"]

    def _cond_probs(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray], clicks: np.ndarray,
                    mask: np.ndarray, const: Mapping[str, np.ndarray] | None) -> np.ndarray:
        return np.where(mask, qd["alpha"] * self._exam(g, self._cells(clicks, mask, const)), 0.0)

    def cond_probs(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                   clicks: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self._cond_probs(qd, g, clicks, mask, None)

    def scored_log_likelihood(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray], clicks: np.ndarray,
                              mask: np.ndarray, const: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        return log_likelihood(self._cond_probs(qd, g, clicks, mask, const), clicks, mask)

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
        return self.estep_and_log_likelihood(qd, g, clicks, mask, weight)[0]

    def estep_and_log_likelihood(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                                 clicks: np.ndarray, mask: np.ndarray, weight: np.ndarray | None = None,
                                 const: Mapping[str, np.ndarray] | None = None) -> tuple[Stats, np.ndarray]:
        cell = self._cells(clicks, mask, const)
        a, gam = qd["alpha"], self._exam(g, cell)
        p = a * gam   # P(C_r = 1 | clicks above); 0 where masked
        return self._stats(a, gam, p, cell, clicks, mask, weight), log_likelihood(p, clicks, mask)

    @staticmethod
    def _stats(a, gam, p, cell, clicks, mask, weight) -> Stats:
        B, M = a.shape
        p_attr, p_exam = examination_posteriors(a, gam, p, clicks, mask)
        m = mask.astype(float)
        # Sum the examination posteriors into their (rank, last click) cells; masked ranks are in the spare cell
        n_cells = M * (M + 1)
        w = np.broadcast_to(row_weight(weight), (B, M)).ravel()
        num = binned_sums(cell.ravel(), n_cells, p_exam.ravel() * w).reshape(M, M + 1)
        den = binned_sums(cell.ravel(), n_cells, w).reshape(M, M + 1)
        return Stats(qd={"alpha": (p_attr * m, m)}, glob={"gamma": (num, den)})
