"""Click chain model (Guo et al. 2009), fitted by exact EM.

Cascade family with global tau = (tau1, tau2, tau3): after an examined skip the
user goes on with probability tau1; after a click with probability
tau2 * (1 - alpha) + tau3 * alpha.

For EM the click continuation is written with a latent relevance R ~
Bernoulli(alpha), independent of the attractiveness A: go on w.p. tau3 if R = 1,
tau2 if R = 0.  Marginalising R gives exactly the CCM continuation, and alpha
then gets expected counts from both A (every impression) and R (clicks whose
continuation is observable, i.e. not at the final rank).

Departure from PyClick: PyClick's CCM uses the same structure but an approximate
alpha update (unconditional examination probabilities in the tail) and ranks
documents by alpha**2; here the tail posteriors are exact and relevance = alpha.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from clickeval_spark.models.base import Stats, row_weight
from clickeval_spark.models.chain import ChainModel, chain_posteriors, safe_div


class CCM(ChainModel):
    name = "ccm"
    qd_params = ("alpha",)
    iterative = True

    def global_shapes(self, M: int) -> dict[str, tuple[int, ...]]:
        return {"tau": (3,)}

    def continuation(self, qd, g):
        a = qd["alpha"]
        t1, t2, t3 = (float(x) for x in np.asarray(g["tau"]))
        return a, np.full(a.shape, t1), t2 * (1 - a) + t3 * a

    def expected_stats(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                       clicks: np.ndarray, mask: np.ndarray, weight: np.ndarray | None = None) -> Stats:
        a, skip, k = self.continuation(qd, g)
        _, t2, t3 = (float(x) for x in np.asarray(g["tau"]))
        post = chain_posteriors(a, skip, k, clicks, mask)
        w1, w0 = post.w1, post.w0
        z = k * w1 + (1 - k) * w0
        # Joint posteriors of (R, went on) after each click with a next rank.
        p_r1_go = safe_div(a * t3 * w1, z)
        p_r1 = safe_div(a * (t3 * w1 + (1 - t3) * w0), z)
        p_r0_go = safe_div((1 - a) * t2 * w1, z)
        p_r0 = safe_div((1 - a) * (t2 * w1 + (1 - t2) * w0), z)

        cn, sn = post.click_next, post.skip_next
        m = mask.astype(float)
        w = row_weight(weight)

        def total(x, where):
            return float((np.where(where, x, 0.0) * w).sum())

        num = np.array([total(post.exam_next, sn), total(p_r0_go, cn), total(p_r1_go, cn)])
        den = np.array([total(post.exam, sn), total(p_r0, cn), total(p_r1, cn)])
        return Stats(
            qd={"alpha": (post.attract + np.where(cn, p_r1, 0.0), m + cn)},
            glob={"tau": (num, den)},
        )
