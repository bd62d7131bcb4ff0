"""LCM, the learned click model: a logistic regression on features of the rank, the clicks above and the
(query, doc)'s and query's click statistics in the training log. Trained by `learned.train` (Spark MLlib) on
the executors, not by EM; this module is its numpy kernel (the same contract as the classic ten), so predict,
sample and score run through the same Arrow passes as every other model.

    logit P(C_r = 1 | clicks above) = w_rank[r, has_click_above] + x(stats, r, n_above, last_click) . w

The (query, doc) statistics are the kernel's qd "parameters" (counts, so a pair unseen in training takes 0,
which makes every statistic feature 0: the rank's own statistics, as the priors do). The features
depend on the clicks above only through (min(n_above, 3), rank of the last click): `click_probs` marginalises
over that state exactly with a forward dynamic program.

`feature_matrix` is the one definition of the features: the training rows' (built in Spark SQL,
`learned.features`) go through it inside a vectorised Arrow pass, so training and inference cannot drift.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from clickeval_spark.models.base import ClickModel, Stats

# per (query, doc) in the training log: impressions, clicks, expected clicks under the rank's CTR (sum of
# rank CTRs over its impressions), the same two over impressions with no click above (the "first click"
# statistic: attraction without the examination that earlier clicks change), and its query's SERPs,
# clicks and expected clicks (repeated on every pair of the query)
QD_STATS = ("n_imp", "clicks", "exp_clicks", "clicks0", "exp_clicks0", "q_serps", "q_clicks", "q_exp_clicks")
FEATURES = ("n_above_1", "n_above_2", "n_above_3plus", "dist_1", "dist_2", "dist_3",
            "coec_k1", "coec_k10", "coec_k1_x_clicked", "coec0", "coec0_x_clicked", "log_imp",
            "coec_k1_x_log_imp", "coec_k1_x_rank", "q_coec", "q_coec_x_clicked", "log_q_serps")
N_ABOVE_CAP = 3  # the features see n_above only up to 3 (n_above_3plus): the DP's count state stops there


def _coec(clicks: np.ndarray, expected: np.ndarray, k: float) -> np.ndarray:
    """log of clicks over expected clicks, both smoothed by k expected clicks: 0 for an unseen pair."""
    return np.log((clicks + k) / (expected + k))


# Every feature is a product of a factor of the click state above (the rank, the count of clicks above, the
# rank of the last) and a factor of the (query, doc) statistics at that rank: (name, state factor, qd factor).
# feature_matrix multiplies them out (the training rows); the kernel's logit groups the weights by state factor
# (`_logit`), so predicting, marginalising and sampling never build the (positions x features) matrix.
_FACTORS = (("n_above_1", "n1", "one"), ("n_above_2", "n2", "one"), ("n_above_3plus", "n3", "one"),
            ("dist_1", "d1", "one"), ("dist_2", "d2", "one"), ("dist_3", "d3", "one"),
            ("coec_k1", "one", "a1"), ("coec_k10", "one", "a10"), ("coec_k1_x_clicked", "clicked", "a1"),
            ("coec0", "one", "a0"), ("coec0_x_clicked", "clicked", "a0"), ("log_imp", "one", "log_imp"),
            ("coec_k1_x_log_imp", "one", "a1_x_log_imp"), ("coec_k1_x_rank", "one", "a1_x_rank"),
            ("q_coec", "one", "q"), ("q_coec_x_clicked", "clicked", "q"), ("log_q_serps", "one", "log_q_serps"))
assert tuple(f for f, _, _ in _FACTORS) == FEATURES


def _state_factors(rank, n_above, last_click) -> dict[str, np.ndarray]:
    """The click-state factors of positions at ``rank`` (1-based) with ``n_above`` clicks above, the last at
    ``last_click`` (0: none): 0/1 arrays."""
    rank = np.asarray(rank, dtype=np.float64)
    n = np.asarray(n_above, dtype=np.float64)
    clicked = (n > 0).astype(np.float64)
    dist = np.where(clicked > 0, rank - last_click, 0.0)
    return {"clicked": clicked, "n1": n == 1, "n2": n == 2, "n3": n >= 3,
            "d1": dist == 1, "d2": dist == 2, "d3": dist == 3}


def _qd_factors(qd: Mapping[str, np.ndarray], rank, M: int) -> dict[str, np.ndarray]:
    """The statistic factors of (query, doc) pairs at ``rank`` (1-based); all 0 for an unseen pair."""
    rank = np.asarray(rank, dtype=np.float64)
    n_imp = np.asarray(qd["n_imp"], dtype=np.float64)
    seen = (n_imp > 0).astype(np.float64)
    a1 = _coec(qd["clicks"], qd["exp_clicks"], 1.0)
    log_imp = np.log1p(n_imp)
    # the query's statistics only for a seen pair: an unseen pair has no row, so inference cannot see them
    q = seen * _coec(qd["q_clicks"], qd["q_exp_clicks"], 1.0)
    return {"a1": a1, "a10": _coec(qd["clicks"], qd["exp_clicks"], 10.0),
            "a0": _coec(qd["clicks0"], qd["exp_clicks0"], 1.0), "log_imp": log_imp, "a1_x_log_imp": a1 * log_imp,
            "a1_x_rank": a1 * (rank - 1) / max(M - 1, 1), "q": q, "log_q_serps": seen * np.log1p(qd["q_serps"])}


def feature_matrix(qd: Mapping[str, np.ndarray], rank: np.ndarray, n_above: np.ndarray, last_click: np.ndarray,
                   M: int) -> np.ndarray:
    """The features (len(FEATURES) on a new last axis) of positions at ``rank`` (1-based) with ``n_above``
    clicks above, the last at ``last_click`` (0: none). All arrays broadcast together."""
    state, stats = _state_factors(rank, n_above, last_click), _qd_factors(qd, rank, M)
    cols = [state[s] if q == "one" else stats[q] if s == "one" else stats[q] * state[s] for _, s, q in _FACTORS]
    shape = np.broadcast_shapes(*(np.shape(c) for c in cols))
    return np.stack([np.broadcast_to(np.asarray(c, dtype=np.float64), shape) for c in cols], axis=-1)


def _weighted_factors(qd: Mapping[str, np.ndarray], w: np.ndarray, rank, M: int) -> dict[str, np.ndarray]:
    """Per state factor, the sum of its features' weights times their statistic factors: the logit is
    w_rank + sum over state factors of factor x this (`LCM._logit`)."""
    stats = _qd_factors(qd, rank, M)
    out: dict[str, np.ndarray] = {}
    for i, (_, s, q) in enumerate(_FACTORS):
        term = w[i] if q == "one" else w[i] * stats[q]
        out[s] = term if s not in out else out[s] + term
    return out


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # no overflow for any z


class LCM(ClickModel):
    name = "lcm"
    qd_params = QD_STATS
    iterative = False
    relevance_uses_globals = True   # P(click at rank 1) needs the weights

    def global_shapes(self, M: int) -> dict[str, tuple[int, ...]]:
        # w_rank[r, j]: the intercept of rank r + 1 with no click above (j = 0) or some (j = 1)
        return {"w_rank": (M, 2), "w": (len(FEATURES),)}

    def _logit(self, qd, g, rank, n_above, last_click, M) -> np.ndarray:
        """w_rank[rank, any click above] + feature_matrix(...) @ w, with the weights grouped by state factor."""
        w_rank = np.asarray(g["w_rank"], dtype=np.float64)
        base = w_rank[np.asarray(rank) - 1, (np.asarray(n_above) > 0).astype(np.int64)]
        state = _state_factors(rank, n_above, last_click)
        coef = _weighted_factors(qd, np.asarray(g["w"], dtype=np.float64), rank, M)
        z = base + coef.pop("one")
        for s, c in coef.items():
            z = z + state[s] * c
        return z

    def cond_probs(self, qd, g, clicks, mask) -> np.ndarray:
        B, M = mask.shape
        c = np.where(mask, clicks, 0).astype(np.int64)
        ranks = np.arange(1, M + 1)
        n_above = np.cumsum(c, axis=1) - c
        last = np.maximum.accumulate(c * ranks[None, :], axis=1)
        last_above = np.concatenate([np.zeros((B, 1), dtype=np.int64), last[:, :-1]], axis=1)
        return _sigmoid(self._logit(qd, g, np.broadcast_to(ranks, (B, M)), n_above, last_above, M))

    def click_probs(self, qd, g, mask) -> np.ndarray:
        """P(C_r = 1), the clicks above marginalised exactly: a forward pass over the state the features see,
        (n = min(clicks above, 3), l = rank of the last click above, 0 for none), P[b, n, l] its probability."""
        B, M = mask.shape
        states_n = np.arange(N_ABOVE_CAP + 1)[None, :, None]    # (1, 4, 1)
        states_l = np.arange(M + 1)[None, None, :]               # (1, 1, M + 1)
        P = np.zeros((B, N_ABOVE_CAP + 1, M + 1))
        P[:, 0, 0] = 1.0
        out = np.zeros((B, M))
        for r in range(1, M + 1):
            # before rank r the last click is above it (l < r): only those states can hold mass; of them, the
            # ones that cannot occur (clicks without a last click, a last click without clicks) have P = 0,
            # their logits are computed anyway (vectorised) and weigh nothing
            qd_r = {k: np.asarray(v)[:, r - 1][:, None, None] for k, v in qd.items()}
            p = _sigmoid(self._logit(qd_r, g, np.full((1, 1, 1), r), states_n, states_l[:, :, :r], M))
            live = P[:, :, :r]
            hit = live * p                                       # (B, 4, r)
            out[:, r - 1] = hit.sum(axis=(1, 2))
            # a masked rank (past the list's end) is never clicked: its mass stays where it was
            shown = mask[:, r - 1]
            moved = np.where(shown[:, None], hit.sum(axis=2), 0.0)   # (B, 4): by count before the click
            P[:, :, :r] = np.where(shown[:, None, None], live - hit, live)
            P[:, 1:, r] += moved[:, :-1]
            P[:, N_ABOVE_CAP, r] += moved[:, -1]
        return np.where(mask, out, 0.0)

    def expected_stats(self, qd, g, clicks, mask, weight=None) -> Stats:
        raise NotImplementedError("lcm is trained by clickeval_spark.learned (Spark MLlib), not by EM")

    def relevance(self, qd, g=None) -> np.ndarray:
        """P(click | the document at rank 1, nothing clicked above): the model's attractiveness at the top."""
        if g is None:
            raise ValueError("lcm's relevance needs its weights (the global parameters)")
        shape = np.shape(qd["n_imp"])
        ones = np.ones(shape, dtype=np.int64)
        return _sigmoid(self._logit(qd, g, ones, 0 * ones, 0 * ones, np.shape(g["w_rank"])[0]))
