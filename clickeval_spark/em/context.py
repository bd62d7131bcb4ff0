"""FitContext: what every candidate of one fit shares, handed around the EM loop as one object."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from clickeval_spark.em.options import EMOptions
from clickeval_spark.em.passes import Passes
from clickeval_spark.models.base import ClickModel
from clickeval_spark.models.priors import ModelPrior

#: called after every EM pass: (passes done, the iteration cap, "" on the fit's log or "sample" on the
#: selection sample of `driver._select_on_sample`)
OnPass = Callable[[int, int, str], None]


@dataclass(frozen=True)
class FitContext:
    """One fit of ``model`` by its own estimator.

    prior: the fit's resolved prior, before its candidates resolve `k: auto`.
    engine: builds the passes over a packed log (`driver.fit_groups`: resident or one job per pass); its
        ``shared`` argument, a number of candidates, shares them out over a selection sample's tasks.
    n_passes: the cap on a candidate's passes (a counting model makes one, two for empirical Bayes).
    pooled: some family's prior mean is pooled, so the means follow the fit during the warm-up.
    """

    model: ClickModel
    max_rank: int
    opts: EMOptions
    prior: ModelPrior
    engine: Callable[..., Passes]
    log: logging.Logger
    on_pass: OnPass | None = None
    n_passes: int = 1
    pooled: bool = False
