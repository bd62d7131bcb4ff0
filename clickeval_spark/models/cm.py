"""Cascade model (CM): the user scans down until the first click and stops."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from clickeval_spark.models.base import Stats
from clickeval_spark.models.chain import ChainModel, first_click


class CM(ChainModel):
    """Cascade model: the user scans down until the first click and stops.

    Counting MLE (exact for this model): alpha = clicks / impressions over the
    ranks up to and including the first click (all ranks of a click-less SERP).
    """

    name = "cm"
    qd_params = ("alpha",)
    iterative = False

    def continuation(self, qd, g):
        a = qd["alpha"]
        return a, np.ones_like(a), np.zeros_like(a)  # a click ends the session

    def expected_stats(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                       clicks: np.ndarray, mask: np.ndarray, weight: np.ndarray | None = None) -> Stats:
        clicked = (clicks == 1) & mask
        first = first_click(clicked)
        seen = (np.arange(mask.shape[1])[None, :] <= first[:, None]) | (first[:, None] < 0)
        seen &= mask
        return Stats(qd={"alpha": ((clicked & seen).astype(float), seen.astype(float))})
