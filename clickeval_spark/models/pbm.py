"""Position-based model: C_r = E_r * A_r with E_r ~ Bernoulli(gamma_r), A_r ~ Bernoulli(alpha).

Examination depends on the rank only, so clicks at different ranks are
independent and P(C_r = 1 | clicks above) = P(C_r = 1) = gamma_r * alpha.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from clickeval_spark.models.base import ClickModel, Stats, log_likelihood, row_weight
from clickeval_spark.models.chain import safe_div


class PBM(ClickModel):
    name = "pbm"
    qd_params = ("alpha",)
    iterative = True
    impression_dens = ("alpha",)
    examination_cells = True

    def global_shapes(self, M: int) -> dict[str, tuple[int, ...]]:
        return {"gamma": (M,)}

    def row_constants(self, clicks: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
        """``cell`` (B, M): the rank (gamma's index), M where masked; in the smallest unsigned type, as
        `UBM.row_constants`."""
        M = clicks.shape[1]
        cell = np.broadcast_to(np.arange(M, dtype=np.min_scalar_type(M)), clicks.shape).copy()
        cell[~mask] = M
        return {"cell": cell}

    def cond_probs(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                   clicks: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self.click_probs(qd, g, mask)

    def click_probs(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                    mask: np.ndarray) -> np.ndarray:
        return np.where(mask, qd["alpha"] * np.asarray(g["gamma"])[None, :], 0.0)

    def expected_stats(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                       clicks: np.ndarray, mask: np.ndarray, weight: np.ndarray | None = None) -> Stats:
        a, gam = qd["alpha"], np.asarray(g["gamma"])[None, :]
        return self._stats(a, gam, a * gam, clicks, mask, weight)

    def estep_and_log_likelihood(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                                 clicks: np.ndarray, mask: np.ndarray, weight: np.ndarray | None = None,
                                 const: Mapping[str, np.ndarray] | None = None) -> tuple[Stats, np.ndarray]:
        a, gam = qd["alpha"], np.asarray(g["gamma"])[None, :]
        p = a * gam   # P(C_r = 1 | clicks above)
        return self._stats(a, gam, p, clicks, mask, weight), log_likelihood(p, clicks, mask)

    @staticmethod
    def _stats(a, gam, p, clicks, mask, weight) -> Stats:
        p_attr, p_exam = examination_posteriors(a, gam, p, clicks, mask)
        m = mask.astype(float)
        mw = m * row_weight(weight)
        return Stats(
            qd={"alpha": (p_attr * m, m)},
            glob={"gamma": ((p_exam * mw).sum(axis=0), mw.sum(axis=0))},
        )


def examination_posteriors(a: np.ndarray, gam: np.ndarray, p: np.ndarray, clicks: np.ndarray,
                           mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """P(A_r = 1 | C) and P(E_r = 1 | C) of C_r = E_r * A_r, P(A_r) = a, P(E_r) = gam, p = a * gam
    (PBM; UBM given the clicks above r). A skip is either "not examined" or "examined, not attracted"."""
    clicked = (clicks == 1) & mask
    p_skip = 1 - p
    p_attr = np.where(clicked, 1.0, safe_div(a * (1 - gam), p_skip))
    p_exam = np.where(clicked, 1.0, safe_div(gam * (1 - a), p_skip))
    return p_attr, p_exam
