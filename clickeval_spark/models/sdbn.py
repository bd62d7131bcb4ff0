"""Simplified DBN (Chapelle & Zhang 2009): DBN with gamma = 1, fitted by counting.

The counting estimator assumes the ranks up to the last click were examined,
nothing below it was, and the last click satisfied the user; a SERP without
clicks counts every rank as examined.  Its probabilities are DBN's with gamma = 1.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from clickeval_spark.models.base import Stats
from clickeval_spark.models.chain import ChainModel, last_click


class SDBN(ChainModel):
    name = "sdbn"
    qd_params = ("alpha", "sigma")
    iterative = False

    def continuation(self, qd, g):
        a = qd["alpha"]
        return a, np.ones_like(a), 1 - qd["sigma"]

    def expected_stats(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                       clicks: np.ndarray, mask: np.ndarray, weight: np.ndarray | None = None) -> Stats:
        clicked = (clicks == 1) & mask
        last = last_click(clicked)
        ranks = np.arange(mask.shape[1])[None, :]
        seen = ((ranks <= last[:, None]) | (last[:, None] < 0)) & mask
        is_last = clicked & (ranks == last[:, None])
        return Stats(qd={
            "alpha": ((clicked & seen).astype(float), seen.astype(float)),
            "sigma": (is_last.astype(float), clicked.astype(float)),
        })

    def relevance(self, qd: Mapping[str, np.ndarray]) -> np.ndarray:
        return qd["alpha"] * qd["sigma"]
