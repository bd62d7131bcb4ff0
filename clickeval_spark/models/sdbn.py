"""Simplified DBN (Chapelle & Zhang 2009): DBN with gamma = 1, fitted by exact EM on that likelihood.

Under gamma = 1 a user who is not satisfied goes on examining, so the ranks below the last click were
examined unless its click satisfied the user: the E-step weighs the two (DBN's posteriors at gamma = 1).

`CountedSDBN` is the estimator SDBN is known by (PyClick's): it counts as if the last click satisfied the
user and nothing below it was examined (a SERP without clicks: every rank examined). That is not the maximum
of the likelihood the predictions use; it is the fit under `prior: pyclick`, and under any other prior the
valid split chooses between the two (`em.driver.fit_groups`).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from clickeval_spark.models.base import Stats
from clickeval_spark.models.chain import ChainModel, last_click
from clickeval_spark.models.dbn import DBN

_DBN = DBN()
_GAMMA_ONE = {"gamma": np.asarray(1.0)}


class SDBN(ChainModel):
    name = "sdbn"
    qd_params = ("alpha", "sigma")
    iterative = True

    def continuation(self, qd, g):
        a = qd["alpha"]
        return a, np.ones_like(a), 1 - qd["sigma"]

    def expected_stats(self, qd: Mapping[str, np.ndarray], g: Mapping[str, np.ndarray],
                       clicks: np.ndarray, mask: np.ndarray, weight: np.ndarray | None = None) -> Stats:
        # DBN's exact posteriors at gamma = 1; gamma itself is not a parameter here
        return Stats(qd=_DBN.expected_stats(qd, _GAMMA_ONE, clicks, mask, weight).qd)

    def relevance(self, qd: Mapping[str, np.ndarray]) -> np.ndarray:
        return qd["alpha"] * qd["sigma"]


class CountedSDBN(SDBN):
    """SDBN's probabilities, its parameters counted (one pass): the last click satisfied, nothing below it seen."""

    iterative = False
    counting = None

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


SDBN.counting = CountedSDBN()
