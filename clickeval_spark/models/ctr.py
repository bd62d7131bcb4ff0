"""Click-through-rate baselines: every click is an independent coin.

GCTR: one global rate.  RCTR: one rate per rank.  DCTR: one rate per
(query, doc).  Clicks do not depend on each other, so the conditional and the
marginal click probability are the same number, and the MLE is a plain count.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from clickeval_spark.models.base import ClickModel, Stats, row_weight


def _no_doc_relevance(name: str) -> np.ndarray:
    # relevance(qd) only sees per-document arrays, and these models have none: the
    # score is one constant for every document, whose shape cannot be known here.
    raise ValueError(f"{name} has no per-document parameter: its relevance is the same "
                     "constant for every document and cannot rank them")


class GCTR(ClickModel):
    name = "gctr"
    qd_params = ()
    iterative = False

    def global_shapes(self, M: int) -> dict[str, tuple[int, ...]]:
        return {"ctr": ()}

    def cond_probs(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                   clicks: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self.click_probs(qd, g, mask)

    def click_probs(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                    mask: np.ndarray) -> np.ndarray:
        return np.where(mask, float(g["ctr"]), 0.0)

    def expected_stats(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                       clicks: np.ndarray, mask: np.ndarray, weight: np.ndarray | None = None) -> Stats:
        w = row_weight(weight)
        num = np.asarray(float((((clicks == 1) & mask) * w).sum()))
        den = np.asarray(float((mask * w).sum()))
        return Stats(glob={"ctr": (num, den)})

    def relevance(self, qd: Mapping[str, np.ndarray]) -> np.ndarray:
        return _no_doc_relevance(self.name)


class RCTR(ClickModel):
    name = "rctr"
    qd_params = ()
    iterative = False

    def global_shapes(self, M: int) -> dict[str, tuple[int, ...]]:
        return {"ctr": (M,)}

    def cond_probs(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                   clicks: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self.click_probs(qd, g, mask)

    def click_probs(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                    mask: np.ndarray) -> np.ndarray:
        return np.where(mask, np.asarray(g["ctr"], dtype=float)[None, :], 0.0)

    def expected_stats(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                       clicks: np.ndarray, mask: np.ndarray, weight: np.ndarray | None = None) -> Stats:
        w = row_weight(weight)
        num = (((clicks == 1) & mask) * w).sum(axis=0).astype(float)
        den = (mask * w).sum(axis=0).astype(float)
        return Stats(glob={"ctr": (num, den)})

    def relevance(self, qd: Mapping[str, np.ndarray]) -> np.ndarray:
        return _no_doc_relevance(self.name)


class DCTR(ClickModel):
    name = "dctr"
    qd_params = ("alpha",)
    iterative = False
    impression_dens = ("alpha",)

    def cond_probs(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                   clicks: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self.click_probs(qd, g, mask)

    def click_probs(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                    mask: np.ndarray) -> np.ndarray:
        return np.where(mask, qd["alpha"], 0.0)

    def expected_stats(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                       clicks: np.ndarray, mask: np.ndarray, weight: np.ndarray | None = None) -> Stats:
        num = ((clicks == 1) & mask).astype(float)
        return Stats(qd={"alpha": (num, mask.astype(float))})
