"""FittedModel: a fitted click model's parameters, and what can be done with them.

Like Spark MLlib's ALSModel: the parameters live in a DataFrame (per (query, doc)) and
numpy arrays (per rank / global), and the methods return DataFrames, computed by
Spark without collecting anything per query to the driver.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F

from clickeval_spark.errors import ClickevalError
from clickeval_spark.models import get_model
from clickeval_spark.models.base import ClickModel
from clickeval_spark.fitted.params_io import fields_from_rows, global_rows, to_param_rows
from clickeval_spark.fitted.predict import predict_clicks, relevance_scores
from clickeval_spark.fitted.sampling import sample_serps


@dataclass
class FittedModel:
    """A fitted click model.

    qd:      DataFrame query_id string, doc_id string, one double column per
             ``model.qd_params`` entry, n_obs double (impressions of the pair in
             the training log). Empty of columns but the keys for models with no
             qd parameters.
    glob:    per-rank / global parameters, shapes ``model.global_shapes(max_rank)``.
    prior:   qd parameter -> its family's prior mean m (README, "Priors"): the relevance of
             (query, doc) pairs unseen in training.
    prior_by_rank: qd parameter -> the value such a pair takes at each rank 1..max_rank when
             clicks are predicted or drawn (the rank's pooled mean; empty: ``prior`` at every rank).
    history: (iteration, mean per-SERP training LL, seconds); iteration 0 is the
             starting point.
    """

    model: ClickModel
    max_rank: int
    qd: DataFrame
    glob: dict[str, np.ndarray]
    prior: dict[str, float]
    prior_by_rank: dict[str, list[float]] = field(default_factory=dict)
    history: list[tuple[int, float, float]] = field(default_factory=list)
    #: the estimator, enough to reproduce the fit: kind, and per family with a prior its k and m
    prior_spec: dict = field(default_factory=dict)
    #: `k: auto`: every candidate strength's valid LL per position and the choice (None otherwise)
    selection: dict | None = None
    #: log posterior per training SERP, per history entry (LL + log prior density)
    log_posterior: list[float] = field(default_factory=list)
    #: LL per position of the held-out SERPs packed with the log (None without)
    valid_ll: float | None = None
    #: per rank, the held-out SERPs reaching it and their summed ln P(observed click) under p_click
    #: (`em.driver.fit_groups` with ``EMOptions.ppl_eps``: the surrogate's Reverse PPL terms; None otherwise)
    held_out_ppl: tuple[np.ndarray, np.ndarray] | None = None

    def unseen_at_ranks(self, p: str) -> list[float]:
        """The value of qd parameter ``p`` for a pair unseen in training, at ranks 1..max_rank."""
        return [float(v) for v in self.prior_by_rank.get(p) or [self.prior[p]] * self.max_rank]

    def predict(self, serps: DataFrame) -> DataFrame:
        """One row per evaluated position of `serps` with click, p_click_cond and p_click (fitted/predict.py)."""
        return predict_clicks(serps, self)

    def relevance(self, pairs: DataFrame | None = None) -> DataFrame:
        """query_id, doc_id, score: the model's relevance estimate of `pairs` (default: its qd table)."""
        return relevance_scores(self, pairs)

    def sample(self, serps: DataFrame, *, k: int, seed: int, **options) -> DataFrame:
        """`k` click sequences per SERP drawn from the model (fitted/sampling.py `sample_serps`)."""
        return sample_serps(serps, self, k=k, seed=seed, **options)

    def to_rows(self, run_id: str) -> DataFrame:
        """The model_params rows of this model for run `run_id` (fitted/params_io.py)."""
        return to_param_rows(self, run_id)

    @classmethod
    def from_rows(cls, rows: DataFrame, model: ClickModel, run_id: str, max_rank: int) -> FittedModel:
        """The model `model` of run `run_id` from model_params rows (history is not stored)."""
        return cls(**fields_from_rows(rows, model, run_id, max_rank))


def load_fitted(params: DataFrame, name: str, run_id: str, max_rank: int) -> FittedModel:
    """Model `name` of run `run_id` from model_params. A run or model never fitted, or a model name the
    code does not know, is a user error: one line saying what to run, not a traceback."""
    return load_fitted_models(params, [name], run_id, max_rank)[name]


def load_fitted_models(params: DataFrame, names: Sequence[str], run_id: str,
                       max_rank: int) -> dict[str, FittedModel]:
    """`load_fitted` of each of ``names``, their global parameters read in one Spark job (not one per model:
    a stage loading eleven models paid eleven jobs)."""
    models = {}
    for name in names:
        try:
            models[name] = get_model(name)
        except ValueError as exc:
            raise ClickevalError(f"model_params: {exc}") from None
    glob = global_rows(params, run_id, list(models))
    return {name: _from_global_rows(params, model, run_id, max_rank, glob[name]) for name, model in models.items()}


def _from_global_rows(params: DataFrame, model: ClickModel, run_id: str, max_rank: int,
                      glob_rows: Sequence[Row]) -> FittedModel:
    """The model from its global rows (read already) and its per-pair rows (lazy); user errors as `load_fitted`."""
    name = model.name
    try:
        return FittedModel(**fields_from_rows(params, model, run_id, max_rank, glob_rows))
    except ValueError as exc:
        if params.where((F.col("run_id") == run_id) & (F.col("model") == name)).limit(1).count() == 0:
            raise ClickevalError(f"run {run_id}: no model_params for model {name}; "
                                 f"run `clickeval fit --run-id {run_id}` first") from None
        raise ClickevalError(f"run {run_id}: {exc}; rerun `clickeval fit --run-id {run_id}`") from None
