"""The maths shared by every cascade-family model (CM, DCM, CCM, DBN, SDBN).

Cascade family (CM, DCM, CCM, DBN, SDBN): the user starts at rank 1 (E_1 = 1),
never skips ahead (E_r = 0 implies E_{r+1} = 0), clicks an examined document
with probability alpha (C_r = E_r * A_r), and after an examined rank goes on
with probability ``cont_skip`` (no click) or ``cont_click`` (click).  The
models differ only in those two continuation probabilities and in how a click's
continuation decomposes into latent variables (satisfaction, relevance), so the
chain algebra lives here once:

- ``chain_cond_probs`` / ``chain_click_probs``: the forward pass.
- ``chain_posteriors``: an exact E-step over the examination chain.  Every rank
  up to the last click l is examined; only the click-free tail after l is
  uncertain, so one backward pass (T) and one forward pass in the tail suffice.

Masks are prefixes (padding at the end): rank r+1 exists iff mask[:, r+1].
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from clickeval_spark.models.base import ClickModel


def safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den, and 0 where den == 0 (only reached on impossible observations)."""
    num, den = np.broadcast_arrays(np.asarray(num, dtype=float), np.asarray(den, dtype=float))
    return np.divide(num, den, out=np.zeros(num.shape), where=den > 0)


def last_click(clicked: np.ndarray) -> np.ndarray:
    """0-based rank of the last click per SERP, -1 without clicks."""
    M = clicked.shape[1]
    rev = np.argmax(clicked[:, ::-1], axis=1)
    return np.where(clicked.any(axis=1), M - 1 - rev, -1)


def first_click(clicked: np.ndarray) -> np.ndarray:
    """0-based rank of the first click per SERP, -1 without clicks."""
    return np.where(clicked.any(axis=1), np.argmax(clicked, axis=1), -1)


def has_next_rank(mask: np.ndarray) -> np.ndarray:
    """True where rank r+1 exists, i.e. a continuation decision after r is observable."""
    nxt = np.zeros_like(mask, dtype=bool)
    nxt[:, :-1] = mask[:, 1:]
    return nxt & mask


def _cols(*arrays: np.ndarray) -> list[np.ndarray]:
    """(B, M) -> contiguous (M, B): the rank loops below read whole rows, not strided columns."""
    return [np.ascontiguousarray(np.asarray(x).T) for x in arrays]


def chain_cond_probs(alpha: np.ndarray, cont_skip: np.ndarray, cont_click: np.ndarray,
                     clicks: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """P(C_r = 1 | clicks above) = alpha_r * P(E_r = 1 | clicks above)."""
    a, s, k, c, m = _cols(alpha, cont_skip, cont_click, clicks == 1, mask)
    M, B = a.shape
    out = np.zeros((M, B))
    e = np.ones(B)  # P(E_r = 1 | clicks above r)
    for r in range(M):
        p = e * a[r]
        out[r] = np.where(m[r], p, 0.0)
        # Bayes on a skip: the user either did not examine r, or examined and was not attracted.
        e_skip = safe_div(e * (1 - a[r]) * s[r], 1 - p)
        e = np.where(c[r], k[r], e_skip)
    return out.T


def chain_click_probs(alpha: np.ndarray, cont_skip: np.ndarray, cont_click: np.ndarray,
                      mask: np.ndarray) -> np.ndarray:
    """Marginal P(C_r = 1) = alpha_r * P(E_r = 1); E and A_r are independent."""
    a, s, k, m = _cols(alpha, cont_skip, cont_click, mask)
    M, B = a.shape
    out = np.zeros((M, B))
    e = np.ones(B)  # P(E_r = 1)
    for r in range(M):
        out[r] = np.where(m[r], e * a[r], 0.0)
        e = e * ((1 - a[r]) * s[r] + a[r] * k[r])
    return out.T


@dataclass
class ChainPosterior:
    """Exact posteriors of the examination chain given one SERP's clicks.

    exam:       P(E_r = 1 | C), 0 where masked.
    exam_next:  P(E_r = 1, E_{r+1} = 1 | C) at ``skip_next`` ranks, else 0.
    attract:    P(A_r = 1 | C), 0 where masked.
    skip_next:  unclicked rank with a next rank (a skip-continuation decision).
    click_next: clicked rank with a next rank (a click-continuation decision).
    w1, w0:     at ``click_next`` ranks, the likelihood of the clicks below given
                that the user continued (w1) or stopped (w0), up to a common
                factor.  A model whose click continuation mixes latent states z
                gets P(z, K | C) proportional to P(z) P(K | z) w_K.
    """

    exam: np.ndarray
    exam_next: np.ndarray
    attract: np.ndarray
    skip_next: np.ndarray
    click_next: np.ndarray
    w1: np.ndarray
    w0: np.ndarray


def chain_posteriors(alpha: np.ndarray, cont_skip: np.ndarray, cont_click: np.ndarray,
                     clicks: np.ndarray, mask: np.ndarray) -> ChainPosterior:
    B, M = alpha.shape
    clicked = (clicks == 1) & mask
    nxt = has_next_rank(mask)
    last = last_click(clicked)
    rows = np.arange(B)
    ranks = np.arange(M)
    a, s, m = _cols(alpha, cont_skip, mask)

    # T[r] = P(no click at ranks >= r | E_r = 1); 1 past the end of the list.
    T = np.ones((M + 1, B))
    for r in range(M - 1, -1, -1):
        T[r] = np.where(m[r], (1 - a[r]) * ((1 - s[r]) + s[r] * T[r + 1]), 1.0)

    start = last + 1  # first rank of the click-free tail
    # Examination probability entering the tail: the click continuation after the
    # last click, or 1 at rank 1 for a SERP without clicks.
    e0 = np.where(last >= 0, cont_click[rows, np.maximum(last, 0)], 1.0)
    t_start = T[start, rows]
    z_tail = (1 - e0) + e0 * t_start  # P(no clicks after l | clicks up to l)
    inv_z = safe_div(1.0, z_tail)

    exam = np.ones((M, B))
    exam_next = np.ones((M, B))
    f = np.zeros(B)  # P(E_r = 1, no click in [start, r) | clicks up to l)
    for r in range(M):
        f = np.where(start == r, e0, f)
        in_tail = r >= start
        step = f * (1 - a[r]) * s[r]
        exam[r] = np.where(in_tail, f * T[r] * inv_z, 1.0)
        exam_next[r] = np.where(in_tail, step * T[r + 1] * inv_z, 1.0)
        f = step
    exam, exam_next = exam.T, exam_next.T

    skip_next = nxt & ~clicked
    click_next = nxt & clicked
    exam = np.where(mask, exam, 0.0)
    exam_next = np.where(skip_next, exam_next, 0.0)
    # A_r is independent of the chain, and an unexamined rank says nothing about it.
    attract = np.where(clicked, 1.0, alpha * (1 - exam))
    attract = np.where(mask, attract, 0.0)

    before_last = ranks[None, :] < last[:, None]  # clicks above l: the user surely went on
    w1 = np.where(before_last, 1.0, t_start[:, None])
    w0 = np.where(before_last, 0.0, 1.0)
    return ChainPosterior(exam, exam_next, attract, skip_next, click_next, w1, w0)


class ChainModel(ClickModel):
    """A cascade-family model: defined by its per-rank continuation probabilities.

    Subclasses give ``continuation(qd, g) -> (alpha, cont_skip, cont_click)``;
    the click probabilities follow from the chain algebra above.
    """

    @abstractmethod
    def continuation(self, qd: Mapping[str, np.ndarray],
                     g: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(alpha, P(go on | examined, no click), P(go on | click)), each (B, M)."""

    def cond_probs(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                   clicks: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return chain_cond_probs(*self.continuation(qd, g), clicks, mask)

    def click_probs(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                    mask: np.ndarray) -> np.ndarray:
        return chain_click_probs(*self.continuation(qd, g), mask)
