"""Dynamic Bayesian network model (Chapelle & Zhang 2009), fitted by exact EM.

Cascade family: an examined document is clicked w.p. alpha; after a click the
user is satisfied w.p. sigma and stops; an unsatisfied user (or one who skipped)
goes on w.p. gamma (global).  So cont_skip = gamma, cont_click = gamma*(1-sigma).

Departures from PyClick (both change the fitted values, not just speed):
- a SERP without clicks is a user who examined from rank 1 until abandoning;
  PyClick treats it as if the last click were at the final rank (every rank
  examined), which biases alpha down and gamma up;
- the E-step uses exact posteriors P(E_r | C) of the tail after the last click;
  PyClick's alpha update uses the unconditional P(E_r) instead.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from clickeval_spark.models.base import Stats, row_weight
from clickeval_spark.models.chain import ChainModel, chain_posteriors, safe_div


class DBN(ChainModel):
    name = "dbn"
    qd_params = ("alpha", "sigma")
    iterative = True

    def global_shapes(self, M: int) -> dict[str, tuple[int, ...]]:
        return {"gamma": ()}

    def continuation(self, qd, g):
        a = qd["alpha"]
        gam = float(g["gamma"])
        return a, np.full(a.shape, gam), gam * (1 - qd["sigma"])

    def expected_stats(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                       clicks: np.ndarray, mask: np.ndarray, weight: np.ndarray | None = None) -> Stats:
        a, skip, k = self.continuation(qd, g)
        s = qd["sigma"]
        gam = float(g["gamma"])
        post = chain_posteriors(a, skip, k, clicks, mask)
        w1, w0 = post.w1, post.w0
        z = k * w1 + (1 - k) * w0
        p_sat = safe_div(s * w0, z)
        p_unsat = safe_div((1 - s) * ((1 - gam) * w0 + gam * w1), z)
        p_go = safe_div((1 - s) * gam * w1, z)

        cn, sn = post.click_next, post.skip_next
        # Satisfaction after a click at the final rank is unobservable (posterior =
        # prior): such clicks are left out of sigma and gamma rather than counted.
        w = row_weight(weight)
        gamma_num = (np.where(cn, p_go, 0.0) * w).sum() + (np.where(sn, post.exam_next, 0.0) * w).sum()
        gamma_den = (np.where(cn, p_unsat, 0.0) * w).sum() + (np.where(sn, post.exam, 0.0) * w).sum()
        return Stats(
            qd={"alpha": (post.attract, mask.astype(float)),
                "sigma": (np.where(cn, p_sat, 0.0), cn.astype(float))},
            glob={"gamma": (np.asarray(float(gamma_num)), np.asarray(float(gamma_den)))},
        )

    def relevance(self, qd: Mapping[str, np.ndarray]) -> np.ndarray:
        return qd["alpha"] * qd["sigma"]
