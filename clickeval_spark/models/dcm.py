"""Dependent click model (Guo, Liu & Wang 2009), fitted by exact EM.

Cascade family: E_1 = 1; after a skip the user always goes on; after a click at
rank r the user goes on with probability lambda_r (per rank).  Only whether the
user went on after the LAST click is hidden; the E-step is exact.

Departure from PyClick: PyClick fits DCM by counting, assuming the user always
stops at the last click (a biased estimator under DCM itself).  Here the E-step
weighs "stopped" against "went on and found nothing attractive below".
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from clickeval_spark.models.base import Stats, row_weight
from clickeval_spark.models.chain import ChainModel, chain_posteriors, safe_div


class DCM(ChainModel):
    name = "dcm"
    qd_params = ("alpha",)
    iterative = True

    def global_shapes(self, M: int) -> dict[str, tuple[int, ...]]:
        return {"lambda": (M,)}

    def continuation(self, qd, g):
        a = qd["alpha"]
        lam = np.broadcast_to(np.asarray(g["lambda"])[None, :], a.shape)
        return a, np.ones_like(a), lam

    def expected_stats(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                       clicks: np.ndarray, mask: np.ndarray, weight: np.ndarray | None = None) -> Stats:
        a, skip, lam = self.continuation(qd, g)
        post = chain_posteriors(a, skip, lam, clicks, mask)
        # P(went on after the click at r | C); 1 above the last click.
        p_cont = safe_div(lam * post.w1, lam * post.w1 + (1 - lam) * post.w0)
        # A click at the final rank has no observable continuation: it carries no
        # information on lambda, so it is left out (den 0) instead of adding num=lambda.
        cn = post.click_next
        w = row_weight(weight)
        return Stats(
            qd={"alpha": (post.attract, mask.astype(float))},
            glob={"lambda": ((np.where(cn, p_cont, 0.0) * w).sum(axis=0), (cn * w).sum(axis=0).astype(float))},
        )
